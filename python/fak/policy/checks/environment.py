"""The ``environment_dump`` check: commands that print the environment, which may hold API keys
and tokens."""

from __future__ import annotations

from fak.policy import commands as _cmds
from fak.policy import programs as _programs
from fak.policy.checks.base import short
from fak.policy.shell import Analysis

_SETTERS = frozenset({"export", "declare", "typeset", "readonly", "local"})
# declare/typeset options that list functions, not variables
_FUNCTION_LISTS = frozenset({"-f", "-F"})


def environment_dump(a: Analysis, root: str | None, extra: tuple[str, ...]) -> str | None:
    """``env``/``printenv`` without a command (``env``, ``env -0``, ``env -u X``, ``env A=1``,
    ``printenv``, ``printenv NAME``), ``export``/``declare``/``typeset``/``readonly`` with no
    names or with ``-p``, ``set`` alone, ``ps`` with the ``e`` modifier (each process's
    environment), and awk programs that read ``ENVIRON``."""
    for c in a.commands:
        argv, dyn = c.argv, c.dyn
        if not argv or dyn[0]:
            continue
        name = c.name
        if name == "printenv":
            return short(c.line)
        if name == "env":
            if _cmds.unwrap("env", argv, dyn) is None:
                return f"{short(c.line)}: env without a command prints the environment"
        elif name in _SETTERS:
            flags = [w for w in argv[1:] if w.startswith(("-", "+"))]
            names = [w for w in argv[1:] if not w.startswith(("-", "+"))]
            if any(f in _FUNCTION_LISTS for f in flags):
                continue
            if not names or any("p" in f[1:] for f in flags if f.startswith("-")):
                return f"{short(c.line)}: lists variables and their values"
        elif name == "set":
            if len(argv) == 1:
                return f"{short(c.line)}: set alone prints every variable"
        elif name == "ps":
            if any(not d and not w.startswith("-") and w.isalpha() and "e" in w
                   for w, d in zip(argv[1:], dyn[1:])):
                return f"{short(c.line)}: the e modifier prints each process's environment"
        elif _cmds.is_awk(name):
            src = _cmds.awk_source(argv, dyn)
            if src is not None and not src[1] and _programs.awk_effects(src[0])[2]:
                return f"{short(c.line)}: the awk program reads ENVIRON"
    return None
