# Type stubs for the extension module fak._native (rust/src/python/). Checked against the built
# module by tests/test_native_stubs.py (mypy.stubtest); names whose Rust binding has not landed in
# this checkout are listed in tests/data/native_stubtest_allowlist.txt.

from collections.abc import Sequence
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str
__all__ = [
    "__version__",
    "FakError",
    "GGUFError",
    "UnsupportedError",
    "ModelError",
    "ContextLengthError",
    "KVCacheFullError",
    "InvalidArgumentError",
    "BackendError",
    "ShardError",
    "GgufFile",
    "dequantize",
    "matmul",
    "simd_level",
    "simd_levels",
    "quantize_q8",
    "EngineCore",
    "RequestLimits",
    "SAMPLING_LIMITS",
    "check_sampling",
    "cuda_available",
    "cuda_info",
    "cuda_devices",
    "cuda_memory",
    "cuda_kernel_families",
    "cuda_nvrtc_compile",
    "OpRunner",
]

# --- errors (rust/src/python/errors.rs) -----------------------------------------------------

class FakError(Exception):
    """Base class of every error fak raises."""

class GGUFError(FakError):
    """A GGUF file is malformed or unsupported; the message names the problem and the byte offset."""

class UnsupportedError(FakError):
    """A tensor type, architecture or feature fak does not implement."""

class ModelError(FakError):
    """A model file is readable but inconsistent (missing tensor, wrong shape, bad hyper-parameter)."""

class ContextLengthError(FakError):
    """A request does not fit in the context window; its numbers (None when raised without them)."""

    param: str | None
    n_prompt: int | None
    max_tokens: int | None
    n_tokens: int | None
    n_ctx: int | None

class KVCacheFullError(FakError):
    """The KV cache has no room for another sequence or token; the KV blocks it needed and had."""

    needed: int | None
    free: int | None

class InvalidArgumentError(FakError, ValueError):
    """An argument is out of range or of the wrong kind; ``param`` names it (None when raised
    without it)."""

    param: str | None

class BackendError(FakError):
    """A compute backend failed (no usable GPU, CUDA driver error, kernel load)."""

class ShardError(UnsupportedError):
    """A model cannot be split into the requested tensor-parallel shards (a tensor would be cut
    inside a quantization block, or a shard would get no head or FFN column); the message names
    the tensor, its format and the shard count."""

# --- GGUF (rust/src/python/gguf.rs) -----------------------------------------------------------

@final
class GgufFile:
    """A memory-mapped GGUF v2/v3 file; the header is parsed at open (GIL released)."""

    def __new__(cls, path: str | bytes | Any) -> GgufFile: ...
    @staticmethod
    def from_bytes(data: bytes) -> GgufFile: ...
    @property
    def version(self) -> int: ...
    @property
    def alignment(self) -> int: ...
    @property
    def data_offset(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    def metadata(self) -> dict[str, Any]:
        """Key -> int, float, bool, str or (nested) list, in file order."""
    def metadata_types(self) -> dict[str, str]:
        """Key -> GGUF type name (``"UINT32"``, ``"ARRAY[STRING]"``, ...)."""
    def tensors(self) -> list[tuple[str, tuple[int, ...], str, int, int, int]]:
        """``(name, dims in ggml order, type name, absolute offset, n_bytes, n_elements)``."""
    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        """Read-only 1-D uint8 view of the tensor's blocks (zero copy)."""
    def dequantize(self, name: str) -> npt.NDArray[np.float32]:
        """1-D float32 array of ``n_elements`` values (ggml order)."""

def dequantize(
    type_name: str,
    raw: bytes | npt.NDArray[np.uint8],
    n_elements: int,
    out: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.float32]:
    """Blocks of ggml type ``type_name`` -> float32: into ``out`` (writeable, contiguous,
    ``n_elements`` values) when given, else into a new 1-D array; returns the array written."""

# --- CPU ops (rust/src/python/ops.rs) ---------------------------------------------------------

def matmul(
    type_name: str,
    w: bytes | npt.NDArray[np.uint8],
    n_out: int,
    k: int,
    x: npt.NDArray[np.float32],
    threads: int | None = None,
    level: str | None = None,
) -> npt.NDArray[np.float32]:
    """``y = x · Wᵀ``: ``W`` is ``n_out`` rows of ``k`` elements in GGUF blocks, ``x`` float32
    ``[n_rows, k]``; returns float32 ``[n_rows, n_out]``."""

def simd_level() -> str:
    """The SIMD path ``matmul`` runs by default (``"avx512"``, ``"avx2"`` or ``"scalar"``)."""

def simd_levels() -> list[str]:
    """Every SIMD path this CPU can run, lowest first."""

def quantize_q8(type_name: str, x: npt.NDArray[np.float32]) -> bytes:
    """``x`` quantized to ``"Q8_0"``, ``"Q8_1"`` or ``"Q8_K"`` blocks, as ``matmul`` quantizes activations."""

# --- engine (rust/src/python/model.rs; contract in ARCHITECTURE.md) ---------------------------

@final
class EngineCore:
    """A loaded model with its paged KV cache and batch engine; driven by ``fak.Engine``."""

    def __new__(
        cls,
        path: str,
        backend: str = "cpu",
        n_ctx: int = 4096,
        threads: int | None = None,
        kv_cache_tokens: int | None = None,
        max_batch: int = 64,
        prefix_cache: bool = True,
        max_tokens_per_step: int | None = None,
        rope_scaling: str | None = None,
        rope_scale: float | None = None,
        yarn_orig_ctx: int | None = None,
        tensor_parallel: int = 1,
        sliding_window: int | None = None,
        free_window_blocks: bool = True,
        n_cpu_moe: int = 0,
        speculative: str | None = None,
        draft_model: str | None = None,
        speculative_max_batch: int = 8,
        state_checkpoints: int | None = None,
    ) -> EngineCore: ...
    @property
    def backend(self) -> str: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def kv_blocks_total(self) -> int: ...
    @property
    def kv_blocks_free(self) -> int: ...
    @property
    def n_running(self) -> int: ...
    @property
    def n_waiting(self) -> int: ...
    @property
    def request_limits(self) -> RequestLimits:
        """What requests are checked against (its sliding window and speculation included),
        fixed at open."""
    def check_request(self, prompt_ids: Sequence[int], sampling: dict[str, Any] | None = None) -> None:
        """Raises what ``add_sequence`` would for the request, from the same rules, without the
        engine's lock (never waits for a step): InvalidArgumentError, ContextLengthError,
        KVCacheFullError (more blocks than the whole cache)."""
    @property
    def shard_plan(self) -> list[dict[str, Any]]:
        """One dict per tensor-parallel shard: ``rank`` and the ``[start, end)`` ranges it holds
        (``q_heads``, ``kv_heads``, ``ffn``, ``vocab``; ``experts``: the MoE experts it holds whole,
        or None when it holds every expert); empty with one shard."""
    def add_sequence(self, seq_id: int, prompt_ids: list[int], sampling: dict[str, Any] | None = None,
                     resident_tokens: int = 0, conversation: str | None = None) -> None:
        """Queues a sequence for prefill; its first ``resident_tokens`` prompt tokens' cached blocks
        stay resident under the prefix cache's LRU when it ends; with ``conversation``, the
        ``suffix`` draft source also drafts from that conversation's earlier outputs. Raises
        ContextLengthError (prompt, or prompt + ``max_tokens``, past ``n_ctx``), KVCacheFullError,
        InvalidArgumentError (a ValueError naming ``param``)."""
    def take_prefix_hits(self) -> list[tuple[int, int]]:
        """``(seq_id, hit_tokens)`` of each sequence admitted since the last call: prompt tokens
        found in the prefix cache."""
    def remove_sequence(self, seq_id: int) -> None:
        """Frees the sequence's KV blocks; an unknown id is a no-op."""
    def step(self) -> list[tuple[int, int, float, list[tuple[int, float]] | None, str | None]]:
        """One engine iteration: ``[(seq_id, token_id, logprob, top_logprobs | None, finish | None)]``;
        ``finish`` ("stop": a ``stop_ids`` token; "length": ``max_tokens`` or a full context) means
        the engine removed the sequence. With speculative decoding a sequence may get several
        tokens in one step: consecutive tuples in order, only the last with a finish."""
    def logits(self, token_ids: list[int]) -> npt.NDArray[np.float32]:
        """Stateless next-token logits at every position, float32 ``[n_tokens, n_vocab]``."""
    def stats(self) -> dict[str, int | float]:
        """running, waiting, kv_blocks_used, kv_blocks_total, prefill_tokens, decode_tokens,
        prefill_seconds, decode_seconds, sample_seconds, steps, preemptions,
        prefix_cache_query_tokens, prefix_cache_hit_tokens, prefix_cache_blocks,
        device_sampled_rows, device_sampled_host_rows, tp_collective_seconds,
        tp_collective_wait_seconds, kv_blocks_peak, spec_steps, spec_draft_tokens,
        spec_accepted_tokens (speculative decoding: verifications, draft tokens computed, of those
        accepted), spec_draft_forwards, spec_draft_model_tokens, spec_draft_seconds (the draft
        model's forwards, tokens it computed and seconds of its proposals), draft_kv_blocks_total,
        draft_kv_blocks_free (its KV cache; 0 without a draft model)."""
    def reset_stats(self) -> None:
        """Zeroes the counters of ``stats()``."""
    def evict_prefix(self, token_ids: list[int], start: int) -> int:
        """Drops (and bans) every prefix-cache block holding ``token_ids[start:]`` after
        ``token_ids[:start]`` and every block chained after those; returns the blocks dropped."""
    def quarantine_span(self, seq_id: int, start: int, end: int) -> int:
        """Removes tokens ``start:end`` of a sequence as if it never held them; returns the
        prefix-cache blocks dropped."""
    def last_logits(self, seq_id: int) -> npt.NDArray[np.float32] | None:
        """``[n_vocab]`` logits of the last step's token for ``seq_id`` (host copy) or None."""
    def prefix_cache_contents(self) -> list[tuple[int, int | None, list[int]]]:
        """``(hash, parent hash, token ids)`` of every block in the prefix cache."""

@final
class RequestLimits:
    """The request rules of ``EngineCore.add_sequence`` over a snapshot of its limits
    (rust/src/python/limits.rs); ``check`` takes no lock."""

    def __new__(cls, n_ctx: int, n_vocab: int, kv_blocks: int, block_size: int = 32) -> RequestLimits: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def kv_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    def check(self, prompt_ids: Sequence[int], sampling: dict[str, Any] | None = None) -> None:
        """Raises what ``add_sequence(seq_id, prompt_ids, sampling)`` would for the request:
        InvalidArgumentError, ContextLengthError, KVCacheFullError."""
    def check_logits(self, token_ids: Sequence[int]) -> None:
        """Raises what ``EngineCore.logits(token_ids)`` would for the list: InvalidArgumentError,
        ContextLengthError (``param`` "token_ids")."""

# --- CUDA backend (rust/src/python/cuda.rs) -------------------------------------------------

#: The core's limits on sampling values: max_logprobs, max_prefix_choices,
#: max_prefix_choice_tokens, max_stop_ids.
SAMPLING_LIMITS: dict[str, int]

def check_sampling(sampling: dict[str, Any]) -> tuple[str, str] | None:
    """The core's range check of an ``add_sequence`` sampling dict: None, or ``(parameter,
    reason)`` for the first bad value."""

def cuda_available() -> bool:
    """Whether ``backend="cuda"`` can run here (driver, a device of compute capability >= 8.0). Never raises."""

def cuda_info(load_kernels: bool = True) -> dict[str, Any]:
    """``available``, ``reason`` (when not), ``built_with_cuda``, ``build_archs``, ``kernel_families``;
    with a GPU also ``device``, ``compute_capability``, ``sm_count``, ``total_memory_bytes``,
    ``driver_version``, ``graphs``, ``ops`` (op -> kernel path) and, with ``load_kernels``,
    ``kernel_images`` (family -> where its image came from) and ``nvrtc_version``."""

def cuda_devices() -> dict[str, Any]:
    """Every GPU the driver reports and how each ordered pair is linked: ``available``, ``reason``
    (when not), ``devices`` (``ordinal``, ``name``, ``pci_bus_id``, ``compute_capability``,
    ``total_memory_bytes``), ``peers`` (``a``, ``b``, ``access``, ``perf_rank``, ``native_atomics``).
    Never raises for a missing GPU or driver."""

def cuda_memory() -> dict[str, int]:
    """Device bytes fak holds now, by kind: ``weights``, ``kv_cache``, ``activations``, ``total``;
    and the experts of ``--cpu-moe`` layers in host memory: ``host_experts`` (bytes), of them
    ``host_experts_pinned`` (page-locked in place), ``expert_uploads`` (bytes of them copied to the
    GPU for large batches so far). Empty in a build without CUDA."""

def cuda_kernel_families() -> list[str]:
    """The kernel families (``rust/kernels/*.cu``) embedded in this build."""

def cuda_nvrtc_compile(family: str, sm: int) -> bytes:
    """Compiles the embedded source of ``family`` for ``sm_<sm>`` with NVRTC (no GPU needed) and
    returns the cubin. Raises BackendError (no NVRTC, compile error), ValueError (unknown family)."""

@final
class OpRunner:
    """Single ops of a backend on NumPy arrays, through the same trait calls as the forward pass
    (tests compare ``OpRunner("cuda")`` with ``OpRunner("cpu")``); outputs are NaN-poisoned first."""

    def __new__(cls, backend: str = "cpu") -> OpRunner: ...
    def matmul(
        self, wtype: str, w: npt.NDArray[np.uint8], n_out: int, k: int, x: npt.NDArray[np.float32],
        bias: npt.NDArray[np.float32] | None = None,
    ) -> npt.NDArray[np.float32]: ...
    def norm_matmul(
        self, x: npt.NDArray[np.float32], w_norm: npt.NDArray[np.float32], eps: float, wtype: str,
        w: npt.NDArray[np.uint8], n_out: int, bias: npt.NDArray[np.float32] | None = None,
    ) -> npt.NDArray[np.float32]: ...
    def swiglu_matmul(
        self, gate: npt.NDArray[np.float32], up: npt.NDArray[np.float32], k: int, wtype: str,
        w: npt.NDArray[np.uint8], n_out: int,
    ) -> npt.NDArray[np.float32]: ...
    def rmsnorm(self, x: npt.NDArray[np.float32], w: npt.NDArray[np.float32], eps: float) -> npt.NDArray[np.float32]: ...
    def rope(
        self, x: npt.NDArray[np.float32], positions: npt.NDArray[np.uint32], n_heads: int, head_dim: int,
        style: str, n_rot: int, freq_base: float, freq_scale: float,
        freq_factors: npt.NDArray[np.float32] | None = None,
        ext_factor: float = 0.0, attn_factor: float = 1.0, yarn_orig_ctx: int = 0,
    ) -> npt.NDArray[np.float32]: ...
    def swiglu(self, gate: npt.NDArray[np.float32], up: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...
    def add(self, x: npt.NDArray[np.float32], y: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...
    def embed(
        self, wtype: str, table: npt.NDArray[np.uint8], n_vocab: int, dim: int, tokens: npt.NDArray[np.uint32],
    ) -> npt.NDArray[np.float32]: ...
    def gather_rows(self, x: npt.NDArray[np.float32], dim: int, rows: npt.NDArray[np.uint32]) -> npt.NDArray[np.float32]: ...
    def set_matmul_variant(self, variant: str | None = None) -> None: ...
    def time_matmul(
        self,
        wtype: str,
        w: npt.NDArray[np.uint8],
        n_out: int,
        k: int,
        x: npt.NDArray[np.float32],
        cases: list[tuple[int, str | None]],
        iters: int = 10,
        reps: int = 3,
    ) -> list[float]: ...
    def argmax(self, x: npt.NDArray[np.float32], n_cols: int) -> list[int]: ...
    def attention(
        self, seqs: list[tuple[int, int]], n_head: int, n_head_kv: int, head_dim: int,
        block_perm: npt.NDArray[np.uint32], q: npt.NDArray[np.float32], k: npt.NDArray[np.float32],
        v: npt.NDArray[np.float32], window: int = 0,
    ) -> list[npt.NDArray[np.float32]]: ...
    def matmul_multi(
        self, wtypes: list[str], ws: list[npt.NDArray[np.uint8]], n_outs: list[int], k: int,
        x: npt.NDArray[np.float32], biases: list[npt.NDArray[np.float32] | None],
    ) -> list[npt.NDArray[np.float32]]: ...
    def matmul_add(
        self, wtype: str, w: npt.NDArray[np.uint8], n_out: int, k: int, x: npt.NDArray[np.float32],
        res: npt.NDArray[np.float32], bias: npt.NDArray[np.float32] | None = None,
    ) -> npt.NDArray[np.float32]: ...
    def head_norm(self, x: npt.NDArray[np.float32], w: npt.NDArray[np.float32], eps: float) -> npt.NDArray[np.float32]: ...
    def moe_ffn(
        self, h: npt.NDArray[np.float32], res: npt.NDArray[np.float32], d: int, n_ff: int, n_expert: int, k: int,
        gate_inp: npt.NDArray[np.float32], gate_type: str, gate: npt.NDArray[np.uint8], up_type: str,
        up: npt.NDArray[np.uint8], down_type: str, down: npt.NDArray[np.uint8],
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
    def delta_net(
        self, h: npt.NDArray[np.float32], d: int, d_conv: int, d_state: int, n_k: int, n_v: int, eps: float,
        qkv: npt.NDArray[np.float32], gate: npt.NDArray[np.float32], beta: npt.NDArray[np.float32],
        alpha: npt.NDArray[np.float32], conv: npt.NDArray[np.float32], dt_bias: npt.NDArray[np.float32],
        a: npt.NDArray[np.float32], norm: npt.NDArray[np.float32], out: npt.NDArray[np.float32],
        seqs: list[tuple[int, int, int]], n_slots: int, state0: npt.NDArray[np.float32],
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
    def rope_kv_write(
        self, q: npt.NDArray[np.float32], k: npt.NDArray[np.float32], v: npt.NDArray[np.float32], n_past: int,
        table: npt.NDArray[np.uint32], n_head: int, n_head_kv: int, head_dim: int, style: str, n_rot: int,
        freq_base: float, freq_scale: float, freq_factors: npt.NDArray[np.float32] | None = None,
        ext_factor: float = 0.0, attn_factor: float = 1.0, yarn_orig_ctx: int = 0,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
    def greedy(self, x: npt.NDArray[np.float32], n_cols: int) -> tuple[list[int], list[float]]: ...
    def top_rows(self, x: npt.NDArray[np.float32], n_cols: int, rows: list[int], m: int) -> tuple[list[int], list[float], list[float], list[float], list[bool]]: ...
    def penalize(self, x: npt.NDArray[np.float32], n_cols: int, entries: list[tuple[int, int, float, float]]) -> tuple[npt.NDArray[np.float32], list[float]]: ...
    def draw(self, x: npt.NDArray[np.float32], n_cols: int, draws: list[tuple[int, float, float]]) -> tuple[list[int], list[float], list[float], list[float]]: ...
