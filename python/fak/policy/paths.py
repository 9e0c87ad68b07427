"""Path containment: where a path argument really points, and whether that is inside a root.

A path is resolved the way the kernel will resolve it when the tool runs: ``~`` is expanded
(:func:`os.path.expanduser`), a relative path is joined to its base directory (the workspace
root, or the directory a shell command ``cd``-ed to), and :func:`os.path.realpath` follows every
symlink and folds ``..`` after the symlinks it crosses (a physical walk). The result is compared
with the real path of each root by whole path components (``/ws`` contains ``/ws/a`` and ``/ws``
itself, not ``/ws2``).

The check happens when the policy decides, not when the tool runs: a symlink created between
the two can still redirect the call (time-of-check to time-of-use). Run tools of one conversation
one at a time, as the fleet agent does.
"""

from __future__ import annotations

import os

# Special files whose writing modifies nothing on disk (the tool's own output, the bit bucket).
HARMLESS_WRITE_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/fd/1",
                                    "/dev/fd/2", "/dev/tty", "/proc/self/fd/1",
                                    "/proc/self/fd/2"})

_ROOTS: dict[str, str] = {}


def real_root(root: str) -> str:
    """The real path of a root directory (``~`` expanded, symlinks resolved), memoized per
    spelling: roots are resolved once, not on every decision."""
    r = _ROOTS.get(root)
    if r is None:
        r = os.path.realpath(os.path.expanduser(root))
        if len(_ROOTS) >= 4096:
            _ROOTS.clear()
        _ROOTS[root] = r
    return r


def resolve(path: str, cwd: str | None, root: str | None) -> str | None:
    """Real path of ``path`` (str) for a process running in ``cwd`` (``""``: the workspace root;
    a path relative to it; an absolute or ``~`` path; ``None``: unknown), with ``root`` the real
    workspace root (``None``: unknown). ``None`` when it cannot be known: a relative path with an
    unknown directory, ``~user`` of an unknown user, or a NUL byte (the kernel would refuse it)."""
    if "\0" in path:
        return None
    if path.startswith("~"):
        path = os.path.expanduser(path)
        if path.startswith("~"):
            return None
    if not path.startswith("/"):
        if cwd is None:
            return None
        if cwd.startswith("~"):
            cwd = os.path.expanduser(cwd)
            if cwd.startswith("~"):
                return None
        if cwd.startswith("/"):
            path = os.path.join(cwd, path)
        else:
            if root is None:
                return None
            path = os.path.join(root, cwd, path) if cwd else os.path.join(root, path)
    return os.path.realpath(path)


def within(real: str, root: str, strict: bool = False) -> bool:
    """True when the real path ``real`` is ``root`` or below it (``strict``: below only)."""
    if real == root:
        return not strict
    if root == "/":
        return True
    return real.startswith(root) and real[len(root)] == "/"
