"""Dequantization tests: fak's Rust dequantizers are bit-identical to the ``gguf`` package's
``gguf.quants.dequantize`` (which mirrors ggml's ``dequantize_row_*``) on random blocks of every
format (finite scales: exact bits; fully random bytes with NaN/inf scales: NaN-aware) and on real
tensors of both real models (the smallest tensor of every type present).

To add a format: append it to ``FORMATS`` in tests/gguf_util.py (and its f16 scale fields to
``F16_FIELDS``); every test here then covers it.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest

import fak
from fak import _native
from fak.gguf import GGUFFile, dequantize
from gguf_util import F16_FIELDS, FORMATS, assert_bit_identical, geometry, gguf_dequantize, random_blocks


def block_counts(dtype: str) -> list[int]:
    """One block, an odd count, and enough blocks to take the parallel (rayon) path."""
    bs, _ = geometry(dtype)
    return [1, 37, math.ceil(70_000 / bs)]


@pytest.mark.parametrize("dtype", FORMATS)
def test_random_finite_blocks_bit_exact(dtype: str) -> None:
    rng = np.random.default_rng(sum(map(ord, dtype)))
    bs, _ = geometry(dtype)
    for n_blocks in block_counts(dtype):
        raw = random_blocks(dtype, n_blocks, rng)
        want = gguf_dequantize(dtype, raw)
        assert np.isfinite(want).all()
        got = dequantize(dtype, raw, n_blocks * bs)
        assert_bit_identical(got, want, f"{dtype} x{n_blocks}")


@pytest.mark.parametrize("dtype", FORMATS)
def test_random_raw_bytes_nan_aware(dtype: str) -> None:
    """Fully random bytes: scales may be NaN, inf or subnormal; NaN positions must match too."""
    rng = np.random.default_rng(1000 + sum(map(ord, dtype)))
    bs, _ = geometry(dtype)
    n_blocks = 4096 if bs == 1 else 512
    raw = random_blocks(dtype, n_blocks, rng, finite=False)
    with np.errstate(all="ignore"):
        want = gguf_dequantize(dtype, raw)
    got = _native.dequantize(dtype, raw.tobytes(), n_blocks * bs)
    assert_bit_identical(got, want, dtype)


@pytest.mark.parametrize("dtype", [d for d in FORMATS if geometry(d)[0] > 1])
def test_special_scales(dtype: str) -> None:
    """Blocks whose scales are +-0, +-inf, NaN, the largest f16 and the smallest subnormal."""
    rng = np.random.default_rng(7)
    bs, ts = geometry(dtype)
    specials = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7BFF, 0x0001, 0x8001], dtype=np.uint16)
    blocks = random_blocks(dtype, len(specials) ** 2, rng).reshape(-1, ts)
    fields = F16_FIELDS[dtype]
    for i in range(len(specials) ** 2):
        for k, sl in enumerate(fields):
            v = specials[(i // len(specials) ** k) % len(specials)]
            blocks[i, sl] = np.frombuffer(struct.pack("<H", int(v)), dtype=np.uint8)
    raw = blocks.reshape(-1)
    with np.errstate(all="ignore"):
        want = gguf_dequantize(dtype, raw)
    assert_bit_identical(dequantize(dtype, raw, raw.size // ts * bs), want, dtype)


def test_hand_computed_blocks() -> None:
    """Values worked out by hand from the layouts in rust/src/quant/*.rs (independent of gguf)."""
    one = struct.pack("<e", 1.0)
    half = struct.pack("<e", 0.5)
    # Q4_0: d = 1, every byte 0x1F -> low nibble 15 - 8 = 7, high nibble 1 - 8 = -7
    out = dequantize("Q4_0", one + bytes([0x1F]) * 16, 32)
    assert out.tolist() == [7.0] * 16 + [-7.0] * 16
    # Q8_0: d = 0.5, quants -16..15
    out = dequantize("Q8_0", half + np.arange(-16, 16, dtype=np.int8).tobytes(), 32)
    assert out.tolist() == [q * 0.5 for q in range(-16, 16)]
    # Q5_1: d = 1, m = 0.5, qh bit j set only for j = 3 and j = 20, nibbles 0x21
    qh = (1 << 3) | (1 << 20)
    out = dequantize("Q5_1", one + half + struct.pack("<I", qh) + bytes([0x21]) * 16, 32)
    want = [1.5] * 16 + [2.5] * 16
    want[3] += 16
    want[20] += 16
    assert out.tolist() == want
    # BF16: 0x3F80 is 1.0, 0xC000 is -2.0
    assert dequantize("BF16", struct.pack("<HH", 0x3F80, 0xC000), 2).tolist() == [1.0, -2.0]
    # Q6_K: d = 1, all scales 2, ql = 0, qh = 0 -> q = -32 everywhere -> -64
    block = bytes(128) + bytes(64) + bytes([2] * 16) + one
    assert dequantize("Q6_K", block, 256).tolist() == [-64.0] * 256


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="unknown ggml type name"):
        dequantize("Q9_9", b"", 0)
    with pytest.raises(ValueError, match="not a whole number of Q4_0 blocks"):
        dequantize("Q4_0", bytes(17), 32)
    with pytest.raises(ValueError, match="hold 32 elements but dst has 64"):
        dequantize("Q4_0", bytes(18), 64)
    with pytest.raises(fak.UnsupportedError, match="IQ2_XXS"):
        dequantize("IQ2_XXS", bytes(66), 256)
    with pytest.raises(ValueError, match="C-contiguous"):
        dequantize("Q8_0", np.zeros(68, dtype=np.uint8)[::2], 32)
    with pytest.raises(ValueError, match="bytes or a numpy uint8 array"):
        dequantize("Q8_0", np.zeros(34, dtype=np.float32), 32)
    assert dequantize("Q8_0", b"", 0).shape == (0,)


def smallest_of_each_type(f: GGUFFile) -> list[str]:
    best: dict[str, tuple[int, str]] = {}
    for t in f.tensors:
        if t.dtype not in best or t.n_bytes < best[t.dtype][0]:
            best[t.dtype] = (t.n_bytes, t.name)
    return [name for _, name in best.values()]


@pytest.mark.parametrize("which", ["model_05b", "model_15b"])
def test_real_tensors_bit_exact(which: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(which)
    with GGUFFile(path) as f:
        names = smallest_of_each_type(f)
        assert len(names) >= 3
        for name in names:
            info = f.tensor(name)
            got = f.dequantize(name)
            assert got.shape == info.shape
            want = gguf_dequantize(info.dtype, f.raw(name)).reshape(info.shape)
            assert_bit_identical(got, want, f"{path.name}:{name} ({info.dtype})")


def test_out_argument() -> None:
    rng = np.random.default_rng(5)
    raw = random_blocks("Q4_K", 3, rng)
    out = np.full(768, np.nan, dtype=np.float32)
    assert dequantize("Q4_K", raw, 768, out) is out
    assert_bit_identical(out, gguf_dequantize("Q4_K", raw), "Q4_K out=")
    out2d = np.empty((3, 256), dtype=np.float32)
    dequantize("Q4_K", raw, 768, out2d)
    assert_bit_identical(out2d.reshape(-1), out, "Q4_K out 2-D")
    with pytest.raises(ValueError, match="out has 512 elements"):
        dequantize("Q4_K", raw, 768, np.empty(512, dtype=np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        dequantize("Q4_K", raw, 768, np.empty(1536, dtype=np.float32)[::2])
    with pytest.raises(TypeError):
        dequantize("Q4_K", raw, 768, np.empty(768, dtype=np.float64))
    readonly = np.empty(768, dtype=np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        dequantize("Q4_K", raw, 768, readonly)
