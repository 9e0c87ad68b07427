"""Serving logic of ``POST /v1/chat/completions`` in engine mode.

Request → validated ``ChatCompletionRequest`` → messages for the model's chat template → prompt
token ids → context check → ``EngineRun`` (admission slot + ``Engine.astream``) → generated text
through ``AssistantOutputFilter`` (tool-call parsing, text tools, policy) → one
``ChatCompletion`` or a stream of ``ChatCompletionChunk`` events.

``tool_choice`` with a small local model:

- ``"none"``: the tools are left out of the prompt and no tool call is parsed.
- ``"auto"`` (default when tools are given): tools in the prompt, calls parsed.
- ``"required"``: the assistant turn is pre-filled with ``<tool_call>\\n{"name": "`` so the model
  writes a tool name and its arguments (Qwen2.5-Coder-1.5B, given only ``<tool_call>\\n``, ends its
  turn at once: measured, see docs/gateway.md); a call it then botches (bad JSON) comes back as
  content, never as an error.
- named (``{"type": "function", "function": {"name": F}}``): pre-filled with
  ``<tool_call>\\n{"name": "F", "arguments": `` so the model writes only the arguments.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from fak.gateway.chat_completions.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatMessage,
    ChatResponseMessage,
    ChatToolCall,
    ChoiceLogprobs,
    ChunkFunction,
    ChunkToolCall,
    FakPolicyInfo,
    TokenLogprob,
    ToolCallFunction,
    TopLogprob,
)
from fak.gateway.disconnect import ClientDisconnected, run_until_disconnect
from fak.gateway.engine_api import (
    EngineRun,
    TokenLogprobs,
    check_context,
    sampling_kwargs,
    token_logprobs,
)
from fak.gateway.errors import APIError, bad_request, error_response
from fak.gateway.inline_reads import round_starter
from fak.gateway.policy_filter import (
    CONVERSATION_HEADER,
    AssistantOutputFilter,
    ContentOut,
    PolicyGate,
    ToolCallOut,
    merge_content,
    request_context,
)
from fak.gateway.schemas import Usage, decode_body, new_id, now
from fak.gateway.sse import DONE, SSE_HEADERS, sse_error, sse_event
from fak.gateway.toolcalls import TOOL_CALL_OPEN

log = logging.getLogger("fak.gateway")

__all__ = [
    "ChatServing",
    "first_messages_key",
    "forced_prefix",
    "template_messages",
    "validate_chat_request",
]

SYSTEM_FINGERPRINT = "fp_fak"


def validate_chat_request(req: ChatCompletionRequest) -> None:
    """Checks beyond the schema, shared by engine and proxy mode.

    Raises:
        APIError: 400 naming the field at fault.
    """
    if req.n is not None and req.n != 1:
        raise bad_request(f"n={req.n} is not supported: this server returns one choice per request (n=1).",
                          param="n", code="unsupported_value")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true.", param="stream_options")
    if req.top_logprobs is not None and req.top_logprobs > 0 and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", param="top_logprobs")
    if req.tool_choice is not None and req.tool_choice not in ("none", "auto") and not req.tools:
        raise bad_request("tool_choice requires tools to be given.", param="tool_choice")
    if req.tools:
        names = [t.function.name for t in req.tools]
        if not isinstance(req.tool_choice, str) and req.tool_choice is not None:
            if req.tool_choice.function.name not in names:
                raise bad_request(f"tool_choice names function {req.tool_choice.function.name!r}, "
                                  f"which is not among the tools {names}.", param="tool_choice")
    for i, msg in enumerate(req.messages):
        where = f"messages[{i}]"
        if msg.role == "tool" and not msg.tool_call_id:
            raise bad_request("A tool message needs the tool_call_id it answers.", param=f"{where}.tool_call_id")
        if msg.role == "assistant":
            if msg.content is None and not msg.tool_calls:
                raise bad_request("An assistant message needs content or tool_calls.", param=f"{where}.content")
        elif msg.content is None:
            raise bad_request(f"A {msg.role} message needs content.", param=f"{where}.content")
        if isinstance(msg.content, list):
            for j, part in enumerate(msg.content):
                allowed = ("text", "refusal") if msg.role == "assistant" else ("text",)
                if part.type not in allowed:
                    raise bad_request(f"Content part type {part.type!r} is not supported by this model "
                                      f"(text only).", param=f"{where}.content[{j}].type",
                                      code="unsupported_content")


def validate_engine_only(req: ChatCompletionRequest) -> None:
    """Checks for features the local engine does not have (the proxy passes them upstream)."""
    if req.logit_bias:
        raise bad_request("logit_bias is not supported by this server.", param="logit_bias",
                          code="unsupported_parameter")
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(f"response_format {req.response_format.type!r} is not supported "
                          "(no constrained decoding); use {\"type\": \"text\"}.",
                          param="response_format", code="unsupported_value")


def _text_of(content: str | list[Any] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p.text if p.text is not None else (p.refusal or "") for p in content)


def _arguments_value(arguments: str) -> Any:
    # Chat templates (Qwen2.5's included) render arguments with `| tojson`: give them the object.
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template expects them (HF ``transformers`` conventions).

    ``developer`` becomes ``system``; content parts are joined with newlines; assistant tool-call
    arguments are decoded to objects.
    """
    out: list[dict[str, Any]] = []
    for msg in messages:
        role = "system" if msg.role == "developer" else msg.role
        item: dict[str, Any] = {"role": role, "content": _text_of(msg.content)}
        if msg.name is not None:
            item["name"] = msg.name
        if msg.tool_calls:
            item["tool_calls"] = [
                {"id": tc.id, "type": "function",
                 "function": {"name": tc.function.name, "arguments": _arguments_value(tc.function.arguments)}}
                for tc in msg.tool_calls]
        if msg.tool_call_id is not None:
            item["tool_call_id"] = msg.tool_call_id
        out.append(item)
    return out


def first_messages_key(messages: list[ChatMessage]) -> list[Any]:
    """The first system message and first user message (role, text), keying a conversation."""
    key: list[Any] = []
    for msg in messages[:2]:
        key.append([msg.role, _text_of(msg.content)])
    return key


def forced_prefix(req: ChatCompletionRequest) -> str:
    """Assistant-turn pre-fill for ``tool_choice`` ``"required"`` or a named function ("" otherwise)."""
    if not req.tools or req.tool_choice is None or req.tool_choice in ("none", "auto"):
        return ""
    if req.tool_choice == "required":
        return TOOL_CALL_OPEN + "\n" + '{"name": "'
    name = req.tool_choice.function.name  # type: ignore[union-attr]
    return TOOL_CALL_OPEN + "\n" + '{"name": ' + json.dumps(name) + ', "arguments": '


def chat_sampling(req: ChatCompletionRequest, max_tokens: int) -> dict[str, Any]:
    """``Engine.astream`` keyword arguments from the request (only what the client set)."""
    s = sampling_kwargs(req, max_tokens)
    if req.logprobs:
        s["logprobs"] = req.top_logprobs or 0
    return s


class ChatServing:
    """Engine-mode chat completions.

    Args:
        gateway: the app's ``Gateway`` (engine, model name, policy, audit, metrics, admission).
    """

    def __init__(self, gateway: Any) -> None:
        self.gw = gateway
        self.engine = gateway.engine

    # -- request handling

    async def handle(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Serve one request (body not yet read)."""
        t_arrival = time.perf_counter()
        req = decode_body(await request.body(), ChatCompletionRequest)
        validate_chat_request(req)
        validate_engine_only(req)
        self.gw.check_model(req.model)
        ctx = request_context(request.headers, user=req.user, first_messages=first_messages_key(req.messages))
        gate = PolicyGate(self.gw.policy, self.gw.audit, ctx, on_verdict=self.gw.metrics.count_verdict)

        use_tools = bool(req.tools) and req.tool_choice != "none"
        tools = [msgspec.to_builtins(t) for t in req.tools] if use_tools and req.tools else None
        prefix = forced_prefix(req) if use_tools else ""
        quarantine = self.gw.quarantine  # withheld tool results never reach the template
        screened = quarantine.screen(req.messages, ctx.conversation).apply(req.messages) if quarantine else req.messages
        messages = template_messages(screened)
        rendered: list[str] = []

        def prompt_tokens() -> list[int]:
            prompt = self._render(messages, tools) + prefix
            rendered.append(prompt)
            return self.engine.tokenize(prompt, add_special=False, parse_special=True)

        # A long conversation takes milliseconds to render and tokenize: off the event loop, so
        # the other streams keep flowing meanwhile.
        prompt_ids = await anyio.to_thread.run_sync(prompt_tokens)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = check_context(len(prompt_ids), requested, self.engine.n_ctx, param="messages")

        run = EngineRun(self.engine, prompt_ids, chat_sampling(req, max_tokens), self.gw.admission,
                        self.gw.metrics, t_arrival)
        if quarantine is not None:
            quarantine.track(ctx.conversation, rendered[0], prompt_ids, screened, run)
        filt = AssistantOutputFilter(gate, parse_tools=use_tools, prefix=prefix,
                                     parallel_tool_calls=req.parallel_tool_calls is not False,
                                     tool_names=frozenset(t.function.name for t in req.tools or []))
        try:
            await run_until_disconnect(request, run.start())
        except ClientDisconnected:
            await run.aclose()
            return Response(b"", status_code=499)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return Stream(self._stream(run, filt, gate, req, len(prompt_ids), include_usage),
                          media_type="text/event-stream", headers=SSE_HEADERS,
                          background=BackgroundTask(run.aclose))
        n_verdicts = len(gate.verdicts)
        try:
            body = await run_until_disconnect(request, self._complete(run, filt, gate, req, len(prompt_ids)))
            inline = self.gw.inline_reads  # repeated read-only calls answered here (--serve-inline-reads)
            if inline is not None and use_tools:
                await run.aclose()
                body = await run_until_disconnect(request, inline.serve(
                    self, body, req=req, conversation=request.headers.get(CONVERSATION_HEADER), messages=messages,
                    tools=tools, prefix=prefix, gate=gate, n_verdicts_before=n_verdicts,
                    start_run=round_starter(self, req, tools, prefix, gate, use_tools)))
        except ClientDisconnected:
            return Response(b"", status_code=499)
        except APIError as err:
            return error_response(err)
        finally:
            await run.aclose()
        return Response(body, media_type="application/json")

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        try:
            return self.engine.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        except Exception as exc:
            if type(exc).__module__.startswith("jinja2") or isinstance(exc, (ValueError, TypeError, KeyError)):
                raise bad_request(f"The model's chat template rejected the messages: {exc}",
                                  param="messages") from None
            raise

    # -- logprobs

    def _text(self, token_id: int, text: str | None) -> str:
        return text if text is not None else self.engine.detokenize([token_id])

    def _chat_logprobs(self, entries: list[TokenLogprobs]) -> list[TokenLogprob]:
        out = []
        for e in entries:
            token = self._text(e.token_id, e.token)
            tops = []
            for tid, lp, text in e.top:
                t = self._text(tid, text)
                tops.append(TopLogprob(token=t, logprob=lp, bytes=list(t.encode("utf-8"))))
            out.append(TokenLogprob(token=token, logprob=e.logprob, bytes=list(token.encode("utf-8")),
                                    top_logprobs=tops))
        return out

    # -- non-streaming

    async def _complete(self, run: EngineRun, filt: AssistantOutputFilter, gate: PolicyGate,
                        req: ChatCompletionRequest, n_prompt: int) -> bytes:
        content: list[str] = []
        calls: list[ChatToolCall] = []
        logprobs: list[TokenLogprobs] = []

        def take(events: list[ContentOut | ToolCallOut]) -> None:
            for ev in events:
                if isinstance(ev, ContentOut):
                    content.append(ev.text)
                else:
                    calls.append(ChatToolCall(id=ev.call.id, function=ToolCallFunction(ev.call.name, ev.call.arguments)))

        async for delta in run.deltas():
            take(filt.feed(delta.text))
            if req.logprobs:
                logprobs += token_logprobs(delta)
        take(filt.finish())
        text = "".join(content)
        message = ChatResponseMessage(content=(text.strip() or None) if calls else text)
        if calls:
            message.tool_calls = calls
        finish = _finish_reason(run.finish_reason, bool(calls))
        choice = ChatChoice(index=0, message=message, finish_reason=finish,
                            logprobs=ChoiceLogprobs(content=self._chat_logprobs(logprobs)) if req.logprobs else None)
        response = ChatCompletion(
            id=new_id("chatcmpl"), created=now(), model=self.gw.model_name, choices=[choice],
            usage=Usage(n_prompt, run.n_completion, n_prompt + run.n_completion),
            system_fingerprint=SYSTEM_FINGERPRINT)
        if gate.active:
            response.fak_policy = FakPolicyInfo(verdicts=gate.verdicts)
        return msgspec.json.encode(response)

    # -- streaming

    async def _stream(self, run: EngineRun, filt: AssistantOutputFilter, gate: PolicyGate,
                      req: ChatCompletionRequest, n_prompt: int, include_usage: bool) -> AsyncIterator[bytes]:
        cid, created, model = new_id("chatcmpl"), now(), self.gw.model_name
        usage_null: Any = None if include_usage else msgspec.UNSET
        pending_lp: list[TokenLogprobs] = []
        sent_calls = 0

        def chunk(delta: ChatDelta, *, finish: str | None = None, verdict: Any = None,
                  lp: list[TokenLogprobs] | None = None) -> bytes:
            c = ChatCompletionChunk(
                id=cid, created=created, model=model, system_fingerprint=SYSTEM_FINGERPRINT, usage=usage_null,
                choices=[ChatChunkChoice(index=0, delta=delta, finish_reason=finish,
                                         logprobs=ChoiceLogprobs(content=self._chat_logprobs(lp)) if lp else None)])
            if verdict is not None:
                c.fak_policy = FakPolicyInfo(verdicts=[verdict])
            return sse_event(c)

        def events_out(events: list[ContentOut | ToolCallOut]) -> list[bytes]:
            nonlocal pending_lp, sent_calls
            out = []
            for ev in events:
                if isinstance(ev, ContentOut):
                    if not ev.text and ev.verdict is None:
                        continue
                    lp, pending_lp = pending_lp, []
                    out.append(chunk(ChatDelta(content=ev.text), verdict=ev.verdict, lp=lp))
                else:
                    sent_calls += 1
                    tc = ChunkToolCall(index=ev.index, id=ev.call.id, type="function",
                                       function=ChunkFunction(name=ev.call.name, arguments=ev.call.arguments))
                    out.append(chunk(ChatDelta(tool_calls=[tc]), verdict=ev.verdict))
            return out

        try:
            yield chunk(ChatDelta(role="assistant", content=""))
            async for group in run.batches():
                events: list[ContentOut | ToolCallOut] = []
                for delta in group:
                    if req.logprobs:
                        pending_lp += token_logprobs(delta)
                    events += filt.feed(delta.text)
                out = events_out(merge_content(events))
                if out:
                    yield b"".join(out)
            tail = events_out(filt.finish())
            tail.append(chunk(ChatDelta(), finish=_finish_reason(run.finish_reason, sent_calls > 0), lp=pending_lp))
            if include_usage:
                tail.append(sse_event(ChatCompletionChunk(
                    id=cid, created=created, model=model, system_fingerprint=SYSTEM_FINGERPRINT, choices=[],
                    usage=Usage(n_prompt, run.n_completion, n_prompt + run.n_completion))))
            tail.append(DONE)
            yield b"".join(tail)
        except APIError as err:
            yield sse_error(err)
            yield DONE
        finally:
            await run.aclose()


def _finish_reason(engine_reason: str | None, has_calls: bool) -> str:
    reason = engine_reason or "stop"
    if has_calls and reason == "stop":
        return "tool_calls"
    return reason
