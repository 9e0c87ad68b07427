"""``GET /v1/models`` and ``GET /v1/models/{model_id}``: the served model (engine mode) or the
upstream's answer (proxy mode)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from fak.gateway.models.protocol import ModelCard, ModelList
from fak.gateway.schemas import openapi_operation

__all__ = ["list_models", "retrieve_model"]


@get("/v1/models", summary="List models", tags=["openai"], operation_class=openapi_operation(None, ModelList))
async def list_models(request: Request) -> Response[Any]:
    """The models this gateway serves, in OpenAI's list format."""
    return await request.app.state.gateway.list_models()


@get("/v1/models/{model_id:path}", summary="Retrieve model", tags=["openai"],
     operation_class=openapi_operation(None, ModelCard))
async def retrieve_model(request: Request) -> Response[Any]:
    """One model's card (OpenAI's ``models.retrieve``); 404 ``model_not_found`` for an unknown id
    (which may hold slashes, as Hugging Face names do)."""
    model_id = str(request.path_params.get("model_id", "")).lstrip("/")
    return await request.app.state.gateway.retrieve_model(model_id)
