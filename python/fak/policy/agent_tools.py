"""Which tools of the agents fak serves only read, and where their shell tools hold the command.

One table for the gateway's judgements about other agents' tools (``fak.gateway.inline_reads``
asks it whether a call only reads): fak's own agent (``read``, ``list``, ``search``, ``bash``),
Claude Code (``Read``, ``Grep``, ``Glob``, ``LS``, ``Bash``), Codex (``shell`` with an argv or
command lines, ``local_shell``, ``exec_command``), Qwen Code (``read_file``, ``read_many_files``,
``list_directory``, ``glob``, ``search_file_content``, ``grep_search``, ``run_shell_command``) and
mini-swe-agent (``bash``). The shipped policies (``examples/policies/``) name the same tools.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

__all__ = ["READ_TOOLS", "SHELL_TOOLS", "shell_command"]

#: Tools that only read files (their result changes only when something writes).
READ_TOOLS = frozenset({
    "read", "list", "search",                                        # fak's agent
    "Read", "Grep", "Glob", "LS",                                    # Claude Code
    "read_file", "read_many_files", "list_directory", "glob",        # Qwen Code
    "search_file_content", "grep_search",
})
#: Shell tools: name → (argument holding the command, how it is held: "line", "argv" or "lines").
SHELL_TOOLS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "bash": (("command", "line"),),
    "Bash": (("command", "line"),),
    "run_shell_command": (("command", "line"),),
    "exec_command": (("cmd", "line"),),
    "shell": (("command", "argv"), ("commands", "lines")),
    "local_shell": (("command", "argv"),),
}


_SHELLS = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/usr/bin/bash", "/bin/zsh"})


def shell_command(name: str, arguments: Mapping[str, Any]) -> str | None:
    """The command line a shell tool call runs (an argv joined as the shell quotes it, command
    lines joined by newlines); ``None`` for another tool or arguments without one. Codex's usual
    argv ``["bash", "-lc", SCRIPT]`` is its ``SCRIPT``."""
    for argument, how in SHELL_TOOLS.get(name, ()):
        value = arguments.get(argument)
        if how == "line" and isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            if how == "argv" and len(value) == 3 and value[0] in _SHELLS and value[1] in ("-c", "-lc", "-cl"):
                return value[2]
            return shlex.join(value) if how == "argv" else "\n".join(value)
    return None
