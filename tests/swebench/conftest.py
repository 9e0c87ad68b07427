"""Fixtures for the SWE-bench tests: tiny instances (``tiny.py``) and the scripted model server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny import make_instances  # noqa: E402



@pytest.fixture()
def tiny(tmp_path: Path) -> dict:
    """Two tiny SWE-bench-shaped instances with a local mirror (see ``tiny.py``)."""
    return make_instances(tmp_path / "tiny")


@pytest.fixture(scope="session")
def envs(tmp_path_factory) -> Path:
    """One env cache for the session: the tiny repo's env is built once (pip upgrade) and reused."""
    return tmp_path_factory.mktemp("envs")
