"""The context window ``fak serve`` gives a model when ``--n-ctx`` is not set.

Agents' first requests are long (Claude Code's and Codex's system prompt and tools alone are
10–28k tokens), so a fixed 4,096-token default cuts them off. The window is instead what the
model and the KV memory allow (vLLM's ``max_model_len`` is chosen the same way: the model's
``max_position_embeddings``, refused when the KV cache cannot hold one such sequence):

1. the model's trained context: the GGUF's ``{arch}.context_length``; with a RoPE scaling given
   on the command line (``--rope-scaling linear|yarn --rope-scale F``) the extended one,
   ``(--yarn-orig-ctx or context_length) × F``;
2. capped by the KV-memory budget: ``--kv-memory BYTES``, else (CUDA) 90 % of the GPU's memory
   less the GGUF's size and 1 GiB for activations, (CPU) half of ``MemAvailable`` less the GGUF's
   size, divided by the KV bytes one token takes: ``2 (K and V) × Σ_layers n_head_kv ×
   head_dim × 2 bytes`` (fak's KV cache is f16 on both backends, ``rust/src/backend/*/kv.rs``);
   ``--kv-cache-tokens N`` is such a budget in tokens.

A hybrid model's (``qwen35`` / ``qwen35moe``) recurrent state is counted in the same budget:
``max_concurrency + 1 + state_checkpoints`` slots (one per running sequence, one for
``logits()``, the prefix cache's checkpoints: ``--state-checkpoints``, docs/hybrid.md) of
``state_bytes_per_slot`` (f32, every Gated DeltaNet layer's convolution and recurrent state) come
off the budget before it is divided into KV tokens.

The KV cache then holds ``min(budget, n_ctx × min(8, max_concurrency))`` tokens (the engine's
default sharing, never past the budget), and at least one whole window. ``fak serve`` prints
the choice at start (``ContextPlan.describe``); ``/v1/models`` (``max_model_len``,
``context_length``) and ``/health`` (``context_window``, ``kv_cache_tokens``) expose it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ContextPlan",
    "ContextPlanError",
    "DEFAULT_N_CTX",
    "DEFAULT_STATE_CHECKPOINTS",
    "MIN_AUTO_N_CTX",
    "kv_bytes_per_token",
    "memory_budget",
    "parse_size",
    "plan_context",
    "state_bytes_per_slot",
    "trained_context",
]

#: The window when the GGUF states no trained context.
DEFAULT_N_CTX = 4096
#: The smallest window chosen automatically; a smaller budget is an error that names the flags.
MIN_AUTO_N_CTX = 512
#: KV cache granularity (``rust/src/engine/mod.rs`` ``BLOCK_SIZE``).
BLOCK_TOKENS = 32
#: A hybrid model's prefix-cache checkpoints of recurrent state when ``--state-checkpoints`` is
#: not given (the engine's ``DEFAULT_STATE_CHECKPOINTS``, ``rust/src/engine/mod.rs``).
DEFAULT_STATE_CHECKPOINTS = 8
#: Bytes of one f16 K or V element.
KV_ELEMENT_BYTES = 2
GIB = 1 << 30


class ContextPlanError(ValueError):
    """The KV-memory budget cannot hold a usable window (the message names the flags to change)."""


@dataclass(frozen=True)
class ContextPlan:
    """The window and KV cache ``fak serve`` starts the engine with.

    Attributes:
        n_ctx: context window per sequence, in tokens.
        kv_cache_tokens: KV cache size in tokens (``None``: the engine's default for ``n_ctx``).
        source: ``"--n-ctx"`` (given), ``"trained"`` (the model's trained context fits the
            budget) or ``"kv-memory"`` (the budget cut it).
        trained_ctx: the model's trained context in tokens (``None``: the GGUF does not say).
        kv_bytes_per_token: KV cache bytes per token (``None``: unknown architecture keys).
        budget_bytes: the KV-memory budget in bytes (``None`` with ``--n-ctx``).
        budget_from: where the budget came from (``--kv-memory``, ``--kv-cache-tokens``, ``GPU
            memory``, ``MemAvailable``).
        state_slots: a hybrid model's recurrent-state slots (0 for dense models).
        state_checkpoints: of them, the prefix cache's checkpoints.
        state_slot_bytes: bytes of one slot.
    """

    n_ctx: int
    kv_cache_tokens: int | None
    source: str
    trained_ctx: int | None = None
    kv_bytes_per_token: int | None = None
    budget_bytes: int | None = None
    budget_from: str | None = None
    state_slots: int = 0
    state_checkpoints: int = 0
    state_slot_bytes: int = 0

    @property
    def state_bytes(self) -> int:
        """Bytes of the recurrent state's slots (hybrid models), counted with the KV cache."""
        return self.state_slots * self.state_slot_bytes

    def describe(self) -> str:
        """One line for the start-up message: the window, why, and the KV cache it sits in."""
        text = f"context window {self.n_ctx} tokens"
        if self.source == "--n-ctx":
            text += " (--n-ctx"
        elif self.source == "trained":
            text += " (the model's trained context"
        else:
            text += f" (the KV-memory budget; the model was trained on {self.trained_ctx}"
        if self.kv_cache_tokens is not None and self.kv_bytes_per_token:
            text += (f"; KV cache {self.kv_cache_tokens} tokens, "
                     f"{_gib(self.kv_cache_tokens * self.kv_bytes_per_token)}")
        if self.state_slots:
            text += (f"; recurrent state {self.state_slots} slots ({self.state_checkpoints} prefix-cache "
                     f"checkpoints) × {self.state_slot_bytes / (1 << 20):.1f} MiB = {_gib(self.state_bytes)}")
        if self.kv_cache_tokens is not None and self.kv_bytes_per_token and self.budget_bytes is not None:
            text += f" of a {_gib(self.budget_bytes)} budget from {self.budget_from}"
        return text + ")"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"8GiB"``, ``"8G"``, ``"512MiB"``, ``"1.5g"``, ``"4096"`` → bytes (K/M/G/T are powers of
    1024 with or without ``i``/``B``).

    Raises:
        ValueError: not a size.
    """
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (write e.g. 8GiB, 512MiB or a number of bytes)")
    scale = 1024 ** " kmgt".index((m.group(2) or " ").lower())
    return int(float(m.group(1)) * scale)


def _arch_key(meta: dict[str, Any], name: str) -> Any:
    arch = meta.get("general.architecture")
    return meta.get(f"{arch}.{name}") if isinstance(arch, str) else None


def trained_context(meta: dict[str, Any], *, rope_scaling: str | None = None, rope_scale: float | None = None,
                    yarn_orig_ctx: int | None = None) -> int | None:
    """The context the model was trained for, in tokens: ``{arch}.context_length``, or with a
    RoPE scaling given by the caller (``linear``/``yarn``/``llama3`` and a factor) the extended
    context ``(yarn_orig_ctx or context_length) × rope_scale``. ``None`` when the GGUF does not
    say (and no scaling makes one)."""
    n = _arch_key(meta, "context_length")
    n = int(n) if isinstance(n, int) and n > 0 else None
    if rope_scaling not in (None, "none") and rope_scale:
        base = yarn_orig_ctx or n
        if base:
            return int(base * rope_scale)
    return n


def kv_bytes_per_token(meta: dict[str, Any]) -> int | None:
    """KV cache bytes one token takes: Σ over layers of ``n_head_kv × (key_length +
    value_length) × 2`` (f16), with ``key_length`` = ``value_length`` = ``embedding_length /
    head_count`` when the GGUF does not give them (llama.cpp's ``n_embd_head_k``). A per-layer
    ``head_count_kv`` array is summed. ``None`` when the keys are missing."""
    n_layer = _arch_key(meta, "block_count")
    n_head = _arch_key(meta, "attention.head_count")
    n_kv = _arch_key(meta, "attention.head_count_kv")
    n_embd = _arch_key(meta, "embedding_length")
    if not isinstance(n_layer, int) or n_layer <= 0:
        return None
    if n_kv is None:
        n_kv = n_head
    if isinstance(n_head, list):
        n_head = max(n_head) if n_head else None
    head_dim = None
    if isinstance(n_head, int) and n_head > 0 and isinstance(n_embd, int):
        head_dim = n_embd // n_head
    k_len = _arch_key(meta, "attention.key_length") or head_dim
    v_len = _arch_key(meta, "attention.value_length") or head_dim
    if not isinstance(k_len, int) or not isinstance(v_len, int):
        return None
    heads = sum(int(h) for h in n_kv) if isinstance(n_kv, list) else (int(n_kv) * n_layer if n_kv else 0)
    return heads * (k_len + v_len) * KV_ELEMENT_BYTES or None


def state_bytes_per_slot(meta: dict[str, Any]) -> int:
    """Bytes of one recurrent-state slot of a hybrid model (``{arch}.ssm.*`` keys): per Gated
    DeltaNet layer (all but every ``full_attention_interval``-th, default 4) the convolution's last
    ``conv_kernel − 1`` inputs of ``2·group_count·state_size + time_step_rank·state_size`` channels
    and ``time_step_rank`` matrices of ``state_size²``, f32 (``HybridConfig::state_len``). 0 for
    dense models."""
    vals = [_arch_key(meta, f"ssm.{k}") for k in ("conv_kernel", "state_size", "group_count", "time_step_rank")]
    n_layer = _arch_key(meta, "block_count")
    if not all(isinstance(v, int) and v > 0 for v in vals) or not isinstance(n_layer, int):
        return 0
    d_conv, d_state, n_k, n_v = vals
    every = _arch_key(meta, "full_attention_interval")
    every = every if isinstance(every, int) and every > 0 else 4
    recurrent = sum(1 for i in range(n_layer) if (i + 1) % every != 0)
    state_len = (d_conv - 1) * (2 * n_k * d_state + n_v * d_state) + n_v * d_state * d_state
    return recurrent * state_len * 4


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _gpu_total() -> int | None:
    try:
        from fak import _native

        info = _native.cuda_info(load_kernels=False)
    except Exception:  # noqa: BLE001 - no driver, no build: no budget from the GPU
        return None
    total = info.get("total_memory_bytes") if isinstance(info, dict) else None
    return int(total) if isinstance(total, int) else None


def memory_budget(backend: str, weights_bytes: int, *, mem_available: int | None = None,
                  gpu_total: int | None = None) -> tuple[int, str] | None:
    """The KV-memory budget in bytes of a backend and where it came from (see the module doc):
    CUDA 90 % of the GPU's memory less the weights and 1 GiB; CPU half of ``MemAvailable`` less
    the weights. ``mem_available`` / ``gpu_total`` override the probes (tests). ``None`` when the
    memory cannot be read."""
    if backend == "cuda":
        total = gpu_total if gpu_total is not None else _gpu_total()
        if total is None:
            return None
        return max(0, int(total * 0.9) - weights_bytes - GIB), "GPU memory"
    avail = mem_available if mem_available is not None else _mem_available()
    if avail is None:
        return None
    return max(0, (avail - weights_bytes) // 2), "MemAvailable"


def plan_context(gguf: str | Path, *, backend: str, max_concurrency: int, n_ctx: int | None = None,
                 kv_cache_tokens: int | None = None, kv_memory: int | None = None,
                 rope_scaling: str | None = None, rope_scale: float | None = None,
                 yarn_orig_ctx: int | None = None, replicas: int = 1, meta: dict[str, Any] | None = None,
                 mem_available: int | None = None, gpu_total: int | None = None,
                 state_checkpoints: int | None = None, **_: Any) -> ContextPlan:
    """The window and KV cache of ``fak serve`` (see the module doc).

    Args:
        gguf: the model file (its metadata and size are read).
        backend: ``"cpu"`` or ``"cuda"`` (``"auto"`` is resolved as ``fak.Engine`` does).
        max_concurrency: the engine's ``max_batch``.
        n_ctx: ``--n-ctx`` when given: kept as is (with ``kv_cache_tokens`` as given).
        kv_cache_tokens: ``--kv-cache-tokens``: the budget, in tokens.
        kv_memory: ``--kv-memory``: the budget, in bytes.
        rope_scaling, rope_scale, yarn_orig_ctx: the command line's RoPE scaling.
        replicas: servers sharing this machine's memory (the automatic budget is divided).
        meta: the GGUF's metadata when already read; ``mem_available`` / ``gpu_total``: the
            memory probes' answers (tests).
        state_checkpoints: ``--state-checkpoints`` (``None``: the engine's default,
            ``DEFAULT_STATE_CHECKPOINTS``); a hybrid model's state slots come off the budget.

    Raises:
        ContextPlanError: the budget holds fewer than ``MIN_AUTO_N_CTX`` tokens.
        OSError / fak.GGUFError: the file cannot be read.
    """
    if meta is None:
        from fak.tokenizer import read_gguf_metadata

        meta = read_gguf_metadata(gguf)
    trained = trained_context(meta, rope_scaling=rope_scaling, rope_scale=rope_scale, yarn_orig_ctx=yarn_orig_ctx)
    per_token = kv_bytes_per_token(meta)
    slot_bytes = state_bytes_per_slot(meta)
    checkpoints = DEFAULT_STATE_CHECKPOINTS if state_checkpoints is None else state_checkpoints
    state = {"state_slots": max(1, max_concurrency) + 1 + checkpoints, "state_checkpoints": checkpoints,
             "state_slot_bytes": slot_bytes} if slot_bytes else {}
    state_bytes = slot_bytes * state["state_slots"] if state else 0
    if n_ctx is not None:
        return ContextPlan(n_ctx, kv_cache_tokens, "--n-ctx", trained, per_token, **state)
    want = trained or DEFAULT_N_CTX
    if kv_cache_tokens is not None:
        budget_tokens, budget_from = kv_cache_tokens, "--kv-cache-tokens"
        budget_bytes = kv_cache_tokens * per_token if per_token else None
    else:
        if kv_memory is not None:
            found: tuple[int, str] | None = (kv_memory, "--kv-memory")
        else:
            if backend == "auto":
                from fak.engine.client import _resolve_backend

                backend = _resolve_backend(backend)
            weights = Path(gguf).stat().st_size
            found = memory_budget(backend, weights, mem_available=mem_available, gpu_total=gpu_total)
            if found is not None and replicas > 1:
                found = (found[0] // replicas, f"{found[1]} / {replicas} replicas")
        if found is None or not per_token:  # nothing to size against: the model's window
            return ContextPlan(want, None, "trained", trained, per_token, **state)
        budget_bytes, budget_from = found
        budget_tokens = max(0, budget_bytes - state_bytes) // per_token
    budget_tokens -= budget_tokens % BLOCK_TOKENS
    if budget_tokens < min(want, MIN_AUTO_N_CTX):
        have = f"{budget_tokens} tokens" + (f" ({_gib(budget_bytes)})" if budget_bytes is not None else "")
        raise ContextPlanError(
            f"the KV-memory budget from {budget_from} holds only {have}, less than a {MIN_AUTO_N_CTX}-token "
            "context window; give --kv-memory or --kv-cache-tokens a larger size, or set --n-ctx")
    window = min(want, budget_tokens)
    kv = kv_cache_tokens if kv_cache_tokens is not None else min(budget_tokens, window * min(8, max(1, max_concurrency)))
    return ContextPlan(window, kv, "trained" if window == want else "kv-memory", trained, per_token,
                       budget_bytes, budget_from, **state)
