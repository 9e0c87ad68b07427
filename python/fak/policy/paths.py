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
_O_PATH = getattr(os, "O_PATH", 0)
_KERNEL = bool(_O_PATH) and os.path.isdir("/proc/self/fd")


def realpath(path: str) -> str:
    """:func:`os.path.realpath` of an absolute ``path``, computed by the kernel when it can:
    the longest existing prefix is opened with ``O_PATH`` and read back through
    ``/proc/self/fd`` (one lookup in C instead of one ``lstat`` per component in Python), and the
    missing components after it are appended as they are (a component that does not exist is
    not a symlink). Falls back to :func:`os.path.realpath` itself for anything unusual: a
    dangling symlink, ``..`` after a missing component, a loop, a non-directory in the middle,
    or a system without ``O_PATH``/procfs."""
    if not _KERNEL:
        return os.path.realpath(path)
    p = path.rstrip("/") or "/"
    tail: list[str] = []
    while True:
        try:
            fd = os.open(p, _O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                os.lstat(p)
            except FileNotFoundError:
                pass
            except OSError:
                return os.path.realpath(path)
            else:                      # it exists, yet cannot be opened: a dangling symlink
                return os.path.realpath(path)
            head, name = os.path.split(p)
            if name == "..":
                return os.path.realpath(path)
            if name and name != ".":
                tail.append(name)
            if not head or head == p:
                return os.path.realpath(path)
            p = head.rstrip("/") or "/"
            continue
        except OSError:
            return os.path.realpath(path)
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return os.path.realpath(path)
        finally:
            os.close(fd)
        if not real.startswith("/"):
            return os.path.realpath(path)
        if tail:
            tail.reverse()
            real = real.rstrip("/") + "/" + "/".join(tail)
        return real


def real_root(root: str) -> str:
    """The real path of a root directory (``~`` expanded, symlinks resolved), memoized per
    spelling: roots are resolved once, not on every decision."""
    r = _ROOTS.get(root)
    if r is None:
        r = os.path.expanduser(root)
        r = realpath(r) if r.startswith("/") else os.path.realpath(r)
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
        if path.startswith(("~+", "~-")):
            return None             # $PWD / $OLDPWD of the shell: unknown here
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
    return realpath(path)


def within(real: str, root: str, strict: bool = False) -> bool:
    """True when the real path ``real`` is ``root`` or below it (``strict``: below only)."""
    if real == root:
        return not strict
    if root == "/":
        return True
    return real.startswith(root) and real[len(root)] == "/"
