"""Qwen2.5 / Hermes tool calls in generated text → OpenAI ``tool_calls``.

Qwen2.5's chat template (the one inside its GGUF) tells the model to answer a tool call as::

    <tool_call>
    {"name": "<function-name>", "arguments": <args-json-object>}
    </tool_call>

one block per call. ``ToolCallParser`` finds these blocks in streamed text (markers split across
deltas included) and turns each into a ``ParsedToolCall`` with the arguments re-encoded as a JSON
string, which is how OpenAI's API returns ``function.arguments``. A block whose JSON does not
parse, or lacks a string ``name``, is returned as ordinary text (content), markers included: a
malformed call is the model's output, never a server error.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from fak.gateway.segmenter import Block, BlockSegmenter, Text

__all__ = [
    "TOOL_CALL_OPEN",
    "TOOL_CALL_CLOSE",
    "ParsedToolCall",
    "ToolCallParser",
    "new_tool_call_id",
    "parse_tool_call_json",
    "extract_tool_calls",
    "arguments_to_json",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

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
        except ValueError:
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
    except ValueError:
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


class ToolCallParser:
    """Streaming parser: text deltas in, ``Text`` and ``ParsedToolCall`` pieces out.

    Args:
        prefix: text the prompt already put in the assistant turn (a forced ``<tool_call>``
            opening for ``tool_choice="required"`` or a named function); parsed as if the model
            had written it.
    """

    def __init__(self, prefix: str = "") -> None:
        self._seg = BlockSegmenter(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
        self._pending: list[Text | ParsedToolCall] = []
        if prefix:
            self._pending = self._convert(self._seg.feed(prefix))

    @staticmethod
    def _convert(pieces: list[Text | Block]) -> list[Text | ParsedToolCall]:
        out: list[Text | ParsedToolCall] = []
        for piece in pieces:
            if isinstance(piece, Text):
                out.append(piece)
                continue
            parsed = parse_tool_call_json(piece.inner)
            if parsed is None:
                out.append(Text(piece.raw))
            else:
                out.append(ParsedToolCall(parsed[0], parsed[1], piece.raw))
        return out

    def feed(self, delta: str) -> list[Text | ParsedToolCall]:
        """Consume a text delta; return the pieces it completes."""
        out = self._pending + self._convert(self._seg.feed(delta))
        self._pending = []
        return out

    def finish(self) -> list[Text | ParsedToolCall]:
        """End of generation. An unterminated block still counts as a call if its JSON is whole."""
        out = self._pending + self._convert(self._seg.finish())
        self._pending = []
        return out


def extract_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """Whole-text form of ``ToolCallParser``: ``(content, calls)``.

    ``content`` is the text outside valid calls (malformed blocks stay in it as text); when there
    are calls, whitespace around them is dropped.
    """
    parser = ToolCallParser()
    pieces = parser.feed(text) + parser.finish()
    calls = [p for p in pieces if isinstance(p, ParsedToolCall)]
    content = "".join(p.text for p in pieces if isinstance(p, Text))
    if calls:
        content = content.strip()
    return content, calls
