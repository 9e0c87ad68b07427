"""The CPU quantized matmul (`fak._native.matmul`) against an independent float64 reference.

The reference dequantizes the weights with the ``gguf`` package (``gguf.quants.dequantize``) and
quantizes the activations with a numpy port of ggml's quantizers (written here, below), then takes
the float64 product. What remains between fak's result and the reference is float rounding in the
f32 accumulation, bounded per output by ``TOL[type] · Σ_i |W[o,i]·x[r,i]|``.

The activation quantizers ported here are the ones llama.cpp's x86 CPU backend runs:
``quantize_row_q8_0`` / ``quantize_row_q8_1`` of ggml-cpu ``arch/x86/quants.c`` (AVX2 path:
``d = amax/127``, ``q = round_half_even(x·127/amax)``, ``s = f16(d·Σq)``) and
``quantize_row_q8_K_ref`` of ggml ``ggml-quants.c`` (``iscale = -127/max`` with ``max`` the
element of largest magnitude, ``q = min(127, nearest_int(iscale·x))``, ``d = 1/iscale``).

To add a case: add a format to ``TOL`` (and ``F16_FIELDS`` for a block format) or a shape to
``SHAPES``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize

from fak import _native
from fak.gguf import GGUFFile

# Per-format bound on |y − y_ref| / Σ|W·x|: float rounding of the f32 accumulation only. Measured
# worst cases on random blocks (k = 1536 and 8960, every SIMD level) are 1e-8..4e-8; a single
# activation quantized one step off would cost ~1e-4.
TOL: dict[str, float] = {
    "Q4_0": 4e-7, "Q4_1": 4e-7, "Q5_0": 4e-7, "Q5_1": 4e-7, "Q8_0": 4e-7,
    "Q2_K": 4e-7, "Q3_K": 4e-7, "Q4_K": 4e-7, "Q5_K": 4e-7, "Q6_K": 4e-7,
    "F16": 4e-7, "BF16": 4e-7, "F32": 4e-7,
}
# Byte offsets of the f16 scale fields inside one block (random bytes elsewhere are valid quants).
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
# (n_out, k): the 1.5B's projections (k=1536: q/o 1536, k/v 256, gate/up 8960; down k=8960) and the
# 0.5B's (hidden 896, ffn 4864). Formats whose block does not divide k are skipped.
SHAPES = [(1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (896, 896), (128, 896), (896, 4864)]


# ---------------------------------------------------------------- numpy ports of ggml quantizers


def quantize_q8_0(x: np.ndarray, with_sum: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [n] (n % 32 == 0) → (d float32 [n/32] (f16-rounded), q int8 [n], s float32 [n/32]).

    ggml-cpu x86 ``quantize_row_q8_0`` / ``quantize_row_q8_1`` (``s = f16(d·Σq)`` for Q8_1).
    """
    xb = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        iden = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * iden[:, None]).astype(np.int32)  # np.rint: round half to even
    q = np.clip(q, -128, 127).astype(np.int8)
    s = (d * q.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float16).astype(np.float32)
    return d.astype(np.float16).astype(np.float32), q.reshape(-1), s


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [n] (n % 256 == 0) → (d float32 [n/256], q int8 [n], bsums int16 [n/16]).

    ggml ``quantize_row_q8_K_ref``.
    """
    xb = x.astype(np.float32).reshape(-1, 256)
    idx = np.argmax(np.abs(xb), axis=1)  # first element of largest magnitude, like ggml's `>` scan
    mx = xb[np.arange(len(xb)), idx]
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale[:, None]), 127).astype(np.int8)
    with np.errstate(divide="ignore"):
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    bsums = q.reshape(-1, 16).astype(np.int16).sum(axis=1).astype(np.int16)
    return d, q.reshape(-1), bsums


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bf16 values (as float32), ggml ``ggml_compute_fp32_to_bf16`` (round half even)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.astype(np.uint32).view(np.float32)


VEC_DOT_TYPE = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q5_1": "Q8_1"}


def quantized_x(type_name: str, x: np.ndarray) -> np.ndarray:
    """The activations as llama.cpp feeds them to the weight type's dot product, float64 [n_rows, k]."""
    rows = []
    for xr in x:
        vt = VEC_DOT_TYPE.get(type_name, "Q8_K" if type_name.endswith("_K") else type_name)
        if vt in ("Q8_0", "Q8_1"):
            d, q, _ = quantize_q8_0(xr)
            rows.append(np.repeat(d.astype(np.float64), 32) * q)
        elif vt == "Q8_K":
            d, q, _ = quantize_q8_k(xr)
            rows.append(np.repeat(d.astype(np.float64), 256) * q)
        elif vt == "F16":
            rows.append(xr.astype(np.float16).astype(np.float64))
        elif vt == "BF16":
            rows.append(to_bf16(xr).astype(np.float64))
        else:
            rows.append(xr.astype(np.float64))
    return np.stack(rows)


def dequantized_w(type_name: str, w: np.ndarray, n_out: int, k: int) -> np.ndarray:
    """The weights as float64 [n_out, k], via ``gguf.quants.dequantize`` (independent of fak)."""
    if type_name == "F32":
        return w.view(np.float32).reshape(n_out, k).astype(np.float64)
    if type_name == "F16":
        return w.view(np.float16).reshape(n_out, k).astype(np.float64)
    if type_name == "BF16":
        return (w.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(n_out, k).astype(np.float64)
    return dequantize(w.reshape(n_out, -1), QT[type_name]).reshape(n_out, k).astype(np.float64)


# ---------------------------------------------------------------- helpers


def block_geometry(type_name: str) -> tuple[int, int]:
    return GGML_QUANT_SIZES[QT[type_name]]


def random_weights(type_name: str, n_out: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``n_out`` rows of ``k`` random valid elements as GGUF block bytes (finite f16 scales)."""
    bs, ts = block_geometry(type_name)
    if type_name == "F32":
        return rng.uniform(-1, 1, n_out * k).astype(np.float32).view(np.uint8)
    if type_name == "F16":
        return rng.uniform(-1, 1, n_out * k).astype(np.float16).view(np.uint8)
    if type_name == "BF16":
        return (to_bf16(rng.uniform(-1, 1, n_out * k).astype(np.float32)).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(n_out * k // bs, ts), dtype=np.uint8)
    for off in F16_FIELDS[type_name]:
        scale = rng.uniform(-0.02, 0.02, len(blocks)).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def q8_1_sum_correction(type_name: str, w: np.ndarray, n_out: int, k: int, x: np.ndarray) -> np.ndarray:
    """[n_rows, n_out] term that Q4_1/Q5_1 add because llama.cpp applies the weight min ``m`` to
    the f16-rounded block sum ``s = f16(d·Σq)`` of Q8_1 rather than to ``d·Σq`` itself."""
    if VEC_DOT_TYPE.get(type_name) != "Q8_1":
        return np.zeros((x.shape[0], n_out))
    _, ts = block_geometry(type_name)
    m = w.reshape(n_out, k // 32, ts)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    rows = []
    for xr in x:
        d32, q, s = quantize_q8_0(xr)
        exact = d32.astype(np.float64) * q.reshape(-1, 32).astype(np.int64).sum(axis=1)
        rows.append(m @ (s.astype(np.float64) - exact))
    return np.stack(rows)


def check(type_name: str, w: np.ndarray, n_out: int, k: int, x: np.ndarray, threads: int = 2, level: str | None = None) -> float:
    """Runs fak's matmul and asserts the per-output bound; returns the worst normalized error."""
    y = _native.matmul(type_name, w, n_out, k, x, threads=threads, level=level)
    assert y.shape == (x.shape[0], n_out) and y.dtype == np.float32
    wd = dequantized_w(type_name, w, n_out, k)
    xq = quantized_x(type_name, x)
    ref = xq @ wd.T + q8_1_sum_correction(type_name, w, n_out, k, x)
    mag = np.abs(xq) @ np.abs(wd).T
    assert np.isfinite(y).all()
    err = np.abs(y.astype(np.float64) - ref) / np.maximum(mag, 1e-30)
    worst = float(err.max())
    assert worst <= TOL[type_name], f"{type_name} [{n_out}x{k}] level={level}: normalized error {worst:.3g} > {TOL[type_name]:.1g}"
    return worst


# ---------------------------------------------------------------- tests


def test_simd_level_reported() -> None:
    levels = _native.simd_levels()
    assert levels[0] == "scalar"
    assert _native.simd_level() in levels


@pytest.mark.parametrize("type_name", ["Q8_0", "Q8_1", "Q8_K"])
def test_activation_quantizer_is_bit_exact(type_name: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4096) * rng.uniform(0.01, 10, 4096)).astype(np.float32)
    x[:32] = 0.0  # an all-zero block
    x[300] = 50.0  # a block whose largest element is positive (Q8_K maps it to -127)
    x[600] = -50.0
    got = _native.quantize_q8(type_name, x)
    if type_name == "Q8_K":
        d, q, bsums = quantize_q8_k(x)
        n = len(d)
        blk = np.zeros(n, dtype=[("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
        blk["d"], blk["qs"], blk["bsums"] = d, q.reshape(n, 256), bsums.reshape(n, 16)
    else:
        d, q, s = quantize_q8_0(x)
        n = len(d)
        fields = [("d", "<f2")] + ([("s", "<f2")] if type_name == "Q8_1" else []) + [("qs", "i1", 32)]
        blk = np.zeros(n, dtype=fields)
        blk["d"], blk["qs"] = d, q.reshape(n, 32)
        if type_name == "Q8_1":
            blk["s"] = s
    assert got == blk.tobytes()


@pytest.mark.parametrize("type_name", list(TOL))
@pytest.mark.parametrize("n_out,k", SHAPES)
def test_random_blocks_at_real_shapes(type_name: str, n_out: int, k: int) -> None:
    bs, _ = block_geometry(type_name)
    if k % bs:
        pytest.skip(f"k={k} is not a multiple of {type_name}'s block of {bs}")
    rng = np.random.default_rng(n_out * 7 + k)
    w = random_weights(type_name, n_out, k, rng)
    x = rng.standard_normal((3, k)).astype(np.float32)
    check(type_name, w, n_out, k, x)


@pytest.mark.parametrize("type_name", list(TOL))
@pytest.mark.parametrize("n_rows", [1, 2, 3, 7, 64])
def test_every_level_and_row_count(type_name: str, n_rows: int) -> None:
    bs, _ = block_geometry(type_name)
    n_out, k = 67, 512  # n_out not a multiple of any tile
    rng = np.random.default_rng(n_rows)
    w = random_weights(type_name, n_out, k, rng)
    x = rng.standard_normal((n_rows, k)).astype(np.float32)
    for level in _native.simd_levels():
        check(type_name, w, n_out, k, x, threads=2, level=level)


def test_errors_are_typed() -> None:
    w = np.zeros(144 * 4, dtype=np.uint8)
    x = np.zeros((2, 256), dtype=np.float32)
    with pytest.raises(ValueError, match="k"):
        _native.matmul("Q4_K", w, 4, 200, np.zeros((2, 200), dtype=np.float32))
    with pytest.raises(ValueError, match="w"):
        _native.matmul("Q4_K", w[:100], 4, 256, x)
    with pytest.raises(ValueError, match="x"):
        _native.matmul("Q4_K", w, 4, 512, x)
    with pytest.raises(ValueError):
        _native.matmul("Q9_Z", w, 4, 256, x)
    with pytest.raises(_native.UnsupportedError):
        _native.matmul("IQ2_XXS", np.zeros(66, dtype=np.uint8), 1, 256, x)
    with pytest.raises(ValueError):
        _native.matmul("Q4_K", w, 4, 256, x, threads=0)


def real_tensors(path: Path, max_rows: int = 1024) -> list[tuple[str, str, np.ndarray, int, int]]:
    """(name, type, bytes, n_out, k) for the first tensor of each (type, k) among the weight
    matrices of ``path`` (read with ``fak.gguf``), limited to ``max_rows`` rows (rows are
    independent)."""
    seen: set[tuple[str, int]] = set()
    out = []
    with GGUFFile(path) as f:
        for t in f.tensors:
            if len(t.shape) != 2 or t.dtype not in TOL:
                continue
            n_out, k = t.shape
            if (t.dtype, k) in seen:
                continue
            seen.add((t.dtype, k))
            rows = min(n_out, max_rows)
            data = np.array(f.raw(t.name).reshape(-1)[: rows * (t.n_bytes // n_out)], dtype=np.uint8)
            out.append((t.name, t.dtype, data, rows, k))
    return out


@pytest.mark.parametrize("model", ["model_05b", "model_15b"])
def test_real_tensors(model: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(model)
    tensors = real_tensors(path)
    assert len(tensors) >= 2
    rng = np.random.default_rng(5)
    for name, type_name, data, n_out, k in tensors:
        x = rng.standard_normal((4, k)).astype(np.float32)
        check(type_name, data, n_out, k, x)


def _q4k_scales_mins(sc: np.ndarray) -> tuple[list[int], list[int]]:
    """ggml ``get_scale_min_k4`` over a block's 12 scale bytes: the 8 sub-blocks' 6-bit scales and mins."""
    s, m = [0] * 8, [0] * 8
    for j in range(8):
        if j < 4:
            s[j], m[j] = int(sc[j]) & 63, int(sc[j + 4]) & 63
        else:
            s[j] = (int(sc[j + 4]) & 0xF) | ((int(sc[j - 4]) >> 6) << 4)
            m[j] = (int(sc[j + 4]) >> 4) | ((int(sc[j]) >> 6) << 4)
    return s, m


def _vec_dot_q4_k_x86(w_row: np.ndarray, x: np.ndarray) -> np.float32:
    """llama.cpp's ``ggml_vec_dot_q4_K_q8_K`` (ggml-cpu ``arch/x86/quants.c``, AVX2 path) in its
    f32 order: per super-block 8 integer lanes (lane t: bytes 4t..4t+3 of each 32-byte chunk,
    weighted by the sub-block scales) into ``acc = fma(d_x·d, float(lane), acc)``, 4 mins lanes into
    ``acc_m = fma(−d_x·dmin, float(lane), acc_m)``; then ``hsum8(acc) + hsum4(acc_m)``."""
    f32 = np.float32
    d_x, q, bsums = quantize_q8_k(x)
    acc, acc_m = np.zeros(8, f32), np.zeros(4, f32)
    for i, blk in enumerate(w_row.reshape(-1, 144)):
        d, dmin = (f32(v) for v in blk[:4].view(np.float16))
        s, m = _q4k_scales_mins(blk[4:16])
        qs, q8 = blk[16:].astype(np.int64), q[256 * i:256 * (i + 1)].astype(np.int64)
        lanes = np.zeros(8, np.int64)
        for j in range(4):
            lo, hi = qs[32 * j:32 * j + 32] & 0xF, qs[32 * j:32 * j + 32] >> 4
            lanes += s[2 * j] * (lo * q8[64 * j:64 * j + 32]).reshape(8, 4).sum(1)
            lanes += s[2 * j + 1] * (hi * q8[64 * j + 32:64 * j + 64]).reshape(8, 4).sum(1)
        bs = bsums[16 * i:16 * (i + 1)].astype(np.int64)
        pair = bs[0::2] + bs[1::2]
        prod = np.array([m[2 * t] * pair[2 * t] + m[2 * t + 1] * pair[2 * t + 1] for t in range(4)])
        # fma(a, b, c) in f32: the f64 product of two f32 is exact, one rounding after the add
        # (values here are far from the f64 double-rounding cases).
        acc = (np.float64(f32(d_x[i] * d)) * lanes.astype(f32).astype(np.float64) + acc).astype(f32)
        acc_m = (np.float64(f32(-d_x[i] * dmin)) * prod.astype(f32).astype(np.float64) + acc_m).astype(f32)
    h = (acc[:4] + acc[4:]).astype(f32)
    h = f32((h[:2] + h[2:])[0] + (h[:2] + h[2:])[1])
    mm = (acc_m[:2] + acc_m[2:]).astype(f32)
    return f32(h + f32(mm[0] + mm[1]))


@pytest.mark.parametrize("n_out", [4, 12])
def test_unrepacked_q4_k_follows_llama_vec_dot(n_out: int) -> None:
    """llama.cpp's x86 build repacks a Q4_K matrix only when its rows are a multiple of 8; any other
    (a Gated DeltaNet's ``ssm_alpha``/``ssm_beta`` with 4 value heads) runs ``ggml_vec_dot_q4_K_q8_K``
    for a single row: fak's result is bit-identical to that arithmetic on the SIMD levels (the
    repacked order differs from it in the last bits, which the tiny qwen35 goldens showed)."""
    levels = [lv for lv in _native.simd_levels() if lv != "scalar"]
    if not levels:
        pytest.fail("no SIMD level on this CPU: the x86 kernels are what this test checks")
    rng = np.random.default_rng(7)
    k = 512
    w = random_weights("Q4_K", n_out, k, rng)
    x = rng.standard_normal((3, k)).astype(np.float32)
    want = np.array([[_vec_dot_q4_k_x86(row, xr) for row in w.reshape(n_out, -1)] for xr in x], dtype=np.float32)
    for level in levels:
        got = _native.matmul("Q4_K", w, n_out, k, x, level=level)
        assert np.array_equal(got, want), (level, float(np.abs(got - want).max()))


@pytest.mark.parametrize("forced", ["scalar", "avx2", "avx512", "bogus"])
def test_env_var_lowers_the_simd_level(forced: str) -> None:
    import os
    import subprocess
    import sys

    levels = _native.simd_levels()
    env = dict(os.environ, FAK_CPU_SIMD=forced)
    out = subprocess.run([sys.executable, "-c", "from fak import _native; print(_native.simd_level())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    # A level this CPU has is taken as asked; an unknown name or one above the CPU keeps the best.
    assert out == (forced if forced in levels else levels[-1])


_TILED_CHILD = """
import hashlib, sys
import numpy as np
from fak import _native
m = _native.EngineCore(sys.argv[1], backend="cpu", n_ctx=1024, threads=2, prefix_cache=False)
tokens = [int(t) for t in np.random.default_rng(16).integers(1000, 30000, size=301)]
print(hashlib.sha256(np.ascontiguousarray(m.logits(tokens), dtype=np.float32).tobytes()).hexdigest())
"""


@pytest.mark.parametrize("model", ["model_05b", "model_15b"])
def test_tiled_prefill_bit_identical_on_real_model(model: str, request: pytest.FixtureRequest) -> None:
    """A 301-token prefill of the real model (300 rows in llama.cpp's 4-row Q4_K GEMM order and
    the Q6_K tiled-kernel order, one in the GEMV order) gives logits at every position bit-identical
    with the register-tiled Q4_K/Q6_K kernels (AVX-512) and with the one-row kernels they replace
    (``FAK_CPU_TILED=0``), whose order the parity tests check against llama.cpp."""
    import os
    import subprocess
    import sys

    if _native.simd_level() != "avx512":
        pytest.skip("the tiled kernels run on the AVX-512 level only")
    path = request.getfixturevalue(model)
    digests = {}
    for tiled in ("0", "1"):
        env = dict(os.environ, FAK_CPU_TILED=tiled)
        digests[tiled] = subprocess.run([sys.executable, "-c", _TILED_CHILD, str(path)], env=env,
                                        capture_output=True, text=True, check=True).stdout.strip()
    assert len(digests["1"]) == 64 and digests["0"] == digests["1"], digests
