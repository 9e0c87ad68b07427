"""Helpers of the CUDA op tests: random valid GGUF blocks, float64 references."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from fak import _native

# Byte offsets of the f16 scale fields in one block (ggml-common.h).
F16_FIELDS: dict[str, list[int]] = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}

QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
DENSE = ["F16", "BF16", "F32"]


def random_weights(wtype: str, n_out: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``n_out`` rows of ``k`` random weights of ``wtype`` as GGUF block bytes (uint8), with
    finite f16 scales of realistic size (|d| ≤ 0.02)."""
    if wtype == "F32":
        return rng.uniform(-1, 1, n_out * k).astype(np.float32).view(np.uint8)
    if wtype == "F16":
        return rng.uniform(-1, 1, n_out * k).astype(np.float16).view(np.uint8)
    if wtype == "BF16":
        f = rng.uniform(-1, 1, n_out * k).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    bs, ts = GGML_QUANT_SIZES[QT[wtype]]
    blocks = rng.integers(0, 256, size=(n_out * k // bs, ts), dtype=np.uint8)
    for off in F16_FIELDS[wtype]:
        scale = rng.uniform(-0.02, 0.02, len(blocks)).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def dequantized(wtype: str, w: np.ndarray, n_out: int, k: int) -> np.ndarray:
    """The exact weights as float64 ``[n_out, k]`` (gguf's reference dequantizer)."""
    if wtype == "F32":
        return w.view(np.float32).reshape(n_out, k).astype(np.float64)
    if wtype == "F16":
        return w.view(np.float16).reshape(n_out, k).astype(np.float64)
    if wtype == "BF16":
        return (w.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(n_out, k).astype(np.float64)
    bs, ts = GGML_QUANT_SIZES[QT[wtype]]
    return dequantize(w.reshape(n_out, k // bs * ts), QT[wtype]).astype(np.float64)


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    """‖y − ref‖ / ‖ref‖ in float64 (inf when y has a NaN: an unwritten, poisoned element)."""
    y = np.asarray(y, dtype=np.float64)
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-300))


def f16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def attention_ref(seqs: list[tuple[int, int]], n_head: int, n_head_kv: int, head_dim: int,
                  q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int = 0) -> np.ndarray:
    """Causal GQA attention in float64 over f16-rounded K/V (as the cache stores them).

    q: ``[Σ n_rows, n_head·head_dim]``; k, v: per sequence ``n_past + n_rows`` rows of
    ``[n_head_kv·head_dim]``, concatenated. ``window`` > 0: a brute-force sliding-window mask, key
    ``j`` of the query at position ``p`` kept iff ``0 <= p − j < window`` (llama.cpp's
    ``LLAMA_SWA_TYPE_STANDARD``). Returns ``[Σ n_rows, n_head·head_dim]``."""
    g = n_head // n_head_kv
    out = np.zeros((q.shape[0], n_head * head_dim))
    r0 = c0 = 0
    for n_past, n_rows in seqs:
        ctx = n_past + n_rows
        ks = f16_round(k[c0:c0 + ctx]).reshape(ctx, n_head_kv, head_dim)
        vs = f16_round(v[c0:c0 + ctx]).reshape(ctx, n_head_kv, head_dim)
        qs = q[r0:r0 + n_rows].astype(np.float64).reshape(n_rows, n_head, head_dim)
        for h in range(n_head):
            kh, vh = ks[:, h // g], vs[:, h // g]
            s = qs[:, h] @ kh.T / np.sqrt(head_dim)
            pos = (n_past + np.arange(n_rows))[:, None]
            mask = np.arange(ctx)[None, :] > pos
            if window > 0:
                mask |= pos - np.arange(ctx)[None, :] >= window
            s[mask] = -np.inf
            s -= s.max(axis=1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=1, keepdims=True)
            out[r0:r0 + n_rows, h * head_dim:(h + 1) * head_dim] = p @ vh
        r0 += n_rows
        c0 += ctx
    return out


def cuda_reason() -> str | None:
    """None when the CUDA backend can run here, else why not."""
    info = _native.cuda_info(load_kernels=False)
    return None if info.get("available") else str(info.get("reason"))


_RUNNERS: dict[str, object] = {}


def runner(backend: str) -> _native.OpRunner:
    """One ``OpRunner`` per backend for the session (the CUDA one loads the kernels once)."""
    if backend == "cuda":
        reason = cuda_reason()
        if reason is not None:
            pytest.skip(f"no usable GPU: {reason}")
    if backend not in _RUNNERS:
        _RUNNERS[backend] = _native.OpRunner(backend)
    return _RUNNERS[backend]  # type: ignore[return-value]


BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
