"""The paths a virtual environment needs inside the sandbox: the venv, the interpreter it was made
from (``home`` in ``pyvenv.cfg``), and the directories its ``.pth`` files add to ``sys.path``
(fak's per-instance overlay venvs point at their shared env that way), followed transitively."""

from __future__ import annotations

from pathlib import Path


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
    """``venv``, its base interpreter's prefix and the venvs/directories its ``.pth`` files name
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
        for pth in v.glob("lib/python*/site-packages/*.pth"):
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
