"""Serving logic of ``POST /v1/responses`` (OpenAI Responses) in engine mode.

A thin protocol over the shared serving base (``fak.gateway.serving.EngineServing``): the
request's ``instructions`` and ``input`` items (after the stored conversation of
``previous_response_id``) become the canonical chat request, the base renders, adjudicates and
generates, and the answer is written as a ``response`` object — its ``output`` a ``message``
item (``output_text``) and one call item per kept tool call, of the type the tool was offered as
(``fak.gateway.responses.tools``) — or as the stream of ``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta`` / ``.done``, ``response.content_part.done``,
``response.function_call_arguments.delta`` / ``.done`` (``response.custom_tool_call_input.*`` for
custom tools), ``response.output_item.done``, then ``response.completed`` (or
``response.incomplete`` when the budget or the window ended it), every event with its
``sequence_number`` from 0. An error after the stream started is an ``error`` event followed by
``response.failed``.

Input items read: messages (``user`` / ``system`` / ``developer`` / ``assistant``, text parts;
image, file and audio parts are refused with a 400 naming the part), the call and result items of
the served tool types, ``reasoning`` items (their text becomes the next assistant turn's
reasoning, which a thinking template shows again after the last user query).

A thinking template's reasoning (``fak.gateway.reasoning``) comes back as a ``reasoning`` output
item (``content`` of ``reasoning_text``, no summary) before the message or calls, streamed as
``response.reasoning_text.delta`` / ``.done``; ``usage.output_tokens_details.reasoning_tokens``
counts its tokens; ``reasoning.effort: "none"`` turns thinking off (the template's
``enable_thinking``). ``tool_choice``: ``auto`` / ``none`` / ``required`` / ``{"type": "function" |
"custom", "name"}`` / ``{"type": "shell" | "local_shell" | "apply_patch"}`` /
``{"type": "allowed_tools", "mode"}`` (its mode). The conversation key of the policy is
``X-Fak-Conversation``, else ``user``, else ``prompt_cache_key`` (Codex sends its session id).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import msgspec
from litestar import Request, Response

from fak.gateway.chat_completions.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    NamedFunction,
    NamedToolChoice,
)
from fak.gateway.disconnect import ClientDisconnected
from fak.gateway.errors import APIError, bad_request
from fak.gateway.policy_filter import ContentOut, ToolCallOut, merge_content
from fak.gateway.responses.protocol import ResponsesRequest
from fak.gateway.responses.store import ResponseStore
from fak.gateway.responses.tools import (
    CALL_ITEMS,
    HOSTED_TOOL_TYPES,
    OUTPUT_ITEMS,
    ToolKinds,
    call_item,
    output_text,
    read_call,
)
from fak.gateway.schemas import decode_lenient, new_id, now
from fak.gateway.serving import EngineServing, Generation, Prepared, ReasoningOut
from fak.toolcalls.wire import FunctionCall, FunctionDefinition, Tool, ToolCall

log = logging.getLogger("fak.gateway")

__all__ = ["ResponsesServing", "input_messages", "to_chat"]

KEEPALIVE = b": keep-alive\n\n"
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_encoder = msgspec.json.Encoder()

_ITEM_PREFIX = {"function": "fc", "custom": "ctc", "shell": "sh", "apply_patch": "apc"}


def _hex_id(prefix: str) -> str:
    return new_id(prefix).replace("-", "_", 1)


def _parts_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of content parts.", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            texts.append(str(part.get("text") or part.get("refusal") or ""))
        elif kind in _MEDIA_PARTS:
            raise bad_request(f"Content part type {kind!r} is not supported by this model (text only).",
                              param=f"{where}.content[{j}].type", code="unsupported_content")
        else:
            raise bad_request(f"Content part type {kind!r} is not known.", param=f"{where}.content[{j}].type")
    return "\n".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[ChatMessage]:
    """The chat messages of a Responses ``input`` (see the module doc).

    Raises:
        APIError: 400 naming the item or part at fault (``input[2].content[0].type``).
    """
    if isinstance(items, str):
        return [ChatMessage(role="user", content=items)]
    out: list[ChatMessage] = []
    thought: list[str] = []  # reasoning items: the next assistant turn's reasoning

    def assistant(msg: ChatMessage) -> ChatMessage:
        if thought:
            msg.reasoning_content = "\n".join(thought)
            thought.clear()
        return msg

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request("An input item must be an object.", param=where)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"Unknown message role {role!r}.", param=f"{where}.role")
            msg = ChatMessage(role=role, content=_parts_text(item.get("content"), where))
            out.append(assistant(msg) if role == "assistant" else msg)
        elif kind in CALL_ITEMS:
            call_id, name, arguments = read_call(item)
            if not call_id or not name:
                raise bad_request(f"A {kind} item needs its call_id and name.", param=where)
            call = ToolCall(id=call_id, function=FunctionCall(name, arguments))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and not thought:
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                out.append(assistant(ChatMessage(role="assistant", content=None, tool_calls=[call])))
        elif kind in OUTPUT_ITEMS:
            answered: Any = item.get("call_id") or item.get("id")
            if not isinstance(answered, str) or not answered:
                raise bad_request(f"A {kind} item needs the call_id it answers.", param=f"{where}.call_id")
            out.append(ChatMessage(role="tool", tool_call_id=answered, content=output_text(item)))
        elif kind == "reasoning":
            parts = [p for p in (item.get("content") or item.get("summary") or []) if isinstance(p, dict)]
            text = "\n".join(str(p.get("text") or "") for p in parts).strip()
            if text:
                thought.append(text)
        elif kind == "compaction":
            continue
        else:
            raise bad_request(f"Input item type {kind!r} is not served (messages, function and custom tool calls, "
                              "shell, local_shell and apply_patch calls, their outputs, reasoning).",
                              param=f"{where}.type", code="unsupported_value")
    return out


def _tool_choice(choice: str | dict[str, Any] | None, kinds: ToolKinds) -> Any:
    if choice is None or isinstance(choice, str):
        if choice not in (None, "auto", "none", "required"):
            raise bad_request(f"Unknown tool_choice {choice!r}.", param="tool_choice")
        if choice == "required" and not kinds.tools:
            raise bad_request("tool_choice requires tools to be given.", param="tool_choice")
        return choice
    kind = choice.get("type")
    if kind == "allowed_tools":
        return _tool_choice(choice.get("mode") or "auto", kinds)
    if kind in ("function", "custom"):
        name = choice.get("name")
    elif kind in ("shell", "local_shell", "apply_patch"):
        name = kind
    else:
        code = "unsupported_tool_type" if kind in HOSTED_TOOL_TYPES else None
        raise bad_request(f"tool_choice type {kind!r} is not served.", param="tool_choice.type", code=code)
    if name not in kinds.by_name:
        raise bad_request(f"tool_choice names tool {name!r}, which is not among the tools "
                          f"{sorted(kinds.by_name)}.", param="tool_choice")
    return NamedToolChoice(function=NamedFunction(name=str(name)))


def to_chat(req: ResponsesRequest, history: list[ChatMessage], kinds: ToolKinds) -> ChatCompletionRequest:
    """The canonical chat request: ``instructions`` as the system turn, then ``history`` (the
    stored conversation and this request's input)."""
    messages = ([ChatMessage(role="system", content=req.instructions)] if req.instructions else []) + history
    if not messages:
        raise bad_request("input holds no item this model can read.", param="input")
    tools = [Tool(function=FunctionDefinition(name=t.name, description=t.function.get("description"),
                                              parameters=t.function.get("parameters")))
             for t in kinds.tools] or None
    effort = (req.reasoning or {}).get("effort")
    return ChatCompletionRequest(
        messages=messages, model=req.model, tools=tools, tool_choice=_tool_choice(req.tool_choice, kinds),
        parallel_tool_calls=req.parallel_tool_calls, max_tokens=req.max_output_tokens, temperature=req.temperature,
        top_p=req.top_p, top_k=req.top_k, seed=req.seed, user=req.user or req.prompt_cache_key,
        chat_template_kwargs={"enable_thinking": False} if effort == "none" else None)


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` output item holding the model's own reasoning text (``reasoning_text``
    content, as servers of open-weight models return it), no summary."""
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n"


class ResponsesServing(EngineServing):
    """Engine-mode OpenAI Responses (``/v1/responses``; stored ones by id).

    Args:
        gateway: the app's ``Gateway``.
        store: the ``ResponseStore`` of ``store: true`` responses (a fresh bounded one if ``None``).
    """

    clamp_budget = True
    prompt_param = "input"

    def __init__(self, gateway: Any, store: ResponseStore | None = None) -> None:
        super().__init__(gateway)
        self.store = store if store is not None else ResponseStore()

    def tool_param(self, index: int) -> str:
        """The request field of the ``index``-th tool's schema, for errors."""
        return f"tools[{index}].parameters"

    def max_tokens_of(self, req: ChatCompletionRequest) -> tuple[int | None, str]:
        """The client's budget (``max_output_tokens``)."""
        return req.max_tokens, "max_output_tokens"

    # -- requests

    async def handle(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Serve one ``POST /v1/responses`` (body not yet read)."""
        t_arrival = time.perf_counter()
        req = decode_lenient(await request.body(), ResponsesRequest, what="/v1/responses")
        if req.background:
            raise bad_request("background responses are not served; send the request and wait (or stream).",
                              param="background", code="unsupported_value")
        history: list[ChatMessage] = []
        if req.previous_response_id:
            prev = self.store.get(req.previous_response_id)
            if prev is None:
                raise bad_request(f"Previous response with id '{req.previous_response_id}' not found (never "
                                  "stored, or past the store's bounds).", param="previous_response_id",
                                  code="previous_response_not_found")
            history = list(prev.messages)
        history += input_messages(req.input)
        kinds = ToolKinds.from_request(req.tools)
        chat = to_chat(req, history, kinds)
        prep = await self.prepare(request, chat, kinds.client_tools() or None, t_arrival)
        rid, created = _hex_id("resp"), now()
        if req.stream:
            try:
                return await self.stream_response(
                    request, prep, lambda started: self._stream(prep, started, req, kinds, history, rid, created),
                    ping=KEEPALIVE, error_event=lambda err: self._failure(req, rid, created, err, [0]))
            except ClientDisconnected:
                return Response(b"", status_code=499)
        try:
            await self.start(request, prep)
            out = await self.complete_body(request, prep)
        except ClientDisconnected:
            return Response(b"", status_code=499)
        data = json.loads(out)
        msg = data["choices"][0]["message"]
        output: list[dict[str, Any]] = []
        if msg.get("reasoning_content"):
            output.append(_reasoning_item(_hex_id("rs"), msg["reasoning_content"]))
        if msg.get("content"):
            output.append(_message_item(_hex_id("msg"), msg["content"]))
        for tc in msg.get("tool_calls") or []:
            output.append(self._call_item(kinds, tc["id"], tc["function"]["name"], tc["function"]["arguments"]))
        usage = data.get("usage") or {}
        body = self._response(req, rid, created, output, prep.gen, int(usage.get("prompt_tokens") or 0),
                              int(usage.get("completion_tokens") or 0))
        if isinstance(data.get("fak_policy"), dict):
            body["fak_policy"] = data["fak_policy"]
        if isinstance(data.get("fak"), dict):
            body["fak"] = data["fak"]
        self._store(req, rid, history, output, body)
        return Response(_encoder.encode(body), media_type="application/json")

    async def retrieve(self, response_id: str) -> Response[Any]:
        """``GET /v1/responses/{id}``: a stored response. Raises APIError 404 when not held."""
        stored = self.store.get(response_id)
        if stored is None:
            raise APIError(404, f"No response with id '{response_id}' is stored here.", param="response_id",
                           code="not_found")
        return Response(_encoder.encode(stored.body), media_type="application/json")

    async def delete(self, response_id: str) -> Response[Any]:
        """``DELETE /v1/responses/{id}``. Raises APIError 404 when not held."""
        if not self.store.delete(response_id):
            raise APIError(404, f"No response with id '{response_id}' is stored here.", param="response_id",
                           code="not_found")
        return Response(_encoder.encode({"id": response_id, "object": "response.deleted", "deleted": True}),
                        media_type="application/json")

    # -- the response object

    def _call_item(self, kinds: ToolKinds, call_id: str, name: str, arguments: str,
                   status: str = "completed") -> dict[str, Any]:
        kind = kinds.kind_of(name)
        item_id = call_id if kind == "local_shell" else _hex_id(_ITEM_PREFIX.get(kind, "fc"))
        item = call_item(kind, item_id=item_id, call_id=call_id, name=name, arguments=arguments, status=status)
        if (space := kinds.namespace_of(name)) is not None:
            item["namespace"] = space
        return item

    def _response(self, req: ResponsesRequest, rid: str, created: int, output: list[dict[str, Any]],
                  gen: Generation | None, n_in: int, n_out: int, *, status: str | None = None) -> dict[str, Any]:
        incomplete = None
        if status is None:
            status = "completed"
            if gen is not None and gen.finish_reason == "length" and not any(
                    o["type"] not in ("message", "reasoning") for o in output):
                status = "incomplete"
                incomplete = {"reason": "max_output_tokens"}
        usage = None
        if status in ("completed", "incomplete"):
            n_reasoning = gen.n_reasoning if gen is not None else 0
            cached = (gen.cached_tokens if gen is not None else None) or 0
            usage = {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0}, "output_tokens": n_out,
                     "output_tokens_details": {"reasoning_tokens": n_reasoning}, "total_tokens": n_in + n_out}
        return {
            "id": rid, "object": "response", "created_at": created, "status": status, "error": None,
            "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "model": self.gw.model_name, "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id, "reasoning": req.reasoning,
            "store": req.store is not False, "temperature": req.temperature if req.temperature is not None else 1.0,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": req.tools or [],
            "top_p": req.top_p if req.top_p is not None else 1.0, "truncation": req.truncation or "disabled",
            "usage": usage, "user": req.user, "metadata": req.metadata or {},
        }

    def _store(self, req: ResponsesRequest, rid: str, history: list[ChatMessage], output: list[dict[str, Any]],
               body: dict[str, Any]) -> None:
        if req.store is False:
            return
        calls = [o for o in output if o["type"] not in ("message", "reasoning")]
        turn = input_messages(calls) if calls else []
        text = "".join(c["text"] for o in output if o["type"] == "message" for c in o["content"])
        thought = "".join(c["text"] for o in output if o["type"] == "reasoning" for c in o["content"])
        if turn:
            turn[0].content = text or None
        elif text or thought:
            turn = [ChatMessage(role="assistant", content=text)]
        if turn and thought:
            turn[0].reasoning_content = thought
        messages = history + turn
        n_bytes = len(_encoder.encode(body)) + sum(len(msgspec.json.encode(m)) for m in messages)
        self.store.put(rid, messages, body, n_bytes)

    def _failure(self, req: ResponsesRequest, rid: str, created: int, err: APIError, seq: list[int]) -> bytes:
        error = {"type": "error", "code": err.code, "message": err.message, "param": err.param,
                 "sequence_number": seq[0]}
        failed = self._response(req, rid, created, [], None, 0, 0, status="failed")
        failed["error"] = {"code": err.code or "server_error", "message": err.message}
        seq[0] += 1
        return _sse("error", error) + _sse("response.failed", {"type": "response.failed", "response": failed,
                                                               "sequence_number": seq[0]})

    # -- streaming

    async def _stream(self, prep: Prepared, started: Callable[[], Awaitable[None]], req: ResponsesRequest,
                      kinds: ToolKinds, history: list[ChatMessage], rid: str, created: int) -> AsyncIterator[bytes]:
        gen = prep.gen
        seq = [0]
        output: list[dict[str, Any]] = []
        msg: dict[str, Any] | None = None  # the open message item: id, index, text
        thought: dict[str, Any] | None = None  # the open reasoning item: id, index, text

        def ev(kind: str, **data: Any) -> bytes:
            data = {"type": kind, **data, "sequence_number": seq[0]}
            seq[0] += 1
            return _sse(kind, data)

        def close_msg() -> list[bytes]:
            nonlocal msg
            if msg is None:
                return []
            item = _message_item(msg["id"], msg["text"])
            at = {"item_id": msg["id"], "output_index": msg["index"], "content_index": 0}
            chunks = [ev("response.output_text.done", **at, text=msg["text"], logprobs=[]),
                      ev("response.content_part.done", **at, part=item["content"][0]),
                      ev("response.output_item.done", output_index=msg["index"], item=item)]
            output.append(item)
            msg = None
            return chunks

        def close_thought() -> list[bytes]:
            nonlocal thought
            if thought is None:
                return []
            item = _reasoning_item(thought["id"], thought["text"])
            chunks = [ev("response.reasoning_text.done", item_id=thought["id"], output_index=thought["index"],
                         content_index=0, text=thought["text"]),
                      ev("response.output_item.done", output_index=thought["index"], item=item)]
            output.append(item)
            thought = None
            return chunks

        def out(events: list[Any]) -> list[bytes]:
            nonlocal msg, thought
            chunks: list[bytes] = []
            for e in events:
                if isinstance(e, ReasoningOut):
                    if thought is None:
                        thought = {"id": _hex_id("rs"), "index": len(output), "text": ""}
                        chunks.append(ev("response.output_item.added", output_index=thought["index"],
                                         item={"type": "reasoning", "id": thought["id"], "summary": [],
                                               "content": []}))
                    thought["text"] += e.text
                    chunks.append(ev("response.reasoning_text.delta", item_id=thought["id"],
                                     output_index=thought["index"], content_index=0, delta=e.text))
                    continue
                chunks += close_thought()
                if isinstance(e, ContentOut):
                    if not e.text:
                        continue
                    if msg is None:
                        msg = {"id": _hex_id("msg"), "index": len(output), "text": ""}
                        chunks.append(ev("response.output_item.added", output_index=msg["index"],
                                         item=_message_item(msg["id"], "", status="in_progress")))
                        chunks.append(ev("response.content_part.added", item_id=msg["id"], output_index=msg["index"],
                                         content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
                    msg["text"] += e.text
                    extra = {"fak_policy": {"verdicts": [msgspec.to_builtins(e.verdict)]}} if e.verdict else {}
                    chunks.append(ev("response.output_text.delta", item_id=msg["id"], output_index=msg["index"],
                                     content_index=0, delta=e.text, logprobs=[], **extra))
                    continue
                chunks += close_msg()
                call = e.call
                item = self._call_item(kinds, call.id, call.name, call.arguments)
                index = len(output)
                added = dict(item, status="in_progress")
                if item["type"] == "function_call":
                    added["arguments"] = ""
                elif item["type"] == "custom_tool_call":
                    added["input"] = ""
                extra = {"fak_policy": {"verdicts": [msgspec.to_builtins(e.verdict)]}} if e.verdict else {}
                chunks.append(ev("response.output_item.added", output_index=index, item=added, **extra))
                if item["type"] == "function_call":
                    chunks.append(ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                     delta=item["arguments"]))
                    chunks.append(ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                     name=item["name"], arguments=item["arguments"]))
                elif item["type"] == "custom_tool_call":
                    chunks.append(ev("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index,
                                     delta=item["input"]))
                    chunks.append(ev("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                                     input=item["input"]))
                chunks.append(ev("response.output_item.done", output_index=index, item=item))
                output.append(item)
            return chunks

        try:
            opening = self._response(req, rid, created, [], None, 0, 0, status="in_progress")
            yield ev("response.created", response=opening) + ev("response.in_progress", response=opening)
            await started()
            async with aclosing(gen.groups()) as groups:
                async for events, _ in groups:
                    chunks = out(merge_content(events))
                    if chunks:
                        yield b"".join(chunks)
            tail = close_thought() + close_msg()
            final = self._response(req, rid, created, output, gen, prep.n_prompt, gen.n_completion)
            if prep.setup.gate.active:
                final["fak_policy"] = {"verdicts": [msgspec.to_builtins(v) for v in prep.setup.gate.verdicts]}
            if (error := gen.tool_call_error) is not None:  # a forced call no attempt wrote whole
                final["fak"] = {"tool_call_error": error}
            self._store(req, rid, history, output, final)
            kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
            tail.append(ev(kind, response=final))
            yield b"".join(tail)
        except APIError as err:
            yield self._failure(req, rid, created, err, seq)
        finally:
            await gen.aclose()
