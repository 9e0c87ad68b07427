"""The bubblewrap command line of a sandbox (``bwrap`` 0.8, Debian package ``bubblewrap``).

``bwrap --unshare-user --disable-userns --uid 0 --gid 0``: a user namespace that maps the caller's
uid to itself, so files keep their owners (the workspace stays writable, git sees its owner), all
capabilities dropped (bounding set included) and no nested user namespaces. New PID, IPC, UTS,
cgroup and (unless ``share_net``) network namespaces; bwrap brings ``lo`` up. ``--die-with-parent``
and ``--new-session``; bwrap's own init is PID 1, so the sandbox ends when the command ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import lru_cache

from fak.sandbox.config import Mount

HOSTNAME = "fak-sandbox"


@lru_cache(maxsize=1)
def bwrap_path() -> str | None:
    """Absolute path of ``bwrap`` on ``PATH``, or ``None``."""
    return shutil.which("bwrap")


@lru_cache(maxsize=1)
def bwrap_version() -> str | None:
    """``bwrap --version`` (``"bubblewrap 0.8.0"``), or ``None`` when it is not installed."""
    exe = bwrap_path()
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def bwrap_argv(mounts: Sequence[Mount], argv: Sequence[str], *, cwd: str,
               share_net: bool) -> list[str]:
    """The ``bwrap`` argv that runs ``argv`` in ``cwd`` with ``mounts`` over a read-only ``/``.
    ``share_net``: stay in the caller's network namespace (``net="host"``, or one prepared by
    ``net_setup``)."""
    uid, gid = os.getuid(), os.getgid()
    a = [bwrap_path() or "bwrap", "--die-with-parent", "--new-session",
         "--unshare-user", "--disable-userns", "--uid", str(uid), "--gid", str(gid),
         "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
         "--hostname", HOSTNAME, "--cap-drop", "ALL"]
    if not share_net:
        a.append("--unshare-net")
    a += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for m in mounts:
        if m.kind == "tmpfs":
            a += ["--perms", f"{m.mode:o}"]
            if m.size:
                a += ["--size", str(m.size)]
            a += ["--tmpfs", m.dest]
        elif m.kind == "ro":
            a += ["--ro-bind", m.src or m.dest, m.dest]
        elif m.kind == "rw":
            a += ["--bind", m.src or m.dest, m.dest]
        elif m.kind == "mask":
            a += ["--ro-bind", "/dev/null", m.dest]
        else:  # pragma: no cover - plan_mounts makes only these
            raise ValueError(f"unknown mount kind {m.kind!r}")
    a += ["--chdir", cwd, "--", *argv]
    return a
