"""``GET /health``: liveness and a summary of the served model."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, get

__all__ = ["Health", "health"]


class Health(msgspec.Struct):
    """``status`` is ``"ok"`` while the gateway serves; ``engine`` holds ``Engine.stats()`` in engine
    mode, ``context_window`` the context window in tokens and ``kv_cache_tokens`` the KV cache's
    size in tokens (shared by all sequences)."""

    status: str
    mode: str
    model: str | None = None
    engine: dict[str, Any] | None = None
    context_window: int | None = None
    kv_cache_tokens: int | None = None
    #: prefix-cache hits, in total and per conversation (``PrefixCacheStats.summary``)
    prefix_cache: dict[str, Any] | None = None


@get("/health", summary="Health check", tags=["monitoring"])
async def health(request: Request) -> Health:
    """200 with the serving mode, the model and (engine mode) the engine's counters."""
    return request.app.state.gateway.health()
