"""Qwen3-Coder tool calls (the XML form) in generated text → OpenAI ``tool_calls``.

Qwen3-Coder's chat template (the one inside its GGUF; Qwen3.5's templates use the same form) tells
the model to answer a tool call as::

    <tool_call>
    <function=NAME>
    <parameter=P>
    value
    </parameter>
    ...
    </function>
    </tool_call>

one ``<function=...>`` block per call, one ``<parameter=...>`` tag per argument, every value
written as text (the template renders a value that is not a string with Jinja's ``| string``:
``True``, ``{'a': 1}``). ``Qwen3XmlParser`` finds these calls in streamed text (markers split
across deltas included) and turns each into a ``ParsedToolCall`` whose ``arguments`` is a JSON
object's text, exactly as the Hermes JSON form's parser (``fak.toolcalls.hermes``) returns them.

The conventions are those of the reference parser Qwen publishes with the model (vLLM's
``Qwen3CoderToolParser``, ``qwen3coder_tool_parser.py``):

- one leading and one trailing newline of a value are the template's, not the value's: removed
  (nothing else is stripped);
- a value is converted by the JSON Schema type the offered tool gives that parameter
  (``convert_parameter``): strings stay text; ``integer`` / ``number`` parse as numbers (an
  integral number becomes an integer); ``boolean`` takes ``true`` / ``false`` in any case;
  ``object`` / ``array`` parse as JSON, else as a Python literal (the template's ``| string`` of
  a dict); ``null`` is JSON null unless the parameter is text only; a parameter the schema does
  not declare is text;
- a missing ``</parameter>`` ends the value at the next ``<parameter=``, ``</function>`` or
  ``<function=`` tag (fak asks that tag to open a line, as the template writes it, so a value may
  hold XML-like text: ``a < b``, ``<div>``, a ``<parameter=x>`` inside a line; and a
  ``</function>`` line that the value's own ``</parameter>`` follows is the value's text);
- a missing ``</function>`` or ``</tool_call>`` is forgiven where the call is otherwise whole; one
  ``<tool_call>`` block may hold several ``<function=...>`` blocks (one call each); a
  ``<function=...>...</function>`` block written without ``<tool_call>`` around it is a call too;
- a ``<tool_call>`` block holding the JSON form instead (``{"name": ..., "arguments": ...}``) is
  read as the JSON form.

Where fak differs from the reference on purpose (a call the policy adjudicates must be the call
the model wrote): a ``boolean`` value other than true/false stays text (the reference turns it
into ``false``), so the schema check rejects it; a call cut off by the end of the generation
(``max_tokens``) in the middle of a value or before ``</function>`` is not a call (the reference
takes the partial value: a cut ``rm -rf /tmp/x`` would run as ``rm -rf /``). The engine's stop at
``</tool_call>`` (the agent asks for it) leaves a whole call: it is one.

A block that is not a call (broken markup, a name that was not offered, arguments that fail the
tool's schema) comes back as text, markers included: a ``RejectedCall`` saying why. A value cannot
hold ``</parameter>`` or ``</tool_call>`` (the reference cannot either), nor a line that opens
with ``<parameter=NAME>`` or ``<function=NAME>`` (read as a value whose ``</parameter>`` is
missing: the value ends before that line; the reference ends it at such a tag anywhere).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fak.toolcalls.hermes import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedToolCall,
    RejectedCall,
    parse_tool_call_objects,
)
from fak.toolcalls.schema import CallProblem, ToolSet
from fak.toolcalls.segmenter import Block, BlockSegmenter, Text

__all__ = [
    "FUNCTION_CLOSE",
    "FUNCTION_OPEN",
    "PARAMETER_CLOSE",
    "PARAMETER_OPEN",
    "XML_EXAMPLE",
    "Qwen3XmlParser",
    "XmlCall",
    "convert_parameter",
    "extract_xml_tool_calls",
    "leading_xml_calls",
    "parameter_kinds",
    "parse_xml_block",
    "scan_functions",
]

FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
#: How a call is written, for the messages that tell a model what was wrong.
XML_EXAMPLE = "<tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>"

#: The next structural tag inside a function block.
_TAG = re.compile(r"<parameter=|</function>|<function=")
#: Where a value whose ``</parameter>`` is missing ends: a line that opens with a tag.
_OPEN_LINE_TAG = re.compile(r"\n(?=<parameter=[^>\n]*>|<function=[^>\n]*>|</function>)")
_OPENING = re.compile(r"<parameter=|<function=")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Longest value read as a Python literal (``ast.literal_eval`` parses the whole text).
_MAX_LITERAL = 1 << 16

_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_BOOLEAN_TYPES = frozenset({"boolean", "bool", "binary"})
_NO = object()  # a conversion that does not apply


# -------------------------------------------------------------------------------- values


def _kind(type_name: Any) -> str:
    """One schema type name as the reference parser reads it: ``string``, ``integer``, ``number``,
    ``boolean``, ``json`` (object / array), ``null`` or ``any`` (a name it does not know)."""
    t = str(type_name).strip().lower()
    if t in _STRING_TYPES:
        return "string"
    if t.startswith(("int", "uint", "long", "short", "unsigned")):
        return "integer"
    if t.startswith(("num", "float", "double")):
        return "number"
    if t in _BOOLEAN_TYPES:
        return "boolean"
    if t in ("null", "none"):
        return "null"
    if t in ("object", "array", "arr") or t.startswith(("dict", "list")):
        return "json"
    return "any"


def _value_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, (dict, list)):
        return "json"
    return "string"


def parameter_kinds(schema: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The kinds of value one parameter's JSON Schema allows, in the order they are tried:
    from ``type`` (a name or a list of names), else the ``type`` of each ``anyOf`` / ``oneOf``
    member, else the values of ``enum`` / ``const``. Kinds: ``string``, ``integer``, ``number``,
    ``boolean``, ``json`` (object or array), ``null``, ``any``. A schema that names no type
    (or ``None``: a parameter the tool does not declare) gives ``("string",)``, as the reference
    parser (vLLM ``qwen3coder_tool_parser.py``) treats a parameter without ``type`` as text."""
    if not isinstance(schema, Mapping):
        return ("string",)
    kinds: list[str] = []
    declared = schema.get("type")
    if isinstance(declared, (list, tuple)):
        kinds += [_kind(t) for t in declared]
    elif declared is not None:
        kinds.append(_kind(declared))
    else:
        for key in ("anyOf", "oneOf"):
            for member in schema.get(key) or ():
                kinds += parameter_kinds(member) if isinstance(member, Mapping) and "type" in member else []
        if not kinds and isinstance(schema.get("enum"), list):
            kinds += [_value_kind(v) for v in schema["enum"]]
        if not kinds and "const" in schema:
            kinds.append(_value_kind(schema["const"]))
    return tuple(dict.fromkeys(kinds)) or ("string",)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(text: str) -> Any:
    """JSON text → value (``NaN``/``Infinity`` and numbers past float range refused)."""
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        return _NO


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A Python literal as a JSON value (tuples become lists); ``_NO`` for what JSON cannot hold."""
    if depth > 64:
        return _NO
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NO
    if isinstance(value, (list, tuple)):
        items = [_jsonable(v, depth + 1) for v in value]
        return _NO if any(v is _NO for v in items) else items
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            got = _jsonable(v, depth + 1)
            if not isinstance(k, str) or got is _NO:
                return _NO
            out[k] = got
        return out
    return _NO


def _literal(text: str) -> Any:
    """A Python literal (``{'a': True}``: the template's ``| string`` of a value) as JSON."""
    if len(text) > _MAX_LITERAL:
        return _NO
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NO
    return _jsonable(value)


def _as_integer(text: str) -> Any:
    if not _INTEGER.fullmatch(text):
        return _NO
    try:
        return int(text)
    except ValueError:  # longer than Python's int-string limit
        return _NO


def _as_number(text: str) -> Any:
    if _INTEGER.fullmatch(text):
        return _as_integer(text)
    if not _NUMBER.fullmatch(text):
        return _NO
    try:
        value = _finite(text)
    except ValueError:
        return _NO
    return int(value) if value.is_integer() else value


def _as_boolean(text: str) -> Any:
    low = text.lower()
    return (low == "true") if low in ("true", "false") else _NO


def _as_json(text: str) -> Any:
    got = _json(text)
    return _literal(text) if got is _NO else got


_CONVERTERS = (("integer", _as_integer), ("number", _as_number), ("boolean", _as_boolean),
               ("json", _as_json), ("any", _as_json))


def convert_parameter(value: str, schema: Mapping[str, Any] | None) -> Any:
    """One parameter's text (newlines of the template already removed) → its JSON value, by the
    kinds its JSON Schema allows (``parameter_kinds``), as the Qwen3-Coder reference parser
    converts (vLLM ``Qwen3CoderToolParser._convert_param_value``):

    - ``null`` (any case, blanks around) → ``None`` unless the parameter is text only;
    - ``integer``: an ASCII integer; ``number``: a finite decimal number, an integral one as an
      integer (``"5.0"`` → ``5``); ``boolean``: ``true`` / ``false`` in any case; ``json``: JSON,
      else a Python literal (``{'a': True}``); ``any`` (a type name the reference does not know):
      the same as ``json``; tried in that order when the schema allows several;
    - otherwise the text as written. A value that fits none of a non-text schema's kinds stays
      text too (the reference turns a bad boolean into ``false``; fak leaves it for the schema
      check to refuse). Never raises.
    """
    kinds = parameter_kinds(schema)
    text = value.strip()
    if text.lower() == "null" and kinds != ("string",):
        return None
    for kind, convert in _CONVERTERS:
        if kind in kinds:
            got = convert(text)
            if got is not _NO:
                return got
    return value


# -------------------------------------------------------------------------------- markup


@dataclass(frozen=True, slots=True)
class XmlCall:
    """One ``<function=NAME>`` block: the name and each ``(parameter, text)`` in written order
    (the template's newlines removed, no type conversion yet)."""

    name: str
    parameters: tuple[tuple[str, str], ...]


def _malformed(message: str) -> CallProblem:
    return CallProblem("malformed", f"{message}; write a call as {XML_EXAMPLE}")


def _strip_template_newlines(raw: str) -> str:
    if raw.startswith("\n"):
        raw = raw[1:]
    return raw[:-1] if raw.endswith("\n") else raw


def _tag_name(text: str, start: int, what: str) -> tuple[str, int] | CallProblem:
    """The name of a ``<function=NAME>`` / ``<parameter=NAME>`` tag whose name starts at
    ``start``: ``(name, index after '>')``."""
    end = text.find(">", start)
    name = text[start:end].strip() if end >= 0 else ""
    if end < 0 or "\n" in text[start:end] or "<" in name:
        return _malformed(f"a <{what}=...> tag is not closed with '>'")
    if not name:
        return _malformed(f"a <{what}=> tag has no name")
    return name, end + 1


def _missing_close(inner: str, start: int, close: int, limit: int) -> re.Match[str] | None:
    """Where a value starting at ``start`` ends when its ``</parameter>`` is missing: the first
    line before ``limit`` that opens with a tag. A ``</function>`` line followed by this value's
    own ``</parameter>`` (no other tag opens between them) is text of the value (an XML file)."""
    pos = start
    opening = _OPENING.search(inner, start)  # the next <parameter= / <function=, kept ahead of pos
    while (tag := _OPEN_LINE_TAG.search(inner, pos)) is not None and tag.start() < limit:
        after = tag.start() + 1
        if not inner.startswith(FUNCTION_CLOSE, after) or close < 0:
            return tag
        if opening is not None and opening.start() < after:
            opening = _OPENING.search(inner, after)
        if opening is not None and opening.start() < close:
            return tag
        pos = after
    return None


def scan_functions(inner: str, *, closed: bool) -> list[XmlCall] | CallProblem | None:
    """The ``<function=...>`` blocks inside one ``<tool_call>`` block (``inner``: the text between
    the markers), by the rules of the module doc. ``closed``: whether ``</tool_call>`` ended the
    block (``False``: the generation ended first, so a call must have closed its values and its
    ``</function>`` itself). ``None`` when there is no ``<function=`` at all (not the XML form);
    a ``CallProblem`` (kind ``malformed``) for broken markup. Never raises."""
    pos = inner.find(FUNCTION_OPEN)
    if pos < 0:
        return None
    calls: list[XmlCall] = []
    close = inner.find(PARAMETER_CLOSE)  # the next </parameter> (-1: none left)
    while pos >= 0:
        got = _tag_name(inner, pos + len(FUNCTION_OPEN), "function")
        if isinstance(got, CallProblem):
            return got
        name, pos = got
        params: list[tuple[str, str]] = []
        ended = False
        while True:
            tag = _TAG.search(inner, pos)
            if tag is None:
                pos = len(inner)
                break
            if tag.group() == FUNCTION_CLOSE:
                pos, ended = tag.end(), True
                break
            if tag.group() == FUNCTION_OPEN:  # the next call begins: this one forgot </function>
                pos, ended = tag.start(), True
                break
            got = _tag_name(inner, tag.end(), "parameter")
            if isinstance(got, CallProblem):
                return got
            param, start = got
            if 0 <= close < start:  # (-1 stays -1: no </parameter> is left; keeps a long call linear)
                close = inner.find(PARAMETER_CLOSE, start)
            limit = close if close >= 0 else len(inner)
            line_tag = _missing_close(inner, start, close, limit)
            if line_tag is not None:  # </parameter> missing
                raw, pos = inner[start:line_tag.start() + 1], line_tag.start() + 1
            elif close >= 0:
                raw, pos = inner[start:close], close + len(PARAMETER_CLOSE)
            else:
                raw, pos = inner[start:], len(inner)
                if not (closed and raw.endswith("\n")):
                    return _malformed(f"the value of parameter `{param}` of `{name}` is not closed with "
                                      "</parameter> (the call was cut off)")
            params.append((param, _strip_template_newlines(raw)))
        if not ended and not closed:
            return _malformed(f"the call of `{name}` was cut off before </function>")
        calls.append(XmlCall(name, tuple(params)))
        pos = inner.find(FUNCTION_OPEN, pos)
    return calls


def parse_xml_block(inner: str, *, closed: bool = True, tools: ToolSet | None = None,
                    ) -> list[tuple[str, str]] | CallProblem:
    """Parse the inside of one ``<tool_call>`` block of the XML form into ``[(name,
    arguments_json), ...]``, each value converted by the offered tool's schema
    (``convert_parameter``; ``tools=None``: every value is text). A block without
    ``<function=`` is read as the JSON form (``hermes.parse_tool_call_objects``). Returns the
    ``CallProblem`` (kind ``malformed``) when the markup is broken; the calls are not yet checked
    against the offered tools (``ToolSet.check`` does that). Never raises."""
    if inner.lstrip().startswith("{"):  # the JSON form (a "<function=" may be inside one of its strings)
        objects = parse_tool_call_objects(inner)
        if objects is not None:
            return objects
    scanned = scan_functions(inner, closed=closed)
    if scanned is None:
        return _malformed("the tool call has no <function=NAME> block")
    if isinstance(scanned, CallProblem):
        return scanned
    out = []
    for call in scanned:
        args = {p: convert_parameter(v, tools.parameter_schema(call.name, p) if tools is not None else None)
                for p, v in call.parameters}
        out.append((call.name, json.dumps(args, ensure_ascii=False)))
    return out


def _structural_ends(inner: str) -> list[int]:
    """Where each ``</function>`` that surely closes a call ends: one right after a
    ``</parameter>`` (blanks between), or closing a function with no parameter. A ``</function>``
    inside a value still open (an XML file being written) is never one."""
    ends = []
    pos = 0
    while (i := inner.find(FUNCTION_CLOSE, pos)) >= 0:
        head = inner[:i].rstrip()
        opened = head.rfind(FUNCTION_OPEN)
        if head.endswith(PARAMETER_CLOSE) or (opened >= 0 and PARAMETER_OPEN not in head[opened:]):
            ends.append(i + len(FUNCTION_CLOSE))
        pos = i + len(FUNCTION_CLOSE)
    return ends


def leading_xml_calls(inner: str, tools: ToolSet | None = None, *, early: bool = False,
                      ) -> list[tuple[str, str]] | None:
    """The whole calls a ``<tool_call>`` block of the XML form opens with, when what follows
    them is not a call: a forced call (``tool_choice`` required or named) whose model wrote a
    call and then broken markup or junk. Only calls that end at a ``</function>`` that surely
    closes them (``_structural_ends``: never one inside an open value, so no value is ever cut)
    and fit the offered tools count. Returns ``[(name, arguments_json), ...]`` or ``None``.

    ``early=True`` (the block is still open): only when the text after the calls already shows it
    is neither another ``<function=`` nor the close marker, so the caller may decide now."""
    best: tuple[list[tuple[str, str]], int] | None = None
    for end in _structural_ends(inner):
        parsed = parse_xml_block(inner[:end], closed=True, tools=tools)
        if isinstance(parsed, CallProblem) or not parsed:
            break
        if tools is not None and any(tools.check(n, a) is not None for n, a in parsed):
            break
        best = (parsed, end)
    if best is None:
        return None
    if early:
        rest = inner[best[1]:].strip()
        if (not rest or TOOL_CALL_CLOSE.startswith(rest) or rest.startswith(FUNCTION_OPEN)
                or FUNCTION_OPEN.startswith(rest)):
            return None
    return best[0]


def _first_name(inner: str) -> str | None:
    pos = inner.find(FUNCTION_OPEN)
    if pos < 0:
        return None
    got = _tag_name(inner, pos + len(FUNCTION_OPEN), "function")
    return got[0] if isinstance(got, tuple) else None


def _toolset(tools: ToolSet | frozenset[str] | set[str] | None) -> ToolSet | None:
    if tools is None or isinstance(tools, ToolSet):
        return tools
    names = sorted(tools)
    return ToolSet(dict.fromkeys(names), tuple(names))


class Qwen3XmlParser:
    """Streaming parser of the XML form: text deltas in, ``Text``, ``ParsedToolCall`` and
    ``RejectedCall`` pieces out (the pieces of ``hermes.ToolCallParser``, so callers take either).

    Args:
        prefix: text the prompt already put in the assistant turn (the gateway's forced
            ``<tool_call>\\n`` or ``<tool_call>\\n<function=NAME>\\n`` for ``tool_choice``
            ``"required"`` or a named function); parsed as if the model had written it, never
            returned as text. The block it opened is the forced call: whole calls followed by
            junk are taken (``leading_xml_calls``; decided as soon as the junk shows, ``complete``
            then says the rest of the generation is not needed); a block with none comes back
            as a ``RejectedCall`` with empty text (never a fragment of a call).
        tools: the offered tools (a ``ToolSet``, or a set of names without schemas). When given,
            values are typed by each tool's schema and every call is checked: a name that was not
            offered or arguments that fail the tool's schema make the block a ``RejectedCall``.
            ``None``: any name, every value text.

    Text that may still turn into ``<tool_call>`` or ``<function=`` is held until the next delta
    decides it, so no partial markup leaks as text; a call comes out whole when its block ends
    (``</tool_call>``, a bare block's ``</function>``, or ``finish``). Any split of the same text
    into deltas gives the same pieces.
    """

    def __init__(self, prefix: str = "", tools: ToolSet | frozenset[str] | set[str] | None = None) -> None:
        self._seg = BlockSegmenter(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
        self._bare = BlockSegmenter(FUNCTION_OPEN, FUNCTION_CLOSE)  # calls written without <tool_call>
        self._tools = _toolset(tools)
        self._prefix_len = len(prefix)  # stripped from the first block when it is not a call
        self._pending: list[Text | ParsedToolCall] = []
        self._forced_open = bool(prefix)  # the forced block is open and undecided
        self._complete = False
        if prefix:
            self._pending = self._convert(self._seg.feed(prefix))

    @property
    def complete(self) -> bool:
        """The forced call was decided before its block closed (whole calls, then junk): the rest
        of the generation is dropped, so the caller may stop it."""
        return self._complete

    def _call(self, inner: str, closed: bool, raw: str, shown: str) -> list[Text | ParsedToolCall]:
        parsed = parse_xml_block(inner, closed=closed, tools=self._tools)
        if isinstance(parsed, CallProblem):
            problem: CallProblem | None = parsed
        elif self._tools is not None:
            problem = next((p for p in (self._tools.check(n, a) for n, a in parsed) if p is not None), None)
        else:
            problem = None
        if problem is not None or isinstance(parsed, CallProblem):
            return [RejectedCall(shown, problem or _malformed("not a call"), _first_name(inner))]
        return [ParsedToolCall(name, args, raw) for name, args in parsed]

    def _bare_pieces(self, pieces: list[Text | Block]) -> list[Text | ParsedToolCall]:
        out: list[Text | ParsedToolCall] = []
        for piece in pieces:
            if isinstance(piece, Text):
                out.append(piece)
            else:  # closed=False: a bare call must write its own </function>
                inner = FUNCTION_OPEN + piece.inner + (FUNCTION_CLOSE if piece.closed else "")
                out += self._call(inner, False, piece.raw, piece.raw)
        return out

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
                out += self._bare_pieces(self._bare.feed(piece.text))
                continue
            out += self._bare_pieces(self._bare.finish())  # the text before this block, whole
            strip, self._prefix_len = self._prefix_len, 0
            forced, self._forced_open = self._forced_open, False
            got = self._call(piece.inner, piece.closed, piece.raw, piece.raw[strip:])
            first = got[0]
            if forced and isinstance(first, RejectedCall):  # never a fragment of the forced call
                salvaged = leading_xml_calls(piece.inner, self._tools)
                if salvaged is not None:
                    got = [ParsedToolCall(n, a, piece.raw) for n, a in salvaged]
                    self._decided()
                else:
                    got = [RejectedCall("", first.problem, first.name)]
            elif forced and leading_xml_calls(piece.inner, self._tools, early=True) is not None:
                self._decided()  # junk after the calls, inside the block: as if decided early
            out += got
        return out

    def feed(self, delta: str) -> list[Text | ParsedToolCall]:
        """Consume a text delta; return the pieces it completes."""
        if self._complete:
            return []
        out = self._pending + self._convert(self._seg.feed(delta))
        self._pending = []
        if self._forced_open and self._seg.in_block and FUNCTION_CLOSE in self._seg.held:
            early = leading_xml_calls(self._seg.held, self._tools, early=True)
            if early is not None:
                raw = TOOL_CALL_OPEN + self._seg.held
                out += [ParsedToolCall(name, args, raw) for name, args in early]
                self._decided()
        return out

    def finish(self) -> list[Text | ParsedToolCall]:
        """End of generation: the held text, and an unterminated block as a call when it is whole
        (see the module doc), else as text."""
        if self._complete:
            return []
        out = self._pending + self._convert(self._seg.finish()) + self._bare_pieces(self._bare.finish())
        self._pending = []
        return out


def extract_xml_tool_calls(text: str, tools: ToolSet | frozenset[str] | set[str] | None = None,
                           ) -> tuple[str, list[ParsedToolCall]]:
    """Whole-text form of ``Qwen3XmlParser``: ``(content, calls)``. ``content`` is the text outside
    valid calls (broken or rejected blocks stay in it as text); when there are calls, whitespace
    around them is dropped."""
    parser = Qwen3XmlParser(tools=tools)
    pieces = parser.feed(text) + parser.finish()
    calls = [p for p in pieces if isinstance(p, ParsedToolCall)]
    content = "".join(p.text for p in pieces if isinstance(p, Text))
    return (content.strip() if calls else content), calls
