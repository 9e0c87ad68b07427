"""``/v1/responses`` routes (OpenAI Responses API): create, and retrieve or delete a stored one."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, delete, get, post

from fak.gateway.responses.protocol import ResponsesRequest
from fak.gateway.schemas import openapi_operation

__all__ = ["create_response", "delete_response", "retrieve_response"]


@post("/v1/responses", status_code=200, summary="Create a response (OpenAI Responses API)", tags=["openai"],
      operation_class=openapi_operation(ResponsesRequest, None, streaming=True))
async def create_response(request: Request) -> Response[Any]:
    """OpenAI Responses: a ``response`` object, or server-sent events with ``"stream": true``."""
    return await request.app.state.gateway.responses.handle(request)


@get("/v1/responses/{response_id:str}", summary="Retrieve a stored response", tags=["openai"])
async def retrieve_response(request: Request) -> Response[Any]:
    """A response stored with ``store: true`` (404 when not held)."""
    return await request.app.state.gateway.responses.retrieve(str(request.path_params["response_id"]))


@delete("/v1/responses/{response_id:str}", status_code=200, summary="Delete a stored response", tags=["openai"])
async def delete_response(request: Request) -> Response[Any]:
    """Forget a stored response (404 when not held)."""
    return await request.app.state.gateway.responses.delete(str(request.path_params["response_id"]))
