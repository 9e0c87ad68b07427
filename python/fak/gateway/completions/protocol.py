"""Request and response schemas of ``POST /v1/completions`` (OpenAI's legacy Completions API).

Fields as in OpenAI's API reference for ``/v1/completions``; the top level forbids unknown fields.
``prompt`` is one text or one list of token ids (or a one-element list of text); batches of
prompts are refused with a 400 (send one request per prompt: the engine batches them anyway).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, UnsetType

from fak.gateway.schemas import StreamOptions, Usage
from fak.toolcalls.wire import FakPolicyInfo

__all__ = ["Completion", "CompletionChoice", "CompletionLogprobs", "CompletionRequest"]

Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]


class CompletionRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /v1/completions``. ``max_tokens`` defaults to 16, as in OpenAI's API."""

    model: str
    prompt: str | Annotated[list[str | int], Meta(min_length=1)]
    best_of: Annotated[int, Meta(ge=1, le=20)] | None = None
    echo: bool | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[str], Meta(max_length=4)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    user: str | None = None
    # extensions (vLLM / llama.cpp server names)
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0.0, le=10.0)] | None = None
    #: speculative decoding of this request over the server's ``--speculative`` (fak's extension:
    #: ``"ngram"``, ``"suffix:8"``, ``"none"``; docs/speculative.md)
    speculative: Annotated[str, Meta(max_length=32)] | None = None


class CompletionLogprobs(msgspec.Struct):
    """Legacy logprobs: per generated token its text, log-probability, top alternatives, offset."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    """One choice (``n == 1``); also the choice of a streamed chunk."""

    text: str
    index: int
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(msgspec.Struct):
    """Response of ``/v1/completions`` (and each streamed chunk, without ``usage``)."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    system_fingerprint: str | None = None
    usage: Usage | None | UnsetType = UNSET
    fak_policy: FakPolicyInfo | UnsetType = UNSET
