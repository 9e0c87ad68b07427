"""Serving logic of ``POST /v1/messages`` (Anthropic Messages) in engine mode.

A thin protocol over the shared serving base (``fak.gateway.serving.EngineServing``): the
request becomes the canonical chat request (``to_chat``), the base renders, adjudicates and
generates, and the answer is written in Anthropic's form — one ``Message``, or the stream of
``message_start``, ``content_block_start`` / ``content_block_delta`` (``text_delta``,
``input_json_delta``) / ``content_block_stop``, ``message_delta`` (stop reason, usage),
``message_stop``, with ``ping`` events at the start and whenever the model is silent.

The request, read as Anthropic documents it:

- ``system`` (a string or text blocks) and ``system`` turns inside ``messages`` become the
  template's system text; blocks that open with ``x-anthropic-billing-header:`` (Claude Code
  sends one per request, with a ``cch=`` value that changes every time) are left out, so the
  system prompt, and the prefix cache behind it, stays the same across requests;
- ``user`` turns: ``text`` blocks are the user's text; each ``tool_result`` becomes a tool
  message answering its ``tool_use_id`` (its text blocks joined; an image inside one is replaced
  by a short note, since the model reads text); ``image`` / ``document`` blocks of the user are
  refused (400 naming the block), as chat completions refuse image parts;
- ``assistant`` turns: ``text`` blocks and ``tool_use`` blocks (calls with their ``input``);
  ``thinking`` blocks become the turn's reasoning (a thinking template shows it again in the
  turns after the last user query; others ignore it), ``redacted_thinking`` is dropped;
- ``tools`` with ``input_schema`` are offered as functions; Anthropic's own tool types
  (``web_search_20250305``, ``code_execution_...``: no ``input_schema``) are refused with a 400
  naming the type; ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` are the chat
  ``auto`` / ``required`` / named / ``none`` (forced calls as in ``fak.gateway.serving``), and
  ``disable_parallel_tool_use`` keeps the first call;
- ``max_tokens`` is a ceiling cut to the context window's room; ``stop_sequences``,
  ``temperature``, ``top_p``, ``top_k``; ``thinking`` (``enabled`` / ``disabled`` become the
  template's ``enable_thinking``) and ``metadata`` (``metadata.user_id`` keys the policy's
  conversation without ``X-Fak-Conversation``).

A thinking template's reasoning (``fak.gateway.reasoning``) comes back as a ``thinking`` block
before the answer (``signature`` empty: a local model signs nothing), streamed as
``thinking_delta`` events.

Stop reasons: ``end_turn``, ``tool_use`` (calls kept after the policy), ``stop_sequence`` (with
the string), ``max_tokens``, and ``model_context_window_exceeded`` when the window, not the
client's budget, ended the answer. Denied calls are replaced by the policy's note in a text
block; ``fak_policy`` carries the verdicts (on the message, or on the stream's events that
carry a call or a note).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import anyio
import msgspec
from litestar import Request, Response

from fak.gateway.chat_completions.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    NamedFunction,
    NamedToolChoice,
)
from fak.gateway.disconnect import ClientDisconnected
from fak.gateway.errors import APIError, anthropic_body, bad_request
from fak.gateway.messages.protocol import (
    ContentBlock,
    CountTokensRequest,
    CountTokensResponse,
    InputMessage,
    Message,
    MessagesRequest,
    MessageUsage,
)
from fak.gateway.policy_filter import ContentOut, ToolCallOut, merge_content
from fak.gateway.schemas import decode_lenient, new_id
from fak.gateway.serving import EngineServing, Generation, Prepared, ReasoningOut
from fak.toolcalls.wire import FakPolicyInfo, FunctionCall, FunctionDefinition, Tool, ToolCall

log = logging.getLogger("fak.gateway")

__all__ = [
    "BILLING_HEADER",
    "MessagesServing",
    "anthropic_event",
    "message_from_chat",
    "message_usage",
    "stop_reason_of",
    "to_chat",
]

#: The opening of Claude Code's per-request billing block of the system prompt (left out).
BILLING_HEADER = "x-anthropic-billing-header:"
#: What the model reads in place of an image inside a tool result.
IMAGE_NOTE = "[image omitted: this model reads text only]"
#: Content block types of a user turn that this text model cannot read.
_MEDIA = frozenset({"image", "document", "search_result", "container_upload"})

_encoder = msgspec.json.Encoder()


def anthropic_event(event: str, data: Any) -> bytes:
    """One server-sent event in Anthropic's form: ``event: NAME`` then ``data: JSON``."""
    return b"event: " + event.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n"


PING = anthropic_event("ping", {"type": "ping"})


def _error_event(err: APIError) -> bytes:
    return anthropic_event("error", anthropic_body(err))


def _text_blocks(content: str | list[ContentBlock], where: str) -> str:
    """The text of a system turn (a string, or text blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    for j, b in enumerate(content):
        if b.type != "text":
            raise bad_request(f"A system turn holds text blocks only, not {b.type!r}.",
                              param=f"{where}[{j}].type", code="unsupported_content")
        parts.append(b.text or "")
    return "\n".join(parts)


def _tool_result_text(block: ContentBlock) -> str:
    content = block.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for b in content:
        if b.type == "text":
            parts.append(b.text or "")
        elif b.type in _MEDIA:
            parts.append(IMAGE_NOTE if b.type == "image" else f"[{b.type} omitted: this model reads text only]")
    return "\n".join(parts)


def _system_text(system: str | list[ContentBlock] | None) -> list[str]:
    if system is None:
        return []
    if isinstance(system, str):
        return [system] if system else []
    out = []
    for i, b in enumerate(system):
        if b.type != "text":
            raise bad_request(f"system holds text blocks only, not {b.type!r}.", param=f"system[{i}].type",
                              code="unsupported_content")
        text = b.text or ""
        if text.lstrip().lower().startswith(BILLING_HEADER):
            continue  # volatile per request: it would break the cached prefix (see the module doc)
        out.append(text)
    return out


def _turns(messages: list[InputMessage], system: list[str]) -> list[ChatMessage]:
    """Anthropic turns → chat messages; leading system turns join ``system`` (mutated)."""
    out: list[ChatMessage] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role == "system":
            text = _text_blocks(m.content, f"{where}.content")
            if not out:
                system.append(text)
            else:
                out.append(ChatMessage(role="system", content=text))
            continue
        if isinstance(m.content, str):
            out.append(ChatMessage(role=m.role, content=m.content))
            continue
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[ToolCall] = []
        for j, b in enumerate(m.content):
            at = f"{where}.content[{j}]"
            if b.type == "text":
                texts.append(b.text or "")
            elif b.type == "thinking":
                if m.role == "assistant" and b.thinking:
                    thoughts.append(b.thinking)
            elif b.type == "redacted_thinking":
                continue
            elif m.role == "user" and b.type == "tool_result":
                if not b.tool_use_id:
                    raise bad_request("A tool_result block needs the tool_use_id it answers.",
                                      param=f"{at}.tool_use_id")
                if texts:  # text before a result stays before it
                    out.append(ChatMessage(role="user", content="\n".join(texts)))
                    texts = []
                out.append(ChatMessage(role="tool", tool_call_id=b.tool_use_id, content=_tool_result_text(b)))
            elif m.role == "assistant" and b.type == "tool_use":
                if not b.id or not b.name:
                    raise bad_request("A tool_use block needs its id and name.", param=at)
                arguments = json.dumps(b.input if isinstance(b.input, dict) else {}, ensure_ascii=False)
                calls.append(ToolCall(id=b.id, function=FunctionCall(b.name, arguments)))
            elif b.type in _MEDIA:
                raise bad_request(f"Content block type {b.type!r} is not supported by this model (text only).",
                                  param=f"{at}.type", code="unsupported_content")
            else:
                raise bad_request(f"Content block type {b.type!r} is not served in a {m.role} turn.",
                                  param=f"{at}.type", code="unsupported_content")
        if m.role == "assistant":
            if texts or calls:
                out.append(ChatMessage(role="assistant", content="".join(texts) if texts or not calls else None,
                                       tool_calls=calls or None, reasoning_content="\n".join(thoughts) or None))
        elif texts:
            out.append(ChatMessage(role="user", content="\n".join(texts)))
    return out


def _tools(req: CountTokensRequest | MessagesRequest) -> tuple[list[Tool] | None, list[dict[str, Any]] | None]:
    if not req.tools:
        return None, None
    tools: list[Tool] = []
    client: list[dict[str, Any]] = []
    for i, t in enumerate(req.tools):
        if t.type not in (None, "custom") and t.input_schema is None:
            raise bad_request(f"Tool type {t.type!r} is one of Anthropic's server or built-in tools, which this "
                              "server does not run; offer it as a custom tool with an input_schema.",
                              param=f"tools[{i}].type", code="unsupported_tool_type")
        schema = t.input_schema if t.input_schema is not None else {"type": "object", "properties": {}}
        fn: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            fn["description"] = t.description
        fn["parameters"] = schema
        client.append({"type": "function", "function": fn})
        tools.append(Tool(function=FunctionDefinition(name=t.name, description=t.description, parameters=schema)))
    return tools, client


def to_chat(req: MessagesRequest | CountTokensRequest) -> tuple[ChatCompletionRequest, list[dict[str, Any]] | None]:
    """The canonical chat request of a Messages request, and its tools in OpenAI's form (only the
    client's fields). See the module doc for the mapping.

    Raises:
        APIError: 400 naming the field at fault (a media block, an unserved tool type, a
            ``tool_choice`` naming a tool that was not offered, an empty stop sequence).
    """
    system = _system_text(req.system)
    turns = _turns(req.messages, system)
    messages = ([ChatMessage(role="system", content="\n\n".join(system))] if system else []) + turns
    if not messages:
        raise bad_request("messages holds no turn this model can read.", param="messages")
    tools, client_tools = _tools(req)
    choice: Any = None
    parallel: bool | None = None
    tc = req.tool_choice
    if tc is not None:
        if tc.type != "none" and tc.type != "auto" and not tools:
            raise bad_request("tool_choice requires tools to be given.", param="tool_choice")
        if tc.type == "tool":
            names = [t.function.name for t in tools or []]
            if not tc.name or tc.name not in names:
                raise bad_request(f"tool_choice names tool {tc.name!r}, which is not among the tools {names}.",
                                  param="tool_choice.name")
            choice = NamedToolChoice(function=NamedFunction(name=tc.name))
        else:
            choice = {"auto": "auto", "any": "required", "none": "none"}[tc.type]
        if tc.disable_parallel_tool_use:
            parallel = False
    chat = ChatCompletionRequest(messages=messages, model=req.model, tools=tools, tool_choice=choice,
                                 parallel_tool_calls=parallel)
    if isinstance(req, MessagesRequest):
        for i, s in enumerate(req.stop_sequences or []):
            if not s:
                raise bad_request("A stop sequence must not be empty.", param=f"stop_sequences[{i}]")
        user = (req.metadata or {}).get("user_id")
        chat.max_tokens = req.max_tokens
        chat.temperature = req.temperature
        chat.top_p = req.top_p
        chat.top_k = req.top_k
        chat.stop = list(req.stop_sequences) if req.stop_sequences else None
        chat.user = user if isinstance(user, str) and user else None
        kind = (req.thinking or {}).get("type")
        if kind in ("enabled", "disabled"):  # Anthropic's switch → the template's (Qwen3's enable_thinking)
            chat.chat_template_kwargs = {"enable_thinking": kind == "enabled"}
    return chat, client_tools


def stop_reason_of(finish: str | None, *, has_calls: bool, stop_sequence: str | None, window_cut: bool) -> str:
    """Anthropic's ``stop_reason`` of a generation (see the module doc)."""
    if has_calls:
        return "tool_use"
    if finish == "length":
        return "model_context_window_exceeded" if window_cut else "max_tokens"
    if stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def _tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def message_usage(n_prompt: int, n_output: int, cached: int | None) -> MessageUsage:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens the prefix cache did not hold,
    ``cache_read_input_tokens`` those it held (so the three input counts add up to the prompt, as
    Anthropic's do); ``cache_creation_input_tokens`` 0 (fak caches every prompt without being
    asked)."""
    if cached is None:
        return MessageUsage(n_prompt, n_output)
    return MessageUsage(n_prompt - cached, n_output, cache_creation_input_tokens=0, cache_read_input_tokens=cached)


def message_from_chat(data: dict[str, Any], gen: Generation, model: str) -> Message:
    """The ``Message`` of a finished generation, from the base's ``ChatCompletion`` (decoded)."""
    choice = data["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    calls = msg.get("tool_calls") or []
    for tc in calls:
        fn = tc["function"]
        content.append({"type": "tool_use", "id": tc["id"], "name": fn["name"], "input": _tool_input(fn["arguments"])})
    usage = data.get("usage") or {}
    stop = stop_reason_of(gen.finish_reason, has_calls=bool(calls), stop_sequence=gen.stop_sequence,
                          window_cut=gen.window_cut)
    out = Message(id=new_id("msg").replace("-", "_", 1), model=model, content=content, stop_reason=stop,
                  stop_sequence=gen.stop_sequence if stop == "stop_sequence" else None,
                  usage=message_usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                                      gen.cached_tokens))
    if isinstance(data.get("fak_policy"), dict):
        out.fak_policy = msgspec.convert(data["fak_policy"], type=FakPolicyInfo)
    if isinstance(data.get("fak"), dict):
        out.fak = data["fak"]
    return out


class MessagesServing(EngineServing):
    """Engine-mode Anthropic Messages (``/v1/messages``, ``/v1/messages/count_tokens``)."""

    clamp_budget = True

    def tool_param(self, index: int) -> str:
        """The request field of the ``index``-th tool's schema, for errors."""
        return f"tools[{index}].input_schema"

    async def handle(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Serve one ``POST /v1/messages`` (body not yet read)."""
        t_arrival = time.perf_counter()
        req = decode_lenient(await request.body(), MessagesRequest, what="/v1/messages")
        chat, client_tools = to_chat(req)
        prep = await self.prepare(request, chat, client_tools, t_arrival)
        if req.stream:
            try:
                return await self.stream_response(request, prep, lambda started: self._stream(prep, started),
                                                  ping=PING, error_event=_error_event)
            except ClientDisconnected:
                return Response(b"", status_code=499)
        try:
            await self.start(request, prep)
            out = await self.complete_body(request, prep)
        except ClientDisconnected:
            return Response(b"", status_code=499)
        message = message_from_chat(json.loads(out), prep.gen, self.gw.model_name)
        return Response(message, media_type="application/json")

    async def count_tokens(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Serve one ``POST /v1/messages/count_tokens``: the prompt's tokens (template, tools and
        a forced call's pre-fill included)."""
        req = decode_lenient(await request.body(), CountTokensRequest, what="/v1/messages/count_tokens")
        chat, client_tools = to_chat(req)
        self.gw.check_model(chat.model)
        n = await anyio.to_thread.run_sync(lambda: self.count_prompt_tokens(chat, client_tools))
        return Response(CountTokensResponse(n), media_type="application/json")

    async def _stream(self, prep: Prepared, started: Callable[[], Awaitable[None]]) -> AsyncIterator[bytes]:
        gen = prep.gen
        model = self.gw.model_name
        mid = new_id("msg").replace("-", "_", 1)
        index = -1
        open_kind: str | None = None  # the kind of the open content block ("text"), None when closed
        n_calls = 0

        def close() -> list[bytes]:
            nonlocal open_kind
            if open_kind is None:
                return []
            open_kind = None
            return [anthropic_event("content_block_stop", {"type": "content_block_stop", "index": index})]

        def with_policy(data: dict[str, Any], verdict: Any) -> dict[str, Any]:
            if verdict is not None:
                data["fak_policy"] = {"verdicts": [msgspec.to_builtins(verdict)]}
            return data

        def out(events: list[Any]) -> list[bytes]:
            nonlocal index, open_kind, n_calls
            chunks: list[bytes] = []
            for ev in events:
                if isinstance(ev, ReasoningOut):
                    if open_kind != "thinking":
                        chunks += close()
                        index += 1
                        open_kind = "thinking"
                        chunks.append(anthropic_event("content_block_start", {
                            "type": "content_block_start", "index": index,
                            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}))
                    chunks.append(anthropic_event("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "thinking_delta", "thinking": ev.text}}))
                elif isinstance(ev, ContentOut):
                    if not ev.text:
                        continue
                    if open_kind != "text":
                        chunks += close()
                        index += 1
                        open_kind = "text"
                        chunks.append(anthropic_event("content_block_start", {
                            "type": "content_block_start", "index": index,
                            "content_block": {"type": "text", "text": ""}}))
                    chunks.append(anthropic_event("content_block_delta", with_policy({
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": ev.text}}, ev.verdict)))
                else:
                    chunks += close()
                    index += 1
                    n_calls += 1
                    call = ev.call
                    chunks.append(anthropic_event("content_block_start", with_policy({
                        "type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}},
                        ev.verdict)))
                    arguments = json.dumps(_tool_input(call.arguments), ensure_ascii=False)
                    chunks.append(anthropic_event("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": arguments}}))
                    chunks.append(anthropic_event("content_block_stop", {"type": "content_block_stop",
                                                                         "index": index}))
            return chunks

        try:
            yield anthropic_event("message_start", {"type": "message_start", "message": {
                "id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": prep.n_prompt, "output_tokens": 0}}}) + PING
            await started()
            async with aclosing(gen.groups()) as groups:
                async for events, _ in groups:
                    chunks = out(merge_content(events))
                    if chunks:
                        yield b"".join(chunks)
            stop = stop_reason_of(gen.finish_reason, has_calls=n_calls > 0, stop_sequence=gen.stop_sequence,
                                  window_cut=gen.window_cut)
            tail = close()
            delta: dict[str, Any] = {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": gen.stop_sequence if stop == "stop_sequence" else None},
                "usage": msgspec.to_builtins(message_usage(prep.n_prompt, gen.n_completion, gen.cached_tokens))}
            if (error := gen.tool_call_error) is not None:  # a forced call no attempt wrote whole
                delta["fak"] = {"tool_call_error": error}
            tail.append(anthropic_event("message_delta", delta))
            tail.append(anthropic_event("message_stop", {"type": "message_stop"}))
            yield b"".join(tail)
        except APIError as err:
            yield b"".join(close()) + _error_event(err)
        finally:
            await gen.aclose()
