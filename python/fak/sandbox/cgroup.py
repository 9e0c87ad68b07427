"""A pids cgroup per sandbox run: the process limit that also holds for uid 0.

``RLIMIT_NPROC`` is not enforced for root (the kernel exempts the init user), so where fak runs as
root the process limit is a cgroup's ``pids.max``: cgroup v2 when the pids controller is already
delegated to fak's own cgroup (fak never changes a parent's ``subtree_control``), else the v1
``pids`` hierarchy. The run's cgroup is a child of fak's own (so every limit above still applies),
named ``fak-sandbox-<pid>-<n>``; the sandbox's first process joins it before anything forks
(``echo $$ > cgroup.procs`` in the launcher), and ``pids.events`` says whether the limit was hit.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_counter = itertools.count()
_lock = threading.Lock()
_base: tuple[Path, int] | None | bool = False  # False: not looked up yet


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of this process's mount namespace."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) >= 5 and len(rfields) >= 3:
            out.append((fields[4], rfields[0], rfields[2]))
    return out


def _own_cgroups() -> dict[str, str]:
    """Controller (``""`` for v2) → this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    except (OSError, ValueError):
        pass
    return out


def _usable(parent: Path) -> bool:
    """A child cgroup with ``pids.max`` can be made (and removed) under ``parent``."""
    probe = parent / f"fak-sandbox-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "pids.max").exists()
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def find_base() -> tuple[Path, int] | None:
    """(the cgroup under which run cgroups are made, cgroup version) or ``None`` when no pids
    cgroup can be made here. Looked up once per process."""
    global _base
    with _lock:
        if _base is not False:
            return _base  # type: ignore[return-value]
        own = _own_cgroups()
        found: tuple[Path, int] | None = None
        for mnt, fstype, opts in _mounts():
            if fstype == "cgroup2" and "" in own:
                d = Path(mnt + own[""]).resolve()
                try:
                    ctl = (d / "cgroup.subtree_control").read_text().split()
                except OSError:
                    continue
                if "pids" in ctl and _usable(d):
                    found = (d, 2)
                    break
        if found is None:
            for mnt, fstype, opts in _mounts():
                if fstype == "cgroup" and "pids" in opts.split(",") and "pids" in own:
                    d = Path(mnt + own["pids"]).resolve()
                    if _usable(d):
                        found = (d, 1)
                        break
        if found is not None:
            _remove_stale(found[0])
        _base = found
        return found


def _remove_stale(base: Path) -> None:
    """Remove run cgroups left by fak processes that are gone (empty ones only)."""
    for d in base.glob("fak-sandbox-*-*"):
        try:
            pid = int(d.name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            try:
                d.rmdir()
            except OSError:
                pass


@dataclass
class PidsCgroup:
    """One run's pids cgroup at ``path`` (cgroup ``version`` 1 or 2) with ``pids.max = limit``."""

    path: Path
    version: int
    limit: int

    @classmethod
    def create(cls, limit: int) -> PidsCgroup | None:
        """A new run cgroup, or ``None`` when pids cgroups are not available here. Raises
        ``OSError`` when one is available but cannot be made now."""
        base = find_base()
        if base is None:
            return None
        path = base[0] / f"fak-sandbox-{os.getpid()}-{next(_counter)}"
        path.mkdir()
        try:
            (path / "pids.max").write_text(f"{int(limit)}\n")
        except OSError:
            path.rmdir()
            raise
        return cls(path, base[1], int(limit))

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def limit_hit(self) -> bool:
        """Whether a fork in the cgroup failed on ``pids.max`` (``pids.events`` ``max`` > 0)."""
        try:
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value) > 0
        except (OSError, ValueError):
            pass
        return False

    def kill(self) -> None:
        """SIGKILL every process in the cgroup where the kernel can do it atomically
        (v2 ``cgroup.kill``); with v1 the PID namespace's end does it."""
        if self.version == 2:
            try:
                (self.path / "cgroup.kill").write_text("1\n")
            except OSError:
                pass

    def remove(self, wait_s: float = 5.0) -> None:
        """Remove the cgroup once its processes are gone (waits up to ``wait_s`` seconds)."""
        deadline = time.monotonic() + wait_s
        delay = 0.002
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # left for _remove_stale of a later fak process
                time.sleep(delay)
                delay = min(0.1, delay * 2)
