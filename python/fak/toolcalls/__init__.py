"""One tool-call contract: how a model's calls are found in its text, checked against the offered
tools, and referred to by the policy's verdicts. Used by the gateway (``fak.gateway``) and by the
agent's protocols (``fak.agent.protocols``), so both read a reply the same way.

- ``hermes``: Qwen2.5 / Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
  (and bare call objects) → ``ParsedToolCall`` / ``RejectedCall`` (``ToolCallParser``,
  ``extract_tool_calls``);
- ``qwen3xml``: Qwen3-Coder ``<tool_call><function=NAME><parameter=P>value</parameter>...``
  blocks → the same pieces (``Qwen3XmlParser``, ``extract_xml_tool_calls``), values typed by the
  offered tool's schema;
- ``formats``: which of the two a model speaks (``detect_tool_call_format``, from its chat
  template) and each form's parser and forced-call pre-fill (``ToolCallFormat``);
- ``shell``: fenced shell blocks of text-protocol agents (``BashBlockParser``, ``shell_blocks``);
- ``schema``: the offered tools and their argument schemas (``ToolSet.check``);
- ``segmenter``: the streaming marker splitter under both parsers;
- ``wire``: the wire form of offered tools, tool calls and the policy's verdicts (``Tool``,
  ``ToolCall``, ``PolicyVerdictInfo``, ``FakPolicyInfo``) and the one digest of a call's
  arguments (``arguments_digest``), shared by every endpoint, the audit log and the agent.

Every verdict the gateway returns (``fak_policy.verdicts[i]``) carries a ``call_ref``: the
``tool_call_id`` of a structured call (``call_...``; for a denied call, the id it would have had,
never sent), or ``block:N`` for the ``N``-th shell block of a reply (from 0, in the order written),
with its ``span`` ``[start, end)``: where, in the message content the client received, the block
stands (an allowed block) or the note that replaced it (a denied one). A client finds a call's
verdict with ``verdict_for`` and needs no digest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fak.toolcalls.formats import ToolCallFormat, detect_tool_call_format, format_of_text
from fak.toolcalls.hermes import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedToolCall,
    RejectedCall,
    ToolCallParser,
    explain_block,
    extract_tool_calls,
    new_tool_call_id,
    parse_bare_calls,
)
from fak.toolcalls.qwen3xml import Qwen3XmlParser, convert_parameter, extract_xml_tool_calls
from fak.toolcalls.schema import CallProblem, SchemaError, ToolSet
from fak.toolcalls.segmenter import Block, BlockSegmenter, Text
from fak.toolcalls.shell import (
    BashBlockParser,
    ShellBlock,
    bash_command,
    fence_language,
    shell_blocks,
)

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "BashBlockParser",
    "Block",
    "BlockSegmenter",
    "CallProblem",
    "ParsedToolCall",
    "Qwen3XmlParser",
    "RejectedCall",
    "SchemaError",
    "ShellBlock",
    "Text",
    "ToolCallFormat",
    "ToolCallParser",
    "ToolSet",
    "bash_command",
    "block_ref",
    "convert_parameter",
    "detect_tool_call_format",
    "explain_block",
    "extract_tool_calls",
    "extract_xml_tool_calls",
    "fence_language",
    "format_of_text",
    "new_tool_call_id",
    "parse_bare_calls",
    "shell_blocks",
    "verdict_for",
]


def block_ref(index: int) -> str:
    """The ``call_ref`` of the ``index``-th shell block of a reply: ``block:<index>``."""
    return f"block:{index}"


def verdict_for(verdicts: Iterable[Mapping[str, Any]], *, call_ref: str | None = None,
                span: tuple[int, int] | None = None) -> Mapping[str, Any] | None:
    """The verdict about one call: the one whose ``call_ref`` is ``call_ref`` (a structured call's
    id), or, for a shell block, the ``block:N`` verdict whose ``span`` is ``span``. ``None`` when
    no verdict refers to it (the gateway did not adjudicate it)."""
    for v in verdicts:
        ref = v.get("call_ref")
        if call_ref is not None and ref == call_ref:
            return v
        if span is not None and isinstance(ref, str) and ref.startswith("block:"):
            got = v.get("span")
            if isinstance(got, (list, tuple)) and len(got) == 2 and (got[0], got[1]) == span:
                return v
    return None
