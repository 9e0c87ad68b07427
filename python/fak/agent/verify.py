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

import shlex
from typing import Any

#: characters that make a command more than one plain program run
_SHELL_META = set(";&|<>$`\n\\(){}*?[]~!#")
_PYTHONS = {"python", "python3"}
#: most characters of the script's output shown with the edit (the middle is cut)
OUTPUT_CHARS = 1500


def _norm(path: str) -> str:
    p = path.strip()
    while p.startswith("./"):
        p = p[2:]
    return p


def script_of(command: str) -> str | None:
    """The ``.py`` file a plain ``python [OPTIONS] FILE.py [ARGS]`` command runs, else ``None``
    (``-c``/``-m``, anything with shell syntax, another program)."""
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
        return _norm(w) if w.endswith(".py") else None
    return None


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
            self.written.add(_norm(str(arguments.get("path") or "")))
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
        if _norm(str(arguments.get("path") or "")) == self.script:
            return None
        return self.command
