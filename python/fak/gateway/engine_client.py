"""The gateway's view of ``fak.Engine`` and one generation run through it.

The gateway is a thin client of ``fak.Engine`` (contract in ARCHITECTURE.md): it renders the
chat template, tokenizes, and streams ``Delta`` objects from ``Engine.astream``; the engine checks
the request (context window, token ids, sampling ranges, stop strings), queues and batches
concurrent sequences itself (continuous batching) and ends each one. Its typed errors
(``fak.errors``) become the client's 4xx here (``engine_error``). ``EngineRun`` holds one
request's place among those in flight and its async iterator; closing it (end of stream, client
disconnect, error) closes the iterator, which cancels the sequence and frees its KV cache.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from fak.errors import ContextLengthError, FakError, InvalidArgumentError, KVCacheFullError
from fak.gateway.admission import Admission
from fak.gateway.disconnect import cancel_and_wait
from fak.gateway.errors import APIError, bad_request
from fak.gateway.schemas import Timings
from fak.toolcalls import ToolCallFormat, detect_tool_call_format

log = logging.getLogger("fak.gateway")

__all__ = [
    "EngineLike",
    "EngineRun",
    "TokenLogprobs",
    "engine_error",
    "engine_tool_call_format",
    "sampling_kwargs",
    "token_logprobs",
]


class EngineLike(Protocol):
    """The part of ``fak.Engine`` the gateway uses. Read when present: ``token_bytes(id)``
    (logprobs ``bytes``); ``astream`` takes ``prefix_choices`` (forced tool calls), checks the
    request and raises ``fak.errors``' typed errors (``engine_error`` maps them)."""

    model_name: str
    n_ctx: int
    backend: str

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def detokenize(self, ids: list[int]) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True) -> str: ...

    def astream(self, prompt: str | list[int], **sampling: Any) -> AsyncIterator[Any]: ...

    def stats(self) -> dict[str, Any]: ...


def engine_tool_call_format(engine: Any, override: str | None = None) -> ToolCallFormat:
    """The tool-call form the engine's model speaks: ``override`` when given (``"hermes"`` or
    ``"qwen3_xml"``, ``fak serve --tool-call-format``), else what its chat template teaches
    (``fak.toolcalls.detect_tool_call_format`` over ``engine.chat_template.source``: the
    template inside the GGUF, or the one that overrides it; a plain string is read as the
    source). An engine without a template speaks the Hermes JSON form.

    Raises:
        ValueError: ``override`` names no form.
    """
    if override is not None and override != "auto":
        try:
            return ToolCallFormat(override)
        except ValueError:
            forms = ", ".join(f.value for f in ToolCallFormat)
            raise ValueError(f"unknown tool-call format {override!r}; use auto, {forms}") from None
    template = getattr(engine, "chat_template", None)
    source = template if isinstance(template, str) else getattr(template, "source", None)
    return detect_tool_call_format(source if isinstance(source, str) else None)


def sampling_kwargs(req: Any, max_tokens: int) -> dict[str, Any]:
    """``Engine.astream`` sampling keywords from a chat or completion request.

    Only what the client set is passed (the engine's defaults apply otherwise). ``top_p == 0``
    means greedy; ``top_k`` -1 or 0 means off; ``repetition_penalty`` maps to the engine's
    ``repeat_penalty``; a negative ``seed`` is taken modulo 2**64.
    """
    s: dict[str, Any] = {"max_tokens": max_tokens}
    if req.temperature is not None:
        s["temperature"] = req.temperature
    if req.top_p is not None:
        if req.top_p == 0.0:
            s["temperature"] = 0.0
        else:
            s["top_p"] = req.top_p
    if req.top_k is not None:
        s["top_k"] = max(req.top_k, 0)
    if req.min_p is not None:
        s["min_p"] = req.min_p
    if req.presence_penalty is not None:
        s["presence_penalty"] = req.presence_penalty
    if req.frequency_penalty is not None:
        s["frequency_penalty"] = req.frequency_penalty
    if req.repetition_penalty is not None:
        s["repeat_penalty"] = req.repetition_penalty
    if req.seed is not None:
        s["seed"] = req.seed % (1 << 64)
    if req.stop is not None:
        s["stop"] = req.stop  # checked by the engine (an empty stop string is refused there)
    if getattr(req, "speculative", None) is not None:
        s["speculative"] = req.speculative
    return s


# The engine's names of sampling arguments (``InvalidArgumentError.param``) -> the request field.
_REQUEST_FIELDS = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "seed": "seed", "stop": "stop", "logprobs": "logprobs",
    "n_logprobs": "logprobs", "speculative": "speculative",
}
# The engine's names of the prompt's token ids.
_PROMPT_ARGS = ("prompt_ids", "token_ids")


def engine_error(exc: BaseException, *, prompt_param: str = "messages",
                 max_tokens_param: str | None = None) -> APIError:
    """Map an exception raised by the engine for one request to the client's error.

    The engine's errors are typed (``fak.errors``): a ``ContextLengthError`` carries ``param``,
    ``n_prompt``, ``max_tokens`` and ``n_ctx``, an ``InvalidArgumentError`` the ``param`` at fault.
    ``prompt_param``: the request field holding the prompt (``messages`` or ``prompt``), named by
    context-length errors about the prompt and by errors about its token ids;
    ``max_tokens_param``: the completion budget's field when the client set it (``max_tokens``,
    ``max_completion_tokens``, ...), named when the prompt fits but not with the budget (else the
    prompt's field is).
    """
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):
        return _context_error(exc, prompt_param, max_tokens_param)
    if isinstance(exc, KVCacheFullError):
        return APIError(503, f"The KV cache is full ({exc}); retry when running requests finish.",
                        type="server_error", code="kv_cache_full", headers={"Retry-After": "1"})
    if isinstance(exc, InvalidArgumentError):
        param = exc.param
        if param in _PROMPT_ARGS:
            return bad_request(f"Invalid prompt: {exc}", param=prompt_param, code="invalid_value")
        if param == "max_tokens":
            field: str | None = max_tokens_param or "max_tokens"
        elif param is not None and param.startswith("stop["):
            field = param
        else:
            field = _REQUEST_FIELDS.get(param or "")
        return bad_request(f"Invalid sampling parameters: {exc}", param=field, code="invalid_value")
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        return bad_request(f"Invalid sampling parameters: {exc}", code="invalid_value")
    if isinstance(exc, FakError):
        log.error("engine error: %s", exc)
        return APIError(500, f"The engine failed: {exc}", type="server_error", code="engine_error")
    log.error("unexpected engine failure", exc_info=exc)
    return APIError(500, f"The engine failed ({type(exc).__name__}); see the gateway log.",
                     type="server_error", code="engine_error")


def _context_error(exc: ContextLengthError, prompt_param: str, max_tokens_param: str | None) -> APIError:
    """400 ``context_length_exceeded`` in OpenAI's wording, from the numbers the engine's error
    carries (its own message when it carries none)."""
    n_ctx, n_prompt, max_tokens = exc.n_ctx, exc.n_prompt, exc.max_tokens
    if n_ctx is None or n_prompt is None:
        return APIError(400, str(exc), param=prompt_param, code="context_length_exceeded")
    if max_tokens is None:
        return APIError(
            400, f"This model's maximum context length is {n_ctx} tokens. However, your messages "
            f"resulted in {n_prompt} tokens. Please reduce the length of the messages.",
            param=prompt_param, code="context_length_exceeded")
    return APIError(
        400, f"This model's maximum context length is {n_ctx} tokens. However, you requested "
        f"{n_prompt + max_tokens} tokens ({n_prompt} in the {prompt_param}, {max_tokens} in the completion). "
        f"Please reduce the length of the {prompt_param} or completion.",
        param=max_tokens_param if max_tokens_param is not None else prompt_param,
        code="context_length_exceeded")


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities (natural log) at one generated position.

    ``token`` is the engine's text of the token when it sent one (else ``None``: detokenize);
    ``top`` lists ``(token_id, logprob, token_text | None)`` alternatives, most likely first.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float, str | None]]
    token: str | None = None


def _finite(x: Any) -> float:
    v = float(x)
    return v if math.isfinite(v) else -9999.0  # JSON has no -inf (OpenAI reports -9999.0 too)


def _top_list(top: Any) -> list[tuple[int, float, str | None]]:
    if top is None:
        return []
    if isinstance(top, dict):
        return [(int(k), _finite(v), None) for k, v in top.items()]
    out: list[tuple[int, float, str | None]] = []
    for item in top:
        if isinstance(item, (tuple, list)):
            out.append((int(item[0]), _finite(item[1]), None))
        else:
            out.append((int(item.token_id), _finite(item.logprob), getattr(item, "token", None)))
    return out


def token_logprobs(delta: Any) -> list[TokenLogprobs]:
    """Per-token log-probabilities of a ``Delta`` (``[]`` when the engine sent none).

    ``fak.Engine`` sends ``TokenLogprob(token_id, token, logprob, top_logprobs=[TopLogprob(token_id,
    token, logprob)])``; ``(token_id, logprob, top)`` tuples (with ``top`` as ``(id, logprob)``
    pairs or an ``{id: logprob}`` dict) are accepted too.
    """
    entries = getattr(delta, "logprobs", None)
    if not entries:
        return []
    out = []
    for entry in entries:
        if isinstance(entry, (tuple, list)):
            out.append(TokenLogprobs(int(entry[0]), _finite(entry[1]), _top_list(entry[2] if len(entry) > 2 else None)))
        else:
            out.append(TokenLogprobs(int(entry.token_id), _finite(entry.logprob),
                                     _top_list(getattr(entry, "top_logprobs", None)), getattr(entry, "token", None)))
    return out


@dataclass
class EngineRun:
    """One request's generation: its place in flight, engine iterator, timing and token counts.

    Args:
        engine: the engine.
        prompt_ids: prompt token ids.
        sampling: keyword arguments for ``Engine.astream``.
        admission: the gateway's count of requests in flight.
        metrics: ``GatewayMetrics`` (or ``None``).
        t_arrival: ``time.perf_counter()`` at request arrival (for time to first token).
        prompt_param: the request field of the prompt, for errors (``messages`` / ``prompt``).
        max_tokens_param: the request field of the completion budget when the client set it, for
            context-length errors (``engine_error``).

    ``start()`` counts the run in flight, submits it (the engine queues it until it runs) and
    waits for the first delta (so errors before the first token still get a proper HTTP status); ``deltas()`` yields every delta; ``aclose()`` is idempotent
    and shielded from cancellation, so a disconnect cannot skip freeing the sequence.

    Metrics: a run refused before its first token (queue full, context, KV cache, bad values)
    counts in ``fak_requests_rejected_total{reason}``; one closed before its end (client gone,
    engine failure mid-way) in ``fak_requests_cancelled_total``; a run the server itself set
    aside (``discard()``: a forced tool call sampled again) in neither.
    """

    engine: EngineLike
    prompt_ids: list[int]
    sampling: dict[str, Any]
    admission: Admission
    metrics: Any = None
    t_arrival: float = field(default_factory=time.perf_counter)
    prompt_param: str = "messages"
    max_tokens_param: str | None = None
    n_completion: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    #: prompt tokens the engine's prefix cache held (its first delta says; ``None``: not reported)
    cached_tokens: int | None = None
    _it: Any = None
    _first: Any = None
    _has_first: bool = False
    _slot: bool = False
    _closed: bool = False
    _t_first: float | None = None
    _t_last: float | None = None
    _rejected: str | None = None
    _discarded: bool = False

    async def start(self) -> None:
        """Count the run in flight, submit the sequence, wait for its first delta.

        Raises:
            APIError: 429 (as many in flight as the engine runs and queues), 400/503/500 mapped
                from the engine's error.
        """
        try:
            self.admission.acquire()
        except APIError as err:
            if self.metrics is not None:
                self.metrics.count_rejected(err.code or "rate_limit_exceeded")
            raise
        self._slot = True
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(self.prompt_ids))
        try:
            self._it = self.engine.astream(self.prompt_ids, **self.sampling)
            try:
                self._first = await self._it.__anext__()
                self._has_first = True
            except StopAsyncIteration:
                self._has_first = False
        except BaseException as exc:
            mapped = self._error(exc) if isinstance(exc, Exception) else None
            if mapped is not None:
                self._rejected = mapped.code or "engine_error"
            await self.aclose()
            if mapped is not None:
                raise mapped from None
            raise

    def _error(self, exc: Exception) -> APIError:
        return engine_error(exc, prompt_param=self.prompt_param, max_tokens_param=self.max_tokens_param)

    def timings(self) -> Timings | None:
        """This run's ``Timings`` (``None`` before its first token)."""
        if self._t_first is None or self._t_last is None:
            return None
        decode_s = self._t_last - self._t_first
        n_decode = max(0, self.n_completion - 1)  # the first token ends the prefill
        return Timings(prompt_n=len(self.prompt_ids),
                       prompt_ms=round((self._t_first - self.t_arrival) * 1e3, 3),
                       predicted_n=self.n_completion, predicted_ms=round(decode_s * 1e3, 3),
                       predicted_per_second=round(n_decode / decode_s, 3) if decode_s > 0 else 0.0)

    async def discard(self) -> None:
        """Close the run as set aside by the server (counted neither cancelled nor rejected)."""
        self._discarded = True
        await self.aclose()

    def _account(self, delta: Any) -> None:
        cached = getattr(delta, "cached_tokens", None)
        if cached is not None and self.cached_tokens is None:
            self.cached_tokens = int(cached)
        n = len(getattr(delta, "token_ids", ()) or ())
        if n:
            now = time.perf_counter()
            if self._t_first is None:
                self._t_first = now
                if self.metrics is not None:
                    self.metrics.ttft.observe(now - self.t_arrival)
            self._t_last = now
            self.n_completion += n
        if getattr(delta, "finish_reason", None):
            self.finish_reason = delta.finish_reason
            self.stop_reason = getattr(delta, "stop_reason", None)

    async def deltas(self) -> AsyncIterator[Any]:
        """Every delta of the generation, the first one included.

        Raises:
            APIError: an engine failure after the first token.
        """
        if self._has_first:
            self._has_first = False
            self._account(self._first)
            yield self._first
        if self._it is None or self._closed:
            return
        try:
            async for delta in self._it:
                self._account(delta)
                yield delta
        except Exception as exc:  # noqa: BLE001 - mapped for the client
            raise self._error(exc) from None

    async def batches(self) -> AsyncGenerator[list[Any], None]:
        """Every delta, grouped: each group is what arrived while the previous one was handled.

        A pump task moves deltas from the engine into a queue; the consumer takes everything
        queued at once. When the client side keeps up, groups hold one delta; when it falls behind
        (many streams, a fast engine), one group (one write to the socket) carries several, so the
        cost per token of the HTTP path shrinks instead of the backlog growing.

        Raises:
            APIError: an engine failure, after the deltas that preceded it.
        """
        queue: asyncio.Queue[Any] = asyncio.Queue()
        end = object()

        async def pump() -> None:
            try:
                async for delta in self.deltas():
                    queue.put_nowait(delta)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer
                queue.put_nowait(exc)
            finally:
                queue.put_nowait(end)

        task = asyncio.ensure_future(pump())
        try:
            while True:
                group = [await queue.get()]
                while not queue.empty():
                    group.append(queue.get_nowait())
                done = group[-1] is end
                if done:
                    group.pop()
                failure = next((g for g in group if isinstance(g, Exception)), None)
                deltas = [g for g in group if not isinstance(g, Exception)]
                if deltas:
                    yield deltas
                if failure is not None:
                    raise failure
                if done:
                    return
        finally:
            await cancel_and_wait(task)

    async def aclose(self) -> None:
        """Close the engine iterator (cancels an unfinished sequence) and release the slot."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            it, self._it = self._it, None
            if it is not None:
                close = getattr(it, "aclose", None)
                if close is not None:
                    try:
                        await close()
                    except Exception:
                        log.exception("closing the engine stream failed")
            if self._slot:
                self._slot = False
                self.admission.release()
        if self.metrics is not None:
            self.metrics.completion_tokens.inc(self.n_completion)
            if self._t_first is not None and self._t_last is not None and self.n_completion > 1:
                self.metrics.tpot.observe((self._t_last - self._t_first) / (self.n_completion - 1))
            self.metrics.e2e.observe(time.perf_counter() - self.t_arrival)
            if self._rejected is not None:
                self.metrics.count_rejected(self._rejected)
            elif self.finish_reason is None and not self._discarded:
                self.metrics.cancelled.inc()
