"""The plain text protocol (as mini-swe-agent): each reply holds one ```bash block, whose command
runs in the workspace; a block holding only ``submit`` ends the run. The gateway is told with
``X-Fak-Text-Tools: bash`` so that its policy adjudicates the block as a ``bash`` call.

Blocks are found by the gateway's own parser (``fak.toolcalls.shell_blocks``), so each block's
span in the content is the ``span`` of the gateway's ``block:N`` verdict about it; closed blocks
fenced ``bash``, ``sh`` or ``shell`` (any case) are run. Small models often write their whole plan
as several blocks in one reply; every block is parsed (in order) and the agent runs the first one only (``AgentConfig.max_actions_per_step``), keeps the
reply up to the end of that block in the history, and says so in the observation.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fak.agent.exceptions import FormatError
from fak.agent.prompts import render
from fak.agent.protocols.base import Action, AgentProtocol
from fak.toolcalls import bash_command, fence_language, shell_blocks

SUBMIT_COMMAND = "submit"
#: the fence languages whose blocks the agent runs (the gateway adjudicates more: zsh, console)
RUN_LANGUAGES = frozenset({"bash", "sh", "shell"})


class TextProtocol(AgentProtocol):
    """One shell command per turn in a fenced ```bash block. Needs ``allow_exec``."""

    name = "text"

    def __init__(self, *, allow_exec: bool):
        if not allow_exec:
            raise ValueError("the text protocol runs shell commands: it needs --allow-exec")
        super().__init__(allow_exec=allow_exec)

    def headers(self) -> dict[str, str]:
        return {"X-Fak-Text-Tools": "bash"}

    @staticmethod
    def history_message(message: dict[str, Any]) -> dict[str, Any]:
        """Only the text: in this protocol the conversation carries no tool_calls."""
        return {"role": "assistant", "content": message.get("content") or ""}

    def parse(self, message: dict[str, Any]) -> list[Action]:
        content = message.get("content") or ""
        # the blocks as the gateway finds them (fak.toolcalls.shell_blocks), so each one's span
        # is the span of the gateway's verdict about it
        blocks = [b for b in shell_blocks(content) if b.block.closed and fence_language(b.block) in RUN_LANGUAGES]
        if blocks:
            actions = [self._action(bash_command(b.block), b.block.raw, (b.start, b.end)) for b in blocks
                       if bash_command(b.block)]
            if not actions:
                raise FormatError("the ```bash block is empty")
            return actions
        # a gateway that parsed the block into a structured bash call
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            if fn.get("name") == "bash":
                try:
                    command = str(json.loads(fn.get("arguments") or "{}").get("command", ""))
                except (ValueError, AttributeError):
                    command = ""
                if command.strip():
                    action = self._action(command.strip(), "")
                    action.call_ref = call.get("id")
                    return [action]
        if not content.strip():
            raise FormatError("the reply was empty")
        raise FormatError("no ```bash block found")

    @staticmethod
    def _action(command: str, source: str, span: tuple[int, int] | None = None) -> Action:
        action_id = f"text_{uuid.uuid4().hex[:12]}"
        if command == SUBMIT_COMMAND:
            return Action(id=action_id, name="submit", arguments={}, source=source,
                          policy_name="bash", policy_arguments={"command": command}, span=span)
        return Action(id=action_id, name="bash", arguments={"command": command}, source=source, span=span)

    def trim_history(self, message: dict[str, Any], keep: list[Action]) -> dict[str, Any]:
        sources = [a.source for a in keep if a.source]
        content = message.get("content") or ""
        if not sources or sources[-1] not in content:
            return message
        return {**message, "content": content[: content.index(sources[-1]) + len(sources[-1])]}

    def observation(self, action: Action, output: str, returncode: int | None,
                    steps_left: int | None) -> dict[str, Any]:
        rc = returncode if returncode is not None else "none"
        return {"role": "user", "content": render("observation_text.j2", output=output,
                                                  returncode=rc, steps_left=steps_left)}

    def format_error(self, error: str) -> dict[str, Any]:
        return {"role": "user", "content": render("format_error_text.j2",
                                                  **self.variables(error=error))}
