"""The OpenAI tool-call protocol: the request carries ``tools``; the model answers with
``tool_calls``; each result goes back as a ``role: tool`` message with its ``tool_call_id``.

For small models the request asks for a call every turn (``tool_choice: "required"``; fak's
gateway then pre-fills the assistant turn with ``<tool_call>``, so Qwen2.5 cannot drift into
prose) and stops at ``</tool_call>`` (one call per turn, no runaway repeats). ``tool_choice`` can
be ``"auto"`` instead (the model may then write text before its call).

Small models sometimes print the call instead of emitting it, or the server cannot parse it (a
reply cut by ``max_tokens``): a ``<tool_call>{"name": ..., "arguments": {...}}`` block (closed or
not) or a reply that starts with such a bare JSON object naming a tool is accepted too, and so is
Qwen3-Coder's XML form (``<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>...``),
read by the gateway's own parsers (``fak.toolcalls``; the form picked from the reply itself, since
the agent cannot see the model's chat template), and its result goes back as a user message, since
there is no tool_call id to answer. Such a call has no ``call_ref``: when the gateway runs a policy,
no verdict refers to it and it is not run.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from fak.agent.exceptions import FormatError
from fak.agent.prompts import render
from fak.agent.protocols.base import Action, AgentProtocol
from fak.agent.tools import TOOL_NAMES, tool_schemas
from fak.toolcalls import (
    TOOL_CALL_CLOSE,
    ParsedToolCall,
    RejectedCall,
    ToolSet,
    format_of_text,
    parse_bare_calls,
)

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


def calls_in_text(content: str, tools: ToolSet | Iterable[str] = TOOL_NAMES) -> list[Action]:
    """Tool calls written in ``content``, read and checked as the gateway reads and checks them
    (``fak.toolcalls.ToolCallParser``, or ``Qwen3XmlParser`` when the reply holds ``<function=``,
    over the offered ``tools``: a ``ToolSet``, or names without schemas): every ``<tool_call>``
    block of an offered tool whose arguments fit its schema (the closing tag is optional), else a
    reply that starts with bare ``{"name": TOOL, ...}`` objects (optionally in a ```json fence).
    Raises ``FormatError`` saying what is wrong when a call is there but does not fit (bad JSON,
    broken XML, an unknown tool, arguments that miss the schema); returns ``[]`` when there is no
    call at all."""
    toolset = tools if isinstance(tools, ToolSet) else ToolSet(dict.fromkeys(tools), tuple(tools))
    parser = format_of_text(content).parser(tools=toolset)
    pieces = parser.feed(content) + parser.finish()
    calls = [p for p in pieces if isinstance(p, ParsedToolCall)]
    rejected = next((p for p in pieces if isinstance(p, RejectedCall)), None)
    if not calls and rejected is None:
        calls = parse_bare_calls(content, toolset.names, leading=True) or []
        problem = next((pr for pr in (toolset.check(c.name, c.arguments) for c in calls) if pr), None)
        if problem is not None:
            raise FormatError(problem.message)
    if calls:
        return [Action(id=f"text_{uuid.uuid4().hex[:12]}", name=c.name,
                       arguments=_arguments(c.arguments, c.name), source=c.raw) for c in calls]
    if rejected is not None:
        raise FormatError(rejected.problem.message)
    return []


class ToolCallProtocol(AgentProtocol):
    """Structured tool calls (OpenAI ``tools`` / ``tool_calls``). ``tool_choice``: ``"required"``
    (default) or ``"auto"``."""

    name = "tools"

    def __init__(self, *, allow_exec: bool, tool_choice: str = "required"):
        if tool_choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, not {tool_choice!r}")
        super().__init__(allow_exec=allow_exec)
        self.tool_choice = tool_choice
        self._toolset: ToolSet | None = None  # the offered tools' schemas, compiled on first use

    def tools(self) -> list[dict] | None:
        return tool_schemas(self.allow_exec)

    def request_options(self) -> dict[str, Any]:
        return {"tool_choice": self.tool_choice, "stop": [TOOL_CALL_CLOSE]}

    def parse(self, message: dict[str, Any]) -> list[Action]:
        calls = message.get("tool_calls") or []
        actions: list[Action] = []
        for call in calls:
            fn = call.get("function") or {}
            name = fn.get("name")
            if not name:
                raise FormatError("a tool call has no function name")
            call_id = call.get("id") or f"call_{uuid.uuid4().hex[:12]}"
            actions.append(Action(id=call_id, name=name, arguments=_arguments(fn.get("arguments"), name),
                                  call_ref=call.get("id")))
        if actions:
            return actions
        content = message.get("content") or ""
        if self._toolset is None:
            self._toolset = ToolSet.from_openai(self.tools())
        actions = calls_in_text(content, self._toolset)
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
