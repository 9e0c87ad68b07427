"""The OpenAI tool-call protocol: the request carries ``tools``; the model answers with
``tool_calls``; each result goes back as a ``role: tool`` message with its ``tool_call_id``.

For small models the request asks for a call every turn (``tool_choice: "required"``; fak's
gateway then pre-fills the assistant turn with ``<tool_call>``, so Qwen2.5 cannot drift into
prose) and stops at ``</tool_call>`` (one call per turn, no runaway repeats). ``tool_choice`` can
be ``"auto"`` instead (the model may then write text before its call).

Small models sometimes print the call instead of emitting it, or the server cannot parse it (a
reply cut by ``max_tokens``): a ``<tool_call>{"name": ..., "arguments": {...}}`` block (closed or
not) or a reply that starts with such a bare JSON object naming a tool is accepted too, and its
result goes back as a user message, since there is no tool_call id to answer.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from fak.agent.exceptions import FormatError
from fak.agent.prompts import render
from fak.agent.protocols.base import Action, AgentProtocol
from fak.agent.tools import TOOL_NAMES, tool_schemas

_TOOL_CALL_OPEN = "<tool_call>"
_TOOL_CALL_CLOSE = "</tool_call>"
_JSON_FENCE = re.compile(r"^```(?:json)?[ \t]*\n")
TOOL_CHOICES = ("required", "auto")


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


def _decode_call(text: str, start: int) -> tuple[dict[str, Any], int]:
    """The JSON object starting at ``text[start:]`` (after blanks) and where it ends.

    Raises ``FormatError`` naming the JSON error or what the object lacks."""
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    try:
        obj, end = json.JSONDecoder().raw_decode(text, start)
    except ValueError as e:
        raise FormatError(f"the tool call is not valid JSON ({e}); write it as "
                          '{"name": TOOL, "arguments": {...}}') from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise FormatError('the tool call needs a "name" (and "arguments", a JSON object)')
    return obj, end


def calls_in_text(content: str) -> list[Action]:
    """Tool calls written in ``content``: every ``<tool_call>`` block (its JSON object; the
    closing tag is optional), else a reply that starts with a bare ``{"name": TOOL, ...}`` object
    (optionally in a ```json fence) naming one of fak's tools. Raises ``FormatError`` when a
    ``<tool_call>`` block holds no valid call; returns ``[]`` when there is no call at all."""
    actions: list[Action] = []
    pos = content.find(_TOOL_CALL_OPEN)
    while pos >= 0:
        obj, end = _decode_call(content, pos + len(_TOOL_CALL_OPEN))
        close = content.find(_TOOL_CALL_CLOSE, end)
        if close >= 0 and not content[end:close].strip():
            end = close + len(_TOOL_CALL_CLOSE)
        name = str(obj["name"])
        actions.append(Action(id=f"text_{uuid.uuid4().hex[:12]}", name=name,
                              arguments=_arguments(obj.get("arguments", obj.get("parameters")), name),
                              source=content[pos:end]))
        pos = content.find(_TOOL_CALL_OPEN, end)
    if actions:
        return actions
    body = content.lstrip()
    fence = _JSON_FENCE.match(body)
    offset = len(content) - len(body) + (fence.end() if fence else 0)
    if content[offset:offset + 1] != "{":
        return []
    try:
        obj, end = _decode_call(content, offset)
    except FormatError:
        return []
    if obj["name"] not in TOOL_NAMES:
        return []
    name = str(obj["name"])
    return [Action(id=f"text_{uuid.uuid4().hex[:12]}", name=name,
                   arguments=_arguments(obj.get("arguments", obj.get("parameters")), name),
                   source=content[:end])]


class ToolCallProtocol(AgentProtocol):
    """Structured tool calls (OpenAI ``tools`` / ``tool_calls``). ``tool_choice``: ``"required"``
    (default) or ``"auto"``."""

    name = "tools"

    def __init__(self, *, allow_exec: bool, tool_choice: str = "required"):
        if tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, not {tool_choice!r}")
        super().__init__(allow_exec=allow_exec)
        self.tool_choice = tool_choice

    def tools(self) -> list[dict] | None:
        return tool_schemas(self.allow_exec)

    def request_options(self) -> dict[str, Any]:
        return {"tool_choice": self.tool_choice, "stop": [_TOOL_CALL_CLOSE]}

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
        actions = calls_in_text(content)
        if not actions:
            raise FormatError("the reply was empty" if not content.strip() else "")
        return actions

    def trim_history(self, message: dict[str, Any], keep: list[Action]) -> dict[str, Any]:
        ids = {a.id for a in keep}
        out = dict(message)
        if out.get("tool_calls"):
            out["tool_calls"] = [c for c in out["tool_calls"] if c.get("id") in ids]
            if not out["tool_calls"]:
                out.pop("tool_calls")
        sources = [a.source for a in keep if a.source]
        content = out.get("content") or ""
        if sources and sources[-1] in content:
            out["content"] = content[: content.index(sources[-1]) + len(sources[-1])]
        return out

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
