"""``GET /v1/models``: the served model (engine mode) or the upstream's list (proxy mode)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from fak.gateway.models.protocol import ModelList
from fak.gateway.schemas import openapi_operation

__all__ = ["list_models"]


@get("/v1/models", summary="List models", tags=["openai"], operation_class=openapi_operation(None, ModelList))
async def list_models(request: Request) -> Response[Any]:
    """The models this gateway serves, in OpenAI's list format."""
    return await request.app.state.gateway.list_models()
