"""``fak.Engine``: generation over one native model, sync and async, with continuous batching.

One engine-loop thread per :class:`Engine` owns the native model (``fak._native.Model``, contract in
ARCHITECTURE.md) and is the only thread that calls it. Requests reach the loop through a locked
inbox, each carrying its own reply channel (a ``queue.SimpleQueue`` for sync callers; for async
callers a deque whose consumer is woken with ``loop.call_soon_threadsafe`` under asyncio or
``TrioToken.run_sync_soon`` under trio, so anyio works on either backend). Between two
``step()`` calls the loop admits waiting requests (``add_sequence``), so new sequences join a
running batch; it sleeps on a condition while nothing is running. The native engine core ends a
request itself: each sequence carries ``max_tokens`` and the end-of-generation ids (EOS/EOT from
the GGUF metadata), and the step that samples one of them, or the last allowed token, returns
its ``finish`` and frees the sequence. Each sampled token goes through the request's UTF-8-safe
detokenizer and stop-string matcher; a stop string (text, which the core never sees) finishes the
request here (``remove_sequence``). Closing or dropping a stream, or cancelling the task that
awaits it, cancels its sequence.

Failures stay with the request that caused them: a failing ``add_sequence`` (bad values, a prompt
that can never fit in the KV cache) fails that request, and a failing ``step()`` fails the sequences
that the core held then; the loop goes on serving the others. The queue is the native core's: a
request is handed to it as soon as the loop sees it, and the core runs up to ``max_batch``
sequences, queues the rest and admits them as KV blocks free up (preempting by recompute when it
must), as vLLM's EngineCore does; ``fak.Engine`` keeps no queue of its own.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from fak.chat import ChatTemplate, NoChatTemplateError
from fak.errors import FakError, context_length_error, invalid_argument
from fak.sampling import SamplingParams
from fak.tokenizer import IncrementalDetokenizer, StopMatcher, Tokenizer, read_gguf_metadata

__all__ = [
    "Engine",
    "Delta",
    "Completion",
    "Usage",
    "Timings",
    "TokenLogprob",
    "TopLogprob",
    "TokenStream",
    "AsyncTokenStream",
    "NativeModel",
]


class NativeModel(Protocol):
    """What :class:`Engine` needs from a model: the ``fak._native.Model`` contract."""

    @property
    def n_ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def kv_blocks_total(self) -> int: ...
    @property
    def kv_blocks_free(self) -> int: ...
    def add_sequence(self, seq_id: int, prompt_ids: list[int], sampling: dict[str, Any],
                     resident_tokens: int = 0, conversation: str | None = None) -> None: ...
    def remove_sequence(self, seq_id: int) -> None: ...
    def step(self) -> list[tuple[int, int, float, list[tuple[int, float]] | None, str | None]]: ...
    def logits(self, token_ids: list[int]) -> Any: ...


# --- results ---------------------------------------------------------------------------------


class TopLogprob(msgspec.Struct, frozen=True):
    """One alternative at a position: its token id, piece text and natural-log probability."""

    token_id: int
    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True):
    """The sampled token at one position, its log-probability (natural log of the softmax of the
    model's raw logits, before penalties, temperature and truncation) and the most likely
    alternatives."""

    token_id: int
    token: str
    logprob: float
    top_logprobs: list[TopLogprob]


class Usage(msgspec.Struct, frozen=True):
    """Token counts of one request (the generated count includes a final EOS/EOT token)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(msgspec.Struct, frozen=True):
    """Wall-clock timings of one request, in seconds and tokens per second.

    ``ttft_s``: submission to first token (queueing + prefill); ``queue_s``: submission to
    admission into the batch; ``prefill_s``: the engine step that prefilled the prompt (shared with
    the decode of other running sequences); ``decode_s``: first to last token.
    ``prefill_tok_s = prompt_tokens / prefill_s``, ``decode_tok_s = (completion_tokens - 1) / decode_s``.
    """

    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0


class Delta(msgspec.Struct):
    """A piece of a streamed completion.

    ``text``: new text (may be empty while bytes of a character or a possible stop string are
    held back); ``token_ids``: the tokens sampled since the previous delta; ``finish_reason``:
    ``"stop"`` (EOS/EOT token or stop string) or ``"length"`` (max_tokens or context full) on the
    last delta, else None; ``logprobs``: one entry per token when requested. The last delta also
    carries ``usage`` and ``timings``. The first delta carries ``cached_tokens``: the prompt tokens
    the prefix cache held (their prefill was skipped), when the native core reports it.
    """

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    stop_reason: str | int | None = None
    cached_tokens: int | None = None


class Completion(msgspec.Struct):
    """A finished completion.

    ``text``: the generated text (without the stop string or EOS); ``token_ids``: every sampled
    token (including a final EOS/EOT and the tokens of a stop string); ``finish_reason``:
    ``"stop"`` or ``"length"``; ``stop_reason``: the stop string or EOS/EOT id that ended it.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None


def _merge(deltas: Sequence[Delta]) -> Delta:
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    logprobs = None
    if any(d.logprobs is not None for d in deltas):
        logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
    return Delta(
        text="".join(d.text for d in deltas),
        token_ids=[t for d in deltas for t in d.token_ids],
        finish_reason=last.finish_reason,
        logprobs=logprobs,
        usage=last.usage,
        timings=last.timings,
        stop_reason=last.stop_reason,
        cached_tokens=deltas[0].cached_tokens,
    )


def _collect(deltas: Iterator[Delta] | list[Delta]) -> Completion:
    parts: list[Delta] = list(deltas)
    final = _merge(parts) if parts else None
    if final is None or final.finish_reason is None or final.usage is None or final.timings is None:
        raise FakError("generation ended without a final delta")
    return Completion(final.text, final.token_ids, final.finish_reason, final.usage, final.timings,
                      final.logprobs, final.stop_reason)


# --- reply channels --------------------------------------------------------------------------

_END = object()


class _SyncSink:
    """Reply channel of a thread-blocking consumer."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, item: Any) -> None:
        self._q.put(item)

    def put_deferred(self, item: Any, wakes: _Wakes) -> None:
        self._q.put(item)

    def get_all(self) -> list[Any]:
        items = [self._q.get()]
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                return items


def _wake_all(sinks: list[_AsyncSink]) -> None:
    for sink in sinks:
        sink._wake()


class _Wakes:
    """Async sinks that received items during one engine step, grouped by event loop."""

    def __init__(self) -> None:
        self._by_loop: dict[Any, list[_AsyncSink]] = {}

    def add(self, sink: _AsyncSink) -> None:
        group = self._by_loop.setdefault(sink.loop_key, [])
        if not group or group[-1] is not sink:
            group.append(sink)

    def flush(self) -> None:
        by_loop, self._by_loop = self._by_loop, {}
        for sinks in by_loop.values():
            sinks[0].wake_soon(sinks)


class _AsyncSink:
    """Reply channel of an async consumer (asyncio, or anyio on asyncio or trio).

    The engine thread appends to a deque and schedules a wake-up on the consumer's event loop;
    the wake-up runs on that loop's thread, so it cannot race with the consumer's wait.
    """

    def __init__(self) -> None:
        try:
            loop: Any = asyncio.get_running_loop()
            self._schedule = loop.call_soon_threadsafe
        except RuntimeError:  # not asyncio: anyio's other backend is trio
            try:
                import trio

                loop = trio.lowlevel.current_trio_token()
                self._schedule = loop.run_sync_soon
            except (ImportError, RuntimeError):
                raise RuntimeError("Engine.astream needs a running asyncio or trio event loop") from None
        self.loop_key = id(loop)
        self._items: deque[Any] = deque()
        self._event: Any = None

    def put(self, item: Any) -> None:
        self._items.append(item)
        self.wake_soon([self])

    def put_deferred(self, item: Any, wakes: _Wakes) -> None:
        """Queues ``item``; the consumer is woken by ``wakes.flush()`` (one cross-thread call per
        event loop per engine step instead of one per token)."""
        self._items.append(item)
        wakes.add(self)

    def wake_soon(self, sinks: list[_AsyncSink]) -> None:
        try:
            self._schedule(_wake_all, sinks)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening
            pass

    def _wake(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def get_all(self) -> list[Any]:
        import anyio

        while not self._items:
            self._event = anyio.Event()
            await self._event.wait()
        items = []
        while self._items:
            items.append(self._items.popleft())
        return items


# --- requests --------------------------------------------------------------------------------


class _Request:
    """One generation request, owned by the engine thread once submitted."""

    def __init__(self, seq_id: int, prompt_ids: list[int], params: SamplingParams, max_new: int,
                 tokenizer: Tokenizer, stop_ids: list[int]) -> None:
        self.seq_id = seq_id
        self.prompt_ids = prompt_ids
        self.params = params
        # The core ends the request: at an end-of-generation token or after max_new tokens.
        self.native = {**params.to_native(), "max_tokens": max_new, "stop_ids": stop_ids}
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop = StopMatcher(params.stop_strings)
        self.sink: Any = None
        self.cancelled = False
        self.native_done = False  # the core finished (and removed) the sequence
        self.n_generated = 0
        self.t_submit = 0.0
        self.t_added = 0.0
        self.prefill_s = 0.0
        self.t_first: float | None = None
        self.t_last = 0.0
        self.resident = 0  # leading prompt tokens to keep resident in the prefix cache
        self.conversation: str | None = None  # its conversation (drafts from earlier outputs)
        self.cached_tokens: int | None = None  # prompt tokens the prefix cache held


class _Stream:
    """State shared by the sync and async streams: the request and the items received."""

    def __init__(self, engine: Engine, request: _Request) -> None:
        self._engine = engine
        self._request = request
        self._started = False
        self._done = False
        self._pending: deque[Any] = deque()

    def _take(self) -> Delta:
        """Merges the deltas received so far, up to the last one or an error (raised)."""
        deltas: list[Delta] = []
        while self._pending:
            item = self._pending[0]
            if isinstance(item, BaseException):
                if deltas:
                    break
                self._pending.popleft()
                self._done = True
                raise item
            self._pending.popleft()
            deltas.append(item)
            if item.finish_reason is not None:
                self._done = True
                break
        return _merge(deltas)

    def _cancel(self) -> None:
        if self._started and not self._done:
            self._engine._cancel(self._request)
        self._done = True

    def __del__(self) -> None:
        try:
            self._cancel()
        except Exception:  # interpreter shutdown
            pass


class TokenStream(_Stream, Iterator[Delta]):
    """Iterator of :class:`Delta` for one request (``Engine.stream``).

    The request is submitted on the first ``next()``. Deltas that queued up while the consumer was
    busy are merged into one. ``close()`` (or leaving a ``with`` block, or dropping the iterator)
    cancels the request and frees its KV cache.
    """

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> Delta:
        if self._done:
            raise StopIteration
        if not self._started:
            self._request.sink = _SyncSink()
            self._engine._submit(self._request)
            self._started = True
        if not self._pending:
            self._pending.extend(self._request.sink.get_all())
        return self._take()

    def close(self) -> None:
        """Cancels the request if it is still running; idempotent."""
        self._cancel()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cancel()


class AsyncTokenStream(_Stream, AsyncIterator[Delta]):
    """Async iterator of :class:`Delta` for one request (``Engine.astream``), for asyncio and anyio.

    Submitted on the first ``__anext__``. ``aclose()``, leaving an ``async with`` block, dropping
    the iterator, or cancelling the task while it awaits a delta cancels the request and frees its
    KV cache.
    """

    def __aiter__(self) -> AsyncTokenStream:
        return self

    async def __anext__(self) -> Delta:
        if self._done:
            raise StopAsyncIteration
        if not self._started:
            self._request.sink = _AsyncSink()
            self._engine._submit(self._request)
            self._started = True
        if not self._pending:
            try:
                self._pending.extend(await self._request.sink.get_all())
            except BaseException:
                self._cancel()
                raise
        return self._take()

    async def aclose(self) -> None:
        """Cancels the request if it is still running; idempotent."""
        self._cancel()

    async def __aenter__(self) -> AsyncTokenStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._cancel()


# --- the engine ------------------------------------------------------------------------------


def _resolve_backend(backend: str) -> str:
    if backend not in ("auto", "cpu", "cuda"):
        raise ValueError(f"backend must be 'auto', 'cpu' or 'cuda', got {backend!r}")
    if backend != "auto":
        return backend
    from fak import _native

    probe = getattr(_native, "cuda_available", None)
    try:
        return "cuda" if probe is not None and probe() else "cpu"
    except FakError:
        return "cpu"


class Engine:
    """A GGUF model ready to generate: tokenizer, chat template, native model and engine loop.

    Args:
        path: GGUF file.
        backend: ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when ``fak._native`` reports a usable
            GPU, else CPU). ``"cuda"`` without a GPU raises ``fak.BackendError``; it never falls
            back silently.
        n_ctx: context window per sequence, in tokens (prompt + generated).
        threads: CPU threads for the native model (None: its default).
        max_batch: most sequences decoded together (the native core's); more requests wait in
            its queue.
        chat_template: Jinja chat template overriding the file's ``tokenizer.chat_template``.
        kv_cache_tokens: size of the paged KV cache shared by all sequences, in tokens (None: the
            native model's default).
        prefix_cache: automatic prefix caching: a prompt that starts with full KV blocks (32
            tokens) already computed for an earlier request (a shared system prompt, the earlier
            turns of a conversation) skips their prefill. Outputs are the same with it off.
        rope_scaling: RoPE scaling scheme over the file's ``{arch}.rope.scaling.type``:
            ``"none"``, ``"linear"``, ``"yarn"`` or ``"llama3"`` (None: the file decides;
            docs/long-context.md). Qwen2.5's 128k setting is ``rope_scaling="yarn",
            rope_scale=4, yarn_orig_ctx=32768``.
        rope_scale: context extension factor (``rope.scaling.factor``, > 0).
        yarn_orig_ctx: the context the model was trained on before extension, in tokens
            (``rope.scaling.original_context_length``; None: the file's, else its
            ``context_length``).
        tensor_parallel: shards the forward runs as (Megatron-style: attention heads, FFN
            columns and the LM head's vocabulary divided, two all-reduces per layer;
            docs/tensor-parallel.md). On the CPU backend the shards are threads of this process
            sharing ``threads``; multi-GPU (NCCL) is not built, so ``backend="cuda"`` (or
            ``"auto"`` finding a GPU) with ``tensor_parallel > 1`` raises ``fak.BackendError``.
        sliding_window: sliding-window attention over the file's
            ``{arch}.attention.sliding_window``, in tokens (0: none; None: the file decides):
            windowed layers (the file's ``attention.sliding_window_pattern``, every layer without
            one) attend to the last ``sliding_window`` positions only (llama.cpp's and Hugging
            Face's convention). With every layer windowed, each sequence's KV memory is bounded by
            the window instead of ``n_ctx`` (docs/long-context.md).
        n_cpu_moe: a mixture-of-experts model's experts of the first ``n_cpu_moe`` layers stay
            in host memory and run on the CPU, the rest of the model on the GPU (llama.cpp's
            ``--n-cpu-moe``; ≥ the layer count: every layer, ``--cpu-moe``; no effect on the CPU
            backend or a dense model; docs/moe.md).
        speculative: speculative decoding of requests that do not set their own
            (docs/speculative.md): ``"ngram"`` (prompt lookup over the sequence), ``"suffix"``
            (suffix index over the sequence), ``"METHOD:K"`` (at most K draft tokens per step,
            1..32; default 4), ``"none"`` or None (off). Greedy outputs are the same tokens and
            log-probabilities, sampled ones the same distribution. Off for hybrid models and
            ``tensor_parallel > 1``.

    Raises:
        OSError / fak.GGUFError: unreadable or invalid file.
        fak.UnsupportedError: an architecture, tensor type or tokenizer fak does not support;
            its subclass fak.ShardError when the model cannot be split ``tensor_parallel`` ways
            (the message names the tensor, its format and the shard count).
        fak.BackendError: the backend cannot start.
        ValueError: bad arguments.
    """

    def __init__(
        self,
        path: str | Path,
        backend: str = "auto",
        n_ctx: int = 4096,
        threads: int | None = None,
        max_batch: int = 64,
        chat_template: str | None = None,
        *,
        kv_cache_tokens: int | None = None,
        prefix_cache: bool = True,
        rope_scaling: str | None = None,
        rope_scale: float | None = None,
        yarn_orig_ctx: int | None = None,
        tensor_parallel: int = 1,
        sliding_window: int | None = None,
        n_cpu_moe: int = 0,
        speculative: str | None = None,
    ) -> None:
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        if tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        from fak import _native

        path = Path(path)
        metadata = read_gguf_metadata(path)
        tokenizer = Tokenizer.from_gguf_metadata(metadata)
        template = _template_or_none(metadata, chat_template)
        resolved = _resolve_backend(backend)
        model = _native.Model(str(path), backend=resolved, n_ctx=n_ctx, threads=threads,
                              kv_cache_tokens=kv_cache_tokens, max_batch=max_batch,
                              prefix_cache=prefix_cache, rope_scaling=rope_scaling, rope_scale=rope_scale,
                              yarn_orig_ctx=yarn_orig_ctx, tensor_parallel=tensor_parallel,
                              sliding_window=sliding_window, n_cpu_moe=n_cpu_moe,
                              **({"speculative": speculative} if speculative is not None else {}))
        self._init(model, tokenizer, template, path.stem, resolved, max_batch)

    @classmethod
    def from_model(
        cls,
        model: NativeModel,
        tokenizer: Tokenizer,
        *,
        chat_template: ChatTemplate | None = None,
        model_name: str = "model",
        backend: str = "cpu",
        max_batch: int = 64,
    ) -> Engine:
        """An engine over an already built model object that follows the native contract (used by
        tests and by embedders that construct ``fak._native.Model`` themselves)."""
        engine = cls.__new__(cls)
        engine._init(model, tokenizer, chat_template, model_name, backend, max_batch)
        return engine

    def _init(self, model: NativeModel, tokenizer: Tokenizer, template: ChatTemplate | None,
              name: str, backend: str, max_batch: int) -> None:
        self._model = model
        self.tokenizer = tokenizer
        self.chat_template = template
        self.model_name = name
        self.backend = backend
        self.n_ctx: int = int(model.n_ctx)
        self.max_batch = max_batch
        # per-sequence prefix-cache hits and resident prefixes (native cores that have them)
        self._prefix_hits = callable(getattr(model, "take_prefix_hits", None))
        # conversations (drafts from a conversation's earlier outputs): fak's own native core
        from fak import _native

        self._conversations = isinstance(model, _native.Model)
        # The tokens that end a generation (EOS, EOT, ...), decided by the engine core per step.
        self._stop_ids: list[int] = sorted(tokenizer.eog_ids)
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, Any]] = []
        self._waiting: deque[_Request] = deque()
        self._active: dict[int, _Request] = {}
        self._closing = False
        self._closed = False
        self._broken: BaseException | None = None
        self._stats: dict[str, int | float] = {"running": 0, "waiting": 0, "kv_blocks_used": 0, "kv_blocks_total": 0,
                       "steps": 0, "requests_finished": 0, "tokens_generated": 0}
        self._update_stats()
        self._thread = threading.Thread(target=self._run, name=f"fak-engine-{name}", daemon=True)
        self._thread.start()

    # --- text ---------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (llama.cpp-exact; see :meth:`fak.tokenizer.Tokenizer.encode`)."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    @property
    def n_vocab(self) -> int:
        """Number of token ids a prompt may use (the tokenizer's vocabulary), ``[0, n_vocab)``."""
        return int(self.tokenizer.n_vocab)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token as the engine emits them (control tokens rendered as their text,
        as in logprobs): a byte-fallback piece of a multi-byte character is its own bytes, not
        U+FFFD's. Raises IndexError for an id outside ``[0, n_vocab)``."""
        return self.tokenizer.token_bytes(token_id, skip_special=False)

    def detokenize(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of ``ids``: the same text a stream of these tokens produces (control tokens empty
        unless ``skip_special=False``)."""
        return self.tokenizer.decode(ids, skip_special=skip_special)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (and ``tools``), rendered with the model's template.

        Raises:
            fak.chat.NoChatTemplateError: the file has no template and none was given.
            fak.chat.ChatTemplateError: the template rejected the messages.
        """
        if self.chat_template is None:
            raise NoChatTemplateError(
                f"{self.model_name} has no chat template (tokenizer.chat_template); pass "
                "Engine(..., chat_template=...) or use plain-text prompts")
        return self.chat_template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         **kwargs)

    # --- generation ---------------------------------------------------------------------------

    def _prepare(self, prompt: str | Sequence[int], sampling: dict[str, Any], add_special: bool = True) -> _Request:
        if self._closing or self._closed:
            raise FakError("the engine is closed")
        if self._broken is not None:
            raise FakError(f"the engine loop has failed: {self._broken!r}")
        sampling = dict(sampling)
        resident = int(sampling.pop("resident_prefix", 0) or 0)
        if resident < 0:
            raise ValueError(f"resident_prefix must be >= 0, got {resident}")
        conversation = sampling.pop("conversation", None)
        if conversation is not None and not isinstance(conversation, str):
            raise ValueError(f"conversation must be a string, got {conversation!r}")
        params = SamplingParams.from_kwargs(**sampling)
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=add_special, parse_special=True)
        else:
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.tokenizer.n_vocab]
            if bad:
                raise invalid_argument("prompt_ids", f"prompt token ids outside the vocabulary [0, {self.tokenizer.n_vocab}): {bad[:8]}")
        if not ids:
            raise invalid_argument("prompt_ids", "the prompt is empty (no tokens); give at least one token")
        for choice in params.prefix_choices or ():
            if any(t >= self.tokenizer.n_vocab for t in choice):
                raise invalid_argument("prefix_choices", f"prefix_choices hold token ids outside the vocabulary [0, {self.tokenizer.n_vocab})")
        n = len(ids)
        if n >= self.n_ctx:
            raise context_length_error(
                f"the prompt has {n} tokens but the context holds {self.n_ctx} tokens (one must be left "
                "to generate); shorten the prompt or raise n_ctx", n_prompt=n, n_ctx=self.n_ctx)
        if params.max_tokens is not None and n + params.max_tokens > self.n_ctx:
            raise context_length_error(
                f"the prompt has {n} tokens and max_tokens asks for {params.max_tokens} more: "
                f"{n + params.max_tokens} tokens, but the context holds {self.n_ctx}; shorten the prompt, "
                "lower max_tokens or raise n_ctx", n_prompt=n, n_ctx=self.n_ctx, max_tokens=params.max_tokens)
        max_new = self.n_ctx - n if params.max_tokens is None else params.max_tokens
        req = _Request(next(self._ids), ids, params, max_new, self.tokenizer, self._stop_ids)
        req.resident = min(resident, n)
        req.conversation = conversation
        return req

    def stream(self, prompt: str | Sequence[int], **sampling: Any) -> TokenStream:
        """Streams a completion of ``prompt`` (text, tokenized with BOS per the model, or ids).

        Args:
            prompt: text or token ids.
            **sampling: :class:`fak.sampling.SamplingParams` fields (max_tokens, temperature,
                top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty,
                frequency_penalty, seed, stop, logprobs, prefix_choices, speculative), and
                ``resident_prefix``: the leading prompt tokens (an agent's system prompt and
                tools, repeated by its every request) whose prefix-cache blocks get second chances
                under the LRU when this sequence ends (0: none; needs a native core that has it);
                ``conversation``: the conversation it belongs to (the gateway's
                ``X-Fak-Conversation``): the ``suffix`` draft source also drafts from the
                conversation's earlier outputs (docs/speculative.md).

        Returns:
            an iterator of :class:`Delta`; the last one has ``finish_reason``, ``usage``, ``timings``.

        Raises:
            fak.ContextLengthError: the prompt (plus max_tokens) does not fit in ``n_ctx``; the
                exception has ``n_tokens`` and ``n_ctx`` attributes.
            ValueError: bad sampling values or token ids. TypeError: unknown sampling keyword.
            From the iterator: fak.KVCacheFullError (the request can never fit), other
            ``fak.FakError`` raised by the native model for this request.
        """
        return TokenStream(self, self._prepare(prompt, sampling))

    def generate(self, prompt: str | Sequence[int], **sampling: Any) -> Completion:
        """Generates a whole completion; see :meth:`stream` for arguments and errors."""
        return _collect(self.stream(prompt, **sampling))

    def astream(self, prompt: str | Sequence[int], **sampling: Any) -> AsyncTokenStream:
        """Async twin of :meth:`stream` (asyncio or anyio). Validation errors are raised here,
        synchronously; engine errors from ``__anext__``."""
        return AsyncTokenStream(self, self._prepare(prompt, sampling))

    async def agenerate(self, prompt: str | Sequence[int], **sampling: Any) -> Completion:
        """Async twin of :meth:`generate`."""
        deltas = []
        async with self.astream(prompt, **sampling) as it:
            async for d in it:
                deltas.append(d)
        return _collect(deltas)

    def _chat_prompt(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        text = self.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
        # The template writes BOS itself when the model wants one (HF apply_chat_template).
        return self.tokenize(text, add_special=False, parse_special=True)

    def chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
             **sampling: Any) -> Completion:
        """Completes a conversation: renders the chat template, then :meth:`generate`. The reply is
        returned as text; tool calls in it are not parsed here."""
        return self.generate(self._chat_prompt(messages, tools), **sampling)

    def chat_stream(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    **sampling: Any) -> TokenStream:
        """Streaming :meth:`chat`."""
        return self.stream(self._chat_prompt(messages, tools), **sampling)

    async def achat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                    **sampling: Any) -> Completion:
        """Async :meth:`chat`."""
        return await self.agenerate(self._chat_prompt(messages, tools), **sampling)

    def achat_stream(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                     **sampling: Any) -> AsyncTokenStream:
        """Async streaming :meth:`chat`."""
        return self.astream(self._chat_prompt(messages, tools), **sampling)

    def logits(self, tokens: str | Sequence[int]) -> Any:
        """Next-token logits at every position of ``tokens`` (text is tokenized with BOS per the
        model), computed statelessly by the native model between engine steps.

        Returns:
            ``numpy.ndarray`` of float32, shape ``[n_tokens, n_vocab]``.

        Raises:
            fak.ContextLengthError: more tokens than ``n_ctx``. ValueError: empty input or ids
            outside the vocabulary.
        """
        ids = self.tokenize(tokens) if isinstance(tokens, str) else [int(t) for t in tokens]
        if not ids:
            raise ValueError("logits of an empty token list")
        if any(not 0 <= t < self.tokenizer.n_vocab for t in ids):
            raise ValueError(f"token ids outside the vocabulary [0, {self.tokenizer.n_vocab})")
        if len(ids) > self.n_ctx:
            raise context_length_error(f"{len(ids)} tokens but the context holds {self.n_ctx} tokens",
                                       n_prompt=len(ids), n_ctx=self.n_ctx, param="token_ids")
        reply: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._post("call", (lambda m: m.logits(ids), reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        return result

    # --- KV quarantine ------------------------------------------------------------------------

    def _call(self, fn: Any) -> Any:
        reply: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._post("call", (fn, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def evict_prefix(self, token_ids: Sequence[int], start: int) -> int:
        """Drops from the prefix cache (and bans: never cached or matched again) every KV block
        holding ``token_ids[start:]`` after ``token_ids[:start]``, and every block chained after
        those; blocks before ``start // 32`` stay. For a tool result found poisoned after the
        fact (``fak.gateway.quarantine_filter``). Returns the blocks dropped (runs between steps).

        Raises:
            ValueError: ``start`` is not a position of ``token_ids``.
        """
        ids = [int(t) for t in token_ids]
        return int(self._call(lambda m: m.evict_prefix(ids, int(start))))

    def quarantine_span(self, stream: _Stream, start: int, end: int) -> int:
        """Removes prompt positions ``start:end`` from the sequence of a running ``stream``
        (``stream``/``astream``): it goes on exactly as a sequence whose prompt never held them
        (KV blocks before ``start // 32`` kept, the rest recomputed; its logits from the next
        step on are bit-identical to a fresh prefill of the clean prompt), and the prefix-cache
        blocks holding the span are dropped and banned. A stream not yet admitted has its prompt
        edited; a finished one is left alone. Returns the cache blocks dropped.

        Raises:
            ValueError: an empty or out-of-range span, or one covering the whole prompt.
        """
        req = stream._request
        start, end = int(start), int(end)
        if not 0 <= start < end <= len(req.prompt_ids) or end - start >= len(req.prompt_ids):
            raise ValueError(f"{start}:{end} is not a span of the {len(req.prompt_ids)}-token prompt that leaves one")

        def edit(m: Any) -> int:
            if req.seq_id in self._active:
                n = int(m.quarantine_span(req.seq_id, start, end))
            elif req in self._waiting or not stream._started:
                n = int(m.evict_prefix(list(req.prompt_ids), start))
            else:
                return 0
            req.prompt_ids = req.prompt_ids[:start] + req.prompt_ids[end:]
            return n

        return int(self._call(edit))

    def prefix_cache_contents(self) -> list[tuple[int, int | None, list[int]]]:
        """``(hash, parent hash, token ids)`` of every KV block in the prefix cache (audits, tests)."""
        return list(self._call(lambda m: m.prefix_cache_contents()))

    def stats(self) -> dict[str, int | float]:
        """Engine counters as of the last engine step: ``running`` and ``waiting`` sequences,
        ``kv_blocks_used`` / ``kv_blocks_total`` of the paged KV cache, ``steps``,
        ``requests_finished``, ``tokens_generated``, plus the native model's own counters when it
        has them (``prefill_tokens``, ``decode_tokens``, ``prefill_seconds``, ``decode_seconds``,
        ``preemptions``, ``prefix_cache_hit_tokens``, ``prefix_cache_query_tokens``, ...; prefixed
        ``native_``)."""
        with self._cond:
            stats = dict(self._stats)
            stats["waiting"] += sum(1 for kind, _ in self._inbox if kind == "submit")
        return stats

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the engine loop (running requests fail with ``fak.FakError``), joins its thread.
        Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self._closed = True

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Engine({self.model_name!r}, backend={self.backend!r}, n_ctx={self.n_ctx})"

    # --- engine thread ------------------------------------------------------------------------

    def _post(self, kind: str, payload: Any) -> None:
        with self._cond:
            if self._broken is not None:
                raise FakError(f"the engine loop has failed: {self._broken!r}")
            if self._closing:
                raise FakError("the engine is closed")
            self._inbox.append((kind, payload))
            self._cond.notify()

    def _submit(self, req: _Request) -> None:
        req.t_submit = time.perf_counter()
        self._post("submit", req)

    def _cancel(self, req: _Request) -> None:
        req.cancelled = True
        with self._cond:
            if not self._closing and self._broken is None:
                self._inbox.append(("cancel", req))
                self._cond.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._inbox and not self._active and not self._waiting and not self._closing:
                        self._cond.wait()
                    inbox, self._inbox = self._inbox, []
                    if self._closing:
                        self._inbox = inbox
                        return
                for kind, payload in inbox:
                    self._handle(kind, payload)
                self._admit()
                if self._active:
                    self._step()
                self._update_stats()
        except BaseException as e:  # a bug in the loop itself: fail everyone, never hang them
            self._broken = e
        finally:
            self._shutdown()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "submit":
            self._waiting.append(payload)
        elif kind == "cancel":
            req: _Request = payload
            if self._active.pop(req.seq_id, None) is not None:
                self._remove(req)
            else:
                try:
                    self._waiting.remove(req)
                except ValueError:
                    pass
        elif kind == "call":
            fn, reply = payload
            try:
                reply.put(fn(self._model))
            except BaseException as e:
                reply.put(e)

    def _admit(self) -> None:
        # Every request goes to the core at once: it queues what it cannot run yet.
        while self._waiting:
            req = self._waiting[0]
            if req.cancelled:
                self._waiting.popleft()
                continue
            try:
                # The native scheduler queues a sequence past max_batch or until KV blocks free
                # up (preempting by recompute when needed); KVCacheFullError means the prompt can
                # never fit.
                extra: dict[str, Any] = {}
                if req.resident and self._prefix_hits:
                    extra["resident_tokens"] = req.resident
                if req.conversation is not None and self._conversations:
                    extra["conversation"] = req.conversation
                self._model.add_sequence(req.seq_id, req.prompt_ids, req.native, **extra)
            except Exception as e:
                self._remove(req)
                self._waiting.popleft()
                req.sink.put(e)
                continue
            self._waiting.popleft()
            req.t_added = time.perf_counter()
            self._active[req.seq_id] = req

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            outputs = self._model.step()
        except Exception as e:
            # Fail every sequence handed to the core (those that took part in the failed step
            # and those it queued: the core's state after a failed forward is not trusted), free
            # their KV.
            failed = list(self._active.values())
            self._active.clear()
            for req in failed:
                self._remove(req)
                req.sink.put(e)
            return
        t1 = time.perf_counter()
        self._stats["steps"] += 1
        if self._prefix_hits:
            for seq_id, n_hit in self._model.take_prefix_hits():  # type: ignore[attr-defined]
                hit_req = self._active.get(seq_id)
                if hit_req is not None and hit_req.cached_tokens is None:
                    hit_req.cached_tokens = int(n_hit)
        wakes = _Wakes()
        try:
            self._deliver_step(outputs, t0, t1, wakes)
        finally:
            wakes.flush()

    def _deliver_step(self, outputs: list[Any], t0: float, t1: float, wakes: _Wakes) -> None:
        for seq_id, token_id, logprob, top, native_finish in outputs:
            req = self._active.get(seq_id)
            if req is None:
                continue
            if native_finish is not None:
                req.native_done = True  # the core has removed the sequence already
            if req.cancelled:
                del self._active[seq_id]
                self._remove(req)
                continue
            try:
                self._on_token(req, int(token_id), logprob, top, native_finish, t0, t1, wakes)
            except Exception as e:
                self._active.pop(seq_id, None)
                self._remove(req)
                req.sink.put(e)

    def _on_token(self, req: _Request, token_id: int, logprob: float, top: Any, native_finish: str | None,
                  t0: float, t1: float, wakes: _Wakes) -> None:
        req.n_generated += 1
        self._stats["tokens_generated"] += 1
        if req.t_first is None:
            req.t_first = t1
            req.prefill_s = t1 - t0
        req.t_last = t1
        logprobs = None
        if req.params.logprobs is not None:
            alts = [TopLogprob(int(t), self._piece(int(t)), float(lp)) for t, lp in (top or [])]
            logprobs = [TokenLogprob(token_id, self._piece(token_id), float(logprob), alts)]
        finish: str | None = None
        stop_reason: str | int | None = None
        text = ""
        # The core decided "stop" (an end-of-generation token: not text) or "length"; stop
        # strings are matched here, on the text, and may end the request before the core would.
        if native_finish == "stop":
            finish, stop_reason = "stop", token_id
        else:
            text, stopped = req.stop.feed(req.detok.add(token_id))
            if stopped:
                finish, stop_reason = "stop", req.stop.stopped
            elif native_finish is not None:
                finish = native_finish
        if finish is not None and not isinstance(stop_reason, str):  # not a stop string: release held text
            tail, stopped = req.stop.feed(req.detok.flush())
            text += tail
            if stopped:
                stop_reason, finish = req.stop.stopped, "stop"
            else:
                text += req.stop.flush()
        delta = Delta(text, [token_id], finish, logprobs)
        if req.n_generated == 1:
            delta.cached_tokens = req.cached_tokens
        if finish is not None:
            del self._active[req.seq_id]
            self._remove(req)
            self._stats["requests_finished"] += 1
            self._update_stats(native=False)  # consistent when the consumer sees its last delta
            delta.usage = Usage(len(req.prompt_ids), req.n_generated)
            delta.timings = self._timings(req)
            delta.stop_reason = stop_reason
        req.sink.put_deferred(delta, wakes)

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.token_bytes(token_id, skip_special=False).decode("utf-8", errors="replace")

    @staticmethod
    def _timings(req: _Request) -> Timings:
        t_first = req.t_first if req.t_first is not None else req.t_last
        decode_s = req.t_last - t_first
        n = len(req.prompt_ids)
        return Timings(
            ttft_s=t_first - req.t_submit,
            prefill_tok_s=n / req.prefill_s if req.prefill_s > 0 else 0.0,
            decode_tok_s=(req.n_generated - 1) / decode_s if decode_s > 0 and req.n_generated > 1 else 0.0,
            queue_s=req.t_added - req.t_submit,
            prefill_s=req.prefill_s,
            decode_s=decode_s,
        )

    def _remove(self, req: _Request) -> None:
        if req.native_done:
            return
        try:
            self._model.remove_sequence(req.seq_id)
        except Exception:
            pass  # the sequence is gone either way; nothing else depends on it

    def _update_stats(self, native: bool = True) -> None:
        try:
            total = int(self._model.kv_blocks_total)
            used = total - int(self._model.kv_blocks_free)
        except Exception:
            total = used = 0
        try:
            running, queued = int(self._model.n_running), int(self._model.n_waiting)
        except Exception:
            running, queued = len(self._active), 0
        counters: dict[str, Any] = {}
        native_stats = getattr(self._model, "stats", None) if native else None
        if native_stats is not None:
            try:
                counters = {f"native_{k}": v for k, v in native_stats().items()}
            except Exception:
                counters = {}
        with self._cond:
            self._stats.update(counters)
            # running / waiting: the core's own counts (it queues), plus requests the loop has
            # not handed to it yet
            self._stats.update(running=running, waiting=queued + len(self._waiting),
                               kv_blocks_used=used, kv_blocks_total=total)

    def _shutdown(self) -> None:
        error = FakError(f"the engine loop has failed: {self._broken!r}") if self._broken is not None \
            else FakError("the engine was closed while the request was running")
        with self._cond:
            self._closing = True
            inbox, self._inbox = self._inbox, []
        pending = list(self._active.values()) + list(self._waiting)
        for kind, payload in inbox:
            if kind == "submit":
                pending.append(payload)
            elif kind == "call":
                payload[1].put(error)
        for req in self._active.values():
            self._remove(req)
        self._active.clear()
        self._waiting.clear()
        for req in pending:
            if req.sink is not None:
                req.sink.put(error)
        self._update_stats()


def _template_or_none(metadata: Mapping[str, Any], override: str | None) -> ChatTemplate | None:
    try:
        return ChatTemplate.from_metadata(metadata, override)
    except NoChatTemplateError:
        return None
