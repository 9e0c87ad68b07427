"""``POST /v1/completions`` route: hands the raw request to the app's serving object."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from fak.gateway.completions.protocol import Completion, CompletionRequest
from fak.gateway.schemas import openapi_operation

__all__ = ["create_completion"]


@post("/v1/completions", status_code=200, summary="Create completion", tags=["openai"],
      operation_class=openapi_operation(CompletionRequest, Completion, streaming=True))
async def create_completion(request: Request) -> Response[Any]:
    """OpenAI (legacy) Completions: JSON, or server-sent events with ``"stream": true``."""
    return await request.app.state.gateway.completions.handle(request)
