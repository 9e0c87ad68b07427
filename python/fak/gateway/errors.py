"""OpenAI-shaped errors for the gateway.

Every error the gateway returns has the body OpenAI's API uses::

    {"error": {"message": str, "type": str, "param": str | null, "code": str | null}}

``APIError`` is raised by serving code; ``exception_handlers()`` maps it, Litestar's own
exceptions (validation, 404, 405, 413, ...) and anything unexpected to that shape, so no request
ever sees a traceback. Types and codes follow OpenAI's published error objects
(``invalid_request_error`` with codes such as ``context_length_exceeded``, ``model_not_found``;
401 ``invalid_api_key``; 429 ``rate_limit_exceeded``).

Requests to Anthropic's endpoints (``/v1/messages...``) get Anthropic's shape instead, with the
same status: ``{"type": "error", "error": {"type", "message"}}``, the type by status as
Anthropic's API documents it (400 ``invalid_request_error``, 401 ``authentication_error``, 403
``permission_error``, 404 ``not_found_error``, 413 ``request_too_large``, 429
``rate_limit_error``, 500 ``api_error``, 503/529 ``overloaded_error``); ``anthropic_shape``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap

log = logging.getLogger("fak.gateway")

__all__ = [
    "ANTHROPIC_PREFIX",
    "APIError",
    "ErrorBody",
    "anthropic_body",
    "anthropic_error_type",
    "ErrorResponse",
    "bad_request",
    "decode_error",
    "error_response",
    "exception_handlers",
]


class ErrorBody(msgspec.Struct):
    """The ``error`` object of an OpenAI error response."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct):
    """An OpenAI error response: ``{"error": {...}}``."""

    error: ErrorBody


class APIError(Exception):
    """An error to return to the client as an OpenAI error object.

    Args:
        status: HTTP status code (4xx for client errors, 5xx for server-side failures).
        message: human-readable text saying what was wrong and what to do.
        type: OpenAI error type (``invalid_request_error``, ``authentication_error``, ...).
        param: the request field at fault (``"messages[0].role"``) or ``None``.
        code: a machine-readable code (``context_length_exceeded``) or ``None``.
        headers: extra response headers (``Retry-After`` on 429).
    """

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        """The error as its response body."""
        return ErrorResponse(ErrorBody(self.message, self.type, self.param, self.code))


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 ``invalid_request_error``."""
    return APIError(400, message, param=param, code=code)


_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_FIELD = re.compile(r"(?:missing required field|unknown field) `(?P<name>[^`]+)`")


def decode_error(exc: msgspec.DecodeError) -> APIError:
    """Turn a msgspec decode/validation error into a 400 with ``param`` set.

    msgspec messages look like ``Expected `int`, got `str` - at `$.messages[0].max_tokens```;
    the ``$.a[0].b`` path becomes OpenAI's ``a[0].b`` param. Malformed JSON has no path.
    """
    text = str(exc)
    param: str | None = None
    match = _AT_PATH.search(text)
    if match:
        text = text[: match.start()]
        param = match.group("path").lstrip(".") or None
    field = _FIELD.search(text)
    if field:
        name = field.group("name")
        param = f"{param}.{name}" if param else name
    if isinstance(exc, msgspec.ValidationError):
        message = f"Invalid request: {text}" + (f" (at '{param}')" if param else "")
        return bad_request(message, param=param)
    return bad_request(f"We could not parse the JSON body of your request ({text}). "
                       "The body must be a single JSON object.", code="invalid_json")


#: Paths whose errors take Anthropic's shape (the Messages API and its sub-paths).
ANTHROPIC_PREFIX = "/v1/messages"

_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                    415: "invalid_request_error", 429: "rate_limit_error", 503: "overloaded_error",
                    529: "overloaded_error"}


def anthropic_error_type(status: int) -> str:
    """Anthropic's error ``type`` for an HTTP status (``api_error`` for other 5xx)."""
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_body(err: APIError) -> dict[str, Any]:
    """``err`` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}`` (the
    field at fault, when there is one, is named in the message)."""
    message = err.message
    if err.param and err.param not in message:
        message += f" (at '{err.param}')"
    return {"type": "error", "error": {"type": anthropic_error_type(err.status), "message": message}}


def error_response(err: APIError, *, anthropic: bool = False) -> Response[Any]:
    """Litestar response carrying ``err``'s body (OpenAI's shape, or Anthropic's), status and
    headers."""
    body: Any = anthropic_body(err) if anthropic else err.body()
    return Response(content=body, status_code=err.status, headers=err.headers, media_type="application/json")


def _anthropic(request: Request[Any, Any, Any]) -> bool:
    path = request.url.path
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


_STATUS_TYPES = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def _handle_api_error(request: Request[Any, Any, Any], exc: APIError) -> Response[Any]:
    return error_response(exc, anthropic=_anthropic(request))


def _handle_validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    # Litestar's own validation (path/query parameters, headers); bodies are decoded by the
    # gateway itself with msgspec's strict decoder, so this path is for everything else.
    param = None
    message = exc.detail
    if isinstance(exc.extra, list) and exc.extra:
        first = exc.extra[0]
        if isinstance(first, dict):
            param = first.get("key")
            message = f"{first.get('message', message)}" + (f" (at '{param}')" if param else "")
    return error_response(bad_request(f"Invalid request: {message}", param=param), anthropic=_anthropic(request))


def _handle_http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    etype, code = _STATUS_TYPES.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    if status == 404:
        message = f"Unknown request URL: {request.method} {request.url.path}. See /schema for the API."
    elif status == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
    else:
        message = exc.detail
    headers = dict(exc.headers or {})
    return error_response(APIError(status, message, type=etype, code=code, headers=headers),
                          anthropic=_anthropic(request))


def _handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(APIError(500, f"Internal server error ({type(exc).__name__}); see the gateway log.",
                                   type="server_error", code="internal_error"), anthropic=_anthropic(request))


def exception_handlers() -> ExceptionHandlersMap:
    """Litestar ``exception_handlers`` mapping every error to an OpenAI error object."""
    return {
        APIError: _handle_api_error,
        ValidationException: _handle_validation,
        HTTPException: _handle_http,
        Exception: _handle_unexpected,
    }
