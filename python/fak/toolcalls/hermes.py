"""Qwen2.5 / Hermes tool calls in generated text → OpenAI ``tool_calls``.

Qwen2.5's chat template (the one inside its GGUF) tells the model to answer a tool call as::

    <tool_call>
    {"name": "<function-name>", "arguments": <args-json-object>}
    </tool_call>

one block per call. ``ToolCallParser`` finds these blocks in streamed text (markers split across
deltas included) and turns each into a ``ParsedToolCall`` with the arguments re-encoded as a JSON
string, which is how OpenAI's API returns ``function.arguments``. A block holding several call
objects one after the other (Qwen2.5-Coder-1.5B writes its whole plan that way, never closing the
block) gives one call per object. A block whose JSON does not parse, or lacks a string ``name``, is
returned as ordinary text (content), markers included (a ``RejectedCall`` piece, which says why):
a malformed call is the model's output, never a server error. Given the offered tools
(``ToolSet``), a call naming a tool that was not offered, or whose arguments fail that tool's JSON
Schema, is rejected the same way.

Small models sometimes drop the markers and answer with the bare object (or a ```json fence
around it). Given the offered tool names, the parser also accepts an answer that is *entirely*
such objects naming offered tools (``parse_bare_calls``). To decide, an answer that starts with
``{``, ``[`` or ```json is held until the end of the generation.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from fak.toolcalls.schema import CallProblem, ToolSet
from fak.toolcalls.segmenter import Block, BlockSegmenter, Text

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ParsedToolCall",
    "RejectedCall",
    "ToolCallParser",
    "arguments_to_json",
    "explain_block",
    "extract_tool_calls",
    "leading_calls",
    "new_tool_call_id",
    "parse_bare_calls",
    "parse_tool_call_json",
    "parse_tool_call_objects",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# The tags the Hermes template (Qwen2.5) lists the offered tools in; an answer wrapped in them is
# read as bare calls (``parse_bare_calls``).
TOOLS_OPEN = "<tools>"
TOOLS_CLOSE = "</tools>"

_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """A tool-call id in OpenAI's style: ``call_`` and 24 random alphanumerics."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(slots=True)
class ParsedToolCall:
    """One tool call found in generated text.

    ``arguments`` is a JSON string (an object), ``raw`` the text it was parsed from (markers
    included), ``id`` a fresh ``call_...`` id.
    """

    name: str
    arguments: str
    raw: str
    id: str = field(default_factory=new_tool_call_id)


def arguments_to_json(arguments: Any) -> str | None:
    """Arguments as OpenAI's JSON string; ``None`` if they are not a JSON object (or its text)."""
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
        return arguments if isinstance(decoded, dict) else None
    return None


def parse_tool_call_json(inner: str) -> tuple[str, str] | None:
    """Parse the JSON inside one ``<tool_call>`` block.

    Returns ``(name, arguments_json)``, or ``None`` if ``inner`` is not a JSON object with a
    non-empty string ``name`` and object ``arguments`` (``parameters`` is accepted as an alias;
    a missing one means ``{}``).
    """
    try:
        obj = json.loads(inner)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    args_json = arguments_to_json(args)
    if args_json is None:
        return None
    return name, args_json


def parse_tool_call_objects(inner: str) -> list[tuple[str, str]] | None:
    """Parse the inside of one ``<tool_call>`` block: one call object, or several written one
    after the other (blanks or commas between them). Returns ``[(name, arguments_json), ...]``,
    or ``None`` unless every object is a valid call (see ``parse_tool_call_json``)."""
    single = parse_tool_call_json(inner)
    if single is not None:
        return [single]
    decoder = json.JSONDecoder()
    calls: list[tuple[str, str]] = []
    body = inner.strip()
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except ValueError:
            return None
        parsed = parse_tool_call_json(json.dumps(obj)) if isinstance(obj, dict) else None
        if parsed is None:
            return None
        calls.append(parsed)
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n,":
            pos += 1
    return calls or None


def _call_of(obj: Any, tool_names: frozenset[str] | None) -> tuple[str, str] | None:
    """``(name, arguments_json)`` of a call object naming one of ``tool_names`` (``None``: any
    non-empty string name), else ``None``."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name or (tool_names is not None and name not in tool_names):
        return None
    args_json = arguments_to_json(obj.get("arguments", obj.get("parameters", {})))
    return None if args_json is None else (obj["name"], args_json)


def parse_bare_calls(text: str, tool_names: frozenset[str], *, leading: bool = False) -> list[ParsedToolCall] | None:
    """Calls written without ``<tool_call>`` markers: the whole ``text`` is one or more JSON
    objects ``{"name": <an offered tool>, "arguments": {...}}`` (or a JSON list of them),
    optionally inside one ```json fence, or inside the ``<tools>…</tools>`` tags in which the
    template listed the tools (small models echo them in place of ``<tool_call>``). ``None`` if
    anything else is in the text.

    ``leading=True`` (the agent's reading of a reply it must act on): the calls that open the
    text count even when something else follows them (a reply cut by ``max_tokens`` in its
    second call); the text must still start with a call.
    """
    body = text.strip()
    if body.startswith(TOOLS_OPEN):
        # The tag the Hermes template lists the tools in, echoed around the call (Qwen2.5-Coder
        # 1.5B did so for Codex's exec_command: `<tools>\n{"name": ...}\n</tools>`).
        if not (body.endswith(TOOLS_CLOSE) or leading):
            return None
        body = body[len(TOOLS_OPEN):-len(TOOLS_CLOSE) if body.endswith(TOOLS_CLOSE) else None].strip()
    if body.startswith("```"):
        newline = body.find("\n")
        if newline < 0 or not (body.endswith("```") or leading):
            return None
        header = body[3:newline].strip()
        if header not in ("", "json"):
            return None
        body = body[newline + 1:-3 if body.endswith("```") else None].strip()
    decoder = json.JSONDecoder()
    objects: list[Any] = []
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except ValueError:
            if leading and objects:
                break
            return None
        if leading and objects and not all(_call_of(o, tool_names) for o in (obj if isinstance(obj, list) else [obj])):
            break
        objects += obj if isinstance(obj, list) else [obj]
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n,":
            pos += 1
    calls = []
    for obj in objects:
        parsed = _call_of(obj, tool_names)
        if parsed is None:
            return None
        calls.append(ParsedToolCall(parsed[0], parsed[1], text))
    return calls or None


def leading_calls(inner: str, tools: ToolSet | None = None, *, early: bool = False) -> list[tuple[str, str]] | None:
    """The call objects a block opens with when something else follows them: a forced call
    (``tool_choice`` required or named) whose model wrote a whole call and then junk
    (``{"name": "bash", "arguments": {...}}}}`` or prose inside the block). Returns
    ``[(name, arguments_json), ...]`` of the leading objects that are calls of offered tools
    (``tools.check`` passes; ``tools=None``: any name), or ``None`` when the block does not open
    with one.

    ``early=True`` (the block is still open): only when the text after the calls already shows it
    is not more of the call list (another object, a comma) nor the block's close marker, so the
    caller may decide now and stop the generation.
    """
    body = inner.lstrip()
    decoder = json.JSONDecoder()
    calls: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        try:
            obj, end = decoder.raw_decode(body, pos)
        except (ValueError, RecursionError):
            break
        parsed = _call_of(obj, None) if isinstance(obj, dict) else None
        if parsed is not None and tools is not None:
            parsed = (parsed[0], tools.fit(*parsed))
        if parsed is None or (tools is not None and tools.check(*parsed) is not None):
            break
        calls.append(parsed)
        pos = last = end
        while pos < len(body) and body[pos] in " \t\r\n,":
            pos += 1
    if not calls:
        return None
    if early:
        rest = body[pos:].strip()
        if not rest or TOOL_CALL_CLOSE.startswith(rest) or rest.startswith(("{", "[")) or "," in body[last:pos]:
            return None
    return calls


_JSON_FENCE = "```json"


@dataclass(frozen=True, slots=True)
class RejectedCall(Text):
    """A ``<tool_call>`` block that is not a call of an offered tool: its JSON does not parse,
    lacks a string ``name``, names a tool that was not offered, or has arguments that fail the
    tool's schema. ``text`` is what a client sees in its place (the block as written, markers
    included, less any server pre-fill); ``problem`` says why; ``name`` is the name it gave, if any.
    """

    problem: CallProblem
    name: str | None = None


def explain_block(inner: str) -> CallProblem:
    """Why the inside of a ``<tool_call>`` block is not a call (for a block that
    ``parse_tool_call_objects`` refused), in words a model can act on."""
    body = inner.strip()
    try:
        obj, _ = json.JSONDecoder().raw_decode(body)
    except ValueError as exc:
        return CallProblem("invalid_json", f"the tool call is not valid JSON ({exc}); write it as "
                                           '{"name": TOOL, "arguments": {...}}')
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return CallProblem("invalid_json", 'the tool call needs a "name" (and "arguments", a JSON object)')
    if arguments_to_json(obj.get("arguments", obj.get("parameters", {}))) is None:
        return CallProblem("invalid_json", f"the arguments of `{obj['name']}` must be a JSON object")
    return CallProblem("invalid_json", "the tool call block holds something besides call objects")


def _name_in(inner: str) -> str | None:
    try:
        obj, _ = json.JSONDecoder().raw_decode(inner.strip())
    except ValueError:
        return None
    name = obj.get("name") if isinstance(obj, dict) else None
    return name if isinstance(name, str) else None


def _toolset(tools: ToolSet | frozenset[str] | set[str] | None) -> ToolSet | None:
    if tools is None or isinstance(tools, ToolSet):
        return tools
    names = sorted(tools)
    return ToolSet(dict.fromkeys(names), tuple(names))


class ToolCallParser:
    """Streaming parser: text deltas in, ``Text``, ``ParsedToolCall`` and ``RejectedCall`` pieces out.

    Args:
        prefix: text the prompt already put in the assistant turn (a forced ``<tool_call>``
            opening for ``tool_choice="required"`` or a named function); parsed as if the model
            had written it, and never returned as text. The block it opened is the forced call:
            when it holds a whole call followed by junk, the call is taken (``leading_calls``;
            decided as soon as the junk shows, ``complete`` then says the rest of the generation
            is not needed); when it holds none, it comes back as a ``RejectedCall`` with empty
            text (never a fragment of a call: the caller retries or answers cleanly).
        tools: the offered tools (a ``ToolSet``, or a set of names without schemas). When given,
            every call is checked: a name that was not offered or arguments that fail the tool's
            schema make the block a ``RejectedCall``; and (without ``prefix``) an answer made only
            of bare call objects of offered tools is accepted too (``parse_bare_calls``).
            ``None``: any name, no schema.
    """

    def __init__(self, prefix: str = "", tools: ToolSet | frozenset[str] | set[str] | None = None) -> None:
        self._seg = BlockSegmenter(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
        self._pending: list[Text | ParsedToolCall] = []
        self._tools = _toolset(tools)
        self._prefix_len = len(prefix)  # stripped from the first block when it is not a call
        # "lead": deciding whether the answer may be bare JSON; "bare": holding it; "marked": normal
        self._mode = "lead" if self._tools is not None and self._tools.names and not prefix else "marked"
        self._held = ""
        self._forced_open = bool(prefix)  # the forced block is open and undecided
        self._complete = False
        if prefix:
            self._pending = self._convert(self._seg.feed(prefix))

    @property
    def complete(self) -> bool:
        """The forced call was decided before its block closed (a whole call, then junk): the
        rest of the generation is dropped, so the caller may stop it."""
        return self._complete

    def _lead(self, delta: str) -> list[Text | ParsedToolCall]:
        self._held += delta
        head = self._held.lstrip()
        if not head:
            return []
        if head[0] in "{[" or head.startswith((_JSON_FENCE, TOOLS_OPEN)):
            self._mode = "bare"
            return []
        if any(len(head) < len(m) and m.startswith(head) for m in (_JSON_FENCE, TOOLS_OPEN)):
            return []
        self._mode = "marked"
        text, self._held = self._held, ""
        return self._convert(self._seg.feed(text))

    def _decided(self) -> None:
        """The forced call is taken with junk after it: drop the rest of the generation."""
        self._forced_open, self._complete = False, True
        self._seg = BlockSegmenter(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

    def _convert(self, pieces: list[Text | Block]) -> list[Text | ParsedToolCall]:
        out: list[Text | ParsedToolCall] = []
        for piece in pieces:
            if self._complete:
                break
            if isinstance(piece, Text):
                out.append(piece)
                continue
            strip, self._prefix_len = self._prefix_len, 0
            forced, self._forced_open = self._forced_open, False
            parsed = parse_tool_call_objects(piece.inner)
            problem = explain_block(piece.inner) if parsed is None else None
            if parsed is not None and self._tools is not None:
                parsed = [(n, self._tools.fit(n, a)) for n, a in parsed]
                problem = next((p for p in (self._tools.check(n, a) for n, a in parsed) if p is not None), None)
            if problem is not None and forced:
                salvaged = leading_calls(piece.inner, self._tools)
                if salvaged is not None:
                    out += [ParsedToolCall(name, args, piece.raw) for name, args in salvaged]
                    self._decided()
                else:
                    out.append(RejectedCall("", problem, _name_in(piece.inner)))
            elif problem is not None:
                out.append(RejectedCall(piece.raw[strip:], problem, _name_in(piece.inner)))
            else:
                assert parsed is not None
                out += [ParsedToolCall(name, args, piece.raw) for name, args in parsed]
        return out

    def feed(self, delta: str) -> list[Text | ParsedToolCall]:
        """Consume a text delta; return the pieces it completes."""
        if self._mode == "lead":
            return self._lead(delta)
        if self._mode == "bare":
            self._held += delta
            return []
        if self._complete:
            return []
        out = self._pending + self._convert(self._seg.feed(delta))
        self._pending = []
        if self._forced_open and self._seg.in_block and "}" in delta:
            early = leading_calls(self._seg.held, self._tools, early=True)
            if early is not None:
                raw = TOOL_CALL_OPEN + self._seg.held
                out += [ParsedToolCall(name, args, raw) for name, args in early]
                self._decided()
        return out

    def finish(self) -> list[Text | ParsedToolCall]:
        """End of generation. An unterminated block still counts as a call if its JSON is whole."""
        if self._complete:
            return []
        out: list[Text | ParsedToolCall] = []
        if self._mode != "marked":
            held, self._held = self._held, ""
            self._mode = "marked"
            bare = None
            if held.strip() and self._tools is not None:
                bare = parse_bare_calls(held, self._tools.names)
                if bare is not None:
                    bare = [ParsedToolCall(c.name, self._tools.fit(c.name, c.arguments), c.raw) for c in bare]
                if bare is not None and any(self._tools.check(c.name, c.arguments) for c in bare):
                    bare = None
            if bare is not None:
                return list(bare)
            out += self._convert(self._seg.feed(held))
        out = self._pending + out + self._convert(self._seg.finish())
        self._pending = []
        return out


def extract_tool_calls(text: str, tools: ToolSet | frozenset[str] | set[str] | None = None,
                       ) -> tuple[str, list[ParsedToolCall]]:
    """Whole-text form of ``ToolCallParser``: ``(content, calls)``.

    ``content`` is the text outside valid calls (malformed or rejected blocks stay in it as
    text); when there are calls, whitespace around them is dropped.
    """
    parser = ToolCallParser(tools=tools)
    pieces = parser.feed(text) + parser.finish()
    calls = [p for p in pieces if isinstance(p, ParsedToolCall)]
    content = "".join(p.text for p in pieces if isinstance(p, Text))
    if calls:
        content = content.strip()
    return content, calls
