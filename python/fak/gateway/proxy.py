"""Proxy mode: the same API in front of an upstream server, same policy.

``fak serve --base-url URL`` forwards ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/models`` to ``URL`` (an OpenAI base URL, ``.../v1``) with httpx; ``/v1/messages`` and
``/v1/responses`` are relayed by their own folders over the same flow
(``fak.gateway.messages.proxy``, ``fak.gateway.responses.proxy``: ``_ProxyServing`` and its
hooks, ``sse_events`` for streams with named events). Requests are validated
with the gateway's own schemas first (the same 400s as engine mode), then the client's body is
sent unchanged, with the upstream key (``--upstream-key``) instead of the client's.

Responses come back through the policy: every upstream tool call is adjudicated, a denied call
is removed and replaced by a note in the content, ``fak_policy`` lists the verdicts, and
``finish_reason`` ``"tool_calls"`` becomes ``"stop"`` when no call is left. Streams are relayed
event by event; when a policy is active, tool-call deltas are held until each call is complete
(the next call starts, or the choice finishes), then adjudicated and sent whole in one delta. With
no policy and no text tools the upstream's events pass through byte for byte.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import msgspec
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from fak.gateway.admission import Admission
from fak.gateway.chat_completions.protocol import ChatCompletionRequest
from fak.gateway.chat_completions.serving import (
    first_messages_key,
    validate_chat_request,
)
from fak.gateway.completions.protocol import CompletionRequest
from fak.gateway.completions.serving import prompt_of, validate_completion_request
from fak.gateway.disconnect import ClientDisconnected, run_until_disconnect
from fak.gateway.errors import APIError, error_response
from fak.gateway.policy_filter import (
    AssistantOutputFilter,
    ContentOut,
    PolicyGate,
    RequestContext,
    denial_note,
    request_context,
)
from fak.gateway.schemas import decode_body
from fak.gateway.sse import DONE, SSE_HEADERS, sse_error, sse_event

log = logging.getLogger("fak.gateway.proxy")

__all__ = ["PolicyRelay", "ProxyChatServing", "ProxyCompletionServing", "Upstream", "named_event", "sse_events",
           "upstream_error"]


class Upstream:
    """The upstream server: base URL, key, and one pooled ``httpx.AsyncClient``.

    Args:
        base_url: OpenAI base URL of the upstream (``http://host:port/v1``).
        api_key: sent as ``Authorization: Bearer`` to the upstream, or ``None``.
        timeout: seconds to connect; reads wait up to ``read_timeout`` between bytes.
        transport: an httpx transport (tests), else a network one.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 10.0,
                 read_timeout: float = 600.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._timeout = httpx.Timeout(read_timeout, connect=timeout)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The shared client (created on first use)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, transport=self._transport,
                                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._client

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def headers(self) -> dict[str, str]:
        """Headers of an upstream request."""
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def url(self, path: str) -> str:
        """``base_url`` + ``path`` (``/chat/completions``)."""
        return self.base_url + path

    async def send(self, method: str, path: str, body: bytes | None = None, *, stream: bool = False,
                   headers: dict[str, str] | None = None) -> httpx.Response:
        """Send one request; connection failures become 502/504 ``APIError``s. ``headers``
        replace or add to ``headers()`` (a value ``""`` removes that header)."""
        merged = {**self.headers(), **(headers or {})}
        req = self.client.build_request(method, self.url(path), content=body,
                                        headers={k: v for k, v in merged.items() if v})
        try:
            return await self.client.send(req, stream=stream)
        except httpx.TimeoutException as exc:
            raise APIError(504, f"The upstream server at {self.base_url} timed out ({type(exc).__name__}).",
                           type="server_error", code="upstream_timeout") from None
        except httpx.HTTPError as exc:
            raise APIError(502, f"The upstream server at {self.base_url} could not be reached ({exc!s}).",
                           type="server_error", code="upstream_unavailable") from None


def upstream_error(resp: httpx.Response, body: bytes, *, anthropic: bool = False) -> Response[Any]:
    """The upstream's error, passed through when it is OpenAI-shaped (or, ``anthropic``,
    Anthropic-shaped: ``{"type": "error", "error": {...}}``), else wrapped as a 502."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        if not anthropic or data.get("type") == "error":
            return Response(body, status_code=resp.status_code, media_type="application/json")
    text = body[:500].decode("utf-8", "replace")
    return error_response(APIError(502, f"The upstream server answered {resp.status_code}: {text}",
                                   type="server_error", code="upstream_error"), anthropic=anthropic)


def _content_tail(text: str) -> str:
    return text[-1:] if text else ""


@dataclass
class _PendingCall:
    id: str | None = None
    name: str = ""
    arguments: str = ""


@dataclass
class _ChoiceState:
    """Relay state of one choice index."""

    filt: AssistantOutputFilter | None
    calls: dict[int, _PendingCall] = field(default_factory=dict)
    current: int | None = None
    sent: int = 0
    seen: int = 0
    tail: str = ""
    any_content: bool = False


class PolicyRelay:
    """Applies the policy and text tools to upstream output, whole or streamed.

    Args:
        gate: the request's ``PolicyGate``.
        text_tools: adjudicate ```bash blocks in content.
    """

    def __init__(self, gate: PolicyGate, *, text_tools: bool) -> None:
        self.gate = gate
        self.text_tools = text_tools
        self._choices: dict[int, _ChoiceState] = {}
        self._envelope: dict[str, Any] = {}

    @property
    def active(self) -> bool:
        """Whether anything can change the upstream's output."""
        return self.gate.active or self.text_tools

    def _state(self, index: int) -> _ChoiceState:
        st = self._choices.get(index)
        if st is None:
            st = _ChoiceState(filt=AssistantOutputFilter(self.gate) if self.text_tools else None)
            self._choices[index] = st
        return st

    def _note(self, st: _ChoiceState, tool: str, reason: str, rule: str | None) -> str:
        note = denial_note(tool, reason, rule)
        if st.any_content and st.tail != "\n":
            note = "\n" + note
        st.tail, st.any_content = _content_tail(note), True
        return note

    # -- whole responses

    def filter_message(self, message: dict[str, Any], choice: dict[str, Any]) -> None:
        """Adjudicate a non-streamed ``choices[i].message`` in place."""
        st = self._state(int(choice.get("index", 0)))
        content = message.get("content")
        if isinstance(content, str) and st.filt is not None:
            events = st.filt.feed(content) + st.filt.finish()
            content = "".join(ev.text for ev in events if isinstance(ev, ContentOut))
        text = content if isinstance(content, str) else ""
        st.tail, st.any_content = _content_tail(text), bool(text)
        kept = []
        notes = []
        for tc in message.get("tool_calls") or []:
            fn = tc.get("function") or {}
            name, args = str(fn.get("name", "")), fn.get("arguments", "")
            verdict = self.gate.decide(name, args if isinstance(args, (str, dict)) else json.dumps(args),
                                       tool_call_id=tc.get("id"))
            if verdict is None or verdict.allowed:
                kept.append(tc)
            else:
                notes.append(self._note(st, name, verdict.reason, verdict.rule))
        if message.get("tool_calls"):
            if kept:
                message["tool_calls"] = kept
            else:
                message.pop("tool_calls", None)
                if choice.get("finish_reason") == "tool_calls":
                    choice["finish_reason"] = "stop"
        if notes:
            text += "".join(notes)
        if notes or st.filt is not None:
            message["content"] = text if (text or not kept) else None

    def filter_text_choice(self, choice: dict[str, Any]) -> None:
        """Text tools on a ``/v1/completions`` choice, in place."""
        st = self._state(int(choice.get("index", 0)))
        if st.filt is not None and isinstance(choice.get("text"), str):
            events = st.filt.feed(choice["text"]) + st.filt.finish()
            choice["text"] = "".join(ev.text for ev in events if isinstance(ev, ContentOut))

    # -- streams

    def _chunk(self, index: int, delta: dict[str, Any], verdicts: list[Any] | None = None) -> bytes:
        chunk = dict(self._envelope)
        chunk["choices"] = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]
        if "usage" in chunk:
            chunk["usage"] = None
        if verdicts:
            chunk["fak_policy"] = {"verdicts": [msgspec.to_builtins(v) for v in verdicts]}
        return sse_event(chunk)

    def _decide_pending(self, index: int, st: _ChoiceState, key: int) -> list[bytes]:
        call = st.calls.pop(key)
        st.seen += 1
        verdict = self.gate.decide(call.name, call.arguments, tool_call_id=call.id)
        if verdict is None or verdict.allowed:
            delta = {"tool_calls": [{"index": st.sent, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": call.arguments}}]}
            st.sent += 1
            return [self._chunk(index, delta, [verdict] if verdict else None)]
        return [self._chunk(index, {"content": self._note(st, call.name, verdict.reason, verdict.rule)}, [verdict])]

    def _flush_calls(self, index: int, st: _ChoiceState) -> list[bytes]:
        out = []
        for key in sorted(st.calls):
            out += self._decide_pending(index, st, key)
        st.current = None
        return out

    def _absorb_calls(self, index: int, st: _ChoiceState, deltas: list[dict[str, Any]]) -> list[bytes]:
        out: list[bytes] = []
        for tc in deltas:
            if not isinstance(tc, dict):
                continue
            raw_key = tc.get("index")
            tid = tc.get("id")
            key: int
            if isinstance(raw_key, int) and not isinstance(raw_key, bool):
                key = raw_key
            else:  # servers that omit the index: a new id (or none yet) starts a new call
                cur = st.calls.get(st.current) if st.current is not None else None
                if cur is not None and st.current is not None and (not tid or tid == cur.id):
                    key = st.current
                else:
                    key = max([*st.calls, st.current if st.current is not None else -1]) + 1
            if st.current is not None and key != st.current and st.current in st.calls:
                out += self._decide_pending(index, st, st.current)
            st.current = key
            call = st.calls.setdefault(key, _PendingCall())
            if tid:
                call.id = tid
            fn = tc.get("function") or {}
            name = fn.get("name")
            if name and name != call.name:
                call.name = name if not call.name else call.name + name
            args = fn.get("arguments")
            if isinstance(args, str):
                call.arguments += args
        return out

    def relay_event(self, data: str) -> list[bytes]:
        """One upstream ``data:`` payload → the events to send (possibly none, possibly several)."""
        try:
            chunk = json.loads(data)
        except ValueError:
            return [f"data: {data}\n\n".encode()]
        if not isinstance(chunk, dict) or "error" in chunk or not isinstance(chunk.get("choices"), list):
            return [f"data: {data}\n\n".encode()]
        self._envelope = {k: v for k, v in chunk.items() if k not in ("choices", "fak_policy")}
        before: list[bytes] = []
        verdicts: list[Any] = []
        keep_choices = []
        modified = False
        for choice in chunk["choices"]:
            if not isinstance(choice, dict):
                keep_choices.append(choice)
                continue
            index = int(choice.get("index", 0))
            st = self._state(index)
            delta = choice.get("delta") or {}
            if "text" in choice and st.filt is not None and isinstance(choice["text"], str):  # completions
                events = st.filt.feed(choice["text"])
                if choice.get("finish_reason"):
                    events += st.filt.finish()
                choice["text"] = "".join(ev.text for ev in events if isinstance(ev, ContentOut))
                verdicts += [ev.verdict for ev in events if isinstance(ev, ContentOut) and ev.verdict]
                modified = True
            if self.gate.active and delta.get("tool_calls"):
                before += self._absorb_calls(index, st, delta.pop("tool_calls"))
                modified = True
            content = delta.get("content")
            if isinstance(content, str) and st.filt is not None:
                events = st.filt.feed(content)
                delta["content"] = "".join(ev.text for ev in events if isinstance(ev, ContentOut))
                verdicts += [ev.verdict for ev in events if isinstance(ev, ContentOut) and ev.verdict]
                modified = True
            if choice.get("finish_reason"):
                if st.filt is not None and "text" not in choice:
                    tail = st.filt.finish()
                    text = "".join(ev.text for ev in tail if isinstance(ev, ContentOut))
                    vs = [ev.verdict for ev in tail if isinstance(ev, ContentOut) and ev.verdict]
                    if text or vs:
                        before.append(self._chunk(index, {"content": text}, vs))
                before += self._flush_calls(index, st)
                if choice["finish_reason"] == "tool_calls" and st.sent == 0:
                    choice["finish_reason"] = "stop"
                    modified = True
            c = delta.get("content")
            if isinstance(c, str) and c:
                st.tail, st.any_content = c[-1], True
            if "text" not in choice and not delta and not choice.get("finish_reason") and modified:
                continue  # everything in this choice's delta was held back
            if "text" in choice and not choice["text"] and not choice.get("finish_reason") and modified:
                continue
            if "delta" in choice:
                choice["delta"] = delta
            keep_choices.append(choice)
        if not modified:
            return before + [f"data: {data}\n\n".encode()]
        out = before
        if keep_choices or not chunk["choices"]:
            chunk["choices"] = keep_choices
            if verdicts:
                chunk["fak_policy"] = {"verdicts": [msgspec.to_builtins(v) for v in verdicts]}
            out.append(sse_event(chunk))
        return out

    def finish(self) -> list[bytes]:
        """Upstream stream ended: adjudicate whatever is still held."""
        out: list[bytes] = []
        for index, st in sorted(self._choices.items()):
            if st.filt is not None:
                tail = st.filt.finish()
                text = "".join(ev.text for ev in tail if isinstance(ev, ContentOut))
                vs = [ev.verdict for ev in tail if isinstance(ev, ContentOut) and ev.verdict]
                if text or vs:
                    out.append(self._chunk(index, {"content": text}, vs))
            out += self._flush_calls(index, st)
        return out


async def sse_events(resp: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    """The server-sent events of an upstream stream as ``(event name or None, data)``: ``data:``
    lines of one event joined by newlines (the SSE spec), comments and ``id:``/``retry:`` skipped."""
    event: str | None = None
    data: list[str] = []
    async for line in resp.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield event, "\n".join(data)


def named_event(event: str | None, data: str | bytes) -> bytes:
    """One server-sent event: ``event: NAME`` (when named) and ``data: ...``."""
    payload = data if isinstance(data, bytes) else data.encode()
    return (b"event: " + event.encode() + b"\n" if event else b"") + b"data: " + payload + b"\n\n"


class _ProxyServing:
    """Shared request flow of the proxied endpoints: decode and validate with the gateway's own
    schemas, build the policy context and gate, screen tool results (quarantine), take an
    admission slot, forward, and pass the answer (whole or streamed) through the protocol's
    policy relay. Subclasses set ``path`` and ``request_type`` and the hooks below."""

    path = ""
    request_type: type = ChatCompletionRequest
    #: errors take Anthropic's shape (``/v1/messages``)
    anthropic = False

    def __init__(self, gateway: Any, upstream: Upstream) -> None:
        self.gw = gateway
        self.upstream = upstream

    def _decode(self, body: bytes) -> Any:
        return decode_body(body, self.request_type)

    def _validate(self, req: Any) -> None:
        raise NotImplementedError

    def _context_key(self, req: Any) -> list[Any]:
        raise NotImplementedError

    def _context(self, request: Request[Any, Any, Any], req: Any) -> RequestContext:
        return request_context(request.headers, user=req.user, first_messages=self._context_key(req))

    def _screen(self, req: Any, body: bytes, conversation: str) -> bytes:
        """The body to forward: withheld tool results replaced (quarantine)."""
        if self.gw.quarantine is not None and getattr(req, "messages", None):
            return self.gw.quarantine.screen(req.messages, conversation).apply_raw(body)
        return body

    def _prepare_body(self, req: Any, body: bytes) -> bytes:
        """A last change to the forwarded body (the Responses relay answers denied calls)."""
        return body

    def _relay_for(self, gate: PolicyGate, ctx: RequestContext) -> Any:
        return PolicyRelay(gate, text_tools="bash" in ctx.text_tools)

    def _upstream_headers(self, request: Request[Any, Any, Any]) -> dict[str, str] | None:
        return None

    def _filter_whole(self, relay: Any, data: dict[str, Any]) -> None:
        raise NotImplementedError

    def _finish_whole(self, relay: Any, data: dict[str, Any]) -> None:
        """After ``_filter_whole`` with a policy: attach the verdicts."""
        data["fak_policy"] = {"verdicts": [msgspec.to_builtins(v) for v in relay.gate.verdicts]}

    def _error(self, resp: httpx.Response, body: bytes) -> Response[Any]:
        return upstream_error(resp, body, anthropic=self.anthropic)

    def _fail(self, err: APIError) -> Response[Any]:
        return error_response(err, anthropic=self.anthropic)

    async def handle(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Validate, forward, adjudicate, answer."""
        t0 = time.perf_counter()
        body = await request.body()
        req: Any = self._decode(body)
        self._validate(req)
        ctx = self._context(request, req)
        gate = PolicyGate(self.gw.policy, self.gw.audit, ctx, on_verdict=self.gw.metrics.count_verdict)
        relay = self._relay_for(gate, ctx)
        admission: Admission = self.gw.admission
        body = self._screen(req, body, ctx.conversation)  # withheld tool results never reach the upstream
        body = self._prepare_body(req, body)
        extra = self._upstream_headers(request)

        async def start() -> httpx.Response:
            admission.acquire()
            try:
                return await self.upstream.send("POST", self.path, body, stream=bool(req.stream), headers=extra)
            except BaseException:
                admission.release()
                raise

        try:
            resp = await run_until_disconnect(request, start())
        except ClientDisconnected:
            return Response(b"", status_code=499)
        released = False

        async def done() -> None:
            nonlocal released
            with anyio.CancelScope(shield=True):
                await resp.aclose()
                if not released:
                    released = True
                    admission.release()
                    self.gw.metrics.e2e.observe(time.perf_counter() - t0)

        if not req.stream:
            try:
                raw = resp.content
                if resp.status_code != 200:
                    return self._error(resp, raw)
                try:
                    data = json.loads(raw)
                except ValueError:
                    return self._fail(APIError(502, "The upstream server sent a body that is not JSON.",
                                               type="server_error", code="upstream_error"))
                self._count_usage(data)
                if relay.active and isinstance(data, dict):
                    try:
                        self._filter_whole(relay, data)
                    except Exception:  # noqa: BLE001 - never pass on what could not be adjudicated
                        log.exception("adjudicating the upstream response failed")
                        return self._fail(APIError(502, "The upstream sent a response the gateway could "
                                                   "not read.", type="server_error", code="upstream_error"))
                    if gate.active:
                        self._finish_whole(relay, data)
                    raw = msgspec.json.encode(data)
                return Response(raw, media_type="application/json")
            finally:
                await done()
        if resp.status_code != 200:
            try:
                raw = await resp.aread()
            finally:
                await done()
            return self._error(resp, raw)
        return Stream(self._relay(resp, relay, done), media_type="text/event-stream", headers=SSE_HEADERS,
                      background=BackgroundTask(done))

    def _count_usage(self, data: Any) -> None:
        usage = data.get("usage") if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(data.get("response"), dict):  # Responses' final event
            usage = data["response"].get("usage")
        if isinstance(usage, dict):
            pt = usage.get("prompt_tokens", usage.get("input_tokens"))
            ct = usage.get("completion_tokens", usage.get("output_tokens"))
            if isinstance(pt, int) and pt >= 0:
                self.gw.metrics.prompt_tokens.inc(pt)
            if isinstance(ct, int) and ct >= 0:
                self.gw.metrics.completion_tokens.inc(ct)

    async def _relay(self, resp: httpx.Response, relay: PolicyRelay, done: Any) -> AsyncIterator[bytes]:
        saw_done = False
        try:
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    for event in relay.finish():
                        yield event
                    saw_done = True
                    yield DONE
                    break
                if '"usage"' in data:
                    try:
                        self._count_usage(json.loads(data))
                    except ValueError:
                        pass
                if not relay.active:
                    yield f"data: {data}\n\n".encode()
                    continue
                for event in relay.relay_event(data):
                    yield event
            if not saw_done:
                for event in relay.finish():
                    yield event
        except httpx.HTTPError as exc:
            for event in relay.finish():
                yield event
            yield sse_error(APIError(502, f"The upstream stream failed: {exc!s}", type="server_error",
                                     code="upstream_error"))
            yield DONE
        except Exception as exc:  # noqa: BLE001 - a malformed upstream stream; held calls are dropped
            log.exception("relaying the upstream stream failed")
            yield sse_error(APIError(502, f"The upstream sent a stream the gateway could not relay "
                                          f"({type(exc).__name__}).", type="server_error", code="upstream_error"))
            yield DONE
        finally:
            await done()


class ProxyChatServing(_ProxyServing):
    """Proxied ``/v1/chat/completions``."""

    path = "/chat/completions"
    request_type = ChatCompletionRequest

    def _validate(self, req: Any) -> None:
        validate_chat_request(req)

    def _context_key(self, req: Any) -> list[Any]:
        return first_messages_key(req.messages)

    def _filter_whole(self, relay: PolicyRelay, data: dict[str, Any]) -> None:
        for choice in data.get("choices") or []:
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                relay.filter_message(choice["message"], choice)


class ProxyCompletionServing(_ProxyServing):
    """Proxied ``/v1/completions`` (text tools only: completions carry no tool calls)."""

    path = "/completions"
    request_type = CompletionRequest

    def _validate(self, req: Any) -> None:
        validate_completion_request(req)

    def _context_key(self, req: Any) -> list[Any]:
        prompt = prompt_of(req)
        return [prompt if isinstance(prompt, str) else prompt[:512]]

    def _filter_whole(self, relay: PolicyRelay, data: dict[str, Any]) -> None:
        for choice in data.get("choices") or []:
            if isinstance(choice, dict):
                relay.filter_text_choice(choice)
