"""``POST /v1/chat/completions`` route: hands the raw request to the app's serving object."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from fak.gateway.chat_completions.protocol import ChatCompletion, ChatCompletionRequest
from fak.gateway.schemas import openapi_operation

__all__ = ["create_chat_completion"]


@post("/v1/chat/completions", status_code=200, summary="Create chat completion", tags=["openai"],
      operation_class=openapi_operation(ChatCompletionRequest, ChatCompletion, streaming=True))
async def create_chat_completion(request: Request) -> Response[Any]:
    """OpenAI Chat Completions: JSON, or server-sent events with ``"stream": true``.

    The body is decoded strictly by the serving code (see ``fak.gateway.schemas``).
    """
    return await request.app.state.gateway.chat.handle(request)
