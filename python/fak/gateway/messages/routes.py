"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` routes (Anthropic Messages API).

The ``anthropic-version`` and ``anthropic-beta`` headers and the ``?beta=true`` query (Claude
Code's) are accepted whatever their values; the API key may come as ``x-api-key`` (Anthropic's
SDKs) or ``Authorization: Bearer``.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from fak.gateway.messages.protocol import CountTokensRequest, CountTokensResponse, Message, MessagesRequest
from fak.gateway.schemas import openapi_operation

__all__ = ["count_message_tokens", "create_message"]


@post("/v1/messages", status_code=200, summary="Create a message (Anthropic Messages API)", tags=["anthropic"],
      operation_class=openapi_operation(MessagesRequest, Message, streaming=True))
async def create_message(request: Request) -> Response[Any]:
    """Anthropic Messages: JSON, or server-sent events with ``"stream": true``."""
    return await request.app.state.gateway.messages.handle(request)


@post("/v1/messages/count_tokens", status_code=200, summary="Count a message's input tokens", tags=["anthropic"],
      operation_class=openapi_operation(CountTokensRequest, CountTokensResponse))
async def count_message_tokens(request: Request) -> Response[Any]:
    """The input tokens of a Messages request, as this server's model counts them."""
    return await request.app.state.gateway.messages.count_tokens(request)
