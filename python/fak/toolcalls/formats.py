"""Which tool-call form a model speaks, decided by the chat template inside its GGUF, and what
each form needs: its streaming parser, and the assistant-turn pre-fill and constrained openings
that force a call (``tool_choice`` ``"required"`` or a named function).

Two forms, both between ``<tool_call>`` and ``</tool_call>``:

- ``HERMES`` (Qwen2.5, Qwen3 dense, Hermes; the default): ``{"name": ..., "arguments": {...}}``
  (``fak.toolcalls.hermes``);
- ``QWEN3_XML`` (Qwen3-Coder, Qwen3.5): ``<function=NAME>`` and one ``<parameter=P>`` tag per
  argument (``fak.toolcalls.qwen3xml``).

``detect_tool_call_format`` is the one place that reads a template for this; the gateway's chat
completions, its policy filter (``AssistantOutputFilter``) and its inline reads all take the form
it returns.
"""

from __future__ import annotations

import enum
import json

from fak.toolcalls.hermes import TOOL_CALL_OPEN, ParsedToolCall, ToolCallParser, extract_tool_calls
from fak.toolcalls.qwen3xml import FUNCTION_CLOSE, FUNCTION_OPEN, PARAMETER_OPEN, Qwen3XmlParser, extract_xml_tool_calls
from fak.toolcalls.schema import ToolSet

__all__ = [
    "ARGUMENT_OPENINGS",
    "XML_OPENINGS",
    "ToolCallFormat",
    "detect_tool_call_format",
    "format_of_text",
]

#: How the arguments object may open after a forced ``"arguments":`` (with keys, empty, or
#: pretty-printed): the model picks one, so a forced call's arguments are always an object.
ARGUMENT_OPENINGS = (' {"', " {}", " {\n")
#: What may follow a forced ``<function=NAME>\n``: a parameter, or the end of a call without any.
XML_OPENINGS = (PARAMETER_OPEN, FUNCTION_CLOSE)


class ToolCallFormat(str, enum.Enum):
    """A tool-call form: ``"hermes"`` (JSON) or ``"qwen3_xml"`` (Qwen3-Coder XML)."""

    HERMES = "hermes"
    QWEN3_XML = "qwen3_xml"

    def parser(self, prefix: str = "", tools: ToolSet | frozenset[str] | set[str] | None = None,
               ) -> ToolCallParser | Qwen3XmlParser:
        """A streaming parser of this form (``feed``/``finish`` → ``Text``, ``ParsedToolCall``,
        ``RejectedCall``); ``prefix`` and ``tools`` as ``hermes.ToolCallParser`` takes them."""
        if self is ToolCallFormat.QWEN3_XML:
            return Qwen3XmlParser(prefix, tools)
        return ToolCallParser(prefix, tools)

    def extract(self, text: str, tools: ToolSet | frozenset[str] | set[str] | None = None,
                ) -> tuple[str, list[ParsedToolCall]]:
        """Whole-text parse: ``(content, calls)`` (``extract_tool_calls`` of the form)."""
        if self is ToolCallFormat.QWEN3_XML:
            return extract_xml_tool_calls(text, tools)
        return extract_tool_calls(text, tools)

    def forced_prefix(self, name: str | None = None) -> str:
        """The assistant-turn pre-fill that forces a call: of any offered tool (``name=None``,
        ``tool_choice="required"``; the name comes from ``forced_openings``) or of ``name``.

        Hermes: ``<tool_call>\\n{"name": "`` / ``<tool_call>\\n{"name": "F", "arguments":``.
        XML: ``<tool_call>\\n`` / ``<tool_call>\\n<function=F>\\n``, as Qwen3-Coder's template
        writes a call (the required case leaves ``<function=`` to the openings, so the name is
        tokenized with its tag as the model wrote it in training).
        """
        if self is ToolCallFormat.QWEN3_XML:
            return TOOL_CALL_OPEN + "\n" + ("" if name is None else f"{FUNCTION_OPEN}{name}>\n")
        if name is None:
            return TOOL_CALL_OPEN + "\n" + '{"name": "'
        return TOOL_CALL_OPEN + "\n" + '{"name": ' + json.dumps(name) + ', "arguments":'

    def forced_openings(self, names: list[str] | None = None) -> list[str]:
        """The texts the model must begin with after ``forced_prefix`` (the engine's
        ``prefix_choices``, tokenized by the caller): for ``tool_choice="required"`` (``names``:
        the offered tools, in order) each name then the opening of its arguments; for a named
        function (``names=None``) the openings only.

        Hermes: ``NAME", "arguments":`` + each of ``ARGUMENT_OPENINGS`` / ``ARGUMENT_OPENINGS``.
        XML: ``<function=NAME>\\n`` + each of ``XML_OPENINGS`` / ``XML_OPENINGS``.
        """
        if self is ToolCallFormat.QWEN3_XML:
            if names is None:
                return list(XML_OPENINGS)
            return [f"{FUNCTION_OPEN}{n}>\n{o}" for n in names for o in XML_OPENINGS]
        if names is None:
            return list(ARGUMENT_OPENINGS)
        return [n + '", "arguments":' + o for n in names for o in ARGUMENT_OPENINGS]


def detect_tool_call_format(chat_template: str | None) -> ToolCallFormat:
    """The tool-call form a chat template teaches its model (``tokenizer.chat_template`` of a GGUF,
    or the template that overrides it).

    ``QWEN3_XML`` when the template writes or describes calls as ``<function=NAME>`` with
    ``<parameter=P>`` tags (Qwen3-Coder's template renders an assistant's calls as
    ``<tool_call>\\n<function=`` + name + ``>\\n<parameter=`` ... and its instructions show the same;
    Qwen3.5's templates too). Both tags are required: a template that only mentions
    ``<function=`` (Llama 3.1's custom-tool example, ``<function=NAME>{json}</function>``) is not
    this form. ``HERMES`` otherwise, and for no template: Qwen2.5's and Qwen3's templates render
    ``<tool_call>\\n{"name": ...}``, and the JSON form is what fak parsed before there was a choice.
    """
    if chat_template and FUNCTION_OPEN in chat_template and PARAMETER_OPEN in chat_template:
        return ToolCallFormat.QWEN3_XML
    return ToolCallFormat.HERMES


def format_of_text(text: str) -> ToolCallFormat:
    """The form a reply's calls are written in, for a reader that cannot see the template (the
    fleet agent behind an HTTP API): ``QWEN3_XML`` when the text holds ``<function=``, else
    ``HERMES``. The XML parser also reads a JSON-form ``<tool_call>`` block, so a reply that mixes
    them loses nothing."""
    return ToolCallFormat.QWEN3_XML if FUNCTION_OPEN in text else ToolCallFormat.HERMES
