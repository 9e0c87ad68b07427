"""The serving base every engine-mode endpoint shares (vLLM's ``OpenAIServing``).

Chat completions, Anthropic messages and OpenAI responses are thin protocol folders over this
module: each decodes its own request, turns it into the canonical chat request
(``ChatCompletionRequest``: messages, tools, ``tool_choice``, sampling) and the client's tools in
OpenAI's form, and hands both to ``EngineServing.prepare``. From there everything is one path:

- the policy context and gate (``request_context``, ``PolicyGate``), the quarantine of tool
  results, the offered tools' schemas (``ToolSet``), the forced pre-fill of ``tool_choice``
  ``"required"``/named in the model's tool-call form;
- the prompt rendered by the model's chat template and tokenized off the event loop, the context
  window checked, sampling keywords, the engine's ``prefix_choices``;
- one ``Generation`` (admission slot, engine stream, retries of a forced call that does not fit)
  whose output passes ``AssistantOutputFilter`` (tool-call parsing, text tools, policy);
- the non-streamed result as a ``ChatCompletion`` (with inline reads, ``complete_body``) that a
  protocol converts, or the filtered events (``Generation.groups``) that a protocol streams;
- streams that answer at once: ``stream_response`` sends the status line, headers and the
  protocol's opening event when the first token is not there within
  ``GatewayConfig.stream_headers_after_s``, and a keep-alive (``keepalive.py``) whenever nothing else
  was sent for ``GatewayConfig.stream_keepalive_s`` (long prefills, held forced calls), while
  errors that come at once (queue full, KV cache) keep their HTTP status;
- cancellation when the client goes away (``run_until_disconnect``, Litestar's stream).

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
is forced the same way in its own form (``ToolCallFormat.forced_prefix`` / ``forced_openings``);
its replies are parsed by ``fak.toolcalls.Qwen3XmlParser``.

Every call is checked against the offered tools (``fak.toolcalls.ToolSet``: the name, and the
arguments against the tool's JSON Schema). With ``"auto"`` a call that fails is content. With a
forced choice, a first call that fails (bad JSON, arguments that do not match the schema) is
sampled again, up to ``GatewayConfig.tool_call_retries`` more times (a fresh seed; a greedy
request's retries sample at ``RETRY_TEMPERATURE``, since greedy decoding would write the same call
again). A forced block that holds whole calls followed by junk is those calls (the parsers'
``leading_calls``; the sequence stops as soon as the junk shows: ``Generation`` reads the
filter's ``complete``). If no attempt fits, the answer has empty content, ``finish_reason``
``"stop"`` and ``fak.tool_call_error`` (``Generation.tool_call_error``): never the server's
pre-fill, never a fragment of the call, never a 4xx.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from array import array
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
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
    ChatCompletion,
    ChatCompletionRequest,
    ChatMessage,
    ChatResponseMessage,
    ChoiceLogprobs,
    TokenLogprob,
    TopLogprob,
)
from fak.gateway.disconnect import ClientDisconnected, cancel_and_wait, run_until_disconnect
from fak.gateway.engine_client import EngineRun, TokenLogprobs, sampling_kwargs, token_logprobs
from fak.gateway.errors import APIError, bad_request
from fak.gateway.keepalive import keepalive
from fak.gateway.policy_filter import (
    CONVERSATION_HEADER,
    AssistantOutputFilter,
    ContentOut,
    PolicyGate,
    RequestContext,
    ToolCallOut,
    request_context,
)
from fak.gateway.reasoning import ReasoningSplitter, prompt_opens_reasoning, template_thinks
from fak.gateway.schemas import Usage, new_id, now
from fak.gateway.sse import SSE_HEADERS
from fak.toolcalls import SchemaError, ToolCallFormat, ToolSet
from fak.toolcalls.wire import FakPolicyInfo, FunctionCall, ToolCall

log = logging.getLogger("fak.gateway")

__all__ = [
    "RETRY_TEMPERATURE",
    "SYSTEM_FINGERPRINT",
    "EngineServing",
    "Generation",
    "Prepared",
    "ReasoningOut",
    "Setup",
    "chat_sampling",
    "finish_reason_of",
    "first_messages_key",
    "forced_choices",
    "forced_prefix",
    "keepalive",
    "template_messages",
    "usage_of",
]

SYSTEM_FINGERPRINT = "fp_fak"
#: Temperature of the retries of a greedy request whose forced call did not fit (see module doc).
RETRY_TEMPERATURE = 0.7


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
    arguments are decoded to objects; an assistant turn's ``reasoning_content`` is passed on (a
    thinking template shows it in the turns after the last user query).
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
        if msg.reasoning_content:
            item["reasoning_content"] = msg.reasoning_content
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
class Setup:
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
    #: split the model's ``<think>`` reasoning from its answer (``fak.gateway.reasoning``)
    reasoning: bool = False
    #: extra chat-template variables (``enable_thinking``)
    template_kwargs: dict[str, Any] | None = None


@dataclass(slots=True)
class ReasoningOut:
    """The model's reasoning (``<think>`` text), for the protocol's reasoning field, block or item;
    it always comes before the answer's events."""

    text: str


class Generation:
    """One request's generation through the engine, across the attempts of a forced tool call.

    ``start()`` runs the first attempt up to its first delta (so engine errors before the first
    token still get an HTTP status). ``groups()`` yields ``(events, logprobs)`` per group of
    deltas of the attempt that is kept: while a forced choice's first call is undecided, the
    events are held; when it turns out not to fit the offered tools (``ContentOut.rejected``) and
    retries are left (and the attempt did not run out of tokens), the attempt is closed and the
    next one starts; otherwise everything held is released and the rest streams as it comes.
    """

    def __init__(self, serving: EngineServing, req: ChatCompletionRequest, prompt_ids: list[int],
                 sampling: dict[str, Any], make_filter: Any, forced: bool, t_arrival: float, *,
                 reasoning: bool = False, in_reasoning: bool = False, max_tokens_param: str | None = None) -> None:
        self.serving = serving
        #: the completion budget's request field when the client set one that must fit (errors)
        self.max_tokens_param = max_tokens_param
        #: split reasoning from the answer (a thinking template), starting inside it (``in_reasoning``)
        self.reasoning = reasoning
        self.in_reasoning = in_reasoning
        self.splitter = ReasoningSplitter(in_reasoning=in_reasoning) if reasoning else None
        #: completion tokens of the kept attempt that were reasoning (deltas that gave reasoning text)
        self.n_reasoning = 0
        #: the policy's conversation key (the prefix-cache hits are counted per conversation)
        self.conversation = ""
        self._recorded = False
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
        #: the completion budget was cut to the context window's room (``clamp_budget``)
        self.window_cut = False

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
                         self.t_arrival, prompt_param=self.serving.prompt_param,
                         max_tokens_param=self.max_tokens_param)

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
    def cached_tokens(self) -> int | None:
        """Prompt tokens of the kept attempt the prefix cache held (``None``: not reported)."""
        return self.run.cached_tokens

    @property
    def finish_reason(self) -> str | None:
        """The kept attempt's end: ``"stop"``, ``"length"`` or ``None`` (not ended)."""
        return self.run.finish_reason

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the kept attempt (``None``: an end-of-generation token,
        the budget, or not ended)."""
        reason = self.run.stop_reason
        return reason if isinstance(reason, str) else None

    async def groups(self) -> AsyncGenerator[tuple[list[Any], list[TokenLogprobs]], None]:
        """See the class doc: the events are ``ReasoningOut``, ``ContentOut`` and ``ToolCallOut``.
        Raises APIError (an engine failure)."""
        want_lp = bool(self.req.logprobs)
        while True:
            decided = not self.forced
            held: list[Any] = []
            held_lp: list[TokenLogprobs] = []
            retry = False
            async with aclosing(self.run.batches()) as batches:
                async for group in batches:
                    events: list[Any] = []
                    lps: list[TokenLogprobs] = []
                    for delta in group:
                        if want_lp:
                            lps += token_logprobs(delta)
                        events += self._feed(delta)
                    if decided:
                        yield events, lps
                        if self.filt.complete:
                            break
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
                    if self.filt.complete:
                        break
            if self.filt.complete and not retry:
                # the forced call is whole and the model went on with junk the parser drops:
                # stop the sequence now (it ended as at a stop string)
                if self.run.finish_reason is None:
                    self.run.finish_reason = "stop"
                await self.run.aclose()
            if not retry:
                tail = self._finish()
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
            self.splitter = ReasoningSplitter(in_reasoning=self.in_reasoning) if self.reasoning else None
            self.n_reasoning = 0
            await self.run.start()

    def _feed(self, delta: Any) -> list[Any]:
        """One delta's events: its reasoning (one ``ReasoningOut``) before its answer's."""
        if self.splitter is None:
            return list(self.filt.feed(delta.text))
        reasoning, content = self.splitter.feed(delta.text)
        out: list[Any] = []
        if reasoning:
            self.n_reasoning += len(getattr(delta, "token_ids", ()) or ())
            out.append(ReasoningOut(reasoning))
        if content:
            out += self.filt.feed(content)
        return out

    def _finish(self) -> list[Any]:
        out: list[Any] = []
        if self.splitter is not None:
            reasoning, content = self.splitter.finish()
            if reasoning:
                out.append(ReasoningOut(reasoning))
            if content:
                out += self.filt.feed(content)
        return out + self.filt.finish()

    @property
    def tool_call_error(self) -> dict[str, str] | None:
        """The ``fak.tool_call_error`` of a forced call that no attempt wrote whole (``kind``,
        ``message``: why the last attempt was not a call), else ``None``. The answer then has
        empty content: nothing of a broken call reaches the client."""
        problem = self.filt.forced_error
        if problem is None or self.filt.n_tool_calls:
            return None
        return {"kind": problem.kind, "message": problem.message}

    @staticmethod
    def _first_call(events: list[Any]) -> str | None:
        """How the first tool-call block went: ``"rejected"``, ``"ok"`` (sent or denied), or
        ``None`` while undecided."""
        for ev in events:
            if isinstance(ev, ReasoningOut):
                continue
            if isinstance(ev, ToolCallOut):
                return "ok"
            if ev.rejected is not None:
                return "rejected"
            if ev.verdict is not None:
                return "ok"
        return None

    async def aclose(self) -> None:
        """Close the kept attempt (idempotent) and count its prefix-cache hits for its
        conversation (``Gateway.prefix_stats``)."""
        await self.run.aclose()
        stats = getattr(self.gw, "prefix_stats", None)
        if not self._recorded and stats is not None and self.run.cached_tokens is not None:
            self._recorded = True
            stats.record(self.conversation, len(self.prompt_ids), self.run.cached_tokens)


@dataclass
class Prepared:
    """One request, ready to generate: its ``Setup``, the ``Generation`` (not started), the prompt
    (token ids and text), the messages the template saw (screened) and the policy context."""

    setup: Setup
    gen: Generation
    prompt_ids: list[int]
    prompt: str
    messages: list[dict[str, Any]]
    ctx: RequestContext

    @property
    def n_prompt(self) -> int:
        """Prompt tokens."""
        return len(self.prompt_ids)


def usage_of(n_prompt: int, gen: Generation) -> Usage:
    """Chat ``usage`` of a generation: prompt and completion tokens (every attempt), and the
    prompt tokens the prefix cache held as ``prompt_tokens_details.cached_tokens`` (OpenAI's
    field) when the engine reports them."""
    usage = Usage(n_prompt, gen.n_completion, n_prompt + gen.n_completion)
    if gen.cached_tokens is not None:
        usage.prompt_tokens_details = {"cached_tokens": gen.cached_tokens}
    return usage


def finish_reason_of(engine_reason: str | None, has_calls: bool) -> str:
    """The chat ``finish_reason`` of a generation: the engine's (``"stop"``, ``"length"``), with
    ``"stop"`` read as ``"tool_calls"`` when the message carries calls."""
    reason = engine_reason or "stop"
    if has_calls and reason == "stop":
        return "tool_calls"
    return reason


class EngineServing:
    """The engine-mode serving base of every protocol (see the module doc).

    Args:
        gateway: the app's ``Gateway`` (engine, model name, policy, audit, metrics, admission,
            quarantine, inline reads, tool-call form).

    A protocol subclass decodes its request, builds the canonical ``ChatCompletionRequest`` and
    the client's tools (OpenAI form), calls ``prepare``, then either ``complete_body`` (one
    ``ChatCompletion``, converted) or ``stream_response`` with its own event writer over
    ``Generation.groups``.
    """

    #: the request field that holds the prompt, named by the engine's context-length and prompt errors
    prompt_param = "messages"
    #: whether the client's completion budget is a ceiling cut to the room the prompt leaves
    #: (Anthropic's ``max_tokens``, Responses' ``max_output_tokens``: clients send their model's
    #: largest budget) rather than a request that must fit (chat completions, as OpenAI's API)
    clamp_budget = False

    def __init__(self, gateway: Any) -> None:
        self.gw = gateway
        self.engine = gateway.engine
        self.tool_call_format: ToolCallFormat = getattr(gateway, "tool_call_format", None) or ToolCallFormat.HERMES
        template = getattr(self.engine, "chat_template", None)
        source = template if isinstance(template, str) else getattr(template, "source", None)
        #: the model's chat template has thinking: reasoning is returned apart from the answer
        self.thinks = template_thinks(source if isinstance(source, str) else None)
        #: system turns rendered lately: key → (their text, tokens, conversations seen) (``resident_prefix``)
        self._system_heads: OrderedDict[str, tuple[str, int, set[str]]] = OrderedDict()

    # -- preparation

    def context(self, request: Request[Any, Any, Any], req: ChatCompletionRequest) -> RequestContext:
        """The request's policy context (conversation, workspace, text tools) from its headers,
        ``user`` and first messages. Raises ``APIError`` (400: a bad ``X-Fak-*`` header)."""
        return request_context(request.headers, user=req.user, first_messages=first_messages_key(req.messages))

    async def prepare(self, request: Request[Any, Any, Any], req: ChatCompletionRequest,
                      client_tools: list[dict[str, Any]] | None, t_arrival: float) -> Prepared:
        """Everything before the first token of ``req`` (a validated canonical request).

        ``client_tools``: the tools exactly as the client sent them, in OpenAI's form (only the
        fields it set, so the template shows the model nothing else). Screens tool results
        (quarantine), renders and tokenizes the prompt off the event loop, checks the context
        window, and builds the ``Generation`` (not started).

        Raises:
            APIError: 400 for a bad tool schema, a template that rejects the messages, a prompt
                that does not fit; 404 for another model.
        """
        self.gw.check_model(req.model)
        ctx = self.context(request, req)
        gate = PolicyGate(self.gw.policy, self.gw.audit, ctx, on_verdict=self.gw.metrics.count_verdict)
        use_tools = bool(req.tools) and req.tool_choice != "none"
        tools = client_tools if use_tools else None
        try:
            toolset = ToolSet.from_openai(tools) if use_tools else None
        except SchemaError as exc:
            raise bad_request(str(exc), param=self.tool_param(exc.index)) from None
        fmt = self.tool_call_format
        prefix = forced_prefix(req, fmt) if use_tools else ""
        quarantine = self.gw.quarantine  # withheld tool results never reach the template
        screened = quarantine.screen(req.messages, ctx.conversation).apply(req.messages) if quarantine else req.messages
        messages = template_messages(screened)
        kwargs = self.template_kwargs(req)
        reasoning = self.thinks and not prefix and kwargs.get("enable_thinking") is not False
        setup = Setup(req, tools, toolset, prefix, gate, use_tools, fmt, reasoning, kwargs)
        gen, prompt_ids, prompt = await self._generation(setup, messages, t_arrival)
        if quarantine is not None:
            quarantine.track(ctx.conversation, prompt, prompt_ids, screened, gen)
        return Prepared(setup, gen, prompt_ids, prompt, messages, ctx)

    def tool_param(self, index: int) -> str:
        """The request field of the ``index``-th tool's schema, for errors."""
        return f"tools[{index}].function.parameters"

    @staticmethod
    def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
        """Extra chat-template variables of ``req`` (``chat_template_kwargs``; the names the
        template call itself uses are left out)."""
        kwargs = dict(req.chat_template_kwargs or {})
        for name in ("messages", "tools", "add_generation_prompt"):
            kwargs.pop(name, None)
        return kwargs

    def max_tokens_of(self, req: ChatCompletionRequest) -> tuple[int | None, str]:
        """The completion budget the client asked for and the field that holds it."""
        if req.max_completion_tokens is not None:
            return req.max_completion_tokens, "max_completion_tokens"
        return req.max_tokens, "max_tokens"

    async def _generation(self, setup: Setup, messages: list[dict[str, Any]],
                          t_arrival: float) -> tuple[Generation, list[int], str]:
        """The generation of one conversation (``messages``, already screened): the prompt
        rendered and tokenized off the event loop, the completion budget, the forced tool call's
        choices and the output filter set (the engine checks the context window when the
        generation starts). Returns (generation, prompt ids, prompt text).
        Raises ``APIError`` (400: the template rejects the messages)."""
        req = setup.req

        def prompt_tokens() -> tuple[str, list[int], list[list[int]] | None, int]:
            prompt = self._render(messages, setup.client_tools, **(setup.template_kwargs or {})) + setup.prefix
            ids = self.engine.tokenize(prompt, add_special=False, parse_special=True)
            choices = forced_choices(req, lambda t: self.engine.tokenize(t, add_special=False, parse_special=False),
                                     setup.fmt)
            return prompt, ids, choices, self.resident_prefix(messages, setup, prompt)

        # A long conversation takes milliseconds to render and tokenize: off the event loop, so
        # the other streams keep flowing meanwhile.
        prompt, prompt_ids, choices, resident = await anyio.to_thread.run_sync(prompt_tokens)
        requested, budget_param = self.max_tokens_of(req)
        # the room the prompt leaves in the context window (at least 1: the engine refuses a prompt
        # that leaves none, naming it): the budget without one, and the ceiling of a clamped one
        room = max(1, self.engine.n_ctx - len(prompt_ids))
        if requested is None:
            max_tokens = room
        elif self.clamp_budget:
            max_tokens = min(requested, room)
        else:
            max_tokens = requested
        sampling = chat_sampling(req, max_tokens)
        if choices and setup.use_tools:
            sampling["prefix_choices"] = choices
        if resident:
            sampling["resident_prefix"] = resident
        if setup.gate.ctx.conversation:
            sampling["conversation"] = setup.gate.ctx.conversation  # drafts from its earlier outputs

        def make_filter() -> AssistantOutputFilter:
            return AssistantOutputFilter(setup.gate, parse_tools=setup.use_tools, prefix=setup.prefix,
                                         parallel_tool_calls=req.parallel_tool_calls is not False,
                                         tools=setup.toolset, on_reject=self.gw.metrics.count_tool_call_rejected,
                                         tool_format=setup.fmt)

        gen = Generation(self, req, prompt_ids, sampling, make_filter, forced=bool(setup.prefix),
                         t_arrival=t_arrival, reasoning=setup.reasoning,
                         in_reasoning=setup.reasoning and prompt_opens_reasoning(prompt),
                         max_tokens_param=budget_param if requested is not None and not self.clamp_budget else None)
        gen.window_cut = requested is not None and max_tokens < requested
        gen.conversation = setup.gate.ctx.conversation
        return gen, prompt_ids, prompt

    #: system turns remembered by ``resident_prefix``
    SYSTEM_HEADS = 64

    def resident_prefix(self, messages: list[dict[str, Any]], setup: Setup, prompt: str) -> int:
        """Tokens of the system turn (system prompt and tools, as the template renders them) at
        the head of ``prompt``, once that system turn has been seen in two conversations: an
        agent type (a main agent, each kind of sub-agent) repeats it in every session, so the
        engine keeps its prefix-cache blocks resident (``fak.Engine`` ``resident_prefix``) over
        the private tails of conversations. Within one conversation the LRU already keeps what
        its next turn needs (its whole history is that turn's prefix); protecting its system
        turn there only costs the tails (measured: ``benches/results/agent-prefix.md``). 0
        without a system message, when the template does not render it as the prompt's head, or
        while one conversation has used it. One less than the head's tokens, so a token merged
        across the boundary never counts. Remembers the last ``SYSTEM_HEADS`` heads."""
        if not messages or messages[0].get("role") != "system" or not hasattr(self.engine, "tokenize"):
            return 0
        kwargs = setup.template_kwargs or {}
        key = hashlib.sha256(json.dumps([messages[0].get("content"), setup.client_tools, kwargs], sort_keys=True,
                                        default=str).encode()).hexdigest()
        head = self._system_heads.get(key)
        if head is None:
            try:
                text = self.engine.apply_chat_template(messages[:1], tools=setup.client_tools,
                                                       add_generation_prompt=False, **kwargs)
            except Exception:  # noqa: BLE001 - a template that wants more than a system turn: no hint
                text = ""
            n = len(self.engine.tokenize(text, add_special=False, parse_special=True)) - 1 if text else 0
            head = (text, max(0, n), set())
            self._system_heads[key] = head
            while len(self._system_heads) > self.SYSTEM_HEADS:
                self._system_heads.popitem(last=False)
        else:
            self._system_heads.move_to_end(key)
        seen = head[2]
        if len(seen) < 2:
            seen.add(setup.gate.ctx.conversation)
        return head[1] if len(seen) >= 2 and head[0] and prompt.startswith(head[0]) else 0

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any) -> str:
        try:
            return self.engine.apply_chat_template(messages, tools=tools, add_generation_prompt=True, **kwargs)
        except Exception as exc:
            if type(exc).__module__.startswith("jinja2") or isinstance(exc, (ValueError, TypeError, KeyError)):
                raise bad_request(f"The model's chat template rejected the messages: {exc}",
                                  param=self.prompt_param) from None
            raise

    def count_prompt_tokens(self, req: ChatCompletionRequest, client_tools: list[dict[str, Any]] | None) -> int:
        """Tokens of the prompt ``req`` would send the model (template, tools, forced pre-fill
        included): what ``count_tokens`` endpoints answer. Raises ``APIError`` (400: template)."""
        use_tools = bool(req.tools) and req.tool_choice != "none"
        prompt = self._render(template_messages(req.messages), client_tools if use_tools else None,
                              **self.template_kwargs(req))
        prompt += forced_prefix(req, self.tool_call_format) if use_tools else ""
        return len(self.engine.tokenize(prompt, add_special=False, parse_special=True))

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

    # -- the non-streamed result

    async def complete_body(self, request: Request[Any, Any, Any], prep: Prepared) -> bytes:
        """Run ``prep`` to its end (the generation already started) and return the encoded
        ``ChatCompletion`` (repeated read-only calls served inline when the gateway does so).

        Raises:
            ClientDisconnected: the client went away (the generation is cancelled).
            APIError: an engine failure.
        """
        setup, gen = prep.setup, prep.gen
        n_verdicts = len(setup.gate.verdicts)
        try:
            out = await run_until_disconnect(request, self._complete(gen, setup.gate, setup.req, prep.n_prompt))
            inline = self.gw.inline_reads  # repeated read-only calls answered here (--serve-inline-reads)
            if inline is not None and setup.use_tools:
                await gen.aclose()
                out = await run_until_disconnect(request, inline.serve(
                    self, out, req=setup.req, conversation=request.headers.get(CONVERSATION_HEADER),
                    messages=prep.messages, tools=setup.client_tools, prefix=setup.prefix, gate=setup.gate,
                    n_verdicts_before=n_verdicts, start_run=lambda convo: self._round(setup, convo)))
        finally:
            await gen.aclose()
        return out

    async def _round(self, setup: Setup, messages: list[dict[str, Any]]) -> bytes:
        """One more non-streamed generation of the same request over ``messages`` (the inline
        reads' next round), its encoded ``ChatCompletion``."""
        gen, prompt_ids, _ = await self._generation(setup, messages, time.perf_counter())
        try:
            await gen.start()
            return await self._complete(gen, setup.gate, setup.req, len(prompt_ids))
        finally:
            await gen.aclose()

    async def _complete(self, gen: Generation, gate: PolicyGate, req: ChatCompletionRequest, n_prompt: int) -> bytes:
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        logprobs: list[TokenLogprobs] = []
        async with aclosing(gen.groups()) as groups:
            async for events, lps in groups:
                logprobs += lps
                for ev in events:
                    if isinstance(ev, ReasoningOut):
                        reasoning.append(ev.text)
                    elif isinstance(ev, ContentOut):
                        content.append(ev.text)
                    else:
                        calls.append(ToolCall(id=ev.call.id, function=FunctionCall(ev.call.name, ev.call.arguments)))
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
        if reasoning:
            message.reasoning_content = "".join(reasoning)
        finish = finish_reason_of(gen.finish_reason, bool(calls))
        choice = ChatChoice(index=0, message=message, finish_reason=finish,
                            logprobs=ChoiceLogprobs(content=self._chat_logprobs(logprobs)) if req.logprobs else None)
        response = ChatCompletion(
            id=new_id("chatcmpl"), created=now(), model=self.gw.model_name, choices=[choice],
            usage=usage_of(n_prompt, gen), system_fingerprint=SYSTEM_FINGERPRINT)
        if gate.active:
            response.fak_policy = FakPolicyInfo(verdicts=gate.verdicts)
        if (error := gen.tool_call_error) is not None:
            response.fak = {"tool_call_error": error}
        if (timings := gen.run.timings()) is not None:
            response.timings = timings
        return msgspec.json.encode(response)

    # -- starting

    async def start(self, request: Request[Any, Any, Any], prep: Prepared) -> None:
        """Start a non-streamed generation (up to its first token).

        Raises:
            ClientDisconnected: the client went away first (the generation is closed).
            APIError: refused before the first token (queue full, KV cache, engine values).
        """
        try:
            await run_until_disconnect(request, prep.gen.start())
        except ClientDisconnected:
            await prep.gen.aclose()
            raise

    async def stream_response(self, request: Request[Any, Any, Any], prep: Prepared,
                              body: Callable[[Callable[[], Awaitable[None]]], AsyncIterator[bytes]], *,
                              ping: bytes,
                              error_event: Callable[[APIError], bytes]) -> Response[Any]:
        """A streamed answer that starts at once.

        ``body(started)`` is the protocol's event writer: it sends its opening events, awaits
        ``started()`` (the first token; raises ``APIError`` when the generation is refused), then
        writes the events of ``prep.gen.groups()``. When the first token (or a refusal) comes
        within ``GatewayConfig.stream_headers_after_s``, a refusal still gets its HTTP status;
        otherwise the status line, the headers and the opening events leave now and a refusal
        is sent as ``error_event(err)``. Either way ``ping`` is sent whenever nothing else was for
        ``GatewayConfig.stream_keepalive_s`` seconds.

        Raises:
            ClientDisconnected: the client went away before the headers (the generation is closed).
            APIError: refused within the wait (its HTTP status).
        """
        gen = prep.gen
        task: asyncio.Future[None] = asyncio.ensure_future(gen.start())
        wait = float(getattr(self.gw.config, "stream_headers_after_s", 0.2))
        try:
            await run_until_disconnect(request, asyncio.wait({task}, timeout=wait))
        except ClientDisconnected:
            await cancel_and_wait(task)
            with anyio.CancelScope(shield=True):
                await gen.aclose()
            raise
        if task.done() and task.exception() is not None:
            await gen.aclose()
            raise task.exception()  # type: ignore[misc]

        async def started() -> None:
            await asyncio.shield(task)

        async def events() -> AsyncIterator[bytes]:
            try:
                async for chunk in body(started):
                    yield chunk
            except APIError as err:
                yield error_event(err)
            finally:
                await cancel_and_wait(task)
                await gen.aclose()

        interval = float(getattr(self.gw.config, "stream_keepalive_s", 5.0))
        return Stream(keepalive(events(), interval, ping), media_type="text/event-stream", headers=SSE_HEADERS,
                      background=BackgroundTask(gen.aclose))
