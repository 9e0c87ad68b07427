"""``GET /metrics``: Prometheus text exposition of the gateway's registry."""

from __future__ import annotations

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["metrics"]


@get("/metrics", media_type=CONTENT_TYPE_LATEST, summary="Prometheus metrics", tags=["monitoring"],
     include_in_schema=True)
async def metrics(request: Request) -> Response[bytes]:
    """Requests, tokens, time to first token, time per output token, batch size, KV cache use,
    policy verdicts (Prometheus text format)."""
    body = request.app.state.gateway.metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
