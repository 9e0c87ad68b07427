"""What program a file really is, when a command runs it by path: :func:`real_program`.

A model can rename a program the policy denies (``cp /bin/rm ./del``, ``ln -s /bin/rm zap``) and
run it later under the new name. This module sees through the two cheap cases: a symlink (the
real path's basename is the program) and an ELF executable byte-identical to a program in the
system's command folders (found by size first, then compared in full). Anything else (a script,
a binary built in the workspace, a copy with one byte changed) is not recognized; that is the
sandbox's job.

The index of system programs (size → paths, over :data:`SYSTEM_DIRS`) is built on first use,
once per process (about 2 ms per thousand files); a file's answer is cached by its inode, size
and modification time.
"""

from __future__ import annotations

import os
import stat as _stat
import threading

SYSTEM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
MAX_COMPARE_BYTES = 64 << 20    # larger files are not compared (64 MiB)
_ELF = b"\x7fELF"

_lock = threading.Lock()
_index: dict[int, list[str]] | None = None
_cache: dict[tuple[int, int, int, int], str | None] = {}


def _build_index() -> dict[int, list[str]]:
    index: dict[int, list[str]] = {}
    seen: set[tuple[int, int]] = set()
    for d in SYSTEM_DIRS:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat()
            except OSError:
                continue
            if not (st.st_mode & 0o111) or not os.path.isfile(e.path):
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            index.setdefault(st.st_size, []).append(e.path)
    return index


def _same_bytes(a: str, b: str) -> bool:
    try:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                x = fa.read(1 << 20)
                if x != fb.read(1 << 20):
                    return False
                if not x:
                    return True
    except OSError:
        return False


def real_program(path: str) -> str | None:
    """The system program that the file at ``path`` (absolute, str) is, or ``None``.

    A symlink gives its real path when the real file's basename differs from ``path``'s. A
    regular ELF file gives the first program of :data:`SYSTEM_DIRS` with the same size and the
    same bytes. Missing files, scripts, unreadable files and files over
    :data:`MAX_COMPARE_BYTES` give ``None``. Never raises."""
    global _index
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    if _stat.S_ISLNK(st.st_mode):
        real = os.path.realpath(path)
        if os.path.basename(real) != os.path.basename(path.rstrip("/")):
            return real
        return None
    if not _stat.S_ISREG(st.st_mode) or st.st_size < 4 or st.st_size > MAX_COMPARE_BYTES:
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    try:
        with open(path, "rb") as f:
            if f.read(4) != _ELF:
                found = None
            else:
                found = ""
    except OSError:
        return None
    if found is not None:
        with _lock:
            if _index is None:
                _index = _build_index()
            candidates = list(_index.get(st.st_size, ()))
        found = next((c for c in candidates if _same_bytes(path, c)), None)
    with _lock:
        if len(_cache) >= 4096:
            _cache.clear()
        _cache[key] = found
    return found
