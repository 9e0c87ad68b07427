"""The paths a virtual environment needs inside the sandbox: the venv, the interpreter it was made
from (``home`` in ``pyvenv.cfg``), and the shared env a fak overlay venv points at (its
``_fak_shared_env.pth``), followed transitively (``venv_paths``); and the paths of the Python
fak itself runs on, for a sandbox asked to run that interpreter (``interpreter_paths``).

Only fak's own ``.pth`` file is followed: any other ``.pth`` line is something an install (model
code, in ``eval --local``) may have written, and following it would bind a hidden folder of the
host (``~/.ssh``) into later sandboxes. Call it before model code can write the venv (fak does:
at the toolbox's start, right after an overlay is made)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: the ``.pth`` file of a fak overlay venv that names its shared env's site-packages
SHARED_ENV_PTH = "_fak_shared_env.pth"


def _base_prefix(venv: Path) -> Path | None:
    cfg = venv / "pyvenv.cfg"
    try:
        lines = cfg.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = Path(value.strip())  # .../bin of the base interpreter
            return home.parent if home.name == "bin" else home
    return None


def _venv_of(path: Path) -> Path | None:
    for p in [path, *path.parents]:
        if (p / "pyvenv.cfg").is_file():
            return p
    return None


def venv_paths(venv: Path | str) -> list[Path]:
    """``venv``, its base interpreter's prefix and the venv its ``SHARED_ENV_PTH`` names
    (absolute, existing), deduplicated, in discovery order. A path that is not a venv gives
    ``[venv]``."""
    out: list[Path] = []
    todo = [Path(venv)]
    while todo:
        v = todo.pop(0)
        if v in out or not v.exists():
            continue
        out.append(v)
        base = _base_prefix(v)
        if base is not None and base.exists():
            out.append(base.resolve()) if base.resolve() not in out else None
        for pth in v.glob(f"lib/python*/site-packages/{SHARED_ENV_PTH}"):
            try:
                lines = pth.read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                s = line.strip()
                if s.startswith("/") and Path(s).is_dir():
                    owner = _venv_of(Path(s))
                    todo.append(owner if owner is not None else Path(s))
    return out


def interpreter_paths(prefix: str | Path | None = None, base_prefix: str | Path | None = None,
                      executable: str | Path | None = None, *,
                      home: str | Path | None = None) -> list[Path]:
    """The paths a sandbox must bind read-only to run the Python fak runs on (``sys.prefix``,
    ``sys.base_prefix``, ``sys.executable`` by default), wherever it lives — a venv under
    ``/tmp`` or ``$HOME``, pyenv, uv, conda — since the sandbox hides ``/tmp`` and ``$HOME``:
    ``venv_paths(prefix)`` (the venv and the interpreter it was made from), the base prefix, and
    the prefix of the executable once its links are resolved (``.../bin/python3`` →
    ``...``). Paths that do not exist are left out, and so is any that would show a hidden tree
    whole: ``/``, ``home`` (``$HOME`` by default) or one of ``config.HIDDEN_ROOTS``, or a folder above
    one of them (an interpreter installed with ``--prefix=$HOME`` is not bound: the sandbox
    cannot run it)."""
    from fak.sandbox.config import HIDDEN_ROOTS, host_home

    prefix = Path(sys.prefix if prefix is None else prefix)
    base_prefix = Path(sys.base_prefix if base_prefix is None else base_prefix)
    real_exe = Path(os.path.realpath(sys.executable if executable is None else executable))
    exe_prefix = real_exe.parent.parent if real_exe.parent.name == "bin" else real_exe.parent
    hidden = [Path(h) for h in HIDDEN_ROOTS] + [Path(home) if home is not None else host_home()]
    out: list[Path] = []
    for p in [*venv_paths(prefix), base_prefix, exe_prefix]:
        if p.exists() and p not in out and not _shows_hidden_tree(p, hidden):
            out.append(p)
    return out


def _shows_hidden_tree(path: Path, hidden: Sequence[Path]) -> bool:
    """Whether binding ``path`` would show ``/`` or a whole hidden tree (``path`` is one of
    ``hidden`` or above one)."""
    real = Path(os.path.realpath(path))
    if real == Path("/"):
        return True
    for h in hidden:
        rh = Path(os.path.realpath(h))
        if rh == real or real in rh.parents:
            return True
    return False
