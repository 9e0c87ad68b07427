"""Environments for tests that start ``fak`` in a subprocess.

A child must run the same interpreter and the same ``fak`` package as the pytest process: the
installed package after ``pip install '.[test]'``, or the checkout's ``python/`` when pytest itself
runs with ``PYTHONPATH=python`` (a worktree built with ``scripts/dev-build``). ``fak_env`` puts the
directory that holds the imported ``fak`` on the child's ``PYTHONPATH`` only when a fresh
interpreter would not find it there already (never a site-packages directory, never the
checkout's ``python/`` when the package is installed).

Usage: ``subprocess.run([sys.executable, "-m", "fak.cli", ...], env=fak_env())``.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

import fak

#: the directory that holds the ``fak`` package this pytest process imported
FAK_ROOT = Path(fak.__file__).resolve().parent.parent


def _site_dirs() -> set[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {Path(d).resolve() for d in dirs if d}


def fak_python_path(*prefix: str | os.PathLike[str]) -> str:
    """The ``PYTHONPATH`` a child needs: ``prefix`` entries first, then (only when the imported
    ``fak`` is not installed in a site directory) the directory holding it, then the caller's
    own ``PYTHONPATH``."""
    parts = [str(p) for p in prefix]
    if FAK_ROOT not in _site_dirs():
        parts.append(str(FAK_ROOT))
    inherited = os.environ.get("PYTHONPATH")
    if inherited:
        parts.extend(p for p in inherited.split(os.pathsep) if p and p not in parts)
    return os.pathsep.join(parts)


def fak_env(*prefix: str | os.PathLike[str], **extra: str) -> dict[str, str]:
    """A copy of ``os.environ`` for a child ``python -m fak...``: ``PYTHONPATH`` from
    ``fak_python_path(*prefix)`` (unset when empty) and ``extra`` variables set."""
    env = dict(os.environ)
    path = fak_python_path(*prefix)
    if path:
        env["PYTHONPATH"] = path
    else:
        env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def fak_argv(*args: str) -> list[str]:
    """``[sys.executable, "-m", "fak.cli", *args]``."""
    return [sys.executable, "-m", "fak.cli", *args]
