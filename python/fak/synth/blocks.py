"""Random but valid ggml blocks: weights of a chosen standard deviation in any of fak's formats.

A synthetic model is only useful if a forward pass over it behaves like one over a real model:
finite activations of realistic size. Filling blocks with random bytes is not enough, because the
f16 scale fields would then hold NaN, Inf and values up to 65504. Here every bit of a block that is
a quant or a sub-block scale is random, and every f16 super-block scale (``d``) and min (``dmin``,
``m``) is set to a finite value of realistic magnitude, chosen so that the dequantized weights have
the requested standard deviation (``0.02`` by default, the usual init of transformer weights) and a
mean near zero.

Block layouts (ggml ``ggml-common.h``; the GGUF spec's type table): the byte offset of each f16
field below is where ggml's ``block_*`` struct keeps it. The scale that gives the requested spread is
calibrated once per format by dequantizing a sample with ``gguf.quants.dequantize`` (the reference
the Rust dequantizers are tested against), so it is right by construction for every format.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

__all__ = [
    "FORMATS",
    "BlockFormat",
    "format_of",
    "n_bytes",
    "new_rng",
    "random_blocks",
    "random_bytes",
    "random_floats",
]


@dataclass(frozen=True)
class BlockFormat:
    """Geometry of one ggml storage type.

    Attributes:
        name: ggml type name (``"Q4_K"``).
        block_size: elements per block (1 for float types).
        type_size: bytes per block.
        scale_offsets: byte offsets of the f16 super-block scales ``d`` in a block.
        min_offsets: byte offsets of the f16 mins (``dmin`` of k-quants, ``m`` of Q4_1/Q5_1).
        min_ratio: each min is ``min_ratio * d``; chosen so the mean of the weights is about 0
            (e.g. Q4_K: ``w = d*sc*q - dmin*m`` with ``q`` in 0..15, ``sc``, ``m`` in 0..63, so
            ``dmin = 7.5 d`` centres it; Q4_1: ``w = d*q + m``, ``m = -7.5 d``).
    """

    name: str
    block_size: int
    type_size: int
    scale_offsets: tuple[int, ...] = ()
    min_offsets: tuple[int, ...] = ()
    min_ratio: float = 0.0

    @property
    def is_float(self) -> bool:
        return self.name in ("F32", "F16", "BF16")

    @property
    def qtype(self) -> GGMLQuantizationType:
        return GGMLQuantizationType[self.name]


def _fmt(name: str, scales: tuple[int, ...] = (), mins: tuple[int, ...] = (), ratio: float = 0.0) -> BlockFormat:
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    return BlockFormat(name, block_size, type_size, scales, mins, ratio)


# Offsets from ggml-common.h (block_q4_0 {d; qs[16]}, block_q4_K {d; dmin; scales[12]; qs[128]},
# block_q6_K {ql[128]; qh[64]; scales[16]; d}, ...).
FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    _fmt("F32"), _fmt("F16"), _fmt("BF16"),
    _fmt("Q4_0", scales=(0,)),
    _fmt("Q4_1", scales=(0,), mins=(2,), ratio=-7.5),
    _fmt("Q5_0", scales=(0,)),
    _fmt("Q5_1", scales=(0,), mins=(2,), ratio=-15.5),
    _fmt("Q8_0", scales=(0,)),
    _fmt("Q2_K", scales=(80,), mins=(82,), ratio=1.5),
    _fmt("Q3_K", scales=(108,)),
    _fmt("Q4_K", scales=(0,), mins=(2,), ratio=7.5),
    _fmt("Q5_K", scales=(0,), mins=(2,), ratio=15.5),
    _fmt("Q6_K", scales=(208,)),
)}


def format_of(name: str) -> BlockFormat:
    """The ``BlockFormat`` of a ggml type name. Raises ``ValueError`` for a type fak does not write."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"fak.synth cannot write tensor type {name!r}; "
                         f"supported: {', '.join(FORMATS)}") from None


def n_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of ``shape`` (any axis order) in ``dtype``.

    Raises ``ValueError`` when the contiguous axis (``shape[-1]`` in numpy order) is not a multiple
    of the block size: ggml stores whole blocks per row.
    """
    fmt = format_of(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if shape and shape[-1] % fmt.block_size:
        raise ValueError(f"row length {shape[-1]} is not a multiple of {dtype}'s block size {fmt.block_size}")
    return n // fmt.block_size * fmt.type_size


def _write_f16(blocks: np.ndarray, offset: int, values: np.ndarray) -> None:
    blocks[:, offset:offset + 2] = values.astype("<f2").view(np.uint8).reshape(-1, 2)


def new_rng(*seed: int) -> np.random.Generator:
    """A generator for block data: SFC64 (about 1 GB/s of raw bits, 20x ``Generator.bytes``)."""
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence(list(seed))))


def random_bytes(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniformly random bytes as a writable ``uint8`` array (from the raw 64-bit stream)."""
    words = rng.bit_generator.random_raw((n + 7) // 8)
    return words.view(np.uint8)[:n]


def _scaled_blocks(fmt: BlockFormat, n_blocks: int, rng: np.random.Generator, gain: float = 1.0) -> np.ndarray:
    """Blocks with random quants and sub-block scales, ``d`` ~ gain * U(0.75, 1.25), mins ``min_ratio * d``."""
    blocks = random_bytes(n_blocks * fmt.type_size, rng).reshape(n_blocks, fmt.type_size)
    d = rng.uniform(0.75 * gain, 1.25 * gain, size=(n_blocks, len(fmt.scale_offsets)))
    for j, off in enumerate(fmt.scale_offsets):
        _write_f16(blocks, off, d[:, j])
    for j, off in enumerate(fmt.min_offsets):
        _write_f16(blocks, off, d[:, 0] * fmt.min_ratio * rng.uniform(0.9, 1.1, size=n_blocks))
    return blocks


@cache
def _calibration(name: str) -> float:
    """Standard deviation of the dequantized weights of ``_scaled_blocks`` at gain 1 (d ≈ 1)."""
    fmt = format_of(name)
    blocks = _scaled_blocks(fmt, 4096 * 32 // fmt.block_size, new_rng(12345))
    w = gguf_quants.dequantize(blocks, fmt.qtype)
    return float(np.std(w.astype(np.float64)))


def random_floats(n: int, rng: np.random.Generator, *, std: float, mean: float = 0.0) -> np.ndarray:
    """``n`` float32 values ~ N(mean, std²)."""
    return (rng.standard_normal(n, dtype=np.float32) * np.float32(std) + np.float32(mean)).astype(np.float32)


def random_blocks(dtype: str, n_elements: int, rng: np.random.Generator, *, std: float = 0.02,
                  mean: float = 0.0) -> np.ndarray:
    """Encoded data of ``n_elements`` random weights in ggml type ``dtype``, as flat ``uint8``.

    Float types (F32, F16, BF16) hold N(mean, std²) values. Quantized types hold valid blocks whose
    dequantized values have about mean 0 and standard deviation ``std`` (``mean`` is ignored: use
    a float type for norms); all scales are finite, positive f16 numbers.

    Raises ``ValueError`` for an unsupported type or an ``n_elements`` that is not whole blocks.
    """
    fmt = format_of(dtype)
    if n_elements % fmt.block_size:
        raise ValueError(f"{n_elements} elements is not a whole number of {dtype} blocks of {fmt.block_size}")
    if fmt.name == "F32":
        return random_floats(n_elements, rng, std=std, mean=mean).view(np.uint8)
    if fmt.name == "F16":
        return random_floats(n_elements, rng, std=std, mean=mean).astype("<f2").view(np.uint8)
    if fmt.name == "BF16":
        bits = random_floats(n_elements, rng, std=std, mean=mean).view(np.uint32)
        # round to nearest even into the top 16 bits (as ggml's fp32_to_bf16 does for finite values)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        return rounded.astype("<u2").view(np.uint8)
    # every value of a block is linear in (d, dmin) jointly, so one gain sets the spread
    blocks = _scaled_blocks(fmt, n_elements // fmt.block_size, rng, gain=std / _calibration(fmt.name))
    return blocks.reshape(-1)
