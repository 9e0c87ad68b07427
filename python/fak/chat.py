"""Chat templates: render the Jinja template stored in a GGUF file, as Hugging Face does.

The template (``tokenizer.chat_template`` in the GGUF metadata) is rendered in jinja2's
``ImmutableSandboxedEnvironment`` with the globals and filters of ``transformers``'
``apply_chat_template`` (``utils/chat_template_utils.py``): ``trim_blocks`` and ``lstrip_blocks``,
the ``loopcontrols`` extension and a ``{% generation %}`` block, ``raise_exception(msg)``,
``strftime_now(fmt)``, a ``tojson`` filter that does not HTML-escape (``json.dumps`` with
``ensure_ascii=False``), and the variables ``messages``, ``tools``, ``documents``,
``add_generation_prompt``, ``bos_token``, ``eos_token`` (plus any extra keyword).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from fak.errors import FakError

__all__ = ["ChatTemplate", "ChatTemplateError", "NoChatTemplateError"]


class ChatTemplateError(FakError, ValueError):
    """A chat template failed to compile or render (includes ``raise_exception`` from the
    template itself, e.g. "Conversation roles must alternate")."""


class NoChatTemplateError(ChatTemplateError):
    """The model file has no ``tokenizer.chat_template`` and no template was given."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: renders its body (HF uses it to mark assistant
    tokens for training masks; rendering is unaffected)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from e


def _normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAI-shaped message in the form HF templates expect: text content parts
    joined into one string, and ``tool_calls[].function.arguments`` given as a JSON string parsed
    into an object (templates serialize it with ``tojson``; vLLM does the same conversion)."""
    msg = dict(message)
    content = msg.get("content")
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        msg["content"] = "\n".join(str(p.get("text", "")) for p in content)
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for call in calls:
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                fn = dict(call["function"])
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args)
                    except ValueError:
                        parsed = None
                    if isinstance(parsed, dict):
                        fn["arguments"] = parsed
                call = {**call, "function": fn}
            fixed.append(call)
        msg["tool_calls"] = fixed
    return msg


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja source (``tokenizer.chat_template``).
        bos_token, eos_token: texts of the BOS/EOS tokens, passed to the template.

    Raises:
        ChatTemplateError: the source does not compile.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(source)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], override: str | None = None) -> ChatTemplate:
        """The template of a GGUF file (or ``override`` when given), with its BOS/EOS texts.

        Raises:
            NoChatTemplateError: neither ``override`` nor ``tokenizer.chat_template`` exists.
        """
        source = override if override is not None else metadata.get("tokenizer.chat_template")
        if not source:
            raise NoChatTemplateError(
                "the model file has no chat template (tokenizer.chat_template); pass chat_template= "
                "with a Jinja template, or use plain-text prompts")
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def text(key: str) -> str:
            i = metadata.get(key)
            return str(tokens[int(i)]) if i is not None and 0 <= int(i) < len(tokens) else ""

        return cls(str(source), text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id"))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Renders ``messages`` (OpenAI/HF shape: ``{"role", "content", "tool_calls"?, ...}``).

        Args:
            messages: the conversation.
            tools: JSON-schema tool definitions (``{"type": "function", "function": {...}}``), or
                None; templates test ``if tools`` so None and ``[]`` both mean no tools.
            add_generation_prompt: append the header that starts the assistant's turn.
            documents: retrieval documents, for templates that use them.
            **kwargs: extra template variables (e.g. ``enable_thinking``).

        Returns:
            the prompt text, with special tokens written as text (tokenize it with
            ``parse_special=True`` and without adding BOS, as ``apply_chat_template`` does).

        Raises:
            ChatTemplateError: the template raised (``raise_exception``) or failed to render.
        """
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **kwargs,
            "messages": [_normalize_message(m) for m in messages],
            "tools": list(tools) if tools is not None else None,
            "documents": list(documents) if documents is not None else None,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e}") from e
        except (TypeError, KeyError, AttributeError, IndexError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {type(e).__name__}: {e}") from e
