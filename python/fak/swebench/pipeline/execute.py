"""The one place the pipeline runs a program: model-written scripts and task test suites.

``run_in_sandbox`` runs it in fak's sandbox (``fak.sandbox.Sandbox``: the workspace the only
writable tree, its ``.git`` read-only again (nothing a script writes there is read by fak's own
git, ``fak.gitsafe``, and none of it can be planted for later), the rest read-only, an empty ``$HOME``, its own PID namespace, limits, no network
but loopback); ``net_setup`` lines (the requests tarpit of ``fak.swebench.local.NETNS_SETUP``) run
first inside the sandbox's network namespace. Only ``unsafe_no_sandbox`` (the
``--unsafe-no-sandbox`` flag) runs it on the host instead. The command's environment is what the
caller passes over a minimal ``PATH``/``LANG``, plus the sandbox's allow-listed variables; never
the host's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fak.agent.tools import truncate_middle
from fak.sandbox import Sandbox, probe, run_on_host

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


def sandbox_kind(unsafe_no_sandbox: bool = False) -> str:
    """What runs the pipeline's commands: ``"host (unsafe)"`` or the sandbox's method
    (``"bwrap"`` / ``"unshare"``; ``"unavailable"`` when it cannot be made here)."""
    if unsafe_no_sandbox:
        return "host (unsafe)"
    info = probe()
    return info.method if info.ok and info.method else "unavailable"


def run_in_sandbox(argv: list[str], *, workspace: Path, env: dict[str, str] | None = None,
                   cwd: Path | None = None, timeout_s: float = 120.0,
                   net_setup: Sequence[str] = (), readable: Sequence[Path] = (),
                   unsafe_no_sandbox: bool = False, max_output_chars: int = 200_000) -> RunResult:
    """Run ``argv`` in ``workspace`` (or ``cwd`` inside it) with no network.

    ``env``: variables of the command (merged over ``BASE_ENV``); ``readable``: paths outside
    the workspace it must see (a task venv under the hidden ``$HOME``); ``timeout_s`` in seconds.
    Raises ``fak.sandbox.SandboxUnavailable`` when no sandbox can be made here.
    """
    full_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **BASE_ENV, **(env or {})}
    workdir = Path(cwd or workspace)
    if unsafe_no_sandbox:
        res = run_on_host(list(argv), cwd=workdir, env=full_env, timeout_s=timeout_s)
    else:
        git_dir = Path(workspace) / ".git"
        box = Sandbox(workspace, readable=readable, env=full_env, timeout_s=timeout_s, net="none",
                      net_setup=net_setup, readonly=[git_dir] if git_dir.is_dir() else [])
        res = box.run(list(argv), cwd=workdir)
    text = res.output + (f"\n[{res.note}]" if res.killed and res.note else "")
    return RunResult(res.returncode, truncate_middle(text, max_output_chars), bool(res.killed),
                     float(res.duration_s))
