"""The OpenAI tool-call protocol: the request carries ``tools``; the model answers with
``tool_calls``; each result goes back as a ``role: tool`` message with its ``tool_call_id``.

Small models sometimes print the call instead of emitting it (Qwen2.5's
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the content when the server did not
parse it): such calls are accepted too, and their results go back as user messages, since there is
no tool_call id to answer.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from fak.agent.exceptions import FormatError
from fak.agent.prompts import render
from fak.agent.protocols.base import Action, AgentProtocol
from fak.agent.tools import tool_schemas

_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def _arguments(raw: Any, name: str) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise FormatError(f"the arguments of {name} are not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise FormatError(f"the arguments of {name} must be a JSON object")
    return value


class ToolCallProtocol(AgentProtocol):
    """Structured tool calls (OpenAI ``tools`` / ``tool_calls``)."""

    name = "tools"

    def tools(self) -> list[dict] | None:
        return tool_schemas(self.allow_exec)

    def parse(self, message: dict[str, Any]) -> list[Action]:
        calls = message.get("tool_calls") or []
        actions: list[Action] = []
        for call in calls:
            fn = call.get("function") or {}
            name = fn.get("name")
            if not name:
                raise FormatError("a tool call has no function name")
            actions.append(Action(id=call.get("id") or f"call_{uuid.uuid4().hex[:12]}",
                                  name=name, arguments=_arguments(fn.get("arguments"), name)))
        if actions:
            return actions
        content = message.get("content") or ""
        for m in _TOOL_CALL_TAG.finditer(content):
            try:
                obj = json.loads(m.group(1))
            except ValueError:
                raise FormatError("the <tool_call> block is not valid JSON") from None
            if not isinstance(obj, dict) or not obj.get("name"):
                raise FormatError("the <tool_call> block needs a name")
            actions.append(Action(id=f"text_{uuid.uuid4().hex[:12]}", name=str(obj["name"]),
                                  arguments=_arguments(obj.get("arguments"), str(obj["name"]))))
        if not actions:
            raise FormatError("")
        return actions

    def observation(self, action: Action, output: str, returncode: int | None,
                    steps_left: int | None) -> dict[str, Any]:
        text = render("observation_tools.j2", output=output, steps_left=steps_left)
        if returncode is not None:
            text = f"[exit code {returncode}]\n{text}"
        if action.id.startswith("text_"):
            return {"role": "user", "content": f"Result of {action.name}:\n{text}"}
        return {"role": "tool", "tool_call_id": action.id, "content": text}

    def format_error(self, error: str) -> dict[str, Any]:
        return {"role": "user", "content": render("format_error_tools.j2", error=error,
                                                  tools=self.tool_names)}
