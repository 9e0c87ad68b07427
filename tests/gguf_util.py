"""Helpers for the GGUF and quantization tests: random valid blocks of every format, a synthetic
GGUF written with the ``gguf`` package's ``GGUFWriter``, and a raw byte-level builder for
malformed files (which ``GGUFWriter`` refuses to write).

Block layouts (scale-field positions) are those of ggml's ``ggml-common.h``; see
``rust/src/quant/<format>.rs``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

#: Formats fak dequantizes, in ggml id order.
FORMATS = ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16"]

#: Byte ranges of the f16 scale fields (d, m / dmin) in one block of each quantized format.
F16_FIELDS: dict[str, list[slice]] = {
    "Q4_0": [slice(0, 2)],
    "Q4_1": [slice(0, 2), slice(2, 4)],
    "Q5_0": [slice(0, 2)],
    "Q5_1": [slice(0, 2), slice(2, 4)],
    "Q8_0": [slice(0, 2)],
    "Q2_K": [slice(80, 82), slice(82, 84)],
    "Q3_K": [slice(108, 110)],
    "Q4_K": [slice(0, 2), slice(2, 4)],
    "Q5_K": [slice(0, 2), slice(2, 4)],
    "Q6_K": [slice(208, 210)],
}


def geometry(dtype: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of ggml type ``dtype``, from the ``gguf`` package."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[dtype]]


def finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random finite f16 bit patterns (any sign, zeros and subnormals included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exp = (bits >> 10) & 0x1F
    return np.where(exp == 0x1F, bits & np.uint16(0xBFFF), bits).astype(np.uint16)


def random_blocks(dtype: str, n_blocks: int, rng: np.random.Generator, finite: bool = True) -> np.ndarray:
    """``n_blocks`` random blocks of ``dtype`` as a 1-D uint8 array. With ``finite`` every scale
    (and every F16/BF16/F32 element) is a finite float, so outputs compare exactly; without it the
    bytes are fully random (NaN / inf scales included)."""
    bs, ts = geometry(dtype)
    raw = rng.integers(0, 256, size=n_blocks * ts, dtype=np.uint8)
    if not finite:
        return raw
    if dtype == "F32":
        vals = rng.standard_normal(n_blocks).astype(np.float32) * np.float32(10.0) ** rng.integers(-20, 20, n_blocks)
        return vals.astype(np.float32).view(np.uint8)
    if dtype == "F16":
        return finite_f16_bits(rng, n_blocks).view(np.uint8)
    if dtype == "BF16":
        bits = raw.view(np.uint16)
        exp = (bits >> 7) & 0xFF
        return np.where(exp == 0xFF, bits & np.uint16(0xBFFF), bits).astype(np.uint16).view(np.uint8)
    blocks = raw.reshape(n_blocks, ts)
    for sl in F16_FIELDS[dtype]:
        blocks[:, sl] = finite_f16_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def gguf_dequantize(dtype: str, raw: np.ndarray) -> np.ndarray:
    """The ``gguf`` package's dequantization of ``raw`` (whole blocks), flattened to float32."""
    qtype = gguf.GGMLQuantizationType[dtype]
    bs, ts = geometry(dtype)
    n_blocks = raw.size // ts
    out = gguf.quants.dequantize(raw.reshape(n_blocks, ts), qtype)
    return np.asarray(out, dtype=np.float32).reshape(-1)


def assert_bit_identical(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Bit-exact comparison, NaN-aware: NaN positions must match; every other element must have
    identical bits (so -0.0 != 0.0)."""
    assert got.dtype == np.float32 and want.dtype == np.float32, what
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), f"{what}: NaN positions differ at {np.flatnonzero(gn != wn)[:10]}"
    diff = np.flatnonzero(got.view(np.uint32)[~wn] != want.view(np.uint32)[~wn])
    assert diff.size == 0, (
        f"{what}: {diff.size} elements differ, first at {diff[:5]}: "
        f"{got[~wn][diff[:5]]} vs {want[~wn][diff[:5]]}"
    )


def write_synthetic(path: Path, seed: int = 0, tensors: bool = True) -> dict:
    """Writes a small GGUF v3 with every metadata value type (nested arrays too) and one tensor of
    each format in ``FORMATS`` (random valid blocks, finite scales) with ``GGUFWriter``.

    Returns ``{"metadata": {key: python value}, "tensors": {name: (dtype, ggml dims, raw bytes)}}``
    as written, for the tests to compare against."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    V = gguf.GGUFValueType
    meta: dict = {"general.architecture": "llama"}
    scalars = [
        ("t.u8", 200, V.UINT8), ("t.i8", -7, V.INT8), ("t.u16", 60000, V.UINT16), ("t.i16", -300, V.INT16),
        ("t.u32", 4_000_000_000, V.UINT32), ("t.i32", -2_000_000_000, V.INT32), ("t.f32", 0.1, V.FLOAT32),
        ("t.u64", 2**64 - 1, V.UINT64), ("t.i64", -(2**63), V.INT64), ("t.f64", 0.1, V.FLOAT64),
        ("t.bool", True, V.BOOL), ("t.str", "héllo wörld ✓", V.STRING), ("t.empty_str", "", V.STRING),
    ]
    for key, val, vt in scalars:
        w.add_key_value(key, val, vt)
        meta[key] = float(np.float32(val)) if vt == V.FLOAT32 else val
    arrays = [
        ("t.arr_u8", [1, 2, 255], V.UINT8), ("t.arr_i8", [-1, 0, 1], V.INT8),
        ("t.arr_u16", [1, 65535], V.UINT16), ("t.arr_i16", [-32768, 32767], V.INT16),
        ("t.arr_u32", [0, 2**32 - 1], V.UINT32), ("t.arr_i32", [-(2**31), 5], V.INT32),
        ("t.arr_f32", [0.5, -1.25, 3.0e38], V.FLOAT32), ("t.arr_u64", [2**64 - 1], V.UINT64),
        ("t.arr_i64", [-(2**63), 1], V.INT64), ("t.arr_f64", [0.1, -2.5], V.FLOAT64),
        ("t.arr_bool", [True, False, True], V.BOOL), ("t.arr_str", ["a", "", "ünï", "x" * 300], V.STRING),
    ]
    for key, val, vt in arrays:
        w.add_key_value(key, val, V.ARRAY, sub_type=vt)
        meta[key] = [float(np.float32(v)) for v in val] if vt == V.FLOAT32 else val
    nested = [[1, 2, 3], [4], [5, 6]]  # ARRAY[ARRAY[INT32]]
    w.add_key_value("t.nested", nested, V.ARRAY)
    meta["t.nested"] = nested
    written: dict = {}
    if tensors:
        for i, dtype in enumerate(FORMATS):
            bs, ts = geometry(dtype)
            n_rows = 3
            row_blocks = 2 if bs > 1 else 40
            raw = random_blocks(dtype, n_rows * row_blocks, rng).reshape(n_rows, row_blocks * ts)
            name = f"t{i}.{dtype.lower()}"
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[dtype])
            written[name] = (dtype, (row_blocks * bs, n_rows), raw.reshape(-1).copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"metadata": meta, "tensors": written}


# ---------------------------------------------------------------------------------------------
# Raw builder for malformed files.

VT = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "arr": 9,
      "u64": 10, "i64": 11, "f64": 12}


def gstr(s: str | bytes) -> bytes:
    """A GGUF string: u64 length + bytes."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


@dataclass
class RawGGUF:
    """A GGUF file assembled field by field; ``build()`` records where each field starts in
    ``at`` (``"kv:KEY"``, ``"kv:KEY:value"``, ``"ti:NAME"``, ``"ti:NAME:n_dims"``,
    ``"ti:NAME:dims"``, ``"ti:NAME:type"``, ``"ti:NAME:offset"``, ``"data"``)."""

    version: int = 3
    kv: list[tuple[str, bytes]] = field(default_factory=list)  # (key, type id + value bytes)
    tensors: list[tuple[str, list[int], int, int]] = field(default_factory=list)  # name, dims, type, rel offset
    alignment: int = 32
    data: bytes = b""
    at: dict[str, int] = field(default_factory=dict)

    def add_kv(self, key: str, vtype: str, payload: bytes) -> RawGGUF:
        self.kv.append((key, struct.pack("<I", VT[vtype]) + payload))
        return self

    def add_f32_tensor(self, name: str, dims: list[int]) -> RawGGUF:
        """An F32 tensor with values 0, 1, 2, ... appended (aligned) to the data section."""
        pad = (-len(self.data)) % self.alignment
        self.data += b"\0" * pad
        off = len(self.data)
        n = int(np.prod(dims)) if dims else 1
        self.data += np.arange(n, dtype=np.float32).tobytes()
        self.tensors.append((name, dims, 0, off))
        return self

    def build(self) -> bytes:
        b = bytearray(b"GGUF" + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kv)))
        for key, payload in self.kv:
            self.at[f"kv:{key}"] = len(b)
            b += gstr(key)
            self.at[f"kv:{key}:value"] = len(b) + 4
            b += payload
        for name, dims, ty, off in self.tensors:
            self.at[f"ti:{name}"] = len(b)
            b += gstr(name)
            self.at[f"ti:{name}:n_dims"] = len(b)
            b += struct.pack("<I", len(dims))
            self.at[f"ti:{name}:dims"] = len(b)
            b += b"".join(struct.pack("<Q", d) for d in dims)
            self.at[f"ti:{name}:type"] = len(b)
            b += struct.pack("<I", ty)
            self.at[f"ti:{name}:offset"] = len(b)
            b += struct.pack("<Q", off)
        b += b"\0" * ((-len(b)) % self.alignment)
        self.at["data"] = len(b)
        b += self.data
        return bytes(b)
