"""Proxy mode of ``POST /v1/responses`` (and ``GET`` / ``DELETE /v1/responses/{id}``): OpenAI
Responses relayed to an upstream that speaks them (OpenAI, vLLM, llama.cpp's server, ...),
under the same policy and quarantine as chat completions.

The request is decoded with the engine mode's schema and its tool results (``*_output`` items)
screened (a withheld one is replaced in the forwarded body). The answer comes back through
``ResponsesRelay``:

- every call item (``function_call``, ``custom_tool_call``, ``local_shell_call``, ``shell_call``,
  ``apply_patch_call``) is adjudicated as the engine mode reads it
  (``fak.gateway.responses.tools.read_call``: the name and the arguments the policy sees); a
  denied one is replaced, at the same output index, by a ``message`` item holding the policy's
  note; ``fak_policy`` lists the verdicts (on the response, or on the stream event that carries a
  call or a note);
- in a stream, a call item's events (``response.output_item.added``, its arguments or input
  deltas and ``.done``, ``response.output_item.done``) are held until the item is done, then sent
  as they came or as the note's message item events; ``response.completed`` (``.incomplete``,
  ``.failed``) carries the same output; every event is renumbered (``sequence_number`` from 0,
  since events are added and removed);
- with ``X-Fak-Text-Tools: bash``, shell blocks in ``output_text`` are adjudicated as in engine
  mode;
- a stored response whose calls were denied keeps them upstream: the next request that names it in
  ``previous_response_id`` would leave those calls unanswered, so the relay answers each one
  with its ``*_output`` item holding the note (first in ``input``); ``GET /v1/responses/{id}``
  shows the notes in place of the denied calls.

With no policy and no text tools the upstream's bytes pass unchanged.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
from litestar import Request, Response

from fak.gateway.errors import APIError
from fak.gateway.policy_filter import AssistantOutputFilter, ContentOut, PolicyGate, RequestContext, denial_note
from fak.gateway.proxy import _ProxyServing, named_event, sse_events
from fak.gateway.responses.protocol import ResponsesRequest
from fak.gateway.responses.serving import input_messages
from fak.gateway.responses.tools import CALL_ITEMS, OUTPUT_ITEMS, read_call
from fak.gateway.schemas import decode_lenient

log = logging.getLogger("fak.gateway.proxy")

__all__ = ["ProxyResponsesServing", "ResponsesRelay"]

#: Responses whose denied calls are remembered for ``previous_response_id`` (LRU).
DENIED_REMEMBERED = 1024


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    item_id = "msg_fak" + secrets.token_hex(12)
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _policy(verdict: Any) -> dict[str, Any]:
    return {"verdicts": [msgspec.to_builtins(verdict)]}


class ResponsesRelay:
    """The policy over one Responses answer (see the module doc).

    Args:
        gate: the request's ``PolicyGate``.
        text_tools: adjudicate shell blocks in ``output_text`` (``X-Fak-Text-Tools: bash``).

    After the answer, ``denied`` maps each denied call's ``call_id`` to ``(the output item type
    that answers it, the note, the message item that replaced it)``.
    """

    def __init__(self, gate: PolicyGate, *, text_tools: bool) -> None:
        self.gate = gate
        self.text_tools = text_tools
        self.denied: dict[str, tuple[str, str, dict[str, Any]]] = {}
        self.response_id: str | None = None
        self._seq = 0
        self._held: dict[Any, list[tuple[str | None, dict[str, Any]]]] = {}
        self._filters: dict[str, AssistantOutputFilter] = {}
        self._texts: dict[str, str] = {}

    @property
    def active(self) -> bool:
        """Whether anything can change the upstream's answer."""
        return self.gate.active or self.text_tools

    # -- items

    def _decide(self, item: dict[str, Any]) -> tuple[bool, Any]:
        call_id, name, arguments = read_call(item)
        verdict = self.gate.decide(name, arguments, tool_call_id=call_id or None)
        allowed = verdict is None or verdict.allowed
        if verdict is not None and not allowed:
            note = denial_note(verdict.tool, verdict.reason, verdict.rule)
            self.denied[call_id] = (str(item.get("type")) + "_output", note, _message_item(note))
        return allowed, verdict

    def _filtered(self, text: str) -> tuple[str, list[Any]]:
        filt = AssistantOutputFilter(self.gate)
        events = filt.feed(text) + filt.finish()
        return "".join(e.text for e in events if isinstance(e, ContentOut)), [
            e.verdict for e in events if isinstance(e, ContentOut) and e.verdict is not None]

    def filter_output(self, output: list[Any], *, decide: bool = True) -> list[Any]:
        """``output`` with denied calls replaced by their notes (deciding each call when
        ``decide``, else only replacing those already in ``denied``) and, with text tools, shell
        blocks of ``output_text`` adjudicated."""
        out: list[Any] = []
        for item in output:
            if not isinstance(item, dict):
                out.append(item)
                continue
            if item.get("type") in CALL_ITEMS:
                call_id = str(item.get("call_id") or item.get("id") or "")
                if decide and call_id not in self.denied:
                    self._decide(item)
                out.append(self.denied[call_id][2] if call_id in self.denied else item)
            elif item.get("type") == "message" and self.text_tools and decide:
                parts = []
                for part in item.get("content") or []:
                    if isinstance(part, dict) and part.get("type") == "output_text":
                        key = str(item.get("id"))
                        text = self._texts[key] if key in self._texts else self._filtered(str(part.get("text") or ""))[0]
                        part = dict(part, text=text)
                    parts.append(part)
                out.append(dict(item, content=parts))
            else:
                out.append(item)
        return out

    def filter_response(self, data: dict[str, Any]) -> None:
        """Adjudicate a non-streamed ``response`` object in place."""
        self.response_id = data.get("id") if isinstance(data.get("id"), str) else None
        if isinstance(data.get("output"), list):
            data["output"] = self.filter_output(data["output"])

    # -- streams

    def _emit(self, event: str | None, obj: dict[str, Any]) -> bytes:
        if "sequence_number" in obj or event:
            obj["sequence_number"] = self._seq
            self._seq += 1
        return named_event(event, json.dumps(obj, ensure_ascii=False))

    def relay_event(self, event: str | None, data: str) -> list[bytes]:
        """One upstream event → the events to send (possibly none, possibly several)."""
        try:
            obj = json.loads(data)
        except ValueError:
            return [named_event(event, data)]
        if not isinstance(obj, dict):
            return [named_event(event, data)]
        kind = str(obj.get("type") or event or "")
        index = obj.get("output_index")
        if kind == "response.output_item.added" and isinstance(obj.get("item"), dict) \
                and obj["item"].get("type") in CALL_ITEMS and self.gate.active:
            self._held[index] = [(event, obj)]
            return []
        if index in self._held and kind != "response.output_item.done":
            self._held[index].append((event, obj))
            return []
        if kind == "response.output_item.done" and index in self._held:
            return self._release(index, self._held.pop(index), event, obj)
        if self.text_tools and kind.startswith("response.output_text."):
            return self._text_event(event, obj, kind)
        if self.text_tools and kind in ("response.content_part.done", "response.output_item.done"):
            self._fix_text(obj)
        if kind in ("response.completed", "response.incomplete", "response.failed") \
                and isinstance(obj.get("response"), dict):
            response = obj["response"]
            self.response_id = response.get("id") if isinstance(response.get("id"), str) else None
            if isinstance(response.get("output"), list):
                response["output"] = self.filter_output(response["output"], decide=False)
            if self.gate.active:
                response["fak_policy"] = {"verdicts": [msgspec.to_builtins(v) for v in self.gate.verdicts]}
        return [self._emit(event, obj)]

    def _text_event(self, event: str | None, obj: dict[str, Any], kind: str) -> list[bytes]:
        key = str(obj.get("item_id"))
        filt = self._filters.setdefault(key, AssistantOutputFilter(self.gate))
        if kind == "response.output_text.delta":
            events = filt.feed(str(obj.get("delta") or ""))
        elif kind == "response.output_text.done":
            events = filt.finish()
        else:
            return [self._emit(event, obj)]
        out: list[bytes] = []
        for e in events:
            if isinstance(e, ContentOut) and (e.text or e.verdict is not None):
                self._texts[key] = self._texts.get(key, "") + e.text
                delta = {"type": "response.output_text.delta", "item_id": key, "output_index": obj.get("output_index"),
                         "content_index": obj.get("content_index", 0), "delta": e.text, "logprobs": [],
                         "sequence_number": 0}
                if e.verdict is not None:
                    delta["fak_policy"] = _policy(e.verdict)
                out.append(self._emit("response.output_text.delta", delta))
        if kind == "response.output_text.done":
            obj["text"] = self._texts.get(key, "")
            out.append(self._emit(event, obj))
        return out

    def _fix_text(self, obj: dict[str, Any]) -> None:
        key = str(obj.get("item_id") or (obj.get("item") or {}).get("id"))
        if key not in self._texts:
            return
        if isinstance(obj.get("part"), dict):
            obj["part"]["text"] = self._texts[key]
        for part in (obj.get("item") or {}).get("content") or []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                part["text"] = self._texts[key]

    def _release(self, index: Any, held: list[tuple[str | None, dict[str, Any]]], event: str | None,
                 done: dict[str, Any]) -> list[bytes]:
        item: dict[str, Any] = done["item"] if isinstance(done.get("item"), dict) else held[0][1]["item"]
        allowed, verdict = self._decide(item)
        if allowed:
            if verdict is not None:
                held[0][1]["fak_policy"] = _policy(verdict)
            return [self._emit(e, o) for e, o in held] + [self._emit(event, done)]
        note, message = self.denied[str(item.get("call_id") or item.get("id") or "")][1:]
        at = {"item_id": message["id"], "output_index": index, "content_index": 0}
        part = message["content"][0]
        return [
            self._emit("response.output_item.added", {"type": "response.output_item.added", "output_index": index,
                                                      "item": _in_progress(message), "fak_policy": _policy(verdict)}),
            self._emit("response.content_part.added", {"type": "response.content_part.added", **at,
                                                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            self._emit("response.output_text.delta", {"type": "response.output_text.delta", **at, "delta": note,
                                                      "logprobs": []}),
            self._emit("response.output_text.done", {"type": "response.output_text.done", **at, "text": note,
                                                     "logprobs": []}),
            self._emit("response.content_part.done", {"type": "response.content_part.done", **at, "part": part}),
            self._emit("response.output_item.done", {"type": "response.output_item.done", "output_index": index,
                                                     "item": message}),
        ]

    def finish(self) -> list[bytes]:
        """The upstream stream ended: calls still held are dropped (never sent unadjudicated)."""
        self._held.clear()
        return []


def _in_progress(message: dict[str, Any]) -> dict[str, Any]:
    return dict(message, status="in_progress", content=[])


class ProxyResponsesServing(_ProxyServing):
    """Proxied ``/v1/responses`` and stored responses by id (see the module doc)."""

    path = "/responses"
    request_type = ResponsesRequest

    def __init__(self, gateway: Any, upstream: Any) -> None:
        super().__init__(gateway, upstream)
        #: response id → the denied calls' ``call_id → (output type, note, message item)``
        self.denied: OrderedDict[str, dict[str, tuple[str, str, dict[str, Any]]]] = OrderedDict()

    def _decode(self, body: bytes) -> Any:
        return decode_lenient(body, ResponsesRequest, what="/v1/responses")

    def _validate(self, req: Any) -> None:
        input_messages(req.input)  # the engine mode's checks (400s naming the item)

    def _context(self, request: Request[Any, Any, Any], req: Any) -> RequestContext:
        from fak.gateway.policy_filter import request_context

        first = [[m.role, m.content] for m in input_messages(req.input)[:2]]
        if req.instructions:
            first = [["system", req.instructions], *first[:1]]
        return request_context(request.headers, user=req.user or req.prompt_cache_key, first_messages=first)

    def _screen(self, req: Any, body: bytes, conversation: str) -> bytes:
        if self.gw.quarantine is None or isinstance(req.input, str):
            return body
        data = msgspec.json.decode(body)
        items = data.get("input") or []
        messages: list[dict[str, Any]] = []
        where: list[int] = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind in OUTPUT_ITEMS:
                from fak.gateway.responses.tools import output_text

                messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output_text(item)})
                where.append(i)
            elif kind in CALL_ITEMS:
                call_id, name, _ = read_call(item)
                messages.append({"role": "assistant", "content": None,
                                 "tool_calls": [{"id": call_id, "function": {"name": name}}]})
                where.append(-1)
        screening = self.gw.quarantine.screen(messages, conversation)
        if not screening.any:
            return body
        for k, decision in screening.withheld.items():
            items[where[k]]["output"] = decision.replacement
        return msgspec.json.encode(data)

    def _prepare_body(self, req: Any, body: bytes) -> bytes:
        """Answer the denied calls of ``previous_response_id`` (see the module doc)."""
        denied = self.denied.get(req.previous_response_id or "")
        if not denied:
            return body
        data = msgspec.json.decode(body)
        given = data.get("input")
        items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        answered = {str(i.get("call_id")) for i in items if isinstance(i, dict) and i.get("type") in OUTPUT_ITEMS}
        notes = [{"type": kind, "call_id": call_id, "output": note}
                 for call_id, (kind, note, _) in denied.items() if call_id not in answered]
        data["input"] = notes + items
        return msgspec.json.encode(data)

    def _relay_for(self, gate: PolicyGate, ctx: RequestContext) -> Any:
        return ResponsesRelay(gate, text_tools="bash" in ctx.text_tools)

    def _remember(self, relay: ResponsesRelay) -> None:
        if relay.denied and relay.response_id:
            self.denied[relay.response_id] = dict(relay.denied)
            self.denied.move_to_end(relay.response_id)
            while len(self.denied) > DENIED_REMEMBERED:
                self.denied.popitem(last=False)

    def _filter_whole(self, relay: Any, data: dict[str, Any]) -> None:
        relay.filter_response(data)
        self._remember(relay)

    async def _relay(self, resp: httpx.Response, relay: Any, done: Any) -> AsyncIterator[bytes]:
        try:
            async for event, data in sse_events(resp):
                if event in ("response.completed", "response.incomplete"):
                    try:
                        self._count_usage(json.loads(data))
                    except ValueError:
                        pass
                if not relay.active:
                    yield named_event(event, data)
                    continue
                for chunk in relay.relay_event(event, data):
                    yield chunk
                if event in ("response.completed", "response.incomplete", "response.failed"):
                    self._remember(relay)
            relay.finish()
        except Exception as exc:  # noqa: BLE001 - a failed or malformed upstream stream; held calls are dropped
            log.warning("relaying the upstream responses stream failed: %s", exc)
            error = {"type": "error", "code": "upstream_error", "param": None,
                     "message": f"The upstream stream failed ({type(exc).__name__})."}
            yield named_event("error", json.dumps(error))
        finally:
            await done()

    async def retrieve(self, response_id: str) -> Response[Any]:
        """``GET /v1/responses/{id}`` relayed, with the notes in place of calls the policy denied."""
        resp = await self.upstream.send("GET", "/responses/" + quote(response_id, safe=""))
        try:
            if resp.status_code != 200:
                return self._error(resp, resp.content)
            denied = self.denied.get(response_id)
            if not denied:
                return Response(resp.content, media_type="application/json")
            data = json.loads(resp.content)
            relay = ResponsesRelay(PolicyGate(None, None, RequestContext("")), text_tools=False)
            relay.denied = dict(denied)
            if isinstance(data, dict) and isinstance(data.get("output"), list):
                data["output"] = relay.filter_output(data["output"], decide=False)
            return Response(msgspec.json.encode(data), media_type="application/json")
        except ValueError:
            return self._fail(APIError(502, "The upstream server sent a body that is not JSON.",
                                       type="server_error", code="upstream_error"))
        finally:
            await resp.aclose()

    async def delete(self, response_id: str) -> Response[Any]:
        """``DELETE /v1/responses/{id}`` relayed."""
        resp = await self.upstream.send("DELETE", "/responses/" + quote(response_id, safe=""))
        try:
            if resp.status_code != 200:
                return self._error(resp, resp.content)
            self.denied.pop(response_id, None)
            return Response(resp.content, media_type="application/json")
        finally:
            await resp.aclose()
