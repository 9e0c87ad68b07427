"""CPU engine speed on the real models through ``fak._native.EngineCore`` directly (no Python engine
loop): prefill of a 512-token prompt and decode of 128 tokens, 2 threads, greedy; and the
resident set while holding the 1.1 GB model (weights memory-mapped, not copied).

Run: ``PYTHONPATH=python python -m pytest benches/bench_cpu_engine.py --benchmark-only``
(add ``--benchmark-json FILE`` to keep the numbers). Each result's ``extra_info`` carries tok/s,
the machine and the engine's own counters. ``test_prefill_512_llamacpp`` times llama.cpp
(llama-cpp-python, CPU, ``n_batch`` 512, same prompt, same 2 threads) in the same run, and the
ratio fak / llama.cpp is printed at the end of the session (``-s``). Decode side by side is
``benches/bench_cpu_decode.py``. The engine's prefix cache is off here: every round re-sends the
same prompt, which would otherwise come from the cache.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from conftest import MODEL_05B, MODEL_15B, real_model  # noqa: E402

from fak import _native  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/machine.py, beside this script
from machine import cpu_name  # noqa: E402

THREADS = 2
N_PROMPT = 512
N_DECODE = 128
MODELS = [MODEL_05B, MODEL_15B]


def machine() -> dict:
    """CPU model, logical cores and the load while the bench ran (the 2-core box is shared)."""
    cpu = cpu_name(platform.processor())
    return {"cpu": cpu, "logical_cores": os.cpu_count(), "loadavg_1m": os.getloadavg()[0], "threads": THREADS,
            "simd": _native.simd_level() if hasattr(_native, "simd_level") else None}


class CpuClock:
    """Process CPU seconds (all threads) spent inside timed calls: on a shared, busy machine the
    wall-clock rate is depressed by time-sharing, the per-CPU-second rate is not."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, f):
        def timed(*args, **kwargs):
            t0 = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - t0
        return timed


def prompt_ids(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(1000, 100_000, size=n)]


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return request.param, _native.EngineCore(str(real_model(request.param)), n_ctx=2048, threads=THREADS,
                                        prefix_cache=False)


PREFILL_TOK_S: dict[tuple[str, str], float] = {}


def test_prefill_512(benchmark, model):
    name, m = model
    prompt = prompt_ids(N_PROMPT)
    seq = iter(range(1_000_000))

    def setup():
        sid = next(seq)
        m.add_sequence(sid, prompt, {"temperature": 0.0})
        return (sid,), {}

    def prefill(sid):
        out = m.step()  # the whole prompt in one forward (512 ≤ the per-step token budget)
        assert [o[0] for o in out] == [sid]
        m.remove_sequence(sid)

    clock = CpuClock()
    m.reset_stats()
    benchmark.pedantic(clock.wrap(prefill), setup=setup, rounds=3, iterations=1)
    stats = m.stats()
    PREFILL_TOK_S[(name, "fak")] = N_PROMPT / benchmark.stats["median"]
    benchmark.extra_info.update(model=name, tokens=N_PROMPT, tok_per_s=N_PROMPT / benchmark.stats["mean"],
                                tok_per_cpu_s=3 * N_PROMPT / clock.seconds,
                                engine_prefill_tok_per_s=stats["prefill_tokens"] / stats["prefill_seconds"], **machine())


def test_decode_128(benchmark, model):
    name, m = model
    prompt = prompt_ids(32)
    seq = iter(range(1_000_000))

    def setup():
        sid = next(seq)
        m.add_sequence(sid, prompt, {"temperature": 0.0})
        m.step()  # prefill, not timed
        m.reset_stats()
        return (sid,), {}

    def decode(sid):
        for _ in range(N_DECODE):
            m.step()
        m.remove_sequence(sid)

    clock = CpuClock()
    benchmark.pedantic(clock.wrap(decode), setup=setup, rounds=2, iterations=1)
    stats = m.stats()
    benchmark.extra_info.update(model=name, tokens=N_DECODE, tok_per_s=N_DECODE / benchmark.stats["mean"],
                                tok_per_cpu_s=2 * N_DECODE / clock.seconds,
                                engine_decode_tok_per_s=stats["decode_tokens"] / stats["decode_seconds"], **machine())


def test_rss_holding_15b(benchmark):
    """Resident memory of the process before loading, after loading, and after a forward of the
    1.1 GB model: the weights stay in the page cache as a shared file mapping; anonymous memory
    (activations, KV cache pages touched) stays small."""
    path = real_model(MODEL_15B)
    proc = psutil.Process()

    def anon_mb() -> float:
        full = proc.memory_full_info()
        return (full.rss - full.shared) / 2**20

    before_rss, before_anon = proc.memory_info().rss / 2**20, anon_mb()
    m = _native.EngineCore(str(path), n_ctx=2048, threads=THREADS)
    loaded_rss, loaded_anon = proc.memory_info().rss / 2**20, anon_mb()
    benchmark.pedantic(lambda: m.logits(prompt_ids(64)), rounds=1, iterations=1)
    after_rss, after_anon = proc.memory_info().rss / 2**20, anon_mb()
    file_mb = path.stat().st_size / 2**20
    benchmark.extra_info.update(
        file_mb=round(file_mb), rss_before_mb=round(before_rss), rss_loaded_mb=round(loaded_rss),
        rss_after_forward_mb=round(after_rss), anon_before_mb=round(before_anon),
        anon_after_forward_mb=round(after_anon), **machine())
    # Weights are mapped, not copied: private memory grows by far less than the file.
    assert after_anon - before_anon < 0.5 * file_mb
    del m


@pytest.mark.parametrize("name", MODELS)
def test_prefill_512_llamacpp(benchmark, name):
    """llama.cpp's prefill of the same 512 tokens (logits of the last position only, as fak's step)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(real_model(name)), n_ctx=2048, n_batch=N_PROMPT, n_threads=THREADS,
                          n_threads_batch=THREADS, verbose=False)
    prompt = prompt_ids(N_PROMPT)

    def prefill():
        llm.reset()
        llm.eval(prompt)

    clock = CpuClock()
    benchmark.pedantic(clock.wrap(prefill), rounds=3, iterations=1, warmup_rounds=1)
    PREFILL_TOK_S[(name, "llama.cpp")] = N_PROMPT / benchmark.stats["median"]
    benchmark.extra_info.update(model=name, tokens=N_PROMPT, peer="llama.cpp (llama-cpp-python "
                                f"{llama_cpp.__version__})", tok_per_s=N_PROMPT / benchmark.stats["mean"],
                                tok_per_cpu_s=4 * N_PROMPT / clock.seconds, **machine())
    ours = PREFILL_TOK_S.get((name, "fak"))
    if ours is not None:
        print(f"\nprefill 512 {name}: fak {ours:.1f} tok/s, llama.cpp {PREFILL_TOK_S[(name, 'llama.cpp')]:.1f} "
              f"tok/s, ratio {ours / PREFILL_TOK_S[(name, 'llama.cpp')]:.2f}x (medians, same run)")
