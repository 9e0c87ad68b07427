"""The paths a virtual environment needs inside the sandbox: the venv, the interpreter it was made
from (``home`` in ``pyvenv.cfg``), and the shared env a fak overlay venv points at (its
``_fak_shared_env.pth``), followed transitively.

Only fak's own ``.pth`` file is followed: any other ``.pth`` line is something an install (model
code, in ``eval --local``) may have written, and following it would bind a hidden folder of the
host (``~/.ssh``) into later sandboxes. Call it before model code can write the venv (fak does:
at the toolbox's start, right after an overlay is made)."""

from __future__ import annotations

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
