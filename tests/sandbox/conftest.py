"""Fixtures of the sandbox tests: a workspace, a fake home holding canaries, and the methods.

Hostile programs in these tests are written into files inside the workspace by Python and run only
inside the sandbox; nothing hostile is ever put on a shell command line of this host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from canaries import SECRET  # noqa: E402 - a module of this folder, after the path insert

from fak.sandbox import probe  # noqa: E402


@pytest.fixture(autouse=True)
def _sandbox_works():
    info = probe()
    for m, err in info.methods.items():
        assert err is None, f"the {m} sandbox does not work here: {err}"


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    """A fake ``$HOME`` (so that nothing in these tests can reach the real one) with a canary
    ``.ssh/id_canary`` holding the secret, and the secret in the host environment."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "id_canary").write_text(SECRET + "\n")
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("FAK_CANARY_SECRET", SECRET)
    return h


@pytest.fixture()
def ws(tmp_path, home) -> Path:
    """A small git repository as the workspace."""
    w = tmp_path / "ws"
    w.mkdir()
    (w / "hello.py").write_text("print('hello')\n")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=w, check=True, capture_output=True)
    return w


@pytest.fixture()
def canary_process():
    """A process outside the sandbox (``sleep``), by PID; it must outlive every test."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    alive = proc.poll() is None
    proc.kill()
    proc.wait()
    assert alive, "the canary process outside the sandbox was killed"
