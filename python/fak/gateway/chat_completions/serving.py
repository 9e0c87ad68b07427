"""Serving logic of ``POST /v1/chat/completions`` in engine mode.

Request → validated ``ChatCompletionRequest`` → messages for the model's chat template → prompt
token ids → context check → ``EngineRun`` (admission slot + ``Engine.astream``) → generated text
through ``AssistantOutputFilter`` (tool-call parsing, text tools, policy) → one
``ChatCompletion`` or a stream of ``ChatCompletionChunk`` events.

``tool_choice`` with a small local model:

- ``"none"``: the tools are left out of the prompt and no tool call is parsed.
- ``"auto"`` (default when tools are given): tools in the prompt, calls parsed.
- ``"required"``: the assistant turn is pre-filled with ``<tool_call>\\n{"name": "`` (Qwen2.5-Coder-1.5B,
  given only ``<tool_call>\\n``, ends its turn at once: measured, see docs/gateway.md), and the
  engine's ``prefix_choices`` let the model write only an offered name, then ``", "arguments": {``
  (``forced_choices``): it chooses among the offered tools, token by token, and cannot name
  another.
- named (``{"type": "function", "function": {"name": F}}``): pre-filled with
  ``<tool_call>\\n{"name": "F", "arguments":``, the next token an opening brace.

That is the Hermes JSON form. A model whose chat template speaks Qwen3-Coder's XML form
(``fak.toolcalls.detect_tool_call_format``, decided once per gateway: ``Gateway.tool_call_format``)
is forced the same way in its own form: pre-filled with ``<tool_call>\\n``, held to
``<function=NAME>\\n`` + ``<parameter=`` or ``</function>`` for each offered name (required), or
pre-filled with ``<tool_call>\\n<function=F>\\n`` and held to those two openings (named); its
replies are parsed by ``fak.toolcalls.Qwen3XmlParser``.

Every call is checked against the offered tools (``fak.toolcalls.ToolSet``: the name, and the
arguments against the tool's JSON Schema). With ``"auto"`` a call that fails is content. With a
forced choice, a first call that fails (bad JSON, arguments that do not match the schema) is
sampled again, up to ``GatewayConfig.tool_call_retries`` more times (a fresh seed; a greedy
request's retries sample at ``RETRY_TEMPERATURE``, since greedy decoding would write the same call
again); if none fits, the model's own text comes back as content (never the server's pre-fill),
with ``finish_reason`` ``"stop"``: never a 4xx.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from array import array
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
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
    check_stop,
    sampling_kwargs,
    token_logprobs,
)
from fak.gateway.errors import APIError, bad_request, error_response
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
from fak.toolcalls import SchemaError, ToolCallFormat, ToolSet

log = logging.getLogger("fak.gateway")

__all__ = [
    "ChatServing",
    "first_messages_key",
    "forced_choices",
    "forced_prefix",
    "template_messages",
    "validate_chat_request",
]

SYSTEM_FINGERPRINT = "fp_fak"
#: Temperature of the retries of a greedy request whose forced call did not fit (see module doc).
RETRY_TEMPERATURE = 0.7


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
    check_stop(req.stop)
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
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
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


def forced_prefix(req: ChatCompletionRequest, fmt: ToolCallFormat = ToolCallFormat.HERMES) -> str:
    """Assistant-turn pre-fill for ``tool_choice`` ``"required"`` or a named function ("" otherwise),
    in the model's tool-call form ``fmt`` (``ToolCallFormat.forced_prefix``)."""
    if not req.tools or req.tool_choice is None or req.tool_choice in ("none", "auto"):
        return ""
    if req.tool_choice == "required":
        return fmt.forced_prefix()
    return fmt.forced_prefix(req.tool_choice.function.name)  # type: ignore[union-attr]


def forced_choices(req: ChatCompletionRequest, tokenize: Any,
                   fmt: ToolCallFormat = ToolCallFormat.HERMES) -> list[list[int]] | None:
    """The engine's ``prefix_choices`` after ``forced_prefix``: for ``"required"``, each offered
    name followed by the opening of its arguments (JSON: ``", "arguments":`` and an opening brace;
    XML: ``<function=NAME>\\n`` and ``<parameter=`` or ``</function>``); for a named function, the
    openings only (``ToolCallFormat.forced_openings``). ``tokenize(text) -> ids`` (no special
    tokens). ``None`` when the tool choice forces nothing."""
    if not forced_prefix(req, fmt):
        return None
    names = list(dict.fromkeys(t.function.name for t in req.tools or [])) if req.tool_choice == "required" else None
    return [ids for ids in (tokenize(t) for t in fmt.forced_openings(names)) if ids]


def chat_sampling(req: ChatCompletionRequest, max_tokens: int) -> dict[str, Any]:
    """``Engine.astream`` keyword arguments from the request (only what the client set)."""
    s = sampling_kwargs(req, max_tokens)
    if req.logprobs:
        s["logprobs"] = req.top_logprobs or 0
    return s


@dataclass(frozen=True)
class _Setup:
    """What every generation of one chat request shares: the request, the client's own tool
    definitions (for the template), their schemas (``ToolSet``), the forced pre-fill, the policy
    gate, whether tool calls are parsed, and the model's tool-call form."""

    req: ChatCompletionRequest
    client_tools: list[dict[str, Any]] | None
    toolset: Any
    prefix: str
    gate: PolicyGate
    use_tools: bool
    fmt: ToolCallFormat = ToolCallFormat.HERMES


class _Generation:
    """One request's generation through the engine, across the attempts of a forced tool call.

    ``start()`` runs the first attempt up to its first delta (so engine errors before the first
    token still get an HTTP status). ``groups()`` yields ``(events, logprobs)`` per group of
    deltas of the attempt that is kept: while a forced choice's first call is undecided, the
    events are held; when it turns out not to fit the offered tools (``ContentOut.rejected``) and
    retries are left (and the attempt did not run out of tokens), the attempt is closed and the
    next one starts; otherwise everything held is released and the rest streams as it comes.
    """

    def __init__(self, serving: ChatServing, req: ChatCompletionRequest, prompt_ids: list[int],
                 sampling: dict[str, Any], make_filter: Any, forced: bool, t_arrival: float) -> None:
        self.serving = serving
        self.gw = serving.gw
        self.req = req
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.make_filter = make_filter
        self.forced = forced
        self.t_arrival = t_arrival
        self.retries_left = max(0, int(getattr(self.gw.config, "tool_call_retries", 0))) if forced else 0
        self.attempt = 0
        self.n_discarded = 0  # completion tokens of attempts that were not kept
        self.run = self._new_run()
        self.filt: AssistantOutputFilter = make_filter()

    def _new_run(self) -> EngineRun:
        sampling = dict(self.sampling)
        if self.attempt:
            if "seed" in sampling:
                sampling["seed"] = (sampling["seed"] + self.attempt) % (1 << 64)
            if sampling.get("temperature", 1.0) == 0.0:
                sampling["temperature"] = RETRY_TEMPERATURE
                if "seed" not in sampling:
                    # A greedy request stays reproducible through its retries: the same prompt
                    # draws the same retry (a seed from the prompt's tokens and the attempt).
                    digest = hashlib.sha256(array("I", self.prompt_ids).tobytes()).digest()
                    sampling["seed"] = (int.from_bytes(digest[:8], "little") + self.attempt) % (1 << 64)
        return EngineRun(self.serving.engine, self.prompt_ids, sampling, self.gw.admission, self.gw.metrics,
                         self.t_arrival)

    async def start(self) -> None:
        """The first attempt up to its first delta. Raises APIError (mapped engine errors)."""
        await self.run.start()

    @property
    def _it(self) -> Any:
        """The current attempt's engine stream (the quarantine hook removes a span from it)."""
        return self.run._it

    @property
    def _closed(self) -> bool:
        return self.run._closed

    @property
    def n_completion(self) -> int:
        """Completion tokens generated by every attempt."""
        return self.n_discarded + self.run.n_completion

    @property
    def finish_reason(self) -> str | None:
        return self.run.finish_reason

    async def groups(self) -> AsyncGenerator[tuple[list[ContentOut | ToolCallOut], list[TokenLogprobs]], None]:
        """See the class doc. Raises APIError (an engine failure)."""
        want_lp = bool(self.req.logprobs)
        while True:
            decided = not self.forced
            held: list[ContentOut | ToolCallOut] = []
            held_lp: list[TokenLogprobs] = []
            retry = False
            async with aclosing(self.run.batches()) as batches:
                async for group in batches:
                    events: list[ContentOut | ToolCallOut] = []
                    lps: list[TokenLogprobs] = []
                    for delta in group:
                        if want_lp:
                            lps += token_logprobs(delta)
                        events += self.filt.feed(delta.text)
                    if decided:
                        yield events, lps
                        continue
                    held += events
                    held_lp += lps
                    verdict = self._first_call(held)
                    if verdict is None:
                        continue
                    if verdict == "rejected" and self.retries_left:
                        retry = True
                        break
                    decided = True
                    yield held, held_lp
                    held, held_lp = [], []
            if not retry:
                tail = self.filt.finish()
                if not decided:
                    held += tail
                    if (self._first_call(held) == "rejected" and self.retries_left
                            and self.run.finish_reason != "length"):
                        retry = True
                    else:
                        yield held, held_lp
                        return
                else:
                    yield tail, []
                    return
            # this attempt's first call does not fit: sample it again
            self.retries_left -= 1
            self.attempt += 1
            self.gw.metrics.count_tool_call_retry()
            log.info("forced tool call did not fit (%s); sampling attempt %d",
                     "; ".join(p.message for p in self.filt.rejected), self.attempt + 1)
            await self.run.discard()
            self.n_discarded += self.run.n_completion
            self.run = self._new_run()
            self.filt = self.make_filter()
            await self.run.start()

    @staticmethod
    def _first_call(events: list[ContentOut | ToolCallOut]) -> str | None:
        """How the first tool-call block went: ``"rejected"``, ``"ok"`` (sent or denied), or
        ``None`` while undecided."""
        for ev in events:
            if isinstance(ev, ToolCallOut):
                return "ok"
            if ev.rejected is not None:
                return "rejected"
            if ev.verdict is not None:
                return "ok"
        return None

    async def aclose(self) -> None:
        await self.run.aclose()


class ChatServing:
    """Engine-mode chat completions.

    Args:
        gateway: the app's ``Gateway`` (engine, model name, policy, audit, metrics, admission).
    """

    def __init__(self, gateway: Any) -> None:
        self.gw = gateway
        self.engine = gateway.engine
        self.tool_call_format: ToolCallFormat = getattr(gateway, "tool_call_format", None) or ToolCallFormat.HERMES

    # -- request handling

    async def handle(self, request: Request[Any, Any, Any]) -> Response[Any]:
        """Serve one request (body not yet read)."""
        t_arrival = time.perf_counter()
        body = await request.body()
        req = decode_body(body, ChatCompletionRequest)
        validate_chat_request(req)
        validate_engine_only(req)
        self.gw.check_model(req.model)
        ctx = request_context(request.headers, user=req.user, first_messages=first_messages_key(req.messages))
        gate = PolicyGate(self.gw.policy, self.gw.audit, ctx, on_verdict=self.gw.metrics.count_verdict)

        use_tools = bool(req.tools) and req.tool_choice != "none"
        # Only the fields the client sent reach the template (no "strict": null for the model to copy).
        client_tools = msgspec.json.decode(body, type=_ClientTools).tools if use_tools else None
        try:
            toolset = ToolSet.from_openai(client_tools) if use_tools else None
        except SchemaError as exc:
            raise bad_request(str(exc), param=f"tools[{exc.index}].function.parameters") from None
        fmt = self.tool_call_format
        prefix = forced_prefix(req, fmt) if use_tools else ""
        quarantine = self.gw.quarantine  # withheld tool results never reach the template
        screened = quarantine.screen(req.messages, ctx.conversation).apply(req.messages) if quarantine else req.messages
        messages = template_messages(screened)
        setup = _Setup(req, client_tools, toolset, prefix, gate, use_tools, fmt)
        gen, prompt_ids, prompt = await self._generation(setup, messages, t_arrival)
        if quarantine is not None:
            quarantine.track(ctx.conversation, prompt, prompt_ids, screened, gen)
        try:
            await run_until_disconnect(request, gen.start())
        except ClientDisconnected:
            await gen.aclose()
            return Response(b"", status_code=499)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return Stream(self._stream(gen, gate, req, len(prompt_ids), include_usage),
                          media_type="text/event-stream", headers=SSE_HEADERS,
                          background=BackgroundTask(gen.aclose))
        n_verdicts = len(gate.verdicts)
        try:
            out = await run_until_disconnect(request, self._complete(gen, gate, req, len(prompt_ids)))
            inline = self.gw.inline_reads  # repeated read-only calls answered here (--serve-inline-reads)
            if inline is not None and use_tools:
                await gen.aclose()
                out = await run_until_disconnect(request, inline.serve(
                    self, out, req=req, conversation=request.headers.get(CONVERSATION_HEADER), messages=messages,
                    tools=client_tools, prefix=prefix, gate=gate, n_verdicts_before=n_verdicts,
                    start_run=lambda convo: self._round(setup, convo)))
        except ClientDisconnected:
            return Response(b"", status_code=499)
        except APIError as err:
            return error_response(err)
        finally:
            await gen.aclose()
        return Response(out, media_type="application/json")

    async def _generation(self, setup: _Setup, messages: list[dict[str, Any]],
                          t_arrival: float) -> tuple[_Generation, list[int], str]:
        """The generation of one conversation (``messages``, already screened): the prompt
        rendered and tokenized off the event loop, its context checked, the forced tool call's
        choices and the output filter set. Returns (generation, prompt ids, prompt text).
        Raises ``APIError`` (400: the template rejects the messages, or they do not fit)."""
        req = setup.req

        def prompt_tokens() -> tuple[str, list[int], list[list[int]] | None]:
            prompt = self._render(messages, setup.client_tools) + setup.prefix
            ids = self.engine.tokenize(prompt, add_special=False, parse_special=True)
            choices = forced_choices(req, lambda t: self.engine.tokenize(t, add_special=False, parse_special=False),
                                     setup.fmt)
            return prompt, ids, choices

        # A long conversation takes milliseconds to render and tokenize: off the event loop, so
        # the other streams keep flowing meanwhile.
        prompt, prompt_ids, choices = await anyio.to_thread.run_sync(prompt_tokens)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = check_context(
            len(prompt_ids), requested, self.engine.n_ctx, param="messages",
            max_tokens_param="max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens")
        sampling = chat_sampling(req, max_tokens)
        if choices and setup.use_tools:
            sampling["prefix_choices"] = choices

        def make_filter() -> AssistantOutputFilter:
            return AssistantOutputFilter(setup.gate, parse_tools=setup.use_tools, prefix=setup.prefix,
                                         parallel_tool_calls=req.parallel_tool_calls is not False,
                                         tools=setup.toolset, on_reject=self.gw.metrics.count_tool_call_rejected,
                                         tool_format=setup.fmt)

        gen = _Generation(self, req, prompt_ids, sampling, make_filter, forced=bool(setup.prefix),
                          t_arrival=t_arrival)
        return gen, prompt_ids, prompt

    async def _round(self, setup: _Setup, messages: list[dict[str, Any]]) -> bytes:
        """One more non-streamed generation of the same request over ``messages`` (the inline
        reads' next round), its encoded ``ChatCompletion``."""
        gen, prompt_ids, _ = await self._generation(setup, messages, time.perf_counter())
        try:
            await gen.start()
            return await self._complete(gen, setup.gate, setup.req, len(prompt_ids))
        finally:
            await gen.aclose()

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

    def _bytes(self, token_id: int, text: str) -> list[int]:
        # A byte-fallback token's own bytes (the piece of a character split across tokens), not
        # those of the U+FFFD its text shows.
        token_bytes = getattr(self.engine, "token_bytes", None)
        if token_bytes is not None:
            try:
                return list(token_bytes(token_id))
            except (IndexError, ValueError):
                pass
        return list(text.encode("utf-8"))

    def _chat_logprobs(self, entries: list[TokenLogprobs]) -> list[TokenLogprob]:
        out = []
        for e in entries:
            token = self._text(e.token_id, e.token)
            tops = []
            for tid, lp, text in e.top:
                t = self._text(tid, text)
                tops.append(TopLogprob(token=t, logprob=lp, bytes=self._bytes(tid, t)))
            out.append(TokenLogprob(token=token, logprob=e.logprob, bytes=self._bytes(e.token_id, token),
                                    top_logprobs=tops))
        return out

    # -- non-streaming

    async def _complete(self, gen: _Generation, gate: PolicyGate, req: ChatCompletionRequest, n_prompt: int) -> bytes:
        content: list[str] = []
        calls: list[ChatToolCall] = []
        logprobs: list[TokenLogprobs] = []
        async with aclosing(gen.groups()) as groups:
            async for events, lps in groups:
                logprobs += lps
                for ev in events:
                    if isinstance(ev, ContentOut):
                        content.append(ev.text)
                    else:
                        calls.append(ChatToolCall(id=ev.call.id,
                                                  function=ToolCallFunction(ev.call.name, ev.call.arguments)))
        text = "".join(content)
        if calls:
            stripped = text.strip()
            lead = len(text) - len(text.lstrip())
            for v in gate.verdicts:  # the spans of shell blocks follow the stripped content
                if v.span is not None:
                    v.span = [max(0, v.span[0] - lead), max(0, v.span[1] - lead)]
            message = ChatResponseMessage(content=stripped or None)
            message.tool_calls = calls
        else:
            message = ChatResponseMessage(content=text)
        finish = _finish_reason(gen.finish_reason, bool(calls))
        choice = ChatChoice(index=0, message=message, finish_reason=finish,
                            logprobs=ChoiceLogprobs(content=self._chat_logprobs(logprobs)) if req.logprobs else None)
        response = ChatCompletion(
            id=new_id("chatcmpl"), created=now(), model=self.gw.model_name, choices=[choice],
            usage=Usage(n_prompt, gen.n_completion, n_prompt + gen.n_completion),
            system_fingerprint=SYSTEM_FINGERPRINT)
        if gate.active:
            response.fak_policy = FakPolicyInfo(verdicts=gate.verdicts)
        if (timings := gen.run.timings()) is not None:
            response.timings = timings
        return msgspec.json.encode(response)

    # -- streaming

    async def _stream(self, gen: _Generation, gate: PolicyGate, req: ChatCompletionRequest, n_prompt: int,
                      include_usage: bool) -> AsyncIterator[bytes]:
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
            async with aclosing(gen.groups()) as groups:
                async for events, lps in groups:
                    pending_lp += lps
                    out = events_out(merge_content(events))
                    if out:
                        yield b"".join(out)
            tail = [chunk(ChatDelta(), finish=_finish_reason(gen.finish_reason, sent_calls > 0), lp=pending_lp)]
            if include_usage:
                tail.append(sse_event(ChatCompletionChunk(
                    id=cid, created=created, model=model, system_fingerprint=SYSTEM_FINGERPRINT, choices=[],
                    usage=Usage(n_prompt, gen.n_completion, n_prompt + gen.n_completion))))
            tail.append(DONE)
            yield b"".join(tail)
        except APIError as err:
            yield sse_error(err)
            yield DONE
        finally:
            await gen.aclose()


def _finish_reason(engine_reason: str | None, has_calls: bool) -> str:
    reason = engine_reason or "stop"
    if has_calls and reason == "stop":
        return "tool_calls"
    return reason
