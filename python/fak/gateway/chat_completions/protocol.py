"""Request and response schemas of ``POST /v1/chat/completions`` (OpenAI Chat Completions API).

Field names, types and ranges follow OpenAI's API reference for ``/v1/chat/completions``. Unknown
fields are accepted everywhere: at the top level they are ignored and logged (OpenAI itself
answers 400 "Unrecognized request argument", but agents built for other servers send their
vendors' fields), and messages carry what clients send back of the messages they received
(``refusal``, ``annotations``, ``audio`` ...). Extensions, as in vLLM and llama.cpp:
``top_k``, ``min_p``, ``repetition_penalty`` in the request; ``fak_policy`` in the response.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from fak.gateway.schemas import StreamOptions, Timings, Usage
from fak.toolcalls.wire import FakPolicyInfo, Tool, ToolCall

__all__ = [
    "ChatChoice",
    "ChatChunkChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatDelta",
    "ChatMessage",
    "ChatResponseMessage",
    "ChoiceLogprobs",
    "ChunkFunction",
    "ChunkToolCall",
    "ContentPart",
    "NamedToolChoice",
    "ResponseFormat",
    "TokenLogprob",
    "TopLogprob",
]

Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
PositiveTokens = Annotated[int, Meta(ge=1)]


# ---------------------------------------------------------------------------------------- request


class ContentPart(msgspec.Struct):
    """One part of a message's content; only ``text`` (and ``refusal`` for assistants) is served."""

    type: str
    text: str | None = None
    refusal: str | None = None


class ChatMessage(msgspec.Struct):
    """One conversation message.

    ``system``/``developer``/``user`` carry ``content``; ``assistant`` carries ``content`` and/or
    ``tool_calls``; ``tool`` carries the tool's output in ``content`` and the ``tool_call_id`` it
    answers.
    """

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    #: an assistant turn's reasoning, as the gateway returned it (a thinking template shows it
    #: again in the turns after the last user query)
    reasoning_content: str | None = None


class NamedFunction(msgspec.Struct):
    """``{"name": ...}`` of a named tool choice."""

    name: str


class NamedToolChoice(msgspec.Struct):
    """``tool_choice`` that forces one function: ``{"type": "function", "function": {"name": ...}}``."""

    function: NamedFunction
    type: Literal["function"] = "function"


class ResponseFormat(msgspec.Struct):
    """``response_format``: only ``{"type": "text"}`` is served (no constrained decoding)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(msgspec.Struct):
    """Body of ``POST /v1/chat/completions``.

    Unknown top-level fields (vendors' ``reasoning_effort``, ``chat_template_kwargs``, new
    OpenAI fields) are ignored and listed in the ``fak.gateway`` debug log, not refused: a
    client built for another server keeps working (``fak.gateway.schemas.decode_lenient``).

    Ranges as OpenAI documents them: ``temperature`` 0..2, ``top_p`` 0..1, penalties -2..2,
    ``top_logprobs`` 0..20, at most 4 ``stop`` sequences. ``n`` must be 1 (checked by the server
    with a clear message). ``max_completion_tokens`` wins over the deprecated ``max_tokens``;
    without either, generation may use the rest of the context window.
    """

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    model: str
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    max_tokens: PositiveTokens | None = None
    max_completion_tokens: PositiveTokens | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Meta(max_length=4)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # extensions (vLLM / llama.cpp server names)
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    #: speculative decoding of this request over the server's ``--speculative`` (fak's extension:
    #: ``"ngram"``, ``"suffix:8"``, ``"none"``; docs/speculative.md)
    speculative: Annotated[str, Meta(max_length=32)] | None = None
    #: extra chat-template variables (vLLM's name; ``{"enable_thinking": false}`` turns Qwen3's
    #: thinking off)
    chat_template_kwargs: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------- response


class ChatResponseMessage(msgspec.Struct):
    """The assistant message of a choice. ``content`` is ``None`` when only tool calls remain."""

    content: str | None
    role: str = "assistant"
    refusal: str | None = None
    tool_calls: list[ToolCall] | UnsetType = UNSET
    #: the model's reasoning (``<think>`` text of a thinking template; vLLM's name)
    reasoning_content: str | UnsetType = UNSET


class TopLogprob(msgspec.Struct):
    """One alternative token at a position: its text, log-probability (natural log) and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct):
    """The chosen token at a position with its ``top_logprobs`` alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct):
    """``logprobs`` of a choice: one entry per generated token."""

    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class ChatChoice(msgspec.Struct):
    """One choice (the gateway serves ``n == 1``)."""

    index: int
    message: ChatResponseMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(msgspec.Struct):
    """Response of a non-streaming chat completion."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | None = None
    fak_policy: FakPolicyInfo | UnsetType = UNSET
    timings: Timings | UnsetType = UNSET  # engine mode: queue+prefill and decode time (llama.cpp's names)
    #: fak extension: ``tool_call_error`` (a forced call no attempt wrote whole: ``kind``,
    #: ``message``), ``inline_reads`` (``--serve-inline-reads``)
    fak: dict[str, Any] | UnsetType = UNSET


class ChunkFunction(msgspec.Struct):
    """``function`` of a streamed tool-call delta (present parts only)."""

    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ChunkToolCall(msgspec.Struct):
    """A streamed tool-call delta. The gateway sends each call whole, in one delta."""

    index: int
    function: ChunkFunction
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET


class ChatDelta(msgspec.Struct):
    """The ``delta`` of a chunk: only the fields that changed are present."""

    role: str | UnsetType = UNSET
    content: str | None | UnsetType = UNSET
    tool_calls: list[ChunkToolCall] | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct):
    """One choice of a streamed chunk."""

    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct):
    """One server-sent event of a streaming chat completion.

    With ``stream_options.include_usage`` every chunk has ``usage: null`` and a last chunk has
    ``choices: []`` and the usage, as in OpenAI's stream format.
    """

    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | None | UnsetType = UNSET
    fak_policy: FakPolicyInfo | UnsetType = UNSET
    #: fak extension on the chunk that ends the choice (see ``ChatCompletion.fak``)
    fak: dict[str, Any] | UnsetType = UNSET
