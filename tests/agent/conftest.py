"""Fixtures for the agent tests: a small git workspace and the scripted model server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fak.agent.workspace import Workspace


@pytest.fixture()
def repo(tmp_path: Path) -> tuple[Workspace, str]:
    """A git repo with ``calc.py`` (a bug in ``add``), ``pkg/util.py`` and a binary file;
    returns (workspace, base commit)."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n")
    (root / "pkg" / "util.py").write_text("X = 1\nY = 2\nX = 1\n")
    (root / "blob.bin").write_bytes(bytes(range(256)))
    run = lambda *a: subprocess.run(["git", *a], cwd=root, check=True, capture_output=True, text=True)  # noqa: E731
    run("init", "-q", "-b", "main")
    run("config", "user.email", "t@example.invalid")
    run("config", "user.name", "t")
    run("add", "-A")
    run("commit", "-qm", "base")
    base = run("rev-parse", "HEAD").stdout.strip()
    return Workspace(root), base
