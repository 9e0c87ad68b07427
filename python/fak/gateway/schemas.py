"""Schemas shared by the endpoints, strict request decoding, and OpenAPI wiring.

Request bodies are decoded by the gateway itself with msgspec's strict decoder (a string where
an integer belongs is a 400, as in OpenAI's API; Litestar's own body conversion is lenient), so the
handlers take the raw request and the OpenAPI document gets the request/response schemas from
msgspec's JSON Schema generator: the schema fuzzed by the tests is exactly the one the decoder
enforces.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, UnsetType
from litestar.openapi.spec import OpenAPIMediaType as MediaType
from litestar.openapi.spec import OpenAPIResponse, Operation, Reference, RequestBody

from fak.gateway.errors import ErrorResponse, decode_error

__all__ = [
    "StreamOptions",
    "Usage",
    "component_schemas",
    "decode_body",
    "decode_lenient",
    "new_id",
    "now",
    "openapi_operation",
]

T = TypeVar("T")

log = logging.getLogger("fak.gateway")


class Usage(msgspec.Struct):
    """Token counts of one request (tokens of the engine's tokenizer)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    #: ``{"cached_tokens": N}``: prompt tokens the prefix cache held (engine mode)
    prompt_tokens_details: dict[str, int] | UnsetType = UNSET


class Timings(msgspec.Struct):
    """Where one request's time went, with llama.cpp server's field names (``timings``): prompt
    = arrival to the first completion token (queue + prefill), predicted = first to last token
    (decode); milliseconds, and the token counts they cover. A fak extension; OpenAI clients
    ignore it."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    """``stream_options``: ``include_usage`` adds a final chunk with ``usage`` (and ``choices: []``)."""

    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


def decode_body(body: bytes, type_: type[T]) -> T:
    """Decode a JSON request body into ``type_`` strictly.

    Raises:
        APIError: 400 with ``param`` naming the offending field, or ``invalid_json``.
    """
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise decode_error(exc) from None


def decode_lenient(body: bytes, type_: type[T], *, what: str) -> T:
    """Decode a JSON request body into ``type_``, ignoring top-level fields it does not know.

    Vendor APIs grow fields faster than a local server learns them (``reasoning_effort``,
    ``context_management``, ``prompt_cache_key``, ...), and a client that gets a 400 for one stops
    working; the unknown names are listed in the ``fak.gateway`` debug log (``what``: the
    endpoint, for the log line). Known fields are still checked strictly.

    Raises:
        APIError: 400 with ``param`` naming the offending field, or ``invalid_json``.
    """
    value = decode_body(body, type_)
    if log.isEnabledFor(logging.DEBUG):
        known = set(getattr(type_, "__struct_fields__", ()))
        try:
            keys = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
        except msgspec.DecodeError:
            keys = {}
        unknown = sorted(k for k in keys if k not in known)
        if unknown:
            log.debug("%s: ignored unknown fields %s", what, unknown)
    return value


def new_id(prefix: str) -> str:
    """An OpenAI-style object id, e.g. ``chatcmpl-<32 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix time in whole seconds (the ``created`` field)."""
    return int(time.time())


_REF = "#/components/schemas/{name}"


def component_schemas(types: list[Any]) -> dict[str, dict[str, Any]]:
    """JSON Schema (2020-12, as OpenAPI 3.1 uses) of every msgspec type in ``types`` and its parts."""
    _, components = msgspec.json.schema_components(types, ref_template=_REF)
    return components


@dataclass
class _SchemaRef:
    name: str

    def ref(self) -> Reference:
        return Reference(ref=_REF.format(name=self.name))


def openapi_operation(request: type | None, response: type | None, *,
                      streaming: bool = False) -> type[Operation]:
    """An ``Operation`` class for a route whose body the handler decodes itself.

    The request body and the 200 response point at the msgspec-generated components
    (registered by the app factory with ``component_schemas``); 4xx/5xx responses use the
    OpenAI error object. ``streaming`` adds ``text/event-stream`` to the 200 response.
    """

    req_ref = _SchemaRef(request.__name__) if request else None
    resp_ref = _SchemaRef(response.__name__) if response else None
    err = _SchemaRef(ErrorResponse.__name__)

    class _Operation(Operation):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._document()

        def _document(self) -> None:
            if req_ref is not None:
                self.request_body = RequestBody(
                    content={"application/json": MediaType(schema=req_ref.ref())}, required=True)
            responses: dict[str, OpenAPIResponse | Reference] = {}
            if resp_ref is not None:
                content = {"application/json": MediaType(schema=resp_ref.ref())}
                if streaming:
                    content["text/event-stream"] = MediaType(schema={"type": "string"})  # type: ignore[arg-type]
                responses["200"] = OpenAPIResponse(description="Success", content=content)
            else:
                responses.update({k: v for k, v in (self.responses or {}).items() if k.startswith("2")})
            error_content = {"application/json": MediaType(schema=err.ref())}
            for status, text in (("400", "Invalid request"), ("401", "Missing or wrong API key"),
                                 ("404", "Unknown model or URL"), ("429", "Too many requests queued"),
                                 ("500", "Server error")):
                if request is None and status in ("400", "429"):
                    continue
                responses[status] = OpenAPIResponse(description=text, content=error_content)
            self.responses = responses

    _Operation.__name__ = f"{(request or response or Operation).__name__}Operation"
    return _Operation
