"""Request schema of OpenAI's Responses API (``/v1/responses``).

Decoded leniently (unknown top-level fields are ignored and listed in the debug log: Codex sends
``prompt_cache_key``, ``include``, ``reasoning``, ``text.verbosity``, ... and more with each
release). ``input`` items and ``tools`` stay JSON objects: the serving code reads each by its
``type`` and names the exact item (``input[3].type``) when one is refused. Responses are built
as plain dicts with the fields and order of OpenAI's ``Response`` object.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

__all__ = ["ResponsesRequest"]


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/responses``.

    ``input``: a string (one user message) or a list of items (messages, ``function_call``,
    ``function_call_output``, the tool-call items of the served tool types, ``reasoning``).
    ``instructions``: the system text of this request (not carried to a later one by
    ``previous_response_id``, as OpenAI documents). ``max_output_tokens`` is a ceiling cut to the
    context window's room. ``store`` (default true) keeps the response for
    ``previous_response_id`` and ``GET /v1/responses/{id}``. Extensions: ``top_k``, ``seed``.
    """

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    seed: int | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    truncation: str | None = None
    background: bool | None = None
