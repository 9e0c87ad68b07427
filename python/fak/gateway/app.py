"""The app factory: a Litestar app serving OpenAI's API over a ``fak.Engine`` or an upstream.

``create_app(engine=...)`` serves one engine (engine mode); ``create_app(upstream=Upstream(...))``
relays each protocol (chat completions, completions, Anthropic messages, responses) to an
upstream server that speaks it (proxy mode). Either way the app has the same
routes, errors, policy and metrics. The engine (or upstream) is injected, so tests pass a fake
engine and ``fak serve`` passes a real one; the app never closes an engine it was given.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from litestar import Litestar, Response
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin
from litestar.types import Message, Scope

from fak.gateway.admission import Admission
from fak.gateway.chat_completions.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
)
from fak.gateway.chat_completions.routes import create_chat_completion
from fak.gateway.completions.protocol import Completion, CompletionRequest
from fak.gateway.completions.routes import create_completion
from fak.gateway.engine_client import EngineLike, engine_tool_call_format
from fak.gateway.errors import APIError, ErrorResponse, exception_handlers
from fak.gateway.health.routes import Health, health
from fak.gateway.metrics import GatewayMetrics
from fak.gateway.messages.protocol import CountTokensRequest, CountTokensResponse, MessagesRequest
from fak.gateway.messages.protocol import Message as AnthropicMessage
from fak.gateway.messages.routes import count_message_tokens, create_message
from fak.gateway.metrics.routes import metrics
from fak.gateway.responses.protocol import ResponsesRequest
from fak.gateway.responses.routes import create_response, delete_response, retrieve_response
from fak.gateway.models.protocol import ModelCard, ModelList
from fak.gateway.models.routes import list_models, retrieve_model
from fak.gateway.policy_filter import AuditLike, PolicyLike
from fak.gateway.inline_reads import InlineReads
from fak.gateway.prefix_stats import PrefixCacheStats
from fak.gateway.quarantine_filter import QuarantineGate, quarantine_route
from fak.gateway.proxy import (
    ProxyChatServing,
    ProxyCompletionServing,
    Upstream,
    upstream_error,
)
from fak.gateway.schemas import component_schemas

__all__ = ["Gateway", "GatewayConfig", "create_app"]


@dataclass(frozen=True)
class GatewayConfig:
    """Settings of one gateway.

    Attributes:
        model_name: the model id clients must send (engine mode); default the engine's name.
        api_key: when set, ``/v1/*`` requires ``Authorization: Bearer <api_key>`` (else 401).
        max_concurrency: requests generating at once (the engine's ``max_batch``).
        max_queue: requests queued in the engine core beyond those; a request past
            ``max_concurrency + max_queue`` in flight gets 429 (``fak.gateway.admission``).
        tool_call_retries: extra samples of a forced tool call (``tool_choice`` ``"required"`` or
            named) whose first call does not fit the offered tools, before its text is returned
            as content.
        serve_inline_reads: answer a repeated read-only tool call from the conversation's earlier
            result and let the model continue (``fak.gateway.inline_reads``).
        tool_call_format: the form the model writes tool calls in (engine mode): ``None`` /
            ``"auto"`` decides it from the engine's chat template; ``"hermes"`` (JSON) or
            ``"qwen3_xml"`` (Qwen3-Coder) forces one (``fak.toolcalls.ToolCallFormat``).
        model_aliases: other model ids served as ``model_name`` (engine mode): agents that ask
            for their vendor's model names (Claude Code's ``claude-...``); ``"*"`` accepts any id.
        stream_headers_after_s: a stream whose first token is not there after this many seconds
            sends its status, headers and opening events at once (errors before then keep their
            HTTP status).
        stream_keepalive_s: a stream that sent nothing for this many seconds sends a keep-alive
            (an SSE comment, or Anthropic's ``ping`` event).
    """

    model_name: str | None = None
    api_key: str | None = None
    max_concurrency: int = 64
    max_queue: int = 256
    tool_call_retries: int = 2
    serve_inline_reads: bool = False
    tool_call_format: str | None = None
    model_aliases: tuple[str, ...] = ()
    stream_headers_after_s: float = 0.2
    stream_keepalive_s: float = 5.0


class Gateway:
    """Everything the routes need, kept in ``app.state.gateway``.

    Args:
        config: ``GatewayConfig``.
        engine: a ``fak.Engine`` (or a fake with the same contract) for engine mode.
        upstream: an ``Upstream`` for proxy mode (exactly one of ``engine``/``upstream``).
        policy: a ``fak.policy.Policy`` or ``None`` (no adjudication).
        audit: a ``fak.policy.AuditLog`` or ``None``.

    ``tool_call_format`` (engine mode) is the form the model writes tool calls in
    (``engine_tool_call_format``), ``None`` in proxy mode.

    Raises:
        ValueError: neither or both of ``engine`` and ``upstream``; an unknown
            ``config.tool_call_format``.
    """

    def __init__(self, config: GatewayConfig, *, engine: EngineLike | None = None, upstream: Upstream | None = None,
                 policy: PolicyLike | None = None, audit: AuditLike | None = None) -> None:
        if (engine is None) == (upstream is None):
            raise ValueError("give exactly one of engine= (engine mode) or upstream= (proxy mode)")
        self.config = config
        self.engine = engine
        self.upstream = upstream
        self.policy = policy
        self.audit = audit
        self.mode = "engine" if engine is not None else "proxy"
        self.tool_call_format = engine_tool_call_format(engine, config.tool_call_format) if engine is not None else None
        self.model_name = config.model_name or (getattr(engine, "model_name", None) if engine else None) or "fak"
        self.created = int(time.time())
        self.admission = Admission(config.max_concurrency, config.max_queue)
        adm = self.admission
        self.metrics = GatewayMetrics(engine.stats if engine is not None else None, in_flight=lambda: adm.in_flight)
        self.quarantine = QuarantineGate.from_policy(policy, audit=audit, registry=self.metrics.registry,
                                                     engine=engine)
        self.inline_reads = InlineReads() if config.serve_inline_reads and engine is not None else None
        #: prefix-cache hits per conversation (engine mode; ``/health`` ``prefix_cache``)
        self.prefix_stats = PrefixCacheStats() if engine is not None else None
        if engine is not None:
            from fak.gateway.chat_completions.serving import ChatServing
            from fak.gateway.completions.serving import CompletionServing
            from fak.gateway.messages.serving import MessagesServing
            from fak.gateway.responses.serving import ResponsesServing
            self.chat: Any = ChatServing(self)
            self.completions: Any = CompletionServing(self)
            self.messages: Any = MessagesServing(self)
            self.responses: Any = ResponsesServing(self)
        else:
            assert upstream is not None
            from fak.gateway.messages.proxy import ProxyMessagesServing
            from fak.gateway.responses.proxy import ProxyResponsesServing
            self.chat = ProxyChatServing(self, upstream)
            self.completions = ProxyCompletionServing(self, upstream)
            self.messages = ProxyMessagesServing(self, upstream)
            self.responses = ProxyResponsesServing(self, upstream)

    def check_model(self, name: str) -> None:
        """Raise a 404 ``model_not_found`` unless ``name`` is the served model or one of its
        ``model_aliases`` (engine mode)."""
        aliases = self.config.model_aliases
        if self.mode == "engine" and name != self.model_name and name not in aliases and "*" not in aliases:
            raise APIError(404, f"The model `{name}` does not exist. This server serves `{self.model_name}` "
                           "(GET /v1/models).", param="model", code="model_not_found")

    async def list_models(self) -> Response[Any]:
        """``/v1/models``: the served model, or the upstream's list."""
        if self.upstream is not None:
            resp = await self.upstream.send("GET", "/models")
            try:
                if resp.status_code != 200:
                    return upstream_error(resp, resp.content)
                return Response(resp.content, media_type="application/json")
            finally:
                await resp.aclose()
        return Response(ModelList(data=[self._card()]), media_type="application/json")

    def _card(self) -> ModelCard:
        n_ctx = int(self.engine.n_ctx)  # type: ignore[union-attr]
        return ModelCard(id=self.model_name, created=self.created, max_model_len=n_ctx, context_length=n_ctx)

    async def retrieve_model(self, model_id: str) -> Response[Any]:
        """``/v1/models/{model_id}``: the served model's card, or the upstream's answer.

        Raises:
            APIError: 404 ``model_not_found`` for another id (engine mode).
        """
        if self.upstream is not None:
            resp = await self.upstream.send("GET", "/models/" + quote(model_id, safe=""))
            try:
                if resp.status_code != 200:
                    return upstream_error(resp, resp.content)
                return Response(resp.content, media_type="application/json")
            finally:
                await resp.aclose()
        if model_id != self.model_name:
            raise APIError(404, f"The model `{model_id}` does not exist. This server serves `{self.model_name}` "
                           "(GET /v1/models).", param="model", code="model_not_found")
        return Response(self._card(), media_type="application/json")

    def health(self) -> Health:
        """``/health`` body."""
        if self.engine is None:
            return Health(status="ok", mode=self.mode, model=None)
        try:
            stats = dict(self.engine.stats())
        except Exception as exc:  # noqa: BLE001 - health must answer
            stats = {"error": f"{type(exc).__name__}: {exc}"}
        kv_total = stats.get("kv_blocks_total")
        block = int(getattr(self.engine, "kv_block_size", 32))
        return Health(status="ok", mode=self.mode, model=self.model_name, engine=stats,
                      context_window=int(self.engine.n_ctx),
                      kv_cache_tokens=int(kv_total) * block if isinstance(kv_total, int) else None,
                      prefix_cache=self.prefix_stats.summary() if self.prefix_stats is not None else None)

    async def aclose(self) -> None:
        """Release the upstream connection pool (the engine and the audit log belong to the caller)."""
        if self.upstream is not None:
            await self.upstream.aclose()


def _auth_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    gw: Gateway = connection.app.state.gateway
    key = gw.config.api_key
    if not key or not connection.url.path.startswith("/v1/"):
        return
    header = connection.headers.get("authorization", "")
    if not header and connection.headers.get("x-api-key"):  # Anthropic's SDKs send the key this way
        header = "Bearer " + connection.headers["x-api-key"]
    scheme, _sep, token = header.partition(" ")
    if not header:
        raise APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                       type="authentication_error", code="invalid_api_key")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "Incorrect API key provided.", type="authentication_error", code="invalid_api_key")


def create_app(config: GatewayConfig | None = None, *, engine: EngineLike | None = None,
               upstream: Upstream | None = None, policy: PolicyLike | None = None,
               audit: AuditLike | None = None, debug: bool = False) -> Litestar:
    """Build the gateway app.

    Args:
        config: ``GatewayConfig`` (defaults if ``None``).
        engine: engine for engine mode; ``upstream``: ``Upstream`` for proxy mode.
        policy: tool-call policy (``fak.policy.Policy``) or ``None``.
        audit: audit log (``fak.policy.AuditLog``) or ``None``.
        debug: Litestar debug mode (never tracebacks to clients: errors stay OpenAI-shaped).

    Returns:
        A Litestar ASGI app; ``app.state.gateway`` is its ``Gateway``.

    ``tool_call_format`` (engine mode) is the form the model writes tool calls in
    (``engine_tool_call_format``), ``None`` in proxy mode.

    Raises:
        ValueError: neither or both of ``engine`` and ``upstream``; an unknown
            ``config.tool_call_format``.
    """
    from fak import __version__

    gateway = Gateway(config or GatewayConfig(), engine=engine, upstream=upstream, policy=policy, audit=audit)

    async def count_response(message: Message, scope: Scope) -> None:
        if message["type"] == "http.response.start" and scope["type"] == "http":
            path = scope.get("path_template") or scope.get("path", "")
            gateway.metrics.count_request(path, int(message["status"]))

    async def shutdown() -> None:
        await gateway.aclose()

    schemas = component_schemas([ChatCompletionRequest, ChatCompletion, ChatCompletionChunk, CompletionRequest,
                                 Completion, ModelList, ModelCard, ErrorResponse, MessagesRequest, AnthropicMessage,
                                 CountTokensRequest, CountTokensResponse, ResponsesRequest])
    openapi = OpenAPIConfig(
        title="fak gateway", version=__version__,
        description="OpenAI- and Anthropic-compatible API served by fak, with every tool call adjudicated by a "
                    "policy.",
        path="/schema", render_plugins=[JsonRenderPlugin(), SwaggerRenderPlugin()],
    )
    app = Litestar(
        route_handlers=[create_chat_completion, create_completion, create_message, count_message_tokens,
                        create_response, retrieve_response, delete_response, list_models, retrieve_model, health,
                        metrics, quarantine_route],
        exception_handlers=exception_handlers(),
        guards=[_auth_guard],
        before_send=[count_response],
        on_shutdown=[shutdown],
        openapi_config=openapi,
        debug=debug,
        logging_config=None,
    )
    app.state.gateway = gateway
    # Litestar regenerates components.schemas from the handlers' signatures; the request/response
    # schemas come from msgspec (the decoder's own types), so add them to the built document.
    document = app.openapi_schema
    document.components.schemas = {**(document.components.schemas or {}), **schemas}  # type: ignore[dict-item]
    return app
