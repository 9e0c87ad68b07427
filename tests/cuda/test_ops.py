"""Op by op: every op of the Backend trait on the CUDA backend against a float64 reference and
against the CPU backend, on fresh random inputs at the real layer shapes of the 1.5B and 7B models
(and odd sizes). Outputs are poisoned with NaN before every op (``OpRunner``), so an element a
kernel fails to write fails the test.

Each test runs for ``cpu`` (in CI, no GPU) and ``cuda`` (marked ``cuda``: the GPU machine).
Relative error bounds (‖y − ref‖/‖ref‖) per path, derived from the arithmetic of each path:
- against float64: the 8-bit activations (CUDA and CPU alike quantize them as llama.cpp's CPU
  does: Q8_0/Q8_1 per 32, Q8_K per 256) cost one int8 step of the block maximum per value,
  ≈ 0.5 % for Gaussian inputs → bound 1.2e-2; the f16 tensor-core GEMM (``FAK_CUDA_MMQ=f16``)
  rounds weights and activations to f16 → 2e-3; f32 paths 1e-5;
- CUDA against the CPU backend: the quantized GEMV and the int8 GEMM quantize the activations
  bit-exactly as the CPU and sum exact integer sub-block dot products scaled as the CPU, so only
  the order of f32 additions differs → 5e-5 (``CPU_EXACT``); after a fused producer (RMSNorm,
  SwiGLU) whose f32 output may differ from the CPU's in the last bit, a value near a rounding
  boundary can quantize one step apart → 1e-3.
"""

from __future__ import annotations

import functools
import os
import zlib

import numpy as np
import pytest

from cuda_util import BACKENDS, DENSE, QUANT, attention_ref, dequantized, f16_round, random_weights, rel_err, runner

# 8-bit activations (ggml's Q8_K over 256 values, Q8_0 over 32) against float64: ~0.006 for
# standard-normal inputs, up to 0.020 where one 256-value block holds a large outlier (the CPU
# backend's own error on the mixed.forms case, 1 row); the sharp check is CUDA against the CPU
# backend (CPU_EXACT), which computes the same 8-bit activations.
Q8 = 2.5e-2
F16 = 2e-3
F32 = 1e-5
CPU_EXACT = 5e-5
CPU_NEAR = 1e-3
# The prefill GEMM in use: the int8 one (CPU-faithful, default) or FAK_CUDA_MMQ=f16.
MMQ_F16 = os.environ.get("FAK_CUDA_MMQ", "") == "f16"


def matmul_bound(backend: str, wtype: str, n_rows: int) -> float:
    if backend == "cuda":
        if n_rows <= 8:
            return F32 if wtype in DENSE else Q8
        return F16 if (MMQ_F16 or wtype in DENSE) else Q8
    return {"F32": F32, "F16": 1.5e-3, "BF16": 6e-3}.get(wtype, Q8)


def cuda_cpu_bound(wtype: str, n_rows: int) -> float:
    """CUDA against the CPU backend on the same inputs."""
    if wtype in DENSE:
        return matmul_bound("cuda", wtype, n_rows) + matmul_bound("cpu", wtype, n_rows)
    if n_rows > 8 and MMQ_F16:
        return F16 + Q8
    return CPU_EXACT


def seed(*parts: object) -> np.random.Generator:
    """A generator per test case: different random data for every case, reproducible
    (``FAK_TEST_SEED`` changes every case's data)."""
    return np.random.default_rng([zlib.crc32(repr(parts).encode()), int(os.environ.get("FAK_TEST_SEED", "0"))])


@functools.lru_cache(maxsize=1)
def weights_case(wtype: str, n_out: int, k: int, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """Random weights and their float64 dequantization, shared by the cpu and cuda runs."""
    w = random_weights(wtype, n_out, k, seed("w", wtype, n_out, k, tag))
    return w, dequantized(wtype, w, n_out, k)


def check_matmul(backend: str, wtype: str, n_out: int, k: int, n_rows: int, with_bias: bool, tag: str) -> None:
    w, wd = weights_case(wtype, n_out, k, tag)
    rng = seed("x", backend, wtype, n_out, k, n_rows)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    y = runner(backend).matmul(wtype, w, n_out, k, x.reshape(-1), bias)
    ref = x.astype(np.float64) @ wd.T + (bias.astype(np.float64) if bias is not None else 0.0)
    err = rel_err(y.reshape(n_rows, n_out), ref)
    bound = matmul_bound(backend, wtype, n_rows)
    assert err <= bound, f"{backend} {wtype} [{n_rows}x{k}]·[{n_out}x{k}]ᵀ: relative error {err:.3g} > {bound:g}"
    if backend == "cuda":
        y_cpu = runner("cpu").matmul(wtype, w, n_out, k, x.reshape(-1), bias)
        diff = rel_err(y.reshape(n_rows, n_out), y_cpu.reshape(n_rows, n_out).astype(np.float64))
        limit = cuda_cpu_bound(wtype, n_rows)
        assert diff <= limit, f"cuda vs cpu {wtype} rows={n_rows}: {diff:.3g} > {limit:g}"


# ---------------------------------------------------------------- matmul


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [1, 2, 3, 5, 8, 9, 40, 67])
@pytest.mark.parametrize("wtype", QUANT + DENSE)
def test_matmul_every_format_and_row_count(backend: str, wtype: str, n_rows: int) -> None:
    # Odd output count (259) and a K that is not a multiple of 256 for the legacy formats.
    k = 512 if wtype in ("Q4_K", "Q5_K", "Q6_K") else 416
    check_matmul(backend, wtype, 259, k, n_rows, with_bias=n_rows % 2 == 1, tag="formats")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [385, 2100])
@pytest.mark.parametrize("k,n_out", [(2048, 128), (416, 259)])
def test_matmul_f32_many_rows(backend: str, k: int, n_out: int, n_rows: int) -> None:
    """F32 weights on many rows (a MoE router in a prefill: 2048 → 128): on CUDA the GEMV over
    chunks of 8 rows in one launch (385: 48 chunks and a rest of 1) and, above SGEMM_MIN_ROWS
    (2048), the f32 GEMM; odd shapes and partial tiles included, with and without bias."""
    check_matmul(backend, "F32", n_out, k, n_rows, with_bias=n_rows % 2 == 1, tag="sgemm")


# (name, k, n_out, wtype, bias): the projections of the real layouts.
REAL_SHAPES = [
    ("1.5b.attn_q", 1536, 1536, "Q4_K", True),
    ("1.5b.attn_k", 1536, 256, "Q4_K", True),
    ("1.5b.attn_v", 1536, 256, "Q6_K", True),
    ("1.5b.ffn_up", 1536, 8960, "Q4_K", False),
    ("1.5b.ffn_down", 8960, 1536, "Q6_K", False),
    ("1.5b.ffn_down_q4", 8960, 1536, "Q4_K", False),
    ("1.5b.output[:8192]", 1536, 8192, "Q6_K", False),
    ("0.5b.attn_q", 896, 896, "Q5_0", True),
    ("0.5b.ffn_down", 4864, 896, "Q4_K", False),
    ("0.5b.output[:4096]", 896, 4096, "Q8_0", False),
    ("7b.attn_q", 3584, 3584, "Q4_K", True),
    ("7b.attn_v", 3584, 512, "Q6_K", True),
    ("7b.ffn_up", 3584, 18944, "Q4_K", False),
    ("7b.ffn_down", 18944, 3584, "Q6_K", False),
    ("7b.ffn_down_q5", 18944, 3584, "Q5_K", False),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [1, 4, 130])
@pytest.mark.parametrize("shape", REAL_SHAPES, ids=[s[0] for s in REAL_SHAPES])
def test_matmul_real_shapes(backend: str, shape: tuple[str, int, int, str, bool], n_rows: int) -> None:
    name, k, n_out, wtype, bias = shape
    check_matmul(backend, wtype, n_out, k, n_rows, bias, tag=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [1, 3])
@pytest.mark.parametrize("shape", [(1536, 1536, "Q4_K"), (3584, 512, "Q6_K"), (896, 896, "Q5_0")])
def test_rmsnorm_fused_into_gemv(backend: str, shape: tuple[int, int, str], n_rows: int) -> None:
    """RMSNorm writes the q8_1 copy the next GEMV reads (CUDA): same result as norm then matmul."""
    k, n_out, wtype = shape
    w, wd = weights_case(wtype, n_out, k, "fused")
    rng = seed("normmm", backend, k, n_rows)
    x = (rng.standard_normal((n_rows, k)) * 3).astype(np.float32)
    g = rng.uniform(0.5, 1.5, k).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    y = runner(backend).norm_matmul(x.reshape(-1), g, 1e-6, wtype, w, n_out, bias)
    x64 = x.astype(np.float64)
    h = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * g
    ref = h @ wd.T + bias
    err = rel_err(y.reshape(n_rows, n_out), ref)
    assert err <= Q8, f"{backend}: {err:.3g}"
    if backend == "cuda":
        y_cpu = runner("cpu").norm_matmul(x.reshape(-1), g, 1e-6, wtype, w, n_out, bias)
        diff = rel_err(y, y_cpu.astype(np.float64))
        assert diff <= CPU_NEAR, f"cuda vs cpu: {diff:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [1, 2])
@pytest.mark.parametrize("shape", [(8960, 1536, "Q6_K"), (18944, 3584, "Q4_K")])
def test_swiglu_fused_into_gemv(backend: str, shape: tuple[int, int, str], n_rows: int) -> None:
    """SwiGLU writes the q8_1 copy the down projection reads (CUDA)."""
    k, n_out, wtype = shape
    w, wd = weights_case(wtype, n_out, k, "fused")
    rng = seed("swimm", backend, k, n_rows)
    gate = (rng.standard_normal((n_rows, k)) * 2).astype(np.float32)
    up = rng.standard_normal((n_rows, k)).astype(np.float32)
    y = runner(backend).swiglu_matmul(gate.reshape(-1), up.reshape(-1), k, wtype, w, n_out)
    g64 = gate.astype(np.float64)
    h = g64 / (1 + np.exp(-g64)) * up
    err = rel_err(y.reshape(n_rows, n_out), h @ wd.T)
    # silu(g)·u is heavy-tailed: a block's maximum is further from its typical value than for
    # Gaussian data, so the int8 step is relatively coarser (measured ≈ 1.5 % on CPU's Q8_K).
    assert err <= 2.5e-2, f"{backend}: {err:.3g}"
    if backend == "cuda":
        y_cpu = runner("cpu").swiglu_matmul(gate.reshape(-1), up.reshape(-1), k, wtype, w, n_out)
        diff = rel_err(y, y_cpu.astype(np.float64))
        assert diff <= CPU_NEAR, f"cuda vs cpu: {diff:.3g}"


# ---------------------------------------------------------------- element-wise


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim,n_rows", [(1536, 1), (1536, 7), (3584, 64), (896, 3), (100, 5), (37, 2)])
def test_rmsnorm(backend: str, dim: int, n_rows: int) -> None:
    rng = seed("rms", backend, dim, n_rows)
    x = (rng.standard_normal((n_rows, dim)) * 5).astype(np.float32)
    w = rng.uniform(-2, 2, dim).astype(np.float32)
    y = runner(backend).rmsnorm(x.reshape(-1), w, 1e-6)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert rel_err(y.reshape(n_rows, dim), ref) <= F32


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1536 * 3, 8960, 18944 * 2, 1001, 7])
def test_swiglu_and_add(backend: str, n: int) -> None:
    rng = seed("ew", backend, n)
    g = (rng.standard_normal(n) * 4).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    r = runner(backend)
    g64 = g.astype(np.float64)
    assert rel_err(r.swiglu(g, u), g64 / (1 + np.exp(-g64)) * u) <= F32
    assert rel_err(r.add(g, u), g64 + u) <= 1e-7


ROPE_CASES = [
    # (style, n_heads, head_dim, n_rot, freq_base, freq_scale, with_freq_factors)
    ("neox", 12, 128, 128, 1000000.0, 1.0, False),  # qwen2.5 1.5B q
    ("neox", 2, 128, 128, 1000000.0, 1.0, False),   # 1.5B k
    ("neox", 28, 128, 128, 1000000.0, 1.0, False),  # 7B q
    ("neox", 14, 64, 64, 1000000.0, 1.0, False),    # 0.5B q
    ("norm", 8, 64, 64, 10000.0, 1.0, True),        # llama-style with rope_freqs
    ("norm", 3, 48, 32, 10000.0, 0.25, False),      # partial rotation, linear scaling
    ("neox", 16, 256, 64, 10000000.0, 1.0, False),  # Qwen3.5/3.6 hybrid q: a quarter of 256 rotated
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ROPE_CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-rot{c[3]}" for c in ROPE_CASES])
def test_rope(backend: str, case: tuple[str, int, int, int, float, float, bool]) -> None:
    style, n_heads, head_dim, n_rot, base, scale, with_ff = case
    rng = seed("rope", backend, case)
    positions = np.concatenate([[0, 1, 2, 31, 32], rng.integers(0, 32768, 11)]).astype(np.uint32)
    x = rng.standard_normal((len(positions), n_heads, head_dim)).astype(np.float32)
    ff = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32) if with_ff else None
    y = runner(backend).rope(x.reshape(-1), positions, n_heads, head_dim, style, n_rot, base, scale, ff)
    y = y.reshape(x.shape).astype(np.float64)
    assert np.isfinite(y).all()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot) * scale / (ff.astype(np.float64) if ff is not None else 1.0)
    ref = x.astype(np.float64).copy()
    for r, p in enumerate(positions):
        t = float(p) * inv
        a = np.arange(half) if style == "neox" else 2 * np.arange(half)
        b = a + half if style == "neox" else a + 1
        x0, x1 = x[r][:, a].astype(np.float64), x[r][:, b].astype(np.float64)
        ref[r][:, a] = x0 * np.cos(t) - x1 * np.sin(t)
        ref[r][:, b] = x0 * np.sin(t) + x1 * np.cos(t)
        # f32 angle recurrence (as ggml) drifts by ~1e-7·p·n_rot/2 radians.
        tol = 1e-5 + 2e-7 * float(p) * n_rot
        assert np.abs(y[r] - ref[r]).max() <= tol * np.abs(x[r]).max() * 2, f"position {p}"
    if backend == "cuda":
        y_cpu = runner("cpu").rope(x.reshape(-1), positions, n_heads, head_dim, style, n_rot, base, scale, ff)
        assert np.abs(y - y_cpu.reshape(x.shape)).max() <= 1e-4 * np.abs(x).max()


ROPE_YARN_CASES = [
    # (style, n_heads, head_dim, n_rot, freq_base, factor, n_ctx_orig, with_freq_factors)
    ("neox", 12, 128, 128, 1000000.0, 4.0, 32768, False),  # Qwen2.5 1.5B q at 128k (model card)
    ("neox", 14, 64, 64, 1000000.0, 4.0, 32768, False),    # 0.5B q
    ("norm", 8, 64, 64, 500000.0, 8.0, 8192, True),        # llama-style, rope_freqs and YaRN together
    ("neox", 3, 48, 32, 10000.0, 2.0, 2048, False),        # partial rotation
]


def _yarn_corr_dims(n_rot: int, n_orig: int, base: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims with llama.cpp's β_fast = 32, β_slow = 1 (in f32 as there)."""
    def dim(beta: float) -> np.float32:
        return np.float32(n_rot * np.log(np.float32(n_orig / (beta * 2 * np.pi))) / (2 * np.log(np.float32(base))))
    return max(0.0, float(np.floor(dim(32.0)))), min(n_rot - 1.0, float(np.ceil(dim(1.0))))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ROPE_YARN_CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}-rot{c[3]}-f{c[5]:g}" for c in ROPE_YARN_CASES])
def test_rope_yarn(backend: str, case: tuple) -> None:
    """YaRN (ggml rope_yarn) against a float64 reference at positions up to 128k, and CUDA against
    the CPU op."""
    style, n_heads, head_dim, n_rot, base, factor, n_orig, with_ff = case
    rng = seed("rope-yarn", backend, case)
    positions = np.concatenate([[0, 1, 31, 32768, 131071], rng.integers(0, 131072, 11)]).astype(np.uint32)
    x = rng.standard_normal((len(positions), n_heads, head_dim)).astype(np.float32)
    ff = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32) if with_ff else None
    scale, attn = 1.0 / factor, 0.95
    args = (x.reshape(-1), positions, n_heads, head_dim, style, n_rot, base, scale, ff)
    y = runner(backend).rope(*args, ext_factor=1.0, attn_factor=attn, yarn_orig_ctx=n_orig)
    y = y.reshape(x.shape).astype(np.float64)
    assert np.isfinite(y).all()
    half = n_rot // 2
    lo, hi = _yarn_corr_dims(n_rot, n_orig, base)
    i = np.arange(half)
    mix = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
    inv_e = base ** (-2.0 * i / n_rot) / (ff.astype(np.float64) if ff is not None else 1.0)
    mscale = attn * (1.0 + 0.1 * np.log(factor))
    ref = x.astype(np.float64).copy()
    for r, p in enumerate(positions):
        te = float(p) * inv_e
        t = te * scale * (1 - mix) + te * mix
        a = i if style == "neox" else 2 * i
        b = a + half if style == "neox" else a + 1
        x0, x1 = x[r][:, a].astype(np.float64), x[r][:, b].astype(np.float64)
        ref[r][:, a] = mscale * (x0 * np.cos(t) - x1 * np.sin(t))
        ref[r][:, b] = mscale * (x0 * np.sin(t) + x1 * np.cos(t))
        tol = 1e-5 + 2e-7 * float(p) * n_rot
        assert np.abs(y[r] - ref[r]).max() <= tol * np.abs(x[r]).max() * 2, f"position {p}"
    if backend == "cuda":
        y_cpu = runner("cpu").rope(*args, ext_factor=1.0, attn_factor=attn, yarn_orig_ctx=n_orig)
        assert np.abs(y - y_cpu.reshape(x.shape)).max() <= 1e-4 * np.abs(x).max() * 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_kv_write_yarn(backend: str) -> None:
    """The fused RoPE + KV write with YaRN (Qwen2.5 at 128k) against the CPU's separate ops."""
    n_head, n_kv, hd, n_past, n = 12, 2, 128, 70000, 5
    rng = seed("ropekv-yarn", backend)
    q = rng.standard_normal((n, n_head * hd)).astype(np.float32)
    k = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    n_blocks = (n_past + n + 31) // 32 + 2
    table = rng.permutation(n_blocks).astype(np.uint32)
    yarn = {"ext_factor": 1.0, "attn_factor": 1.0, "yarn_orig_ctx": 32768}
    qo, kr, _ = runner(backend).rope_kv_write(q.reshape(-1), k.reshape(-1), v.reshape(-1), n_past, table, n_head,
                                              n_kv, hd, "neox", hd, 1000000.0, 0.25, **yarn)
    pos = np.arange(n_past, n_past + n, dtype=np.uint32)
    cpu = runner("cpu")
    q_ref = cpu.rope(q.reshape(-1), pos, n_head, hd, "neox", hd, 1000000.0, 0.25, **yarn)
    k_ref = cpu.rope(k.reshape(-1), pos, n_kv, hd, "neox", hd, 1000000.0, 0.25, **yarn)
    tol = 1e-4 * max(np.abs(q).max(), np.abs(k).max()) * 4
    assert np.isfinite(qo).all() and np.abs(qo - q_ref).max() <= tol
    assert np.abs(kr.astype(np.float64) - f16_round(k_ref)).max() <= tol + 1e-3 * np.abs(k_ref).max()
    if backend == "cpu":
        np.testing.assert_array_equal(qo, q_ref)
        np.testing.assert_array_equal(kr.astype(np.float64), f16_round(k_ref))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("wtype", QUANT + DENSE)
@pytest.mark.parametrize("dim", [1536, 896])
def test_embed(backend: str, wtype: str, dim: int) -> None:
    if wtype in ("Q4_K", "Q5_K", "Q6_K") and dim % 256:
        dim = 1024
    n_vocab = 301
    table = random_weights(wtype, n_vocab, dim, seed("emb", wtype, dim))
    ref = dequantized(wtype, table, n_vocab, dim)
    tokens = np.array([0, 300, 5, 5, 17, 299, 128], dtype=np.uint32)
    y = runner(backend).embed(wtype, table, n_vocab, dim, tokens).reshape(len(tokens), dim)
    assert rel_err(y, ref[tokens]) <= 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_rows_and_argmax(backend: str) -> None:
    rng = seed("gather", backend)
    r = runner(backend)
    x = rng.standard_normal((9, 1536)).astype(np.float32)
    rows = np.array([8, 0, 3], dtype=np.uint32)
    np.testing.assert_array_equal(r.gather_rows(x.reshape(-1), 1536, rows).reshape(3, 1536), x[rows])
    n_vocab = 151936
    logits = rng.standard_normal((4, n_vocab)).astype(np.float32)
    logits[0, 1000] = logits[0, 77] = 50.0      # tie: the lower index wins
    logits[1, :] = np.nan
    logits[1, 123456] = 3.0                      # NaN never wins
    logits[2, :] = -np.inf                       # nothing beats -inf: index 0
    want = [77, 123456, 0, int(np.argmax(logits[3]))]
    assert r.argmax(logits.reshape(-1), n_vocab) == want


# ---------------------------------------------------------------- KV write + attention

ATTN_CASES = [
    # (name, seqs [(n_past, n_rows)], n_head, n_head_kv, head_dim)
    ("1.5b.decode.ctx1", [(0, 1)], 12, 2, 128),
    ("1.5b.decode.ctx700", [(699, 1)], 12, 2, 128),
    ("1.5b.decode.batch", [(5, 1), (300, 1), (32, 1), (2047, 1)], 12, 2, 128),
    ("1.5b.prefill.67", [(0, 67)], 12, 2, 128),
    ("1.5b.prefill.chunk", [(100, 40)], 12, 2, 128),
    ("1.5b.mixed", [(0, 20), (64, 1), (3, 33)], 12, 2, 128),
    ("7b.decode.ctx3000", [(2999, 1)], 28, 4, 128),
    ("7b.prefill.chunk", [(512, 130)], 28, 4, 128),
    ("0.5b.decode", [(90, 1), (1, 1)], 14, 2, 64),
    ("0.5b.prefill", [(0, 45)], 14, 2, 64),
    ("mha.decode", [(200, 1)], 8, 8, 64),
    ("g32.decode", [(77, 1)], 32, 1, 128),
    ("tiny.d16", [(10, 9)], 4, 2, 16),
    ("d96", [(40, 3)], 6, 3, 96),
    # head_dim 256 (the Qwen3.5/3.6 hybrids' gated attention: 16×2 heads in 35B-A3B, 24×4 in 27B;
    # Gemma): Q read from shared memory, 1/2/4 warps by the group size (8, 24, 40 below).
    ("hd256.decode.ctx1", [(0, 1)], 16, 2, 256),
    ("hd256.decode.batch", [(5, 1), (300, 1), (32, 1), (2047, 1)], 16, 2, 256),
    ("hd256.decode.g24", [(700, 1), (64, 1)], 24, 1, 256),
    ("hd256.decode.g40", [(95, 1)], 40, 1, 256),
    ("hd256.prefill.67", [(0, 67)], 16, 2, 256),
    ("hd256.prefill.chunk", [(100, 40)], 24, 4, 256),
    ("hd256.mixed", [(0, 20), (64, 1), (3, 33), (250, 70)], 24, 4, 256),
    ("hd256.mha", [(200, 1), (31, 2)], 4, 4, 256),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ATTN_CASES, ids=[c[0] for c in ATTN_CASES])
def test_kv_write_and_attention(backend: str, case: tuple[str, list[tuple[int, int]], int, int, int]) -> None:
    name, seqs, n_head, n_head_kv, head_dim = case
    rng = seed("attn", backend, name)
    ctx = sum(p + r for p, r in seqs)
    rows = sum(r for _, r in seqs)
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((ctx, n_head_kv * head_dim)) * 0.5).astype(np.float32)
    v = rng.standard_normal((ctx, n_head_kv * head_dim)).astype(np.float32)
    n_blocks = sum((p + r + 31) // 32 for p, r in seqs) + 3
    perm = rng.permutation(n_blocks).astype(np.uint32)
    out, k_read, v_read = runner(backend).attention(seqs, n_head, n_head_kv, head_dim, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1))
    # The cache holds exactly the f16 rounding of what was written.
    np.testing.assert_array_equal(k_read.astype(np.float64), f16_round(k).reshape(-1))
    np.testing.assert_array_equal(v_read.astype(np.float64), f16_round(v).reshape(-1))
    ref = attention_ref(seqs, n_head, n_head_kv, head_dim, q, k, v)
    err = rel_err(out.reshape(rows, -1), ref)
    # Both round q and the probabilities to f16 (CPU: llama.cpp's roundings, 2^-11 relative;
    # CUDA: the tensor cores' f16 inputs, unnormalized probabilities).
    bound = 5e-3 if backend == "cuda" else 1e-3
    assert err <= bound, f"{backend} {name}: relative error {err:.3g} > {bound:g}"
    if backend == "cuda":
        cpu = runner("cpu").attention(seqs, n_head, n_head_kv, head_dim, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1))[0]
        assert rel_err(out, cpu.astype(np.float64)) <= bound + 1e-3


@pytest.mark.parametrize("backend,ctx", [("cpu", 8192), pytest.param("cuda", 8192, marks=pytest.mark.cuda),
                                         pytest.param("cuda", 32768, marks=pytest.mark.cuda)])
def test_attention_long_context_decode(backend: str, ctx: int) -> None:
    """Flash-decoding split over a long KV range (the 8k and 32k decode benchmarks' shapes; the
    CPU reference run stops at 8k to keep CI short)."""
    rng = seed("attn-long", backend, ctx)
    n_head, n_head_kv, head_dim = 12, 2, 128
    seqs = [(ctx - 1, 1)]
    q = rng.standard_normal((1, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((ctx, n_head_kv * head_dim)) * 0.3).astype(np.float32)
    v = rng.standard_normal((ctx, n_head_kv * head_dim)).astype(np.float32)
    perm = rng.permutation(ctx // 32 + 1).astype(np.uint32)
    out = runner(backend).attention(seqs, n_head, n_head_kv, head_dim, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1))[0]
    ref = attention_ref(seqs, n_head, n_head_kv, head_dim, q, k, v)
    assert rel_err(out.reshape(1, -1), ref) <= (5e-3 if backend == "cuda" else 1e-3)


@pytest.mark.parametrize("backend,ctx", [("cpu", 8192), pytest.param("cuda", 8192, marks=pytest.mark.cuda),
                                         pytest.param("cuda", 32768, marks=pytest.mark.cuda)])
def test_attention_long_context_decode_hd256(backend: str, ctx: int) -> None:
    """The split decode at head_dim 256 (Qwen3.6-35B-A3B's 16 query and 2 KV heads), with a
    second, short sequence in the batch."""
    rng = seed("attn-long-hd256", backend, ctx)
    n_head, n_head_kv, head_dim = 16, 2, 256
    seqs = [(ctx - 1, 1), (100, 1)]
    total = sum(p + r for p, r in seqs)
    q = rng.standard_normal((2, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((total, n_head_kv * head_dim)) * 0.3).astype(np.float32)
    v = rng.standard_normal((total, n_head_kv * head_dim)).astype(np.float32)
    perm = rng.permutation(sum((p + r + 31) // 32 for p, r in seqs) + 1).astype(np.uint32)
    out = runner(backend).attention(seqs, n_head, n_head_kv, head_dim, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1))[0]
    ref = attention_ref(seqs, n_head, n_head_kv, head_dim, q, k, v)
    assert rel_err(out.reshape(2, -1), ref) <= (5e-3 if backend == "cuda" else 1e-3)


# ---------------------------------------------------------------- sliding-window attention

SWA_CASES = [
    # (name, seqs [(n_past, n_rows)], n_head, n_head_kv, head_dim, window): rows below and above
    # the window, decode and (chunked) prefill, batched with sequences of other lengths, windows
    # of 1, of one block, not a multiple of 32, wider than the context.
    ("1.5b.decode.below", [(20, 1)], 12, 2, 128, 64),
    ("1.5b.decode.above", [(699, 1)], 12, 2, 128, 64),
    ("1.5b.decode.batch", [(5, 1), (300, 1), (32, 1), (2047, 1), (95, 1), (96, 1)], 12, 2, 128, 96),
    ("1.5b.decode.w4096", [(9000, 1), (4095, 1), (4096, 1), (100, 1)], 12, 2, 128, 4096),
    ("1.5b.prefill.67", [(0, 67)], 12, 2, 128, 40),
    ("1.5b.prefill.chunk", [(100, 140)], 12, 2, 128, 45),
    ("1.5b.mixed", [(0, 20), (64, 1), (3, 33), (500, 70)], 12, 2, 128, 33),
    ("7b.prefill.chunk", [(512, 130)], 28, 4, 128, 256),
    ("0.5b.decode", [(90, 1), (1, 1), (1000, 1)], 14, 2, 64, 32),
    ("0.5b.prefill", [(0, 200)], 14, 2, 64, 31),
    ("mha.decode", [(200, 1)], 8, 8, 64, 17),
    ("g32.decode", [(777, 1)], 32, 1, 128, 100),
    ("w1", [(10, 9), (70, 1)], 4, 2, 64, 1),
    ("wide", [(40, 30), (7, 1)], 6, 3, 96, 1000),
    ("tiny.d16", [(100, 9)], 4, 2, 16, 8),
    ("hd256.decode.batch", [(5, 1), (300, 1), (2047, 1), (95, 1)], 16, 2, 256, 96),
    ("hd256.prefill.chunk", [(100, 140)], 8, 2, 256, 45),
    ("hd256.mixed", [(0, 20), (64, 1), (500, 70)], 24, 4, 256, 1024),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", SWA_CASES, ids=[c[0] for c in SWA_CASES])
def test_sliding_window_attention(backend: str, case: tuple[str, list[tuple[int, int]], int, int, int, int]) -> None:
    """Windowed attention against the brute-force masked float64 reference, and CUDA against the
    CPU op. The blocks wholly before each sequence's first new row's window point at a block of
    +inf K/V (as released, reused blocks may hold anything): a kernel that loads one gives NaN."""
    name, seqs, n_head, n_head_kv, head_dim, window = case
    rng = seed("swa", backend, name)
    ctx = sum(p + r for p, r in seqs)
    rows = sum(r for _, r in seqs)
    q = rng.standard_normal((rows, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((ctx, n_head_kv * head_dim)) * 0.5).astype(np.float32)
    v = rng.standard_normal((ctx, n_head_kv * head_dim)).astype(np.float32)
    n_blocks = sum((p + r + 31) // 32 for p, r in seqs) + 3
    perm = rng.permutation(n_blocks).astype(np.uint32)
    args = (seqs, n_head, n_head_kv, head_dim, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1))
    out = runner(backend).attention(*args, window=window)[0]
    ref = attention_ref(seqs, n_head, n_head_kv, head_dim, q, k, v, window=window)
    err = rel_err(out.reshape(rows, -1), ref)
    bound = 5e-3 if backend == "cuda" else 1e-3
    assert err <= bound, f"{backend} {name}: relative error {err:.3g} > {bound:g}"
    # The window matters here (else the case tests nothing): the unwindowed result is far.
    if max(p + r for p, r in seqs) > window:
        full = attention_ref(seqs, n_head, n_head_kv, head_dim, q, k, v)
        assert rel_err(out.reshape(rows, -1), full) > 10 * bound, name
    if backend == "cuda":
        cpu = runner("cpu").attention(*args, window=window)[0]
        assert rel_err(out, cpu.astype(np.float64)) <= bound + 1e-3


@pytest.mark.parametrize("backend,ctx", [("cpu", 8192), pytest.param("cuda", 8192, marks=pytest.mark.cuda),
                                         pytest.param("cuda", 131072, marks=pytest.mark.cuda)])
def test_sliding_window_long_context_decode(backend: str, ctx: int) -> None:
    """Decode at the end of a long context with a 4096-token window: the split-KV path counts its
    splits from the window's first tile (the blocks before it are poisoned)."""
    rng = seed("swa-long", backend, ctx)
    n_head, n_head_kv, head_dim, window = 12, 2, 128, 4096
    seqs = [(ctx - 1, 1), (window + 5, 1)]
    total = sum(p + r for p, r in seqs)
    q = rng.standard_normal((2, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((total, n_head_kv * head_dim)) * 0.3).astype(np.float32)
    v = rng.standard_normal((total, n_head_kv * head_dim)).astype(np.float32)
    perm = rng.permutation(sum((p + r + 31) // 32 for p, r in seqs) + 1).astype(np.uint32)
    out = runner(backend).attention(seqs, n_head, n_head_kv, head_dim, perm, q.reshape(-1), k.reshape(-1),
                                    v.reshape(-1), window=window)[0]
    ref = attention_ref(seqs, n_head, n_head_kv, head_dim, q, k, v, window=window)
    assert rel_err(out.reshape(2, -1), ref) <= (5e-3 if backend == "cuda" else 1e-3)


SAFE_SWA = """
import sys
import numpy as np
from fak import _native
r = _native.OpRunner("cuda")
rng = np.random.default_rng(5)
seqs = [(3000, 1), (40, 1), (2047, 1)]
ctx = sum(p + n for p, n in seqs)
hd = int(sys.argv[3])
q = rng.standard_normal((3, 12 * hd)).astype(np.float32)
k = (rng.standard_normal((ctx, 2 * hd)) * 0.5).astype(np.float32)
v = rng.standard_normal((ctx, 2 * hd)).astype(np.float32)
perm = rng.permutation(sum((p + n + 31) // 32 for p, n in seqs) + 2).astype(np.uint32)
out = r.attention(seqs, 12, 2, hd, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1), window=int(sys.argv[1]))[0]
np.save(sys.argv[2], out)
"""


@pytest.mark.cuda
@pytest.mark.parametrize("window,head_dim", [(0, 128), (100, 128), (1000, 128), (0, 256), (1000, 256)],
                         ids=["0", "100", "1000", "0-hd256", "1000-hd256"])
def test_sliding_window_in_kernel_combine(require_cuda: None, window: int, head_dim: int, tmp_path) -> None:
    """``FAK_CUDA_SAFE=1`` (the split decode combined by the last block inside the attention
    kernel, read once per process: a child process) gives what the separate combine gives."""
    import subprocess
    import sys

    outs = {}
    for safe in ("0", "1"):
        path = tmp_path / f"out{safe}.npy"
        env = dict(os.environ, FAK_CUDA_SAFE=safe)
        r = subprocess.run([sys.executable, "-c", SAFE_SWA, str(window), str(path), str(head_dim)], env=env,
                           capture_output=True, text=True, timeout=600, check=False)
        assert r.returncode == 0, r.stderr
        outs[safe] = np.load(path).astype(np.float64)
    assert np.isfinite(outs["1"]).all()
    assert rel_err(outs["1"], outs["0"]) <= 1e-5


# ---------------------------------------------------------------- fused forward steps

MULTI_CASES = [
    # (name, k, [(wtype, n_out, bias)]): the matrices a forward multiplies with one input.
    ("1.5b.qkv", 1536, [("Q4_K", 1536, True), ("Q4_K", 256, True), ("Q6_K", 256, True)]),
    ("1.5b.gate_up", 1536, [("Q4_K", 8960, False), ("Q4_K", 8960, False)]),
    ("0.5b.qkv", 896, [("Q5_0", 896, True), ("Q5_0", 128, True), ("Q8_0", 128, True)]),
    ("legacy.q4_1_q5_1", 512, [("Q4_1", 300, False), ("Q5_1", 77, True), ("Q4_0", 64, False), ("Q5_0", 33, True)]),
    ("mixed.forms", 1024, [("Q4_K", 100, True), ("Q8_0", 50, False), ("F16", 20, False)]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [1, 3, 8, 9])
@pytest.mark.parametrize("case", MULTI_CASES, ids=[c[0] for c in MULTI_CASES])
def test_matmul_multi(backend: str, case: tuple[str, int, list[tuple[str, int, bool]]], n_rows: int) -> None:
    """Several matrices of one input (one GEMV launch on CUDA, up to three matrices of the same
    activation form each): every output as its own matmul computes it."""
    name, k, mats = case
    rng = seed("multi", backend, name, n_rows)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    ws, refs, biases = [], [], []
    for i, (wtype, n_out, with_bias) in enumerate(mats):
        w, wd = weights_case(wtype, n_out, k, f"multi{i}")
        b = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
        ws.append(w)
        biases.append(b)
        refs.append(x.astype(np.float64) @ wd.T + (b.astype(np.float64) if b is not None else 0.0))
    r = runner(backend)
    outs = r.matmul_multi([m[0] for m in mats], ws, [m[1] for m in mats], k, x.reshape(-1), biases)
    for (wtype, n_out, _), w, b, y, ref in zip(mats, ws, biases, outs, refs):
        err = rel_err(y.reshape(n_rows, n_out), ref)
        bound = matmul_bound(backend, wtype, n_rows)
        assert err <= bound, f"{backend} {name} {wtype}: {err:.3g} > {bound:g}"
        if backend == "cuda":
            y_cpu = runner("cpu").matmul(wtype, w, n_out, k, x.reshape(-1), b)
            diff = rel_err(y, y_cpu.astype(np.float64))
            assert diff <= cuda_cpu_bound(wtype, n_rows), f"cuda vs cpu {name} {wtype}: {diff:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [1, 5, 40, 400])
@pytest.mark.parametrize("shape", [(1536, 1536, "Q4_K", True), (8960, 1536, "Q6_K", False), (896, 896, "Q5_0", True), (256, 64, "F32", False)])
def test_matmul_add(backend: str, shape: tuple[int, int, str, bool], n_rows: int) -> None:
    """A projection followed by the residual add (fused into the epilogue on CUDA)."""
    k, n_out, wtype, with_bias = shape
    w, wd = weights_case(wtype, n_out, k, "add")
    rng = seed("mmadd", backend, k, n_out, n_rows)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    res = (rng.standard_normal((n_rows, n_out)) * 3).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32) if with_bias else None
    y = runner(backend).matmul_add(wtype, w, n_out, k, x.reshape(-1), res.reshape(-1), bias).reshape(n_rows, n_out)
    prod = x.astype(np.float64) @ wd.T + (bias.astype(np.float64) if bias is not None else 0.0)
    err = rel_err(y - res, prod)
    assert err <= matmul_bound(backend, wtype, n_rows), f"{backend}: {err:.3g}"
    if backend == "cuda":
        y_cpu = runner("cpu").matmul_add(wtype, w, n_out, k, x.reshape(-1), res.reshape(-1), bias).reshape(n_rows, n_out)
        diff = rel_err(y - res, (y_cpu - res).astype(np.float64))
        assert diff <= cuda_cpu_bound(wtype, n_rows), f"cuda vs cpu: {diff:.3g}"


ROPE_KV_CASES = [
    # (n_head, n_head_kv, head_dim, n_rot, style, n_past, n_rows)
    (12, 2, 128, 128, "neox", 0, 1),
    (12, 2, 128, 128, "neox", 700, 1),
    (28, 4, 128, 128, "neox", 40, 67),
    (14, 2, 64, 64, "neox", 5, 3),
    (8, 8, 64, 32, "norm", 31, 4),
    (16, 2, 256, 64, "neox", 0, 1),     # Qwen3.6-35B-A3B: head_dim 256, a quarter rotated
    (24, 4, 256, 64, "neox", 700, 37),  # Qwen3.5-27B
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ROPE_KV_CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}-rot{c[3]}-{c[4]}-p{c[5]}-n{c[6]}" for c in ROPE_KV_CASES])
def test_rope_kv_write(backend: str, case: tuple[int, int, int, int, str, int, int]) -> None:
    """RoPE of q and k and the KV write (one launch on CUDA) against the separate ops on CPU."""
    n_head, n_kv, hd, n_rot, style, n_past, n = case
    rng = seed("ropekv", backend, case)
    q = rng.standard_normal((n, n_head * hd)).astype(np.float32)
    k = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    n_blocks = (n_past + n + 31) // 32 + 2
    table = rng.permutation(n_blocks).astype(np.uint32)
    args = (n_past, table, n_head, n_kv, hd, style, n_rot, 1000000.0, 1.0)
    qo, kr, vr = runner(backend).rope_kv_write(q.reshape(-1), k.reshape(-1), v.reshape(-1), *args)
    pos = np.arange(n_past, n_past + n, dtype=np.uint32)
    cpu = runner("cpu")
    q_ref = cpu.rope(q.reshape(-1), pos, n_head, hd, style, n_rot, 1000000.0, 1.0)
    k_ref = cpu.rope(k.reshape(-1), pos, n_kv, hd, style, n_rot, 1000000.0, 1.0)
    tol = 1e-4 * max(np.abs(q).max(), np.abs(k).max())
    assert np.isfinite(qo).all() and np.abs(qo - q_ref).max() <= tol
    # The cache holds the f16 rounding of the rotated K and of V.
    np.testing.assert_array_equal(vr, f16_round(v).reshape(-1).astype(np.float32))
    assert np.abs(kr.astype(np.float64) - f16_round(k_ref)).max() <= tol + 1e-3 * np.abs(k_ref).max()
    if backend == "cpu":
        np.testing.assert_array_equal(kr.astype(np.float64), f16_round(k_ref))


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_rows(backend: str) -> None:
    """The greedy step (argmax + its log-softmax; on the device for CUDA) against float64."""
    rng = seed("greedy", backend)
    n_vocab = 151936
    x = (rng.standard_normal((5, n_vocab)) * 3).astype(np.float32)
    x[0, 1000] = x[0, 77] = 30.0                 # tie: the lower index wins
    x[1, :] = -5.0
    x[1, 123] = 0.5                              # one clear winner
    x[2, 9] = np.nan                             # NaN never wins and is not summed
    toks, lps = runner(backend).greedy(x.reshape(-1), n_vocab)
    xs = np.where(np.isnan(x), -np.inf, x.astype(np.float64))
    want = [int(np.argmax(r)) for r in xs]
    want[0] = 77
    assert list(toks) == want
    m = xs.max(axis=1, keepdims=True)
    lse = np.log(np.exp(xs - m).sum(axis=1)) + m[:, 0]
    ref = xs[np.arange(5), want] - lse
    # (The log-probability of a row holding a NaN is left unspecified.)
    finite = [0, 1, 3, 4]
    np.testing.assert_allclose(np.asarray(lps, dtype=np.float64)[finite], ref[finite], rtol=0, atol=2e-5)


# ---------------------------------------------------------------- batched decode matmul

# The decode batch sizes of the issue (odd ones included) at the shapes whose kernel choice the
# measured table makes (rust/src/backend/cuda/ops/matmul_plan.rs): every row count must agree
# with the CPU backend within CPU_EXACT whichever kernel (GEMV in launches of 8, int8 GEMM with
# small tiles, two k-steps per barrier and split-K) the table picks for a decode step.
DECODE_ROWS = [1, 2, 7, 8, 9, 16, 31, 32, 64, 128, 256]
DECODE_SHAPES = [s for s in REAL_SHAPES if s[0] in (
    "1.5b.attn_q", "1.5b.attn_v", "1.5b.ffn_up", "1.5b.ffn_down", "0.5b.attn_q", "0.5b.output[:4096]",
    "7b.attn_v", "7b.ffn_down_q5")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", DECODE_ROWS)
@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=[s[0] for s in DECODE_SHAPES])
def test_matmul_decode_batches(backend: str, shape: tuple[str, int, int, str, bool], n_rows: int) -> None:
    name, k, n_out, wtype, bias = shape
    if backend == "cpu":
        check_matmul(backend, wtype, n_out, k, n_rows, bias, tag=name)
        return
    runner("cuda").set_matmul_variant("decode")  # the table's decode-step choices
    try:
        check_matmul(backend, wtype, n_out, k, n_rows, bias, tag=name)
    finally:
        runner("cuda").set_matmul_variant(None)


# Every kernel variant the table may choose, forced, on every quantized format: K of 10
# super-blocks (k-quants) or 13 blocks of 32 (legacy, an odd number of k-steps for G = 2), so
# that the splits are uneven; row counts that leave partial tiles.
VARIANTS = ["gemv", "tc:16:1:1", "tc:16:2:3", "tc:32:1:5", "tc:32:2:0", "tc:64:1:2", "tc:64:2:0", "tc:64:1:1"]


@pytest.mark.cuda
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n_rows", [1, 9, 33, 70])
@pytest.mark.parametrize("wtype", QUANT)
def test_matmul_forced_variant(variant: str, wtype: str, n_rows: int) -> None:
    k = 2560 if wtype in ("Q4_K", "Q5_K", "Q6_K") else 416
    n_out = 300
    w, wd = weights_case(wtype, n_out, k, "variant")
    rng = seed("variant", wtype, n_rows, variant)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    cuda = runner("cuda")
    cuda.set_matmul_variant(variant)
    try:
        y = cuda.matmul(wtype, w, n_out, k, x.reshape(-1), bias).reshape(n_rows, n_out)
        # The residual add in the epilogue, with the split-K fix-up.
        res = rng.standard_normal((n_rows, n_out)).astype(np.float32)
        ya = cuda.matmul_add(wtype, w, n_out, k, x.reshape(-1), res.reshape(-1), bias).reshape(n_rows, n_out)
    finally:
        cuda.set_matmul_variant(None)
    ref = x.astype(np.float64) @ wd.T + bias
    assert rel_err(y, ref) <= Q8, f"{variant} {wtype} rows={n_rows}: {rel_err(y, ref):.3g}"
    y_cpu = runner("cpu").matmul(wtype, w, n_out, k, x.reshape(-1), bias).reshape(n_rows, n_out).astype(np.float64)
    diff = rel_err(y, y_cpu)
    assert diff <= CPU_EXACT, f"cuda {variant} vs cpu {wtype} rows={n_rows}: {diff:.3g}"
    assert rel_err(ya - res, y_cpu) <= CPU_EXACT
    # Run to run the same bits (the split-K fix-up adds the partials in split order).
    cuda.set_matmul_variant(variant)
    try:
        y2 = cuda.matmul(wtype, w, n_out, k, x.reshape(-1), bias).reshape(n_rows, n_out)
    finally:
        cuda.set_matmul_variant(None)
    np.testing.assert_array_equal(y2, y)


# The staged mode (cp.async stages of 256 values of K): K of 9 stages (an odd number; for Q6_K rows
# of 1,890 bytes, so that half of its rows and stages start 2 bytes off a word), against the CPU
# and bit for bit against the direct mode with the same split count (the same words reach the same
# decode and MMAs).
# The fragment mode (fr:, Q4_K and Q6_K; the other formats take the staged mode) likewise.
STAGED = ["st:16:2:1", "st:16:3:4", "st:32:2:3", "st:32:3:0", "st:64:2:2", "st:64:3:1",
          "fr:16:2:1", "fr:16:3:4", "fr:32:2:3", "fr:32:3:0", "fr:64:2:2", "fr:64:3:1"]


@pytest.mark.cuda
@pytest.mark.parametrize("variant", STAGED)
@pytest.mark.parametrize("n_rows", [1, 9, 33, 70])
@pytest.mark.parametrize("wtype", QUANT)
def test_matmul_staged_variant(variant: str, wtype: str, n_rows: int) -> None:
    k, n_out = 2304, 300
    w, wd = weights_case(wtype, n_out, k, "staged")
    rng = seed("staged", wtype, n_rows, variant)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    res = rng.standard_normal((n_rows, n_out)).astype(np.float32)
    _, bn, _, splits = variant.split(":")
    direct = f"tc:{bn}:2:{splits}"
    cuda = runner("cuda")
    out = {}
    try:
        for v in (variant, direct):
            cuda.set_matmul_variant(v)
            out[v] = (
                cuda.matmul(wtype, w, n_out, k, x.reshape(-1), bias).reshape(n_rows, n_out),
                cuda.matmul_add(wtype, w, n_out, k, x.reshape(-1), res.reshape(-1), bias).reshape(n_rows, n_out),
            )
    finally:
        cuda.set_matmul_variant(None)
    y, ya = out[variant]
    ref = x.astype(np.float64) @ wd.T + bias
    assert rel_err(y, ref) <= Q8, f"{variant} {wtype} rows={n_rows}: {rel_err(y, ref):.3g}"
    y_cpu = runner("cpu").matmul(wtype, w, n_out, k, x.reshape(-1), bias).reshape(n_rows, n_out).astype(np.float64)
    assert rel_err(y, y_cpu) <= CPU_EXACT, f"cuda {variant} vs cpu {wtype} rows={n_rows}: {rel_err(y, y_cpu):.3g}"
    np.testing.assert_array_equal(y, out[direct][0], err_msg=f"{variant} vs {direct} {wtype} rows={n_rows}")
    np.testing.assert_array_equal(ya, out[direct][1], err_msg=f"{variant} vs {direct} (accumulate) {wtype} rows={n_rows}")


@pytest.mark.cuda
def test_matmul_variant_rejects_unknown() -> None:
    with pytest.raises(ValueError):
        runner("cuda").set_matmul_variant("tc:8:1:1")
    with pytest.raises(ValueError):
        runner("cuda").set_matmul_variant("st:16:1:1")
