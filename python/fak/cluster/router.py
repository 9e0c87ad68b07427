"""The replica router: one OpenAI-compatible endpoint in front of several ``fak serve`` replicas.

``create_router_app(Router([...]))`` is a Litestar app that relays ``/v1/chat/completions`` and
``/v1/completions`` to the replica ``fak.cluster.routing.Router`` picks, streams included, with
the request's own headers (``Authorization``, ``X-Fak-*``): the replicas authenticate, apply the
policy and write the audit records (each naming its replica: ``fak serve --replica-name``). Each
answer carries ``X-Fak-Replica`` (who answered) and ``X-Fak-Route`` (why it went there).

A replica whose connection fails (refused, reset, closed mid-answer) is marked down and the
request goes to another one; a non-streaming request that was cut mid-answer is sent again
(generation has no side effect but the audit record). A stream cut after its first bytes ends
with an OpenAI-style error event (``server_error``, code ``replica_unavailable``); with no live
replica left the answer is a 503 of that code. A replica that takes longer than 10 s to accept
the connection is loaded, not dead: the request tries another one and the replica stays up. A
health probe (``GET /health`` every ``probe_interval_s``) marks replicas down (refused, 5xx, or
three timeouts in a row with no answer to a request for 15 s) and up again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream

from fak.cluster.routing import NoReplicaError, Router, prompt_key
from fak.gateway.errors import APIError, exception_handlers

__all__ = ["RouterService", "create_router_app"]

log = logging.getLogger("fak.cluster.router")

#: request headers relayed to a replica (the rest are the hop's own)
PASSED_HEADERS = ("authorization", "content-type", "accept", "x-request-id")
#: response headers relayed back to the client
RETURNED_HEADERS = ("retry-after", "x-request-id")
#: connection failures that mark a replica down and move the request elsewhere (refused, reset,
#: closed mid-answer: aiohttp's ClientConnectionError family, and a malformed answer)
CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
#: health probes in a row that time out (5 s each) before a replica is marked down
PROBE_TIMEOUTS_DOWN = 3


def _unavailable(message: str) -> APIError:
    return APIError(503, message, type="server_error", code="replica_unavailable",
                    headers={"Retry-After": "1"})


def _sse_error(message: str) -> bytes:
    body = {"error": {"message": message, "type": "server_error", "param": None,
                      "code": "replica_unavailable"}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class RouterService:
    """The router's HTTP side: the client pool, relaying, health probes.

    The client is aiohttp's (one ``ClientSession``, its connector pooling per replica): httpx's
    pool (the gateway's proxy client) costs more per request the more connections it holds, and
    at 1,000 concurrent agents through the router that was the bound
    (``benches/results/router.md``).

    Args:
        router: the routing state (``fak.cluster.routing.Router``).
        read_timeout_s: seconds a replica may stay silent mid-answer (a long prefill counts).
        probe_interval_s: seconds between health probes of every replica (0: no probes).
    """

    def __init__(self, router: Router, *, read_timeout_s: float = 600.0,
                 probe_interval_s: float = 2.0) -> None:
        self.router = router
        self.probe_interval_s = probe_interval_s
        self._timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=read_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._probe: asyncio.Task[None] | None = None
        self.resent = 0  # requests sent to another replica after a connection failure
        self._probe_timeouts: dict[str, int] = {}
        self._answered: dict[str, float] = {}  # when each replica last began an answer (monotonic)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled session (made on first use, in the serving loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30))
        return self._session

    async def start(self) -> None:
        """Start the health probe (app start-up)."""
        if self.probe_interval_s > 0:
            self._probe = asyncio.create_task(self._probe_loop())

    async def aclose(self) -> None:
        """Stop the probe and close the pool (app shutdown)."""
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def probe_once(self) -> None:
        """``GET /health`` of every replica: a connection failure or a 5xx marks it down, any
        other answer marks it up (a server without ``/health`` answers 404 and is alive);
        ``PROBE_TIMEOUTS_DOWN`` probes in a row that time out mark it down (one alone is load)."""
        async def one(name: str, url: str) -> None:
            try:
                async with self.session.get(url + "/health",
                                            timeout=aiohttp.ClientTimeout(total=5.0)) as resp:
                    await resp.read()
                    ok = resp.status < 500
                    reason = f"health answered {resp.status}"
            except asyncio.TimeoutError:
                # busy or gone: a loaded replica answers late (and answers requests), a vanished
                # host never does
                if time.monotonic() - self._answered.get(name, 0.0) < 15.0:
                    self._probe_timeouts[name] = 0
                    return
                self._probe_timeouts[name] = self._probe_timeouts.get(name, 0) + 1
                if self._probe_timeouts[name] >= PROBE_TIMEOUTS_DOWN:
                    self.router.mark_down(name, f"{PROBE_TIMEOUTS_DOWN} health probes timed out")
                return
            except aiohttp.ClientError as exc:
                ok, reason = False, f"health probe failed ({type(exc).__name__})"
            self._probe_timeouts[name] = 0
            if ok:
                self.router.mark_up(name)
            else:
                self.router.mark_down(name, reason)

        await asyncio.gather(*(one(r.name, r.url) for r in list(self.router.replicas.values())))

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self.probe_once()
            except Exception:  # noqa: BLE001 - the probe must keep running
                log.exception("health probe")

    async def relay(self, request: Request[Any, Any, Any], path: str) -> Response[Any]:
        """Send one POST to the chosen replica and relay its answer (see the module docstring).

        Raises:
            APIError: 400 for a body that is not a JSON object; 503 ``replica_unavailable``
                when no live replica is left; 504 when a replica stays silent past the timeout.
        """
        body = await request.body()
        try:
            data = json.loads(body)
        except ValueError:
            raise APIError(400, "We could not parse the JSON body of your request. The body must "
                           "be a single JSON object.", code="invalid_json") from None
        if not isinstance(data, dict):
            raise APIError(400, "The body of your request must be a JSON object.", code="invalid_json")
        key = prompt_key(data)
        conversation = request.headers.get("x-fak-conversation") or None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in PASSED_HEADERS or k.lower().startswith("x-fak-")}
        tried: list[str] = []
        while True:
            try:
                replica, why = self.router.choose(key, conversation, exclude=tried)
            except NoReplicaError as exc:
                raise _unavailable(str(exc)) from None
            name = replica.name
            tried.append(name)
            try:
                resp = await self.session.post(replica.url + path, data=body, headers=headers)
            except asyncio.TimeoutError:  # first: aiohttp's connect timeout is also a connection error
                # slow to connect or to start answering is load, not death: try another replica
                # without marking this one down (the probe decides whether it is gone)
                self.router.done(name)
                self.resent += 1
                continue
            except CONNECTION_ERRORS as exc:
                self.router.done(name)
                self.router.mark_down(name, f"{type(exc).__name__} on {path}")
                log.warning("replica %s down (%s); request moves on", name, type(exc).__name__)
                self.resent += 1
                continue
            self._answered[name] = time.monotonic()
            out = {k: v for k, v in resp.headers.items() if k.lower() in RETURNED_HEADERS}
            out.update({"X-Fak-Replica": name, "X-Fak-Route": why})
            media = resp.headers.get("content-type", "application/json")
            if resp.status == 200 and media.startswith("text/event-stream"):
                return Stream(self._stream(resp, name), status_code=200, headers=out, media_type=media)
            try:
                content = await resp.read()
            except CONNECTION_ERRORS as exc:
                self.router.mark_down(name, f"{type(exc).__name__} mid-answer on {path}")
                log.warning("replica %s cut an answer (%s); sent again elsewhere", name,
                            type(exc).__name__)
                self.resent += 1
                continue
            except asyncio.TimeoutError:
                raise APIError(504, f"Replica {name} did not answer in time.", type="server_error",
                               code="upstream_timeout") from None
            finally:
                resp.release()
                self.router.done(name)
            return Response(content, status_code=resp.status, headers=out, media_type=media)

    async def _stream(self, resp: aiohttp.ClientResponse, name: str) -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.content.iter_any():
                yield chunk
        except (*CONNECTION_ERRORS, asyncio.TimeoutError) as exc:
            self.router.mark_down(name, f"{type(exc).__name__} mid-stream")
            yield _sse_error(f"Replica {name} failed mid-answer ({type(exc).__name__}); "
                             "send the request again.")
        finally:
            resp.release()
            self.router.done(name)

    async def get_any(self, path: str) -> Response[Any]:
        """``GET path`` from the first live replica (``/v1/models``), moving on when one fails."""
        for r in list(self.router.replicas.values()):
            if not r.up:
                continue
            try:
                async with self.session.get(r.url + path) as resp:
                    content = await resp.read()
                    return Response(content, status_code=resp.status,
                                    media_type=resp.headers.get("content-type", "application/json"),
                                    headers={"X-Fak-Replica": r.name})
            except CONNECTION_ERRORS as exc:
                self.router.mark_down(r.name, f"{type(exc).__name__} on {path}")
        raise _unavailable("no replica is up")


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    """Relay a chat completion (streamed or not) to the chosen replica."""
    return await request.app.state.service.relay(request, "/v1/chat/completions")


@post("/v1/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    """Relay a completion (streamed or not) to the chosen replica."""
    return await request.app.state.service.relay(request, "/v1/completions")


@get("/v1/models")
async def models(request: Request[Any, Any, Any]) -> Response[Any]:
    """The model list of a live replica (all serve the same model)."""
    return await request.app.state.service.get_any("/v1/models")


@get("/health")
async def health(request: Request[Any, Any, Any]) -> Response[Any]:
    """200 with each replica's state while one is up, else 503."""
    service = request.app.state.service
    snap = service.router.snapshot()
    up = any(r["up"] for r in snap["replicas"])
    return Response({"status": "ok" if up else "unavailable", "mode": "router", **snap,
                     "resent": service.resent},
                    status_code=200 if up else 503, media_type="application/json")


def create_router_app(router: Router, **service_kwargs: Any) -> Litestar:
    """The router app over ``router`` (``service_kwargs`` go to ``RouterService``);
    ``app.state.service`` is its ``RouterService``."""
    service = RouterService(router, **service_kwargs)
    app = Litestar(route_handlers=[chat_completions, completions, models, health],
                   exception_handlers=exception_handlers(), on_startup=[service.start],
                   on_shutdown=[service.aclose], logging_config=None, openapi_config=None)
    app.state.service = service
    return app
