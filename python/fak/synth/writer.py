"""Write a GGUF file from a plan (metadata + tensor layout), streaming random valid tensor data.

The header (magic, version 3, metadata, tensor infos) is written by the ``gguf`` package's
``GGUFWriter``; the data section is then written tensor by tensor in chunks of at most
``CHUNK_BYTES``, so writing a multi-GB twin needs a few tens of MB of memory. Layout per the GGUF
spec: each tensor's data starts at a multiple of ``general.alignment`` (default 32) from the start
of the data section, which itself starts at the first aligned offset after the tensor infos.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from fak.synth.blocks import format_of, n_bytes, new_rng, random_blocks
from fak.synth.layout import TensorSpec

__all__ = ["CHUNK_BYTES", "CONV_STD", "ROUTER_LOGIT_STD", "SSM_A_RANGE", "SSM_DT_BIAS_RANGE", "GGUFPlan", "MetaEntry",
           "router_std", "write_plan"]

CHUNK_BYTES = 32 << 20
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32

_SCALAR_SIZES = {"UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "UINT32": 4, "INT32": 4, "FLOAT32": 4,
                 "BOOL": 1, "UINT64": 8, "INT64": 8, "FLOAT64": 8}


@dataclass
class MetaEntry:
    """One metadata key/value with its GGUF type: ``"UINT32"``, ``"STRING"``, ``"ARRAY[INT32]"``...

    String values may be ``str`` or raw ``bytes`` (copied verbatim from another file).
    """

    key: str
    type: str
    value: object

    def __post_init__(self) -> None:
        base = self.type.removeprefix("ARRAY[").removesuffix("]")
        if base not in _SCALAR_SIZES and base != "STRING":
            raise ValueError(f"metadata {self.key}: unsupported GGUF type {self.type}")
        if self.type.startswith("ARRAY[") and not isinstance(self.value, (list, tuple, np.ndarray)):
            raise ValueError(f"metadata {self.key}: type {self.type} needs a list value")

    @property
    def is_array(self) -> bool:
        return self.type.startswith("ARRAY[")

    @property
    def item_type(self) -> str:
        return self.type[6:-1] if self.is_array else self.type

    def n_bytes(self) -> int:
        """Serialized size of key, type tag and value (GGUF v3: u64 lengths and counts)."""
        size = 8 + len(self.key.encode("utf-8")) + 4
        if not self.is_array:
            return size + _value_size(self.type, self.value)
        size += 4 + 8
        items = cast("list[object]", self.value)
        if self.item_type == "STRING":
            return size + sum(_value_size("STRING", v) for v in items)
        return size + _SCALAR_SIZES[self.item_type] * len(items)


def _value_size(vtype: str, value: object) -> int:
    if vtype == "STRING":
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
        return 8 + len(raw)
    return _SCALAR_SIZES[vtype]


@dataclass
class GGUFPlan:
    """Everything a GGUF file holds except the tensor values.

    Attributes:
        arch: ``general.architecture``.
        metadata: entries in file order (``general.architecture`` included).
        tensors: tensor specs in file order (``shape`` numpy order, ``dtype`` ggml type name).
        alignment: data alignment in bytes (``general.alignment``, 32 when absent).
        values: tensor name → callable ``(rng, n_elements) -> uint8 data`` overriding the random
            fill (used for nothing by default; tests may pin a tensor's values).
    """

    arch: str
    metadata: list[MetaEntry]
    tensors: list[TensorSpec]
    alignment: int = DEFAULT_ALIGNMENT
    values: dict[str, Callable[[np.random.Generator, int], np.ndarray]] = field(default_factory=dict)

    def meta(self, key: str) -> object:
        """The value of metadata ``key``. Raises ``KeyError`` when absent."""
        for e in self.metadata:
            if e.key == key:
                return e.value
        raise KeyError(key)

    def set_meta(self, key: str, vtype: str, value: object) -> None:
        """Set ``key`` (replacing it in place, or appending it)."""
        for i, e in enumerate(self.metadata):
            if e.key == key:
                self.metadata[i] = MetaEntry(key, vtype, value)
                return
        self.metadata.append(MetaEntry(key, vtype, value))

    def tensor_nbytes(self, spec: TensorSpec) -> int:
        return n_bytes(spec.dtype, spec.shape)

    def header_nbytes(self) -> int:
        """Bytes before the data section (header, metadata, tensor infos, alignment padding)."""
        size = 4 + 4 + 8 + 8 + sum(e.n_bytes() for e in self.metadata)
        for t in self.tensors:
            size += 8 + len(t.name.encode("utf-8")) + 4 + 8 * len(t.shape) + 4 + 8
        return _pad(size, self.alignment)

    def data_offsets(self) -> list[int]:
        """Offset of each tensor's data relative to the start of the data section."""
        offsets, pos = [], 0
        for t in self.tensors:
            offsets.append(pos)
            pos += _pad(self.tensor_nbytes(t), self.alignment)
        return offsets

    def data_nbytes(self) -> int:
        """Bytes of the data section (each tensor padded to the alignment)."""
        return sum(_pad(self.tensor_nbytes(t), self.alignment) for t in self.tensors)

    def file_nbytes(self) -> int:
        """Size of the file ``write_plan`` writes (the last tensor is padded too, as ggml does)."""
        return self.header_nbytes() + self.data_nbytes()

    def n_params(self) -> int:
        return sum(int(np.prod(t.shape, dtype=np.int64)) for t in self.tensors)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _add_meta(writer: GGUFWriter, e: MetaEntry) -> None:
    if e.is_array:
        sub = GGUFValueType[e.item_type]
        value = e.value.tolist() if isinstance(e.value, np.ndarray) else list(cast("list[object]", e.value))
        if not value:
            raise ValueError(f"metadata {e.key}: GGUF arrays written by fak.synth must not be empty")
        writer.add_key_value(e.key, value, GGUFValueType.ARRAY, sub_type=sub)
    else:
        writer.add_key_value(e.key, e.value, GGUFValueType[e.type])


ROUTER_LOGIT_STD = 2.0
"""Standard deviation (over experts) of a synthetic MoE router's logits for an input of unit RMS.

A router row of ``n_embd`` weights of std ``s`` gives logits of std ``s * sqrt(n_embd)`` on the
RMS-normalized hidden state, so weights of the usual 0.02 would give logits of std 0.16 at
n_embd 64 (0.9 at 2048): a near-uniform softmax, every expert weighted alike. Real Qwen3-MoE
routers are peaked (the top expert's probability is several times the mean), so router weights are
drawn with std ``ROUTER_LOGIT_STD / sqrt(n_embd)``: logits of std about 2, a top-1 probability of
a few tenths among 16 experts, and a different expert set for different tokens."""


def router_std(n_embd: int) -> float:
    """Weight std of a synthetic router row of ``n_embd`` inputs (see ``ROUTER_LOGIT_STD``)."""
    return ROUTER_LOGIT_STD / float(np.sqrt(n_embd))


SSM_A_RANGE = (0.5, 8.0)
"""``-ssm_a`` (``A = exp(A_log)``) of a synthetic Gated DeltaNet head, drawn log-uniformly in this range."""

SSM_DT_BIAS_RANGE = (-4.0, 0.0)
"""``ssm_dt.bias`` of a synthetic Gated DeltaNet head, drawn uniformly in this range.

The per-token decay of a head's state is ``exp(g)``, ``g = ssm_a * softplus(alpha + dt_bias)``
(llama.cpp ``qwen35.cpp``); ``alpha`` is small (a 0.02-std projection of the normalized hidden
state). With these ranges ``g`` spans about -5.5 .. -0.01: some heads forget within a token, others
keep their state over hundreds of tokens, so a prompt longer than a ubatch depends on state carried
across ubatches. ``ssm_a`` is always negative (``-exp(A_log)``, as the converter writes it), so the
decay is below 1 and the recurrence is stable (keys are L2-normalized and ``beta`` is a sigmoid)."""

CONV_STD = 0.3
"""Standard deviation of a synthetic ``ssm_conv1d`` tap (a depthwise kernel of 4 taps: PyTorch's
default init of such a Conv1d has std ~0.29)."""


def _float_values(dtype: str, values: np.ndarray) -> np.ndarray:
    """``values`` encoded as the float type ``dtype`` (F32 or F16), as flat ``uint8``."""
    if dtype == "F32":
        return values.astype("<f4").view(np.uint8)
    if dtype == "F16":
        return values.astype("<f2").view(np.uint8)
    raise ValueError(f"a {dtype} tensor cannot hold exact per-head values; use F32")


def _tensor_data(spec: TensorSpec, rng: np.random.Generator, n_elements: int) -> np.ndarray:
    """Values by role: norms ~ N(1, 0.05²) (quantized norms: spread only), routers std
    ``router_std(n_embd)``, convolution taps std ``CONV_STD``, Gated DeltaNet ``ssm_a`` and
    ``ssm_dt.bias`` per ``SSM_A_RANGE`` / ``SSM_DT_BIAS_RANGE``, everything else std 0.02."""
    if spec.role == "norm":
        return random_blocks(spec.dtype, n_elements, rng, std=0.05, mean=1.0)
    if spec.role == "router":
        return random_blocks(spec.dtype, n_elements, rng, std=router_std(spec.shape[-1]))
    if spec.role == "conv":
        return random_blocks(spec.dtype, n_elements, rng, std=CONV_STD)
    if spec.role == "ssm_a":
        lo, hi = np.log(SSM_A_RANGE[0]), np.log(SSM_A_RANGE[1])
        return _float_values(spec.dtype, -np.exp(rng.uniform(lo, hi, n_elements)))
    if spec.role == "ssm_dt":
        return _float_values(spec.dtype, rng.uniform(*SSM_DT_BIAS_RANGE, n_elements))
    return random_blocks(spec.dtype, n_elements, rng, std=0.02)


def write_plan(path: str | os.PathLike[str], plan: GGUFPlan, *, seed: int = 0,
               progress: Callable[[int, int], None] | None = None) -> Path:
    """Write ``plan`` to ``path`` with random valid tensor data; returns the path.

    Each tensor's values come from its own generator seeded by ``(seed, index)``, so a file is a
    pure function of (plan, seed). Data is generated and written ``CHUNK_BYTES`` at a time.
    ``progress(done_bytes, total_bytes)`` is called after each chunk. The file is written to a
    temporary name beside ``path`` and renamed when complete, so a crash leaves no partial model.

    Raises:
        ValueError: a tensor whose row length is not a multiple of its type's block size, or an
            unsupported type.
        OSError: the file cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    writer = GGUFWriter(tmp, plan.arch)
    writer.data_alignment = plan.alignment
    writer.kv_data = [{}]  # drop the general.architecture the constructor adds: the plan orders all keys
    for e in plan.metadata:
        _add_meta(writer, e)
    for t in plan.tensors:
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), plan.tensor_nbytes(t),
                               raw_dtype=GGMLQuantizationType[t.dtype])
    total = plan.data_nbytes()
    done = 0
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        out = writer.fout[0]
        out.write(b"\0" * (_pad(out.tell(), plan.alignment) - out.tell()))
        if out.tell() != plan.header_nbytes():
            raise AssertionError(f"header is {out.tell()} bytes, planned {plan.header_nbytes()}")
        for index, t in enumerate(plan.tensors):
            rng = new_rng(seed, index)
            fmt = format_of(t.dtype)
            n_el = int(np.prod(t.shape, dtype=np.int64))
            # whole blocks per chunk, about CHUNK_BYTES each
            chunk_el = max(fmt.block_size, CHUNK_BYTES // fmt.type_size * fmt.block_size)
            written = 0
            for start in range(0, n_el, chunk_el):
                count = min(chunk_el, n_el - start)
                fill = plan.values.get(t.name)
                data = fill(rng, count) if fill else _tensor_data(t, rng, count)
                out.write(np.ascontiguousarray(data, dtype=np.uint8).data)
                written += data.nbytes
                done += data.nbytes
                if progress:
                    progress(done, total)
            if written != plan.tensor_nbytes(t):
                raise AssertionError(f"{t.name}: wrote {written} bytes, expected {plan.tensor_nbytes(t)}")
            pad = _pad(written, plan.alignment) - written
            out.write(b"\0" * pad)
            done += pad
        writer.close()
        if tmp.stat().st_size != plan.file_nbytes():
            raise AssertionError(f"{tmp} is {tmp.stat().st_size} bytes, planned {plan.file_nbytes()}")
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path

