"""Request and response schemas of Anthropic's Messages API (``/v1/messages``).

Field names and shapes follow Anthropic's API reference (Messages, streaming messages, errors).
Requests are decoded leniently: fields this server does not know (``container``,
``mcp_servers``, ``context_management``, new betas) are ignored and listed in the debug log, as
Anthropic's clients send new fields long before a local server knows them. Content blocks are one
struct with every block type's fields (``type`` says which apply), so a block type this server
does not serve is refused by the serving code with the field that holds it, not by the decoder.
Extensions: ``fak_policy`` (the verdicts) and ``fak`` (inline reads) in the response.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from fak.toolcalls.wire import FakPolicyInfo

__all__ = [
    "AnthropicError",
    "AnthropicErrorBody",
    "ContentBlock",
    "CountTokensRequest",
    "CountTokensResponse",
    "InputMessage",
    "Message",
    "MessageUsage",
    "MessagesRequest",
    "ToolChoice",
    "ToolDefinition",
]


class ContentBlock(msgspec.Struct):
    """One content block of a message (or of a ``tool_result``'s content).

    ``text`` (``text``), ``tool_use`` (``id``, ``name``, ``input``), ``tool_result``
    (``tool_use_id``, ``content``, ``is_error``), ``thinking`` (``thinking``, ``signature``),
    ``redacted_thinking`` (``data``), ``image`` / ``document`` (``source``). ``cache_control`` and
    ``citations`` are accepted on any block and ignored.
    """

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    source: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    citations: Any = None


class InputMessage(msgspec.Struct):
    """One turn: ``user`` or ``assistant`` with text or blocks. ``system`` turns inside
    ``messages`` (which Anthropic's API itself refuses, but clients built for other servers send)
    are accepted and read as system text."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class ToolDefinition(msgspec.Struct):
    """A tool the model may call: ``name``, ``description``, ``input_schema`` (JSON Schema of the
    ``input`` object). ``type`` is absent or ``"custom"`` for such tools; Anthropic's own tool
    types (``bash_20250124``, ``web_search_20250305``, ...) carry no schema."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(msgspec.Struct):
    """``tool_choice``: ``auto``, ``any`` (some tool), ``tool`` (the one ``name``d) or ``none``;
    ``disable_parallel_tool_use`` keeps at most one call."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[ContentBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(_Common, kw_only=True):
    """Body of ``POST /v1/messages``.

    ``max_tokens`` is required, as in Anthropic's API; it is the most the answer may take, cut to
    what the context window leaves (Anthropic's ``model_context_window_exceeded`` stop reason
    when the window, not the budget, ends the answer). ``temperature`` 0..1, ``top_p`` 0..1,
    ``top_k`` ≥ 0 (0: off). ``thinking`` and ``metadata`` are accepted; ``metadata.user_id``
    keys the policy's conversation when no ``X-Fak-Conversation`` header is sent.
    """

    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


class CountTokensRequest(_Common, kw_only=True):
    """Body of ``POST /v1/messages/count_tokens``: a Messages request without the sampling fields."""


class CountTokensResponse(msgspec.Struct):
    """``{"input_tokens": N}``: the prompt's tokens as this server's model counts them."""

    input_tokens: int


class MessageUsage(msgspec.Struct):
    """Token counts of one answer (the engine's tokenizer). ``output_tokens`` includes the
    samples of a forced tool call that were set aside."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class Message(msgspec.Struct):
    """Response of a non-streamed ``POST /v1/messages``: ``content`` is a list of ``text`` and
    ``tool_use`` blocks (plain dicts, as Anthropic writes them)."""

    id: str
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: MessageUsage
    type: str = "message"
    role: str = "assistant"
    fak_policy: FakPolicyInfo | UnsetType = UNSET
    fak: dict[str, Any] | UnsetType = UNSET


class AnthropicErrorBody(msgspec.Struct):
    """The ``error`` object of an Anthropic error: ``type`` (``invalid_request_error``,
    ``authentication_error``, ``not_found_error``, ``rate_limit_error``, ``api_error``,
    ``overloaded_error``, ...) and ``message``."""

    type: str
    message: str


class AnthropicError(msgspec.Struct):
    """An Anthropic error response: ``{"type": "error", "error": {"type", "message"}}``."""

    error: AnthropicErrorBody
    type: str = "error"
