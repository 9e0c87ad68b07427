"""The one place the pipeline runs a program: model-written scripts and task test suites.

``run_in_sandbox`` uses fak's sandbox (``fak.sandbox.Sandbox``: the workspace the only writable
tree, the rest read-only, an empty ``$HOME``, own PID namespace, limits, no network but loopback)
when it is importable; until then it falls back to what the agent's bash tool does
(``fak.agent.tools``): ``unshare -n`` with loopback up, a new session killed as a group on
timeout. Either way the command's environment is only what the caller passes (plus a minimal
``PATH``/``LANG``), never the host's.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fak.agent.tools import truncate_middle

BASE_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "PAGER": "cat",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PIP_NO_INPUT": "1"}


@dataclass
class RunResult:
    """``returncode`` (``None`` when killed), ``output`` (stdout and stderr together, cut to
    ``max_output_chars``), ``killed`` (timeout or limit), ``duration_s`` (seconds)."""

    returncode: int | None
    output: str
    killed: bool
    duration_s: float


def sandbox_kind() -> str:
    """``"fak.sandbox"`` when the sandbox is importable, else ``"unshare"``."""
    try:
        from fak.sandbox import Sandbox  # noqa: F401
    except ImportError:
        return "unshare"
    return "fak.sandbox"


def run_in_sandbox(argv: list[str], *, workspace: Path, env: dict[str, str] | None = None,
                   cwd: Path | None = None, timeout_s: float = 120.0, pre: list[str] | None = None,
                   unsafe_network: bool = False, max_output_chars: int = 200_000) -> RunResult:
    """Run ``argv`` in ``workspace`` (or ``cwd`` inside it) with no network.

    ``env``: the whole environment of the command (merged over ``BASE_ENV``). ``pre``: shell
    lines run first in the same namespace (e.g. ``local.NETNS_SETUP``'s tarpit; failures are
    ignored). ``unsafe_network`` (fallback only): no ``unshare -n``.
    """
    full_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **BASE_ENV, **(env or {})}
    lines = ["ip link set lo up 2>/dev/null || true",
             *[f"{{ {p} ; }} >/dev/null 2>&1 || true" for p in (pre or [])],
             "exec " + shlex.join(argv)]
    script = "\n".join(lines)
    workdir = Path(cwd or workspace)
    t0 = time.perf_counter()
    try:
        from fak.sandbox import Sandbox
    except ImportError:
        Sandbox = None
    if Sandbox is not None:
        box = Sandbox(workspace, writable=(), env=full_env, timeout_s=timeout_s, net="none")
        res = box.run(["bash", "-c", script], cwd=workdir)
        return RunResult(res.returncode, truncate_middle(res.output, max_output_chars),
                         bool(res.killed), float(res.duration_s))
    prefix = [] if unsafe_network else ["unshare", "-n"]
    proc = subprocess.Popen([*prefix, "bash", "-c", script], cwd=workdir, env=full_env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    killed = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        killed = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
    text = out.decode("utf-8", "replace")
    if killed:
        text += f"\n[killed after {timeout_s:g} s timeout]"
    return RunResult(None if killed else proc.returncode, truncate_middle(text, max_output_chars),
                     killed, time.perf_counter() - t0)
