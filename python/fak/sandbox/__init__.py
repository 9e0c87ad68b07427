"""The one sandbox for everything fak executes on a model's behalf: the agent's ``bash``, the
scripts and tests a model writes, the task test suites of ``eval --local``.

The workspace is the only writable tree (plus a private ``/tmp`` and the paths a caller names);
every other path is read-only; ``$HOME`` is an empty tmpfs; the command runs in its own user,
mount, PID, IPC, UTS and network namespaces (loopback only) with no capabilities, under rlimits
and a pids cgroup, with an allow-listed environment; the timeout kills the whole PID namespace.
Built with bubblewrap, or the same namespaces through ``unshare`` where bwrap is missing.
See ``docs/sandbox.md``.

    from fak.sandbox import Sandbox
    res = Sandbox(workspace).run(["bash", "-c", "pytest -x"], timeout_s=600)
    res.returncode, res.output, res.killed, res.note
"""

from fak.sandbox.config import GiB, Limits, MiB
from fak.sandbox.detect import SandboxInfo, probe
from fak.sandbox.errors import SandboxError, SandboxUnavailable
from fak.sandbox.run import KILL_REASONS, Sandbox, SandboxResult, run_on_host
from fak.sandbox.venv import interpreter_paths, venv_paths

__all__ = ["Sandbox", "SandboxResult", "SandboxInfo", "SandboxError", "SandboxUnavailable",
           "Limits", "KILL_REASONS", "probe", "run_on_host", "venv_paths",
           "interpreter_paths", "GiB", "MiB"]
