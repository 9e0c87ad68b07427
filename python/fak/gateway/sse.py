"""Server-sent events in OpenAI's stream format: ``data: <json>\\n\\n`` ... ``data: [DONE]\\n\\n``."""

from __future__ import annotations

from typing import Any

import msgspec

from fak.gateway.errors import APIError

__all__ = ["DONE", "SSE_HEADERS", "sse_error", "sse_event"]

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_encoder = msgspec.json.Encoder()


def sse_event(obj: Any) -> bytes:
    """One ``data:`` event carrying ``obj`` as JSON (msgspec Struct, dict, ...)."""
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def sse_error(err: APIError) -> bytes:
    """An error event for a failure after the stream started (the status line is already sent).

    OpenAI's clients raise ``APIError`` on an event whose JSON has an ``error`` key.
    """
    return sse_event(err.body())
