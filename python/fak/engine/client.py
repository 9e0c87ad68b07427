"""``fak.Engine``: the client of one native model's engine loop, sync and async.

It loads the model (tokenizer, chat template, native model), checks each request once (prompt,
sampling values, context length), builds its core request and its text state, and hands them to a
stream; the engine loop (``loop.py``) runs the core request, the stream makes its text.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fak.chat import ChatTemplate, NoChatTemplateError
from fak.engine.loop import CoreRequest, EngineLoop, NativeModel
from fak.engine.request import RequestState
from fak.engine.results import Completion, collect
from fak.engine.streams import AsyncTokenStream, TokenStream, _Stream
from fak.errors import FakError
from fak.sampling import SamplingParams
from fak.tokenizer import Tokenizer, read_gguf_metadata


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
            ``tensor_parallel > 1``. ``"draft"`` drafts with ``draft_model`` (its default when
            that is given).
        draft_model: a GGUF path of a smaller model with the same tokenizer (Qwen2.5-Coder-0.5B
            for the 1.5B), loaded on the same backend with its own KV cache: the ``draft`` source
            proposes its greedy tokens (docs/speculative.md). ``fak.InvalidArgumentError``
            (``param`` "draft_model") for a different vocabulary, a hybrid model or
            ``tensor_parallel > 1``.
        state_checkpoints: a hybrid model's (qwen35 / qwen35moe) checkpoints of recurrent state
            for the prefix cache (docs/hybrid.md): a prompt resumes from the cache only up to a
            block whose state is checkpointed. 0 up to the KV cache's blocks (``None``: 8, fewer
            on a cache of fewer blocks); each takes the
            native config's ``state_slot_bytes`` (all state slots: ``state_bytes``). No effect on
            dense models or with ``prefix_cache=False``.

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
        draft_model: str | Path | None = None,
        speculative_max_batch: int = 8,
        state_checkpoints: int | None = None,
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
        model = _native.EngineCore(str(path), backend=resolved, n_ctx=n_ctx, threads=threads,
                              kv_cache_tokens=kv_cache_tokens, max_batch=max_batch,
                              prefix_cache=prefix_cache, rope_scaling=rope_scaling, rope_scale=rope_scale,
                              yarn_orig_ctx=yarn_orig_ctx, tensor_parallel=tensor_parallel,
                              sliding_window=sliding_window, n_cpu_moe=n_cpu_moe,
                              speculative=speculative,
                              draft_model=str(draft_model) if draft_model is not None else None,
                              speculative_max_batch=speculative_max_batch,
                              state_checkpoints=state_checkpoints)
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
        tests and by embedders that construct ``fak._native.EngineCore`` themselves)."""
        engine = cls.__new__(cls)
        engine._init(model, tokenizer, chat_template, model_name, backend, max_batch)
        return engine

    def _init(self, model: NativeModel, tokenizer: Tokenizer, template: ChatTemplate | None,
              name: str, backend: str, max_batch: int) -> None:
        self.tokenizer = tokenizer
        self.chat_template = template
        self.model_name = name
        self.backend = backend
        self.n_ctx: int = int(model.n_ctx)
        self.max_batch = max_batch
        # The tokens that end a generation (EOS, EOT, ...), decided by the engine core per step.
        self._stop_ids: list[int] = sorted(tokenizer.eog_ids)
        # The core's request rules over its limits, fixed at open: checked on the caller's thread,
        # never waiting for the engine thread.
        self._limits = model.request_limits
        self._ids = itertools.count(1)
        self._loop = EngineLoop(model, name)

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

    def _prepare(self, prompt: str | Sequence[int], sampling: dict[str, Any], add_special: bool = True) -> RequestState:
        self._loop.check_open()
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
        native = {**params.to_native(), "max_tokens": params.max_tokens, "stop_ids": self._stop_ids}
        # The core's own rules (token ids, the context window, a prompt the KV cache can hold,
        # sampling ranges), checked here without waiting for the engine thread, so that stream()
        # raises at the call, before a caller answers anything.
        self._limits.check(ids, native)
        n = len(ids)
        max_new = self.n_ctx - n if params.max_tokens is None else params.max_tokens
        # The core ends the request: at an end-of-generation token or after max_new tokens.
        core = CoreRequest(next(self._ids), ids, {**native, "max_tokens": max_new})
        core.resident = min(resident, n)
        core.conversation = conversation
        return RequestState(core, params, self.tokenizer)

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
        return TokenStream(self._prepare(prompt, sampling), self._loop.submit, self._loop.abort)

    def generate(self, prompt: str | Sequence[int], **sampling: Any) -> Completion:
        """Generates a whole completion; see :meth:`stream` for arguments and errors."""
        return collect(self.stream(prompt, **sampling))

    def astream(self, prompt: str | Sequence[int], **sampling: Any) -> AsyncTokenStream:
        """Async twin of :meth:`stream` (asyncio or anyio). Validation errors are raised here,
        synchronously; engine errors from ``__anext__``."""
        return AsyncTokenStream(self._prepare(prompt, sampling), self._loop.submit, self._loop.abort)

    async def agenerate(self, prompt: str | Sequence[int], **sampling: Any) -> Completion:
        """Async twin of :meth:`generate`."""
        deltas = []
        async with self.astream(prompt, **sampling) as it:
            async for d in it:
                deltas.append(d)
        return collect(deltas)

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
        self._limits.check_logits(ids)  # the core's rules, raised here
        return self._loop.call(lambda m: m.logits(ids))

    # --- KV quarantine ------------------------------------------------------------------------

    def evict_prefix(self, token_ids: Sequence[int], start: int) -> int:
        """Drops from the prefix cache (and bans: never cached or matched again) every KV block
        holding ``token_ids[start:]`` after ``token_ids[:start]``, and every block chained after
        those; blocks before ``start // 32`` stay. For a tool result found poisoned after the
        fact (``fak.gateway.quarantine_filter``). Returns the blocks dropped (runs between steps).

        Raises:
            ValueError: ``start`` is not a position of ``token_ids``.
        """
        ids = [int(t) for t in token_ids]
        return int(self._loop.call(lambda m: m.evict_prefix(ids, int(start))))

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
        req = stream._request.core
        start, end = int(start), int(end)
        if not 0 <= start < end <= len(req.prompt_ids) or end - start >= len(req.prompt_ids):
            raise ValueError(f"{start}:{end} is not a span of the {len(req.prompt_ids)}-token prompt that leaves one")
        return self._loop.quarantine_span(req, start, end)

    def prefix_cache_contents(self) -> list[tuple[int, int | None, list[int]]]:
        """``(hash, parent hash, token ids)`` of every KV block in the prefix cache (audits, tests)."""
        return list(self._loop.call(lambda m: m.prefix_cache_contents()))

    def stats(self) -> dict[str, int | float]:
        """Engine counters as of the last engine step: ``running`` and ``waiting`` sequences,
        ``kv_blocks_used`` / ``kv_blocks_total`` of the paged KV cache, ``steps``,
        ``requests_finished``, ``tokens_generated`` (the core's: with the few a stop string's late
        abort drops), plus the native model's own counters when it
        has them (``prefill_tokens``, ``decode_tokens``, ``prefill_seconds``, ``decode_seconds``,
        ``preemptions``, ``prefix_cache_hit_tokens``, ``prefix_cache_query_tokens``, ...; prefixed
        ``native_``)."""
        return self._loop.stats()

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the engine loop (running requests fail with ``fak.FakError``), joins its thread.
        Idempotent."""
        self._loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Engine({self.model_name!r}, backend={self.backend!r}, n_ctx={self.n_ctx})"


def _template_or_none(metadata: Mapping[str, Any], override: str | None) -> ChatTemplate | None:
    try:
        return ChatTemplate.from_metadata(metadata, override)
    except NoChatTemplateError:
        return None
