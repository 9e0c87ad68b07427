"""Named semantic checks over an analyzed shell command (the ``"check"`` rules of a policy).

Each check reads the simple commands :func:`fak.policy.shell.analyze` found and returns ``None``
(nothing found) or a short description of the offending command, which the verdict's reason
quotes. Checks fail closed: a word whose value is only known at run time counts as the worst case
(``rm $x`` may be ``rm -rf /``), and so does a relative path when the directory is unknown.
The table of checks and what each denies is in ``docs/policy.md``; the functions are in
:mod:`~fak.policy.checks.files` (deleting, writing, git hooks, credentials),
:mod:`~fak.policy.checks.programs` (pipes into interpreters, git push, run-time commands,
inline code, pip), :mod:`~fak.policy.checks.processes` (other processes, fork bombs) and
:mod:`~fak.policy.checks.environment` (environment dumps).

Checks that take paths (``uses_paths``) accept ``extra_roots``: absolute directories treated like
the workspace (``/tmp`` for scratch files, say).
"""

from __future__ import annotations

from fak.policy.checks.base import Check, CheckFn
from fak.policy.checks.environment import environment_dump
from fak.policy.checks.files import (credential_files, git_hooks, rm_outside_workspace,
                                     rm_recursive_force, write_outside_workspace)
from fak.policy.checks.processes import fork_bomb, other_processes
from fak.policy.checks.programs import (dynamic_command, git_push, inline_code,
                                        pip_install_remote, pipe_to_interpreter)

CHECKS: dict[str, Check] = {c.name: c for c in (
    Check("rm_recursive_force", rm_recursive_force,
          "rm with both recursive and force flags, in any spelling", False),
    Check("rm_outside_workspace", rm_outside_workspace,
          "deleting paths outside the workspace (or the workspace root itself)", True),
    Check("write_outside_workspace", write_outside_workspace,
          "writing files outside the workspace (redirections, cp/mv/tee/tar/sed w/...)", True),
    Check("pipe_to_interpreter", pipe_to_interpreter,
          "a shell or interpreter reading its program from a pipe or descriptor", False),
    Check("git_push", git_push, "git push behind any options or aliases", False),
    Check("dynamic_command", dynamic_command,
          "a command whose name or program is only known at run time", False),
    Check("pip_install_remote", pip_install_remote,
          "pip install of anything but local paths", False),
    Check("inline_code", inline_code,
          "inline programs of languages the policy does not read (python -c, perl -e, ...)",
          False),
    Check("other_processes", other_processes,
          "signalling or changing processes the command did not start (kill -1, pkill, ...)",
          False),
    Check("fork_bomb", fork_bomb, "a shell function that starts itself concurrently", False),
    Check("environment_dump", environment_dump,
          "printing the environment (env, printenv, export -p, set, ps e, awk ENVIRON)", False),
    Check("credential_files", credential_files,
          "naming credential files or other processes' environments", True),
    Check("git_hooks", git_hooks,
          "writing git metadata: .git (hooks, config, ...) or a nested repository's .git", True),
)}

__all__ = ["CHECKS", "Check", "CheckFn"]
