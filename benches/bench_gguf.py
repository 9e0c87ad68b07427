"""GGUF reader and dequantization benchmarks (pytest-benchmark), with the ``gguf`` package as the
peer measured in the same run.

Run:  PYTHONPATH=python python -m pytest benches/bench_gguf.py --benchmark-json=/tmp/gguf.json

- ``test_open_*``: open + header parse of the real 1.1 GB Qwen2.5-Coder-1.5B Q4_K_M file
  (fak.gguf.GGUFFile vs gguf.GGUFReader), and how much of the file opening touches: after
  evicting the file from the page cache (``posix_fadvise(DONTNEED)``), the bytes read from
  storage (``/proc/self/io`` ``read_bytes``), page faults, and the file's resident pages after
  open (``mincore``); the header is 5.95 MB of the 1.1 GB.
- ``test_dequant_*``: throughput in GB/s of float32 output for every format on 4 Mi elements of
  random valid blocks: fak into a preallocated array (``out=``), fak allocating its result, and
  ``gguf.quants.dequantize`` on rows of 4096 elements (for F32 it returns a view, no copy);
  plus one real tensor.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import MODEL_15B, real_model  # noqa: E402
from gguf_util import FORMATS, geometry, random_blocks  # noqa: E402

from fak.gguf import GGUFFile, dequantize  # noqa: E402

N_ELEMENTS = 1 << 22
ROW_ELEMENTS = 4096


@pytest.fixture(scope="module")
def model() -> Path:
    return real_model(MODEL_15B)


def test_open_parse_fak(benchmark, model: Path) -> None:
    def run() -> None:
        GGUFFile(model).close()

    benchmark(run)
    benchmark.extra_info["file_bytes"] = model.stat().st_size


def test_open_parse_gguf_reader(benchmark, model: Path) -> None:
    benchmark.pedantic(lambda: gguf.GGUFReader(model), rounds=2, iterations=1)


def _io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def _resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache, via mincore over a fresh read-only mapping."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = ctypes.create_string_buffer((size + page - 1) // page)
        assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) * page


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_open_cold_bytes_read(benchmark, model: Path) -> None:
    """One cold open: what opening reads from the file. Evicts the model from the page cache
    first (others re-read it from storage afterwards)."""
    info: dict[str, int] = {}

    def setup():
        _evict(model)
        info["resident_before"] = _resident_bytes(model)
        info["io_before"] = _io()["read_bytes"]
        ru = resource.getrusage(resource.RUSAGE_SELF)
        info["faults_before"] = ru.ru_minflt + ru.ru_majflt
        return (), {}

    holder: list[GGUFFile] = []
    benchmark.pedantic(lambda: holder.append(GGUFFile(model)), setup=setup, rounds=1, iterations=1)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    extra = benchmark.extra_info
    extra["storage_read_bytes"] = _io()["read_bytes"] - info["io_before"]
    extra["page_faults"] = ru.ru_minflt + ru.ru_majflt - info["faults_before"]
    extra["resident_before_bytes"] = info["resident_before"]
    extra["resident_after_bytes"] = _resident_bytes(model)
    extra["header_bytes"] = holder[0].data_offset
    extra["file_bytes"] = holder[0].file_size
    holder[0].close()


@pytest.fixture(scope="module")
def blocks() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {d: random_blocks(d, N_ELEMENTS // geometry(d)[0], rng) for d in FORMATS}


def _gbps(benchmark, n_elements: int) -> None:
    benchmark.extra_info["out_bytes"] = n_elements * 4


@pytest.mark.parametrize("dtype", FORMATS)
def test_dequant_fak_out(benchmark, blocks: dict[str, np.ndarray], dtype: str) -> None:
    benchmark.group = f"dequant {dtype}"
    out = np.empty(N_ELEMENTS, dtype=np.float32)
    benchmark(dequantize, dtype, blocks[dtype], N_ELEMENTS, out)
    _gbps(benchmark, N_ELEMENTS)


@pytest.mark.parametrize("dtype", FORMATS)
def test_dequant_fak_alloc(benchmark, blocks: dict[str, np.ndarray], dtype: str) -> None:
    benchmark.group = f"dequant {dtype}"
    benchmark(dequantize, dtype, blocks[dtype], N_ELEMENTS)
    _gbps(benchmark, N_ELEMENTS)


@pytest.mark.parametrize("dtype", FORMATS)
def test_dequant_gguf(benchmark, blocks: dict[str, np.ndarray], dtype: str) -> None:
    benchmark.group = f"dequant {dtype}"
    bs, ts = geometry(dtype)
    # rows of ROW_ELEMENTS, the shape of a real weight matrix (the gguf package loops over rows)
    raw = blocks[dtype].reshape(N_ELEMENTS // ROW_ELEMENTS, ROW_ELEMENTS // bs * ts)
    qtype = gguf.GGMLQuantizationType[dtype]
    benchmark.pedantic(gguf.quants.dequantize, args=(raw, qtype), rounds=3, iterations=1, warmup_rounds=1)
    _gbps(benchmark, N_ELEMENTS)


@pytest.mark.parametrize("impl", ["fak_out", "fak", "gguf"])
def test_dequant_real_tensor(benchmark, model: Path, impl: str) -> None:
    """blk.0.ffn_up.weight of the 1.5B model: Q4_K, 8960 x 1536 (55 MB of float32), straight from
    the map: fak into a preallocated array, fak's ``GGUFFile.dequantize`` (allocates), gguf."""
    benchmark.group = "dequant real Q4_K blk.0.ffn_up"
    with GGUFFile(model) as f:
        info = f.tensor("blk.0.ffn_up.weight")
        if impl == "fak_out":
            out = np.empty(info.n_elements, dtype=np.float32)
            benchmark(dequantize, info.dtype, f.raw(info.name), info.n_elements, out)
        elif impl == "fak":
            benchmark(f.dequantize, info.name)
        else:
            raw = f.raw(info.name).reshape(info.shape[0], -1)
            benchmark.pedantic(gguf.quants.dequantize, args=(raw, gguf.GGMLQuantizationType.Q4_K), rounds=3)
        _gbps(benchmark, info.n_elements)
