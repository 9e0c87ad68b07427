"""Proxy mode of ``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic Messages
relayed to an upstream that speaks them (Anthropic's API, llama.cpp's server, vLLM, ...), under
the same policy and quarantine as chat completions.

The request is decoded and checked with the engine mode's own schema (the same 400s, in
Anthropic's shape), its ``tool_result`` blocks screened (a withheld result is replaced in the
forwarded body), and the client's body sent with the upstream key as ``x-api-key`` and the
client's ``anthropic-version`` / ``anthropic-beta`` headers. The answer comes back through
``MessagesRelay``:

- every ``tool_use`` block is adjudicated (``PolicyGate.decide(name, input, tool_call_id=id)``);
  a denied one is replaced, at the same index, by a ``text`` block holding the policy's note,
  and ``stop_reason`` ``tool_use`` becomes ``end_turn`` when no call is left; ``fak_policy``
  lists the verdicts (on the message, or on the stream event that carries a call or a note);
- in a stream, a ``tool_use`` block's events (``content_block_start``, its ``input_json_delta``
  pieces, ``content_block_stop``) are held until the block stops, then sent whole (start, one
  ``input_json_delta`` with the whole input, stop) or as the note's text block; every other event
  passes as it came (``message_start``, ``ping``, ``thinking`` blocks, ``error``);
- with ``X-Fak-Text-Tools: bash``, shell blocks in ``text`` blocks are adjudicated as in engine
  mode (``AssistantOutputFilter``).

With no policy and no text tools the upstream's bytes pass unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
from litestar import Request, Response

from fak.gateway.errors import APIError, anthropic_body
from fak.gateway.messages.protocol import CountTokensRequest, MessagesRequest
from fak.gateway.messages.serving import to_chat
from fak.gateway.policy_filter import AssistantOutputFilter, ContentOut, PolicyGate, RequestContext, denial_note
from fak.gateway.proxy import _ProxyServing, named_event, sse_events
from fak.gateway.schemas import decode_lenient

log = logging.getLogger("fak.gateway.proxy")

__all__ = ["MessagesRelay", "ProxyMessagesServing", "screened_messages"]

#: The client headers an Anthropic upstream reads, passed on as they came.
PASSED_HEADERS = ("anthropic-version", "anthropic-beta")


def screened_messages(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """The Messages body's turns as chat messages for the quarantine screen (``role``,
    ``content``, ``tool_call_id``, ``tool_calls``), and where each came from: ``(message index,
    block index)`` (block ``-1``: the turn's string content). A ``tool_result`` block is a
    ``tool`` message answering its ``tool_use_id``; an assistant turn's ``tool_use`` blocks give
    the tools' names."""
    out: list[dict[str, Any]] = []
    where: list[tuple[int, int]] = []
    for i, m in enumerate(data.get("messages") or []):
        if not isinstance(m, dict):
            continue
        role, content = m.get("role"), m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            where.append((i, -1))
            continue
        calls = []
        for j, b in enumerate(content if isinstance(content, list) else []):
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_result":
                inner = b.get("content")
                text = inner if isinstance(inner, str) else "\n".join(
                    str(p.get("text") or "") for p in inner or [] if isinstance(p, dict) and p.get("type") == "text")
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text})
                where.append((i, j))
            elif b.get("type") == "tool_use":
                calls.append({"id": b.get("id"), "function": {"name": b.get("name")}})
            elif b.get("type") == "text":
                out.append({"role": role, "content": b.get("text") or ""})
                where.append((i, j))
        if calls:
            out.append({"role": "assistant", "content": None, "tool_calls": calls})
            where.append((i, -2))
    return out, where


def _note(verdict: Any) -> str:
    return denial_note(verdict.tool, verdict.reason, verdict.rule)


def _policy(verdict: Any) -> dict[str, Any]:
    return {"verdicts": [msgspec.to_builtins(verdict)]}


@dataclass
class _Held:
    """A streamed ``tool_use`` block held until it stops."""

    start: dict[str, Any]
    partial: list[str] = field(default_factory=list)


class MessagesRelay:
    """The policy over one Messages answer (see the module doc).

    Args:
        gate: the request's ``PolicyGate``.
        text_tools: adjudicate shell blocks in text blocks (``X-Fak-Text-Tools: bash``).
    """

    def __init__(self, gate: PolicyGate, *, text_tools: bool) -> None:
        self.gate = gate
        self.text_tools = text_tools
        self.kept = 0
        self._held: dict[Any, _Held] = {}
        self._text: dict[Any, AssistantOutputFilter] = {}
        self._saw_call = False

    @property
    def active(self) -> bool:
        """Whether anything can change the upstream's answer."""
        return self.gate.active or self.text_tools

    def _filter(self) -> AssistantOutputFilter:
        return AssistantOutputFilter(self.gate)

    def _decide(self, block: dict[str, Any]) -> Any:
        args = block.get("input")
        return self.gate.decide(str(block.get("name") or ""), args if isinstance(args, dict) else {},
                                tool_call_id=block.get("id"))

    # -- whole answers

    def filter_message(self, data: dict[str, Any]) -> None:
        """Adjudicate a non-streamed ``Message`` in place."""
        content = data.get("content")
        if not isinstance(content, list):
            return
        out: list[Any] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self._saw_call = True
                verdict = self._decide(block)
                if verdict is None or verdict.allowed:
                    self.kept += 1
                    out.append(block)
                else:
                    out.append({"type": "text", "text": _note(verdict)})
            elif isinstance(block, dict) and block.get("type") == "text" and self.text_tools:
                filt = self._filter()
                events = filt.feed(str(block.get("text") or "")) + filt.finish()
                out.append(dict(block, text="".join(e.text for e in events if isinstance(e, ContentOut))))
            else:
                out.append(block)
        data["content"] = out
        if data.get("stop_reason") == "tool_use" and self._saw_call and not self.kept:
            data["stop_reason"] = "end_turn"

    # -- streams

    def relay_event(self, event: str | None, data: str) -> list[bytes]:
        """One upstream event → the events to send (possibly none, possibly several)."""
        try:
            obj = json.loads(data)
        except ValueError:
            return [named_event(event, data)]
        if not isinstance(obj, dict):
            return [named_event(event, data)]
        kind = obj.get("type")
        index = obj.get("index")
        if kind == "content_block_start" and isinstance(obj.get("content_block"), dict):
            block = obj["content_block"]
            if block.get("type") == "tool_use" and self.gate.active:
                self._held[index] = _Held(obj)
                return []
            if block.get("type") == "text" and self.text_tools:
                self._text[index] = self._filter()
        elif kind == "content_block_delta" and isinstance(obj.get("delta"), dict):
            if index in self._held:
                partial = obj["delta"].get("partial_json")
                if isinstance(partial, str):
                    self._held[index].partial.append(partial)
                return []
            if index in self._text and obj["delta"].get("type") == "text_delta":
                return self._text_out(index, self._text[index].feed(str(obj["delta"].get("text") or "")))
        elif kind == "content_block_stop":
            if index in self._held:
                return self._release(index, self._held.pop(index))
            if index in self._text:
                tail = self._text_out(index, self._text.pop(index).finish())
                return tail + [named_event(event, data)]
        elif kind == "message_delta" and isinstance(obj.get("delta"), dict):
            if obj["delta"].get("stop_reason") == "tool_use" and self._saw_call and not self.kept:
                obj["delta"]["stop_reason"] = "end_turn"
                return [named_event(event, json.dumps(obj, ensure_ascii=False))]
        return [named_event(event, data)]

    def _text_out(self, index: Any, events: list[Any]) -> list[bytes]:
        out = []
        for e in events:
            if not isinstance(e, ContentOut) or (not e.text and e.verdict is None):
                continue
            body: dict[str, Any] = {"type": "content_block_delta", "index": index,
                                    "delta": {"type": "text_delta", "text": e.text}}
            if e.verdict is not None:
                body["fak_policy"] = _policy(e.verdict)
            out.append(named_event("content_block_delta", json.dumps(body, ensure_ascii=False)))
        return out

    def _release(self, index: Any, held: _Held) -> list[bytes]:
        self._saw_call = True
        block = dict(held.start["content_block"])
        text = "".join(held.partial)
        try:
            args = json.loads(text) if text.strip() else block.get("input") or {}
        except ValueError:
            args = None
        if not isinstance(args, dict):  # a call whose input does not parse is never sent
            verdict = self.gate.decide(str(block.get("name") or ""), text, tool_call_id=block.get("id"))
            allowed = False
        else:
            block["input"] = args
            verdict = self._decide(block)
            allowed = verdict is None or verdict.allowed
        if allowed:
            self.kept += 1
            start = dict(held.start, content_block=dict(block, input={}))
            if verdict is not None:
                start["fak_policy"] = _policy(verdict)
            delta = {"type": "content_block_delta", "index": index,
                     "delta": {"type": "input_json_delta", "partial_json": json.dumps(args, ensure_ascii=False)}}
            return [named_event("content_block_start", json.dumps(start, ensure_ascii=False)),
                    named_event("content_block_delta", json.dumps(delta, ensure_ascii=False)),
                    named_event("content_block_stop", json.dumps({"type": "content_block_stop", "index": index}))]
        note = _note(verdict) if verdict is not None else "[fak policy] Tool call input did not parse."
        start = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        delta = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": note}}
        if verdict is not None:
            delta["fak_policy"] = _policy(verdict)
        return [named_event("content_block_start", json.dumps(start)),
                named_event("content_block_delta", json.dumps(delta, ensure_ascii=False)),
                named_event("content_block_stop", json.dumps({"type": "content_block_stop", "index": index}))]

    def finish(self) -> list[bytes]:
        """The upstream stream ended: held calls that never stopped are dropped (never sent
        unadjudicated); open text filters are flushed."""
        out: list[bytes] = []
        for index, filt in sorted(self._text.items()):
            out += self._text_out(index, filt.finish())
        self._text.clear()
        self._held.clear()
        return out


class ProxyMessagesServing(_ProxyServing):
    """Proxied ``/v1/messages`` and ``/v1/messages/count_tokens`` (see the module doc)."""

    path = "/messages"
    request_type = MessagesRequest
    anthropic = True

    def _decode(self, body: bytes) -> Any:
        return decode_lenient(body, MessagesRequest, what="/v1/messages")

    def _validate(self, req: Any) -> None:
        to_chat(req)  # the engine mode's checks (400s naming the field)

    def _context(self, request: Request[Any, Any, Any], req: Any) -> RequestContext:
        from fak.gateway.policy_filter import request_context

        chat, _ = to_chat(req)
        user = (req.metadata or {}).get("user_id")
        return request_context(request.headers, user=user if isinstance(user, str) and user else None,
                               first_messages=[[m.role, m.content] for m in chat.messages[:2]])

    def _screen(self, req: Any, body: bytes, conversation: str) -> bytes:
        if self.gw.quarantine is None:
            return body
        data = msgspec.json.decode(body)
        messages, where = screened_messages(data)
        screening = self.gw.quarantine.screen(messages, conversation)
        if not screening.any:
            return body
        for k, decision in screening.withheld.items():
            i, j = where[k]
            if j == -1:
                data["messages"][i]["content"] = decision.replacement
            elif j >= 0:
                block = data["messages"][i]["content"][j]
                block["content" if block.get("type") == "tool_result" else "text"] = decision.replacement
        return msgspec.json.encode(data)

    def _relay_for(self, gate: PolicyGate, ctx: RequestContext) -> Any:
        return MessagesRelay(gate, text_tools="bash" in ctx.text_tools)

    def _upstream_headers(self, request: Request[Any, Any, Any]) -> dict[str, str] | None:
        headers = {k: request.headers[k] for k in PASSED_HEADERS if k in request.headers}
        headers.setdefault("anthropic-version", "2023-06-01")
        key = self.upstream.api_key
        headers["Authorization"] = ""  # Anthropic's API authenticates by x-api-key
        if key:
            headers["x-api-key"] = key
        return headers

    def _filter_whole(self, relay: Any, data: dict[str, Any]) -> None:
        relay.filter_message(data)

    async def _relay(self, resp: httpx.Response, relay: Any, done: Any) -> AsyncIterator[bytes]:
        try:
            async for event, data in sse_events(resp):
                if '"usage"' in data:
                    try:
                        self._count_usage(json.loads(data))
                    except ValueError:
                        pass
                if not relay.active:
                    yield named_event(event, data)
                    continue
                for chunk in relay.relay_event(event, data):
                    yield chunk
            for chunk in relay.finish():
                yield chunk
        except Exception as exc:  # noqa: BLE001 - a failed or malformed upstream stream; held calls are dropped
            log.warning("relaying the upstream messages stream failed: %s", exc)
            err = APIError(502, f"The upstream stream failed ({type(exc).__name__}).", type="server_error",
                           code="upstream_error")
            yield named_event("error", json.dumps(anthropic_body(err)))
        finally:
            await done()

    async def count_tokens(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """``/v1/messages/count_tokens``, relayed as is (no tool calls to adjudicate)."""
        body = await request.body()
        req = decode_lenient(body, CountTokensRequest, what="/v1/messages/count_tokens")
        to_chat(req)
        resp = await self.upstream.send("POST", "/messages/count_tokens", body,
                                        headers=self._upstream_headers(request))
        try:
            if resp.status_code != 200:
                return self._error(resp, resp.content)
            return Response(resp.content, media_type="application/json")
        finally:
            await resp.aclose()

