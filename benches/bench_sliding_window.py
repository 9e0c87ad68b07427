"""Sliding-window attention on the CPU: the real 0.5B at a 3,000-token context, without a window and
with a 256-token window set by flag (``sliding_window=256``, every layer): prefill and decode tok/s
and the KV blocks a sequence holds (``kv_blocks_peak``) and the engine allocates
(``kv_blocks_total``, its default size follows the window).

Run: ``PYTHONPATH=python python -m pytest benches/bench_sliding_window.py --benchmark-only -s``.
Each result's ``extra_info`` carries the numbers and the machine (the 2-core box is shared: read
the load average with them). One round each: a 3,000-token prefill on 2 cores takes ~15-30 s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benches"))
from bench_cpu_engine import THREADS, machine  # noqa: E402
from conftest import MODEL_05B, real_model  # noqa: E402

from fak import _native  # noqa: E402

N_PROMPT = 3000
N_DECODE = 48


@pytest.mark.parametrize("window", [None, 256], ids=["full", "w256"])
def test_window_speed_and_kv(benchmark, window: int | None) -> None:
    path = real_model(MODEL_05B)
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 151000, size=N_PROMPT)]
    kw = {} if window is None else {"sliding_window": window}
    model = _native.EngineCore(str(path), n_ctx=4096, threads=THREADS, max_batch=1, prefix_cache=False, **kw)

    def run() -> None:
        model.reset_stats()
        model.add_sequence(1, prompt, {"temperature": 0.0, "max_tokens": N_DECODE})
        done = False
        while not done:
            for _sid, _tok, _lp, _top, fin in model.step():
                done = fin is not None

    benchmark.pedantic(run, rounds=1, iterations=1)
    s = model.stats()
    info = {"window": window or 0, "prefill_tok_s": s["prefill_tokens"] / s["prefill_seconds"],
            "decode_tok_s": s["decode_tokens"] / s["decode_seconds"], "kv_blocks_peak": s["kv_blocks_peak"],
            "kv_blocks_total": model.kv_blocks_total, **machine()}
    benchmark.extra_info.update(info)
    print(f"\nwindow {window}: prefill {info['prefill_tok_s']:.1f} tok/s, decode {info['decode_tok_s']:.2f} tok/s, "
          f"KV blocks peak {s['kv_blocks_peak']} of {model.kv_blocks_total} (load {info['loadavg_1m']:.1f})")
