"""What every named check shares: the :class:`Check` record, the function type, and the path
test that deletion, writing and reading checks use (:func:`path_problem`)."""

from __future__ import annotations

import glob as _glob
import os
from collections.abc import Callable
from dataclasses import dataclass

from fak.policy.paths import resolve, within
from fak.policy.shell import Analysis, SimpleCommand

MAX_GLOB_MATCHES = 1000

CheckFn = Callable[[Analysis, "str | None", "tuple[str, ...]"], "str | None"]


@dataclass(frozen=True)
class Check:
    """A named check: ``fn(analysis, workspace_root_real | None, extra_roots_real)`` returns
    ``None`` or what it found (a short text the verdict's reason quotes); ``uses_paths``: it
    resolves paths (accepts ``extra_roots``)."""

    name: str
    fn: CheckFn
    description: str
    uses_paths: bool


def short(text: str, limit: int = 160) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut)."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def contained(real: str, root: str | None, extra: tuple[str, ...], strict: bool) -> bool:
    """``real`` is inside the workspace root or an extra root (``strict``: not the root
    itself)."""
    if root is not None and within(real, root, strict):
        return True
    return any(within(real, e, strict) for e in extra)


def outside_message(word: str, real: str, root: str | None, strict: bool) -> str:
    if root is None:
        return f"`{short(word, 80)}` resolves to {short(real, 80)} and no workspace root is known"
    if strict and real == root:
        return f"`{short(word, 80)}` is the workspace root itself"
    return f"`{short(word, 80)}` resolves to {short(real, 80)}, outside the workspace"


def cached_resolve(c: SimpleCommand, word: str, cwd: str | None, root: str | None) -> str | None:
    """:func:`fak.policy.paths.resolve` of ``word`` for ``c``, computed once per decision (the
    checks of one decision share ``c.cache``)."""
    cache = c.cache
    if cache is None:
        cache = c.cache = {}
    key = ("resolve", word, cwd, root)
    if key in cache:
        return cache[key]
    real = cache[key] = resolve(word, cwd, root)
    return real


def path_problem(c: SimpleCommand, word: str, dyn: bool, globbed: bool, root: str | None,
                 extra: tuple[str, ...], strict: bool) -> str | None:
    """Why ``word`` (an operand of ``c``) is not inside the workspace or an extra root, or
    ``None`` when it is, for every directory ``c`` may run in (``strict``: the root itself
    does not count as inside). A glob is expanded (at most :data:`MAX_GLOB_MATCHES` matches)
    and every match must be inside."""
    if dyn:
        return f"`{short(word, 80)}` is only known at run time"
    for cwd in c.cwds:
        real = cached_resolve(c, word, cwd, root)
        if real is None:
            if root is None and not word.startswith(("/", "~")):
                return f"`{short(word, 80)}` is relative and no workspace root is known"
            return f"`{short(word, 80)}` cannot be resolved"
        if not contained(real, root, extra, strict):
            return outside_message(word, real, root, strict)
        if globbed:
            base = resolve(".", cwd, root) or "/"
            pattern = word if word.startswith("/") else os.path.join(base, word)
            for k, match in enumerate(_glob.iglob(os.path.expanduser(pattern))):
                if k >= MAX_GLOB_MATCHES:
                    return f"`{short(word, 80)}` matches more than {MAX_GLOB_MATCHES} paths"
                mreal = os.path.realpath(match)
                if not contained(mreal, root, extra, strict):
                    return outside_message(match, mreal, root, strict)
    return None


def is_root(c: SimpleCommand, word: str, root: str | None) -> bool:
    """``word`` names the workspace root itself from some directory ``c`` may run in (or the
    directory is unknown)."""
    if root is None:
        return True
    for cwd in c.cwds:
        real = cached_resolve(c, word, cwd, root)
        if real is None or real == root:
            return True
    return False
