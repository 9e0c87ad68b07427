"""Verify on edit: after each edit of the repository's code, the agent loop runs the model's own
reproduction script again and shows its output with the edit's result (issue 31: verifying after
each edit, not only when the model remembers to, lifts weak models' resolve rates).

Which script: the last one the model created with ``write`` in this run and then ran with
``bash`` as a plain ``python SCRIPT.py`` command (options before the script allowed; no pipes,
redirections, ``;``, ``&&``, substitutions or a second line: only a command the model wrote and
the policy allowed, run again exactly as it was, in the same sandbox). An edit of the script
itself does not run it. Nothing runs before the model has run its script once.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from fak.agent.tools import normalize_arguments

#: characters that make a command more than one plain program run
_SHELL_META = set(";&|<>$`\n\\(){}*?[]~!#")
_PYTHONS = {"python", "python3"}
#: most characters of the script's output shown with the edit (the middle is cut)
OUTPUT_CHARS = 1500


def script_of(command: str) -> str | None:
    """The ``.py`` file a plain ``python [OPTIONS] FILE.py [ARGS]`` command runs (its path
    normalized as the tools' ``path`` arguments are), else ``None`` (``-c``/``-m``, anything with
    shell syntax, another program)."""
    if not command or any(c in _SHELL_META for c in command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or words[0].rsplit("/", 1)[-1] not in _PYTHONS:
        return None
    for w in words[1:]:
        if w in ("-c", "-m"):
            return None
        if w.startswith("-"):
            continue
        return os.path.normpath(w) if w.endswith(".py") else None
    return None


def _path(name: str, arguments: dict[str, Any]) -> str:
    """The call's ``path`` as ``normalize_arguments`` gives it (``.`` for the root or none)."""
    return str(normalize_arguments(name, arguments).get("path", "."))


class EditVerifier:
    """Tracks the model's scripts and says which command to run again after an edit."""

    def __init__(self) -> None:
        self.written: set[str] = set()
        self.command: str | None = None
        self.script: str | None = None

    def observe(self, name: str, arguments: dict[str, Any], ok: bool | None) -> None:
        """After a tool call that ran (and that the policy allowed): remember scripts the model
        wrote and the last plain run of one of them."""
        if name == "write" and ok:
            self.written.add(_path(name, arguments))
        elif name == "bash":
            command = str(arguments.get("command") or "").strip()
            script = script_of(command)
            if script is not None and script in self.written:
                self.command, self.script = command, script

    def after_edit(self, name: str, arguments: dict[str, Any], ok: bool | None) -> str | None:
        """The command to run again after this call: a successful ``edit`` of a file other than
        the script, once a script has run; else ``None``."""
        if name != "edit" or not ok or self.command is None:
            return None
        if _path(name, arguments) == self.script:
            return None
        return self.command
