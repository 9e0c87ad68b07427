"""Serving logic of ``POST /v1/chat/completions`` in engine mode: the chat protocol over the
shared serving base (``fak.gateway.serving.EngineServing``).

Request → validated ``ChatCompletionRequest`` (already the canonical request of the base) →
``EngineServing.prepare`` (template, tools, policy, quarantine, context) → one ``ChatCompletion``
(``complete_body``) or a stream of ``ChatCompletionChunk`` events over ``Generation.groups``.
``tool_choice``, forced calls and their retries are the base's (see ``fak.gateway.serving``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import msgspec
from litestar import Request, Response

from fak.gateway.chat_completions.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChoiceLogprobs,
    ChunkFunction,
    ChunkToolCall,
)
from fak.gateway.disconnect import ClientDisconnected
from fak.gateway.engine_client import TokenLogprobs
from fak.gateway.errors import APIError, bad_request, error_response
from fak.gateway.policy_filter import ContentOut, ToolCallOut, merge_content
from fak.gateway.schemas import Usage, decode_lenient, new_id, now
from fak.gateway.serving import (
    RETRY_TEMPERATURE,
    SYSTEM_FINGERPRINT,
    EngineServing,
    Generation,
    Prepared,
    ReasoningOut,
    chat_sampling,
    finish_reason_of,
    first_messages_key,
    forced_choices,
    forced_prefix,
    template_messages,
    usage_of,
)
from fak.gateway.sse import DONE, sse_error, sse_event
from fak.toolcalls.wire import FakPolicyInfo

log = logging.getLogger("fak.gateway")

__all__ = [
    "RETRY_TEMPERATURE",
    "ChatServing",
    "chat_sampling",
    "first_messages_key",
    "forced_choices",
    "forced_prefix",
    "template_messages",
    "validate_chat_request",
]

KEEPALIVE = b": keep-alive\n\n"


class _ClientTools(msgspec.Struct):
    """The ``tools`` of a chat request exactly as the client sent them (only the client's fields,
    none of the schema's defaults), for the chat template and the argument schemas."""

    tools: list[dict[str, Any]] | None = None


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


class ChatServing(EngineServing):
    """Engine-mode chat completions (the chat protocol over ``EngineServing``).

    Args:
        gateway: the app's ``Gateway`` (engine, model name, policy, audit, metrics, admission).
    """

    async def handle(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Serve one request (body not yet read)."""
        t_arrival = time.perf_counter()
        body = await request.body()
        req = decode_lenient(body, ChatCompletionRequest, what="/v1/chat/completions")
        validate_chat_request(req)
        validate_engine_only(req)
        use_tools = bool(req.tools) and req.tool_choice != "none"
        # Only the fields the client sent reach the template (no "strict": null for the model to copy).
        client_tools = msgspec.json.decode(body, type=_ClientTools).tools if use_tools else None
        prep = await self.prepare(request, req, client_tools, t_arrival)
        try:
            if req.stream:
                include_usage = bool(req.stream_options and req.stream_options.include_usage)
                return await self.stream_response(
                    request, prep, lambda started: self._stream(prep, started, include_usage),
                    ping=KEEPALIVE, error_event=lambda err: sse_error(err) + DONE)
            await self.start(request, prep)
            out = await self.complete_body(request, prep)
        except ClientDisconnected:
            return Response(b"", status_code=499)
        except APIError as err:
            if req.stream:
                raise
            return error_response(err)
        return Response(out, media_type="application/json")

    # -- streaming

    async def _stream(self, prep: Prepared, started: Callable[[], Awaitable[None]],
                      include_usage: bool) -> AsyncIterator[bytes]:
        gen: Generation = prep.gen
        n_prompt = prep.n_prompt
        cid, created, model = new_id("chatcmpl"), now(), self.gw.model_name
        usage_null: Any = None if include_usage else msgspec.UNSET
        pending_lp: list[TokenLogprobs] = []
        sent_calls = 0

        def chunk(delta: ChatDelta, *, finish: str | None = None, verdict: Any = None,
                  lp: list[TokenLogprobs] | None = None, fak: dict[str, Any] | None = None) -> bytes:
            c = ChatCompletionChunk(
                id=cid, created=created, model=model, system_fingerprint=SYSTEM_FINGERPRINT, usage=usage_null,
                choices=[ChatChunkChoice(index=0, delta=delta, finish_reason=finish,
                                         logprobs=ChoiceLogprobs(content=self._chat_logprobs(lp)) if lp else None)])
            if verdict is not None:
                c.fak_policy = FakPolicyInfo(verdicts=[verdict])
            if fak is not None:
                c.fak = fak
            return sse_event(c)

        def events_out(events: list[Any]) -> list[bytes]:
            nonlocal pending_lp, sent_calls
            out = []
            for ev in events:
                if isinstance(ev, ReasoningOut):
                    out.append(chunk(ChatDelta(reasoning_content=ev.text)))
                elif isinstance(ev, ContentOut):
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
            await started()
            async with aclosing(gen.groups()) as groups:
                async for events, lps in groups:
                    pending_lp += lps
                    out = events_out(merge_content(events))
                    if out:
                        yield b"".join(out)
            error = gen.tool_call_error  # a forced call no attempt wrote whole
            tail = [chunk(ChatDelta(), finish=finish_reason_of(gen.finish_reason, sent_calls > 0), lp=pending_lp,
                          fak={"tool_call_error": error} if error is not None else None)]
            if include_usage:
                tail.append(sse_event(ChatCompletionChunk(
                    id=cid, created=created, model=model, system_fingerprint=SYSTEM_FINGERPRINT, choices=[],
                    usage=usage_of(n_prompt, gen))))
            tail.append(DONE)
            yield b"".join(tail)
        except APIError as err:
            yield sse_error(err)
            yield DONE
        finally:
            await gen.aclose()
