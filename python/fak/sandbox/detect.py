"""``probe()``: can a sandbox be made here, how, and which limits hold. Cached per process.

Each method is tried for real: a sandbox around a temporary workspace runs ``sh -c`` that writes
into the workspace and must fail to write ``/etc``. bwrap is preferred (measured faster to start,
see ``benches/results/sandbox.md``); the ``unshare`` path is the fallback.
``$FAK_SANDBOX_METHOD=bwrap|unshare`` picks one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fak.sandbox.bwrap import bwrap_argv, bwrap_path, bwrap_version
from fak.sandbox.cgroup import find_base
from fak.sandbox.config import Limits, build_env, host_home, plan_mounts
from fak.sandbox.unshare import missing_tools, unshare_argv

METHODS = ("bwrap", "unshare")
_lock = threading.Lock()
_cached: SandboxInfo | None = None


@dataclass
class SandboxInfo:
    """What ``probe()`` found. ``ok``: a sandbox can be made; ``method``: the one used
    (``"bwrap"``, ``"unshare"`` or ``None``); ``detail``: one line (how, or what is missing);
    ``methods``: method → ``None`` when it works, else why not; ``bwrap_version``;
    ``limits``: limit → how it is enforced here (or why it is not)."""

    ok: bool
    method: str | None
    detail: str
    methods: dict[str, str | None] = field(default_factory=dict)
    bwrap_version: str | None = None
    limits: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


_CHECK = "echo ok > .fak-probe && rm .fak-probe && ! ( : > /etc/.fak-sandbox-probe ) 2>/dev/null"
_LEAK = Path("/etc/.fak-sandbox-probe")


def _try(method: str, ws: Path) -> str | None:
    """``None`` when ``method`` makes a working sandbox around ``ws``, else the error text."""
    if method == "bwrap" and bwrap_path() is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if method == "unshare" and missing_tools():
        return f"{', '.join(missing_tools())} not installed (util-linux)"
    home = host_home()
    mounts = plan_mounts(ws, home=home, limits=Limits(), net="none")
    build = bwrap_argv if method == "bwrap" else unshare_argv
    argv = build(mounts, ["/bin/sh", "-c", _CHECK], cwd=str(ws), share_net=False)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              env=build_env(None, home=home, net="none"), cwd=str(ws))
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{method} failed to start: {e}"
    if _LEAK.exists():  # the sandbox let a write to / through: never use it
        _LEAK.unlink()
        return f"{method}: / is writable inside the sandbox"
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        return f"{method} exit status {proc.returncode}: {err[-1] if err else 'no output'}"
    return None


def _limits(method: str | None) -> dict[str, str]:
    base = find_base()
    if base is not None:
        procs = f"cgroup v{base[1]} pids.max under {base[0]}"
    elif os.geteuid() != 0:
        procs = "RLIMIT_NPROC (per user namespace)"
    else:
        procs = ("NOT ENFORCED: running as root (RLIMIT_NPROC does not apply to uid 0) and no "
                 "pids cgroup can be made here (mount cgroup v2 with pids delegated, or run fak "
                 "as a non-root user)")
    return {"processes": procs, "cpu": "RLIMIT_CPU", "address_space": "RLIMIT_AS",
            "file_size": "RLIMIT_FSIZE", "open_files": "RLIMIT_NOFILE",
            "output": "byte cap in fak (kills the run)", "timeout": "SIGKILL of the PID namespace",
            "network": "own network namespace, loopback only" if method else "none"}


def probe(refresh: bool = False) -> SandboxInfo:
    """Whether a sandbox can be made here and how (cached per process; ``refresh`` re-probes).
    Never raises."""
    global _cached
    with _lock:
        if _cached is not None and not refresh:
            return _cached
        ws = Path(tempfile.mkdtemp(prefix="fak-sandbox-probe-"))
        try:
            methods = {m: _try(m, ws) for m in METHODS}
        finally:
            shutil.rmtree(ws, ignore_errors=True)
        forced = os.environ.get("FAK_SANDBOX_METHOD")
        order = [forced] if forced in METHODS else list(METHODS)
        method = next((m for m in order if methods.get(m) is None), None)
        version = bwrap_version()
        if forced and forced not in METHODS:
            method = None
            detail = f"FAK_SANDBOX_METHOD={forced!r} is not one of {', '.join(METHODS)}"
        elif method is None:
            detail = "; ".join(f"{m}: {methods[m]}" for m in order)
        elif method == "bwrap":
            detail = f"bubblewrap ({version or 'bwrap'}), namespaces user+mount+pid+net+ipc+uts"
        else:
            detail = ("unshare (util-linux) + fak's PID 1, namespaces user+mount+pid+net+ipc+uts"
                      + (f"; bwrap: {methods['bwrap']}" if methods.get("bwrap") else ""))
        _cached = SandboxInfo(ok=method is not None, method=method, detail=detail,
                              methods=methods, bwrap_version=version, limits=_limits(method))
        return _cached
