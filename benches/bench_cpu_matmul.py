"""CPU quantized matmul benchmarks (pytest-benchmark): `fak._native.matmul` per format and SIMD
level at the Qwen2.5-Coder-1.5B shapes with 2 threads, and numpy's float32 matmul on the
dequantized weights as the kernel-level peer measured in the same run.

Run:  PYTHONPATH=python python -m pytest benches/bench_cpu_matmul.py --benchmark-json=/tmp/mm.json
      python benches/bench_cpu_matmul.py /tmp/mm.json   # prints the results table (markdown)

- ``test_gemv``: decode, ``n_rows = 1``, ``W`` = ffn_gate/up of the 1.5B (n_out 8960, k 1536). Each
  round reads a different copy of the weights out of a pool larger than the 32 MiB L3, so the
  figure is the DRAM-streaming rate a real decode sees (a 1.1 GB model never stays in cache).
  Reported: GB/s of weight bytes read, GFLOP/s (2·n_out·k per row).
- ``test_gemm``: prefill, ``n_rows = 512``, same ``W`` (compute-bound). Reported: GFLOP/s.
- ``peer``: numpy ``x @ W_f32.T`` (its BLAS, same threads) on the dequantized f32 weights.

The model-level comparison with llama.cpp is ``benches/`` of the engine; from the GEMV rate the
decode speed of the 1.5B (≈ 1.0 GB of weights read per token) is estimated in the results file.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_cpu_matmul import dequantized_w, random_weights  # noqa: E402

from fak import _native  # noqa: E402

THREADS = 2
N_OUT, K = 8960, 1536  # Qwen2.5-Coder-1.5B ffn_gate / ffn_up
FORMATS = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "Q2_K", "Q3_K", "F16", "BF16", "F32"]
LEVELS = _native.simd_levels()
POOL_BYTES = 96 << 20  # > 3 × L3, so each GEMV round streams from DRAM

os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))


def weight_pool(type_name: str) -> list[np.ndarray]:
    """Independent copies of one random weight matrix totalling ≥ POOL_BYTES."""
    w = random_weights(type_name, N_OUT, K, np.random.default_rng(0))
    n = max(2, -(-POOL_BYTES // w.nbytes))
    return [w.copy() for _ in range(n)]


class CpuTimed:
    """Wraps a call and records the process CPU time (all threads) of each call, so results on a
    shared, busy machine can also be read per CPU-second (what one core does when it runs)."""

    def __init__(self, f) -> None:
        self.f, self.cpu = f, []

    def __call__(self):
        t0 = time.process_time()
        r = self.f()
        self.cpu.append(time.process_time() - t0)
        return r


def record(benchmark, timed: CpuTimed, type_name: str, level: str, n_rows: int, w_bytes: int) -> None:
    mean = benchmark.stats.stats.mean
    cpu = sum(timed.cpu) / len(timed.cpu)
    flop = 2 * N_OUT * K * n_rows
    benchmark.extra_info.update(
        type=type_name, level=level, n_rows=n_rows, n_out=N_OUT, k=K, threads=THREADS,
        gb_s=w_bytes / mean / 1e9, gflop_s=flop / mean / 1e9,
        gb_per_cpu_s=w_bytes / cpu / 1e9, gflop_per_cpu_s=flop / cpu / 1e9,
    )


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("type_name", FORMATS)
def test_gemv(benchmark, type_name: str, level: str) -> None:
    pool = weight_pool(type_name)
    x = np.random.default_rng(1).standard_normal((1, K)).astype(np.float32)
    it = itertools.cycle(pool)
    timed = CpuTimed(lambda: _native.matmul(type_name, next(it), N_OUT, K, x, threads=THREADS, level=level))
    benchmark.pedantic(timed, rounds=3 * len(pool) if level != "scalar" else len(pool), warmup_rounds=1)
    record(benchmark, timed, type_name, level, 1, pool[0].nbytes)


@pytest.mark.parametrize("level", [lv for lv in LEVELS if lv != "scalar"])
@pytest.mark.parametrize("type_name", FORMATS)
def test_gemm(benchmark, type_name: str, level: str) -> None:
    w = random_weights(type_name, N_OUT, K, np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((512, K)).astype(np.float32)
    timed = CpuTimed(lambda: _native.matmul(type_name, w, N_OUT, K, x, threads=THREADS, level=level))
    benchmark.pedantic(timed, rounds=3, warmup_rounds=1)
    record(benchmark, timed, type_name, level, 512, w.nbytes)


@pytest.mark.parametrize("n_rows", [1, 512])
def test_peer_numpy_f32(benchmark, n_rows: int) -> None:
    """numpy float32 matmul on the dequantized (Q4_K) weights: the BLAS peer."""
    wf = dequantized_w("Q4_K", random_weights("Q4_K", N_OUT, K, np.random.default_rng(0)), N_OUT, K).astype(np.float32)
    pool = [wf] + [wf.copy() for _ in range(max(1, POOL_BYTES // wf.nbytes))] if n_rows == 1 else [wf]
    x = np.random.default_rng(1).standard_normal((n_rows, K)).astype(np.float32)
    it = itertools.cycle(pool)
    timed = CpuTimed(lambda: x @ next(it).T)
    benchmark.pedantic(timed, rounds=6, warmup_rounds=1)
    record(benchmark, timed, "numpy-f32", "blas", n_rows, wf.nbytes)


def table(path: str) -> str:
    """The markdown results table from a ``--benchmark-json`` file."""
    data = json.loads(Path(path).read_text())
    rows = {}
    for b in data["benchmarks"]:
        e = b["extra_info"]
        rows.setdefault((e["type"], e["n_rows"]), {})[e["level"]] = e
    out = ["| weights | n_rows | " + " | ".join(f"{lv}" for lv in LEVELS) + " | unit |", "|---|---|" + "---|" * (len(LEVELS) + 1)]
    for (t, n), by_level in sorted(rows.items(), key=lambda kv: (kv[0][1], FORMATS.index(kv[0][0]) if kv[0][0] in FORMATS else 99)):
        unit = "GB/s of weights" if n == 1 else "GFLOP/s"
        cells = []
        for lv in LEVELS + ["blas"]:
            if lv not in by_level:
                continue
            e = by_level[lv]
            if n == 1:
                cells.append(f"{e['gb_s']:.1f} ({e['gb_per_cpu_s']:.1f}/cpu-s)")
            else:
                cells.append(f"{e['gflop_s']:.0f} ({e['gflop_per_cpu_s']:.0f}/cpu-s)")
        if "blas" in by_level:
            cells = [f"blas: {cells[0]}"] + [""] * (len(LEVELS) - 1)
        while len(cells) < len(LEVELS):
            cells.insert(0, "–")
        out.append(f"| {t} | {n} | " + " | ".join(cells) + f" | {unit} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(sys.argv[1]))
