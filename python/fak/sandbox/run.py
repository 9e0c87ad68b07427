"""``Sandbox``: runs a command in the sandbox and says how it ended (``SandboxResult``).

One run: a pids cgroup is made (where available), the launcher (``launch.py``) joins it and sets
the rlimits, bwrap (``bwrap.py``) or the ``unshare`` path (``unshare.py``) makes the namespaces
and mounts; this module reads the merged stdout/stderr, enforces the timeout, the output cap and
the process limit, kills the whole sandbox when one is reached (SIGKILL to the launcher's process
group; the sandbox's PID 1 dies with it, and with PID 1 every process of the namespace), and
names what ended the run.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fak.sandbox.bwrap import bwrap_argv
from fak.sandbox.cgroup import PidsCgroup, find_base
from fak.sandbox.config import Limits, build_env, filter_path, host_home, plan_mounts
from fak.sandbox.detect import probe
from fak.sandbox.errors import SandboxError, SandboxUnavailable
from fak.sandbox.launch import launcher_argv
from fak.sandbox.unshare import unshare_argv

KILL_REASONS = ("timeout", "process limit", "memory limit", "cpu limit", "file size limit",
                "output limit")
_POLL_S = 0.05  # how often the pids cgroup is looked at while a command runs
_TAIL = 4096
_MEMORY = re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|[Oo]ut of memory")
_FSIZE = re.compile(rb"File too large|File size limit exceeded")
_CPU = re.compile(rb"CPU time limit exceeded")
_NPROC = re.compile(rb"Resource temporarily unavailable|Cannot fork|fork: retry")


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} bytes"


@dataclass
class SandboxResult:
    """How one command ended.

    ``returncode``: its exit status (128 + N when it died of signal N), ``None`` when the sandbox
    killed it; ``output``: stdout and stderr interleaved as written, decoded as UTF-8 (invalid
    bytes replaced), at most ``Limits.output_bytes`` bytes; ``killed``: what ended or cut the run,
    one of ``KILL_REASONS`` or ``None``; ``duration_s``: wall seconds; ``output_bytes``: bytes kept;
    ``note``: one line for a person or a model (``"killed: timeout after 60 s"``) or ``None``;
    ``method``: ``"bwrap"``, ``"unshare"`` or ``"host"`` (``run_on_host``)."""

    returncode: int | None
    output: str
    killed: str | None
    duration_s: float
    output_bytes: int = 0
    note: str | None = None
    method: str = "bwrap"

    @property
    def ok(self) -> bool:
        """Exit status 0 and nothing killed or cut."""
        return self.returncode == 0 and self.killed is None


class Sandbox:
    """The one sandbox for everything fak runs on a model's behalf.

    ``workspace``: the only writable tree besides a private ``/tmp`` and ``writable`` (e.g. a task
    env's venv that an install writes into); ``readable``: paths under hidden trees (``$HOME``,
    ``/tmp``) to show read-only (a venv and its interpreter: see ``venv_paths``); ``readonly``:
    paths inside writable trees to make read-only again (the workspace's ``.git``, so that nothing
    the model writes there runs later in fak's own git commands); ``env``: variables added to the
    allow-listed host environment (``config.build_env``); ``timeout_s``: default wall limit per run
    (seconds); ``net``: ``"none"`` (loopback only) or ``"host"`` (the host's network: install steps
    only); ``limits``: ``Limits()`` by default; ``net_setup``: trusted shell commands run as the
    caller (root) in the sandbox's own network namespace before the command (the requests tarpit);
    ``method``: ``"bwrap"`` / ``"unshare"`` (default: what ``probe()`` found,
    ``$FAK_SANDBOX_METHOD`` to force one).

    Raises ``SandboxUnavailable`` when no sandbox can be made here (the message says what is
    missing), ``ValueError`` for a bad ``net``/``net_setup``, ``FileNotFoundError`` when the
    workspace or a writable path does not exist.
    """

    def __init__(self, workspace: Path | str, *, writable: Sequence[Path | str] = (),
                 readable: Sequence[Path | str] = (), readonly: Sequence[Path | str] = (),
                 env: Mapping[str, str] | None = None, timeout_s: float = 60.0, net: str = "none",
                 limits: Limits | None = None, net_setup: Sequence[str] = (),
                 method: str | None = None):
        if net not in ("none", "host"):
            raise ValueError(f"net must be 'none' or 'host', not {net!r}")
        if net_setup and net != "none":
            raise ValueError("net_setup needs net='none' (it prepares the sandbox's own network)")
        info = probe()
        if method is None:
            if not info.ok:
                raise SandboxUnavailable(f"no sandbox can be made here: {info.detail}")
            method = info.method
        elif method not in ("bwrap", "unshare"):
            raise ValueError(f"method must be 'bwrap' or 'unshare', not {method!r}")
        err = info.methods.get(method)
        if err is not None:
            raise SandboxUnavailable(f"the {method} sandbox does not work here: {err}")
        if net_setup and os.geteuid() != 0:
            raise SandboxUnavailable("net_setup (a network set-up inside the sandbox's namespace) "
                                     "needs fak to run as root")
        self.method = method
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise FileNotFoundError(f"sandbox workspace {self.workspace} is not a directory")
        self.net = net
        self.net_setup = tuple(net_setup)
        self.timeout_s = float(timeout_s)
        self.limits = limits or Limits()
        self.home = host_home()
        self.mounts = plan_mounts(self.workspace, writable=[Path(p) for p in writable],
                                  readable=[Path(p) for p in readable],
                                  readonly=[Path(p) for p in readonly], home=self.home,
                                  limits=self.limits, net=net)
        self.env = build_env(env, home=self.home, net=net)
        self.env["PATH"] = filter_path(self.env["PATH"], self.mounts)
        self.cgroup = find_base() is not None

    def argv(self, argv: Sequence[str], *, cwd: Path | str | None = None,
             timeout_s: float | None = None, cgroup_procs: Path | None = None) -> list[str]:
        """The full command line (launcher + bwrap/unshare) that runs ``argv``."""
        cwd_s = str(Path(cwd).resolve()) if cwd is not None else str(self.workspace)
        share_net = self.net == "host" or bool(self.net_setup)
        build = bwrap_argv if self.method == "bwrap" else unshare_argv
        inner = build(self.mounts, list(argv), cwd=cwd_s, share_net=share_net)
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        return launcher_argv(inner, limits=self.limits, timeout_s=timeout,
                             cgroup_procs=cgroup_procs, net_setup=self.net_setup)

    def run(self, argv: Sequence[str], *, cwd: Path | str | None = None,
            stdin: bytes | None = None, timeout_s: float | None = None,
            stdout_path: Path | str | None = None) -> SandboxResult:
        """Run ``argv`` (no shell: pass ``["bash", "-c", CMD]`` for one) in the sandbox, in ``cwd``
        (default: the workspace), with ``stdin`` bytes (default: empty), at most ``timeout_s``
        seconds (default: the sandbox's). ``stdout_path``: also write the output there as it
        comes (a test log). Returns a ``SandboxResult``; never raises for what the command does.
        Raises ``SandboxError`` when the run's pids cgroup cannot be made, ``ValueError`` for an
        empty ``argv``."""
        if not argv:
            raise ValueError("sandbox: empty command")
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        cg = None
        if self.cgroup and self.limits.processes:
            try:
                cg = PidsCgroup.create(self.limits.processes)
            except OSError as e:
                raise SandboxError(f"cannot make the run's pids cgroup: {e}") from None
        try:
            cmd = self.argv(argv, cwd=cwd, timeout_s=timeout,
                            cgroup_procs=cg.procs_file if cg else None)
            return execute(cmd, env=self.env, cwd=str(self.workspace), stdin=stdin,
                           timeout_s=timeout, limits=self.limits, cgroup=cg,
                           stdout_path=stdout_path, method=self.method)
        finally:
            if cg is not None:
                cg.kill()
                cg.remove()


def run_on_host(argv: Sequence[str], *, cwd: Path | str, env: Mapping[str, str],
                timeout_s: float, limits: Limits | None = None, stdin: bytes | None = None,
                stdout_path: Path | str | None = None) -> SandboxResult:
    """``--unsafe-no-sandbox``: run ``argv`` on the host with the caller's privileges (timeout,
    output cap and process-group kill only; no isolation at all)."""
    return execute(list(argv), env=dict(env), cwd=str(cwd), stdin=stdin, timeout_s=timeout_s,
                   limits=limits or Limits(), cgroup=None, stdout_path=stdout_path, method="host")


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def execute(cmd: list[str], *, env: Mapping[str, str], cwd: str, stdin: bytes | None,
            timeout_s: float, limits: Limits, cgroup: PidsCgroup | None,
            stdout_path: Path | str | None, method: str) -> SandboxResult:
    """Start ``cmd`` in a new session, collect its output and end it (see the module docstring)."""
    cap = limits.output_bytes or 0
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    sink = open(stdout_path, "wb") if stdout_path is not None else None  # noqa: SIM115
    buf = bytearray()
    killed: str | None = None
    proc = subprocess.Popen(cmd, env=dict(env), cwd=cwd, start_new_session=True,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    next_check = t0 + _POLL_S
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                killed = "timeout"
                break
            wait = deadline - now
            if cgroup is not None:
                wait = min(wait, max(0.0, next_check - now))
            if sel.select(wait):
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    break  # every process of the sandbox is gone
                if chunk:
                    if cap and len(buf) + len(chunk) > cap:
                        chunk = chunk[: cap - len(buf)]
                        killed = "output limit"
                    buf += chunk
                    if sink is not None:
                        sink.write(chunk)
                    if killed:
                        break
            if cgroup is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + _POLL_S
                if cgroup.limit_hit():
                    killed = "process limit"
                    break
        if killed is not None:
            _kill(proc, cgroup)
            _drain(fd, sel, time.monotonic() + 5.0)
        try:
            rc: int | None = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed = killed or "timeout"
            _kill(proc, cgroup)
            rc = proc.wait()
    finally:
        sel.close()
        proc.stdout.close()
        if sink is not None:
            sink.close()
    duration = time.monotonic() - t0
    if rc is not None and rc < 0:
        rc = 128 - rc
    if killed is not None:  # the sandbox ended it: no exit status of the command's own
        rc = None
    else:
        killed = _infer(rc, bytes(buf[-_TAIL:]), limits, cgroup)
    note = _note(killed, limits, timeout_s)
    return SandboxResult(returncode=rc, output=buf.decode("utf-8", "replace"), killed=killed,
                         duration_s=duration, output_bytes=len(buf), note=note, method=method)


def _kill(proc: subprocess.Popen, cgroup: PidsCgroup | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        cgroup.kill()


def _drain(fd: int, sel: selectors.BaseSelector, until: float) -> None:
    """Read (and drop) what is left in the pipe until EOF or ``until``."""
    while time.monotonic() < until:
        if sel.select(max(0.0, until - time.monotonic())):
            try:
                if os.read(fd, 1 << 16) == b"":
                    return
            except BlockingIOError:
                continue
            except OSError:
                return


def _infer(rc: int | None, tail: bytes, limits: Limits, cgroup: PidsCgroup | None) -> str | None:
    """The limit a command that ended by itself ran into, from its status and last output."""
    if cgroup is not None and cgroup.limit_hit():
        return "process limit"
    if rc in (None, 0):
        return None
    if rc == 128 + signal.SIGXCPU or _CPU.search(tail):
        return "cpu limit"
    if limits.file_size_bytes and (rc == 128 + signal.SIGXFSZ or _FSIZE.search(tail)):
        return "file size limit"
    lines = b"\n".join(tail.strip().splitlines()[-5:])
    if limits.address_space_bytes and _MEMORY.search(lines):
        return "memory limit"
    if cgroup is None and limits.processes and _NPROC.search(tail):
        return "process limit"
    return None


def _note(killed: str | None, limits: Limits, timeout_s: float) -> str | None:
    if killed is None:
        return None
    if killed == "timeout":
        return f"killed: timeout after {timeout_s:g} s"
    if killed == "output limit":
        return f"killed: output cut at {limits.output_bytes} bytes"
    if killed == "process limit":
        return f"killed: process limit ({limits.processes} processes)"
    if killed == "memory limit":
        return f"killed: memory limit (address space {_size(limits.address_space_bytes or 0)})"
    if killed == "cpu limit":
        return f"killed: cpu limit ({limits.cpu_seconds(timeout_s)} s of CPU time)"
    if killed == "file size limit":
        return f"killed: file size limit ({_size(limits.file_size_bytes or 0)} per file)"
    return f"killed: {killed}"
