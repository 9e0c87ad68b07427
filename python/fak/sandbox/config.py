"""What the sandbox allows: resource limits, the environment allow-list, and the mount plan (which
paths are writable, read-only or hidden) shared by the bubblewrap and the ``unshare`` builders.

The mount plan is a list of ``Mount`` applied on top of a read-only view of ``/``, shallow paths
first so that deeper ones win: ``/tmp``, ``$HOME`` (and ``/root`` for root), ``/run`` and
``/dev/shm`` become empty private tmpfs; ``readable`` paths are bound back read-only (a task env's
venv and its interpreter); the workspace and ``writable`` paths are bound read-write; ``readonly``
paths (the workspace's ``.git``) are bound read-only again; files that hold host secrets readable
by uid 0 (``/etc/shadow``, ssh host keys) are masked with ``/dev/null``.
"""

from __future__ import annotations

import glob
import math
import os
import pwd
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox run. ``None`` turns a limit off.

    - ``processes``: tasks (processes + threads) alive at once in the sandbox: a pids cgroup's
      ``pids.max`` where one can be made, else ``RLIMIT_NPROC`` (which the kernel does not apply
      to uid 0: see ``probe()``). Reaching it kills the run (``killed="process limit"``).
    - ``cpu_s``: CPU seconds per process (``RLIMIT_CPU``; SIGXCPU, then SIGKILL 5 s later);
      ``None`` here means twice the run's timeout (two cores' worth over the run).
    - ``address_space_bytes``: virtual memory per process (``RLIMIT_AS``): an allocation past it
      fails (``MemoryError``, ``malloc`` returns NULL).
    - ``file_size_bytes``: largest file a process may write (``RLIMIT_FSIZE``; SIGXFSZ/EFBIG).
    - ``open_files``: file descriptors per process (``RLIMIT_NOFILE``).
    - ``output_bytes``: stdout+stderr bytes kept; past it the run is killed
      (``killed="output limit"``).
    - ``tmpfs_bytes``: size of each private tmpfs (``/tmp``, ``$HOME``, ``/dev/shm``, ``/run``).
    """

    processes: int | None = 256
    cpu_s: int | None = None
    address_space_bytes: int | None = 8 * GiB
    file_size_bytes: int | None = 2 * GiB
    open_files: int | None = 4096
    output_bytes: int | None = 8 * MiB
    tmpfs_bytes: int = 1 * GiB

    def cpu_seconds(self, timeout_s: float) -> int | None:
        """The CPU limit for a run of ``timeout_s`` seconds (``None``: no limit)."""
        if self.cpu_s is not None:
            return max(1, int(self.cpu_s))
        if not math.isfinite(timeout_s):
            return None
        return max(1, math.ceil(2 * timeout_s))


# -- environment ---------------------------------------------------------------------------------

#: host variables passed into the sandbox by name
ENV_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "VIRTUAL_ENV", "USER", "LOGNAME",
                       "COLUMNS", "LINES", "NO_COLOR"})
#: host variables passed by prefix
ENV_PREFIXES = ("LC_", "PYTHON", "PIP_")
#: never passed from the host (paths into the host's own Python set-up); a caller may set them
ENV_DENY = frozenset({"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                      "PYTHONPYCACHEPREFIX", "PYTHONBREAKPOINT", "PYTHONEXECUTABLE"})
#: passed only with ``net="host"`` (pip behind a proxy during an install step)
ENV_PROXY = frozenset({"http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY",
                       "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"})
#: a URL with a user-info part carries a credential: such a host value is never passed
_CREDENTIAL_URL = re.compile(r"://[^/\s@]*@")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_home() -> Path:
    """The caller's home directory (``$HOME``, else the password database), resolved."""
    home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    return Path(home).resolve()


def build_env(extra: Mapping[str, str] | None, *, home: Path, net: str,
              host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The sandbox's environment: the allow-listed host variables (``ENV_NAMES``,
    ``ENV_PREFIXES`` minus ``ENV_DENY``; proxies only for ``net="host"``; never a value holding a
    URL credential), ``HOME`` set to the (empty) home, defaults for ``PATH``/``LANG``/``TERM``,
    then the caller's ``extra`` as given (trusted: the task env's variables)."""
    src = os.environ if host_env is None else host_env
    env: dict[str, str] = {}
    for key, value in src.items():
        allowed = key in ENV_NAMES or (key.startswith(ENV_PREFIXES) and key not in ENV_DENY)
        if net == "host" and key in ENV_PROXY:
            allowed = True
        if allowed and not _CREDENTIAL_URL.search(value):
            env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("LANG", "C.UTF-8")
    env.setdefault("TERM", "dumb")
    env["HOME"] = str(home)
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


# -- mounts --------------------------------------------------------------------------------------

#: files readable by uid 0 that hold host secrets: masked with /dev/null inside (globs)
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
                "/etc/ssh/ssh_host_*_key", "/etc/sudoers", "/etc/sudoers.d/*")
#: toolchains under $HOME made visible read-only (interpreters, no credentials)
HOME_TOOLCHAINS = (".pyenv",)


@dataclass(frozen=True)
class Mount:
    """One mount of the plan. ``kind``: ``"ro"`` / ``"rw"`` (bind ``src`` at ``dest``),
    ``"tmpfs"`` (empty, ``size`` bytes, ``mode``), ``"mask"`` (``/dev/null`` over a file)."""

    kind: str
    dest: str
    src: str | None = None
    size: int | None = None
    mode: int = 0o755


_ORDER = {"tmpfs": 0, "ro": 1, "rw": 2, "readonly": 3, "mask": 4}


def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


def _real(path: Path | str) -> str:
    return str(Path(path).resolve())


#: the trees a sandbox hides besides the home directory (each an empty private tmpfs): ``/root``
#: for root only, ``/var/run`` where it is a folder of its own (not the usual link to ``/run``)
HIDDEN_ROOTS = ("/tmp", "/run", "/dev/shm", "/var/run", "/root")


def plan_mounts(workspace: Path, *, writable: Sequence[Path] = (), readable: Sequence[Path] = (),
                readonly: Sequence[Path] = (), home: Path, limits: Limits, net: str,
                euid: int | None = None) -> list[Mount]:
    """The mounts over the read-only ``/`` for a sandbox around ``workspace`` (see the module
    docstring), in the order they must be applied. Paths that do not exist are left out, except
    the workspace and ``writable`` ones, which raise ``FileNotFoundError``."""
    euid = os.geteuid() if euid is None else euid
    size = limits.tmpfs_bytes
    items: list[tuple[str, Mount]] = []
    hidden = {h for h in HIDDEN_ROOTS if (h != "/root" or euid == 0)
              and (h != "/var/run" or (os.path.isdir(h) and not os.path.islink(h)))} | {_real(home)}
    hidden.discard("/")
    for d in sorted(h for h in hidden if h in ("/tmp", "/dev/shm") or os.path.isdir(h)):
        items.append(("tmpfs", Mount("tmpfs", d, size=size, mode=0o1777 if d in (
            "/tmp", "/dev/shm") else 0o755)))
    homes = [home] + ([Path("/root")] if euid == 0 else [])
    extra_ro = [h / t for h in homes for t in HOME_TOOLCHAINS]
    if net == "host":  # DNS through a resolver socket directory under /run (systemd-resolved)
        resolv = Path("/etc/resolv.conf")
        if resolv.is_symlink():
            extra_ro.append(resolv.resolve().parent)
    for p in [*extra_ro, *readable]:
        if Path(p).exists():
            rp = _real(p)
            items.append(("ro", Mount("ro", rp, src=rp)))
    for p in [workspace, *writable]:
        if not Path(p).exists():
            raise FileNotFoundError(f"sandbox: writable path {p} does not exist")
        rp = _real(p)
        if rp == "/":
            raise ValueError("sandbox: / cannot be a writable tree")
        items.append(("rw", Mount("rw", rp, src=rp)))
    for p in readonly:
        if Path(p).exists():
            rp = _real(p)
            items.append(("readonly", Mount("ro", rp, src=rp)))
    for pattern in MASKED_FILES:
        for f in sorted(glob.glob(pattern)):
            if os.path.isfile(f) and not os.path.islink(f):
                items.append(("mask", Mount("mask", f, src="/dev/null")))
    items.sort(key=lambda it: (_depth(it[1].dest), _ORDER[it[0]]))
    seen: dict[str, int] = {}
    out: list[Mount] = []
    for _, m in items:  # the same path twice: the later (stronger) entry wins
        if m.dest in seen:
            out[seen[m.dest]] = m
        else:
            seen[m.dest] = len(out)
            out.append(m)
    return out


def visible(path: str, mounts: Sequence[Mount]) -> bool:
    """Whether ``path`` shows its host contents inside a sandbox with ``mounts`` (not under a
    private tmpfs, or bound back in)."""
    p = os.path.normpath(path)
    best: Mount | None = None
    for m in mounts:
        inside = p == m.dest or p.startswith(m.dest.rstrip("/") + "/")
        if inside and (best is None or _depth(m.dest) >= _depth(best.dest)):
            best = m
    return best is None or best.kind != "tmpfs" or best.dest == p


def filter_path(path_var: str, mounts: Sequence[Mount]) -> str:
    """``PATH`` with the entries that are hidden inside the sandbox left out."""
    parts = [p for p in path_var.split(":") if p and os.path.isabs(p) and visible(p, mounts)]
    return ":".join(dict.fromkeys(parts)) or DEFAULT_PATH


def rlimit_kib(n: int) -> int:
    """Bytes → KiB, rounded up (bash ``ulimit -v``/``-f`` units)."""
    return max(1, math.ceil(n / KiB))
