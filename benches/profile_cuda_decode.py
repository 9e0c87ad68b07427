"""Where a CUDA decode step's GPU time goes: per-kernel totals of N single-sequence decode steps,
recorded by CUPTI through ``torch.profiler`` (the GPU machine has PyTorch; fak does not use it).

Kernels are timed with the decode CUDA graph off (``FAK_CUDA_GRAPHS=0``, set here) so that every
launch is its own record; the wall time per step with graphs on and off is printed beside it,
the difference being the launch overhead the graph removes.

Usage (GPU machine): ``python benches/profile_cuda_decode.py MODEL.gguf [--steps 64] [--ctx 0] [--seqs 1]``
(``--seqs N``: N sequences decoding together, every step one row each; figures are per step).

``--prefill N`` profiles prefill instead: ``--steps`` forwards of one N-token prompt each (a fresh
sequence per forward, ``max_tokens_per_step = N``), figures per forward.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def start(path: str, ctx: int, steps: int, seqs: int):
    """A model with `seqs` sequences of `ctx + 4` prompt tokens each, prefilled (in forwards of up to
    `rows` tokens) and then 8 decode steps on (so the decode graph of `seqs` rows is captured)."""
    from fak import _native

    n_ctx = ctx + steps + 64
    rows = max(512, min(4096, seqs * (ctx + 4)))
    m = _native.EngineCore(path, backend="cuda", n_ctx=n_ctx, kv_cache_tokens=seqs * n_ctx, max_batch=seqs, max_tokens_per_step=rows)
    rng = np.random.default_rng(0)
    for s in range(seqs):
        m.add_sequence(s, [int(t) for t in rng.integers(100, 1000, ctx + 4)], {"temperature": 0.0})
    for _ in range(8 + (ctx + 4) * seqs // rows + 1):
        m.step()
    return m


def wall_per_step(path: str, ctx: int, steps: int, graphs: bool, seqs: int) -> float:
    os.environ["FAK_CUDA_GRAPHS"] = "1" if graphs else "0"
    m = start(path, ctx, steps, seqs)
    t = time.perf_counter()
    for _ in range(steps):
        m.step()
    return (time.perf_counter() - t) / steps


def profile_prefill(path: str, n: int, reps: int) -> None:
    """Per-kernel GPU time of `reps` forwards of an `n`-token prompt (one step each)."""
    from fak import _native

    m = _native.EngineCore(path, backend="cuda", n_ctx=n + 64, kv_cache_tokens=n + 64, max_batch=1, max_tokens_per_step=n)
    rng = np.random.default_rng(0)

    def one(i: int) -> None:
        m.add_sequence(i, [int(t) for t in rng.integers(10, min(1000, m.n_vocab - 10), n)], {"temperature": 0.0, "max_tokens": 1})
        while m.n_running or m.n_waiting:
            m.step()

    one(0)
    t = time.perf_counter()
    for i in range(reps):
        one(1 + i)
    wall = (time.perf_counter() - t) / reps
    print(f"wall per {n}-token prefill: {wall * 1e3:.1f} ms ({n / wall:.0f} tok/s)")
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            one(100 + i)
    report(prof, reps, "forward")


def report(prof, per: int, unit: str) -> None:
    """Prints the profile's GPU kernels by total time, per ``unit`` (``per`` of them were
    profiled): µs, launches, µs per launch, the 40 largest."""
    rows = []
    total = 0.0
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if t <= 0:
            continue
        rows.append((t, e.count, e.key))
        total += t
    rows.sort(reverse=True)
    print(f"GPU time per {unit}: {total / per:.1f} µs over {sum(r[1] for r in rows) / per:.1f} launches")
    print(f"{'µs/' + unit:>9} {'launches':>14} {'µs/launch':>10}  kernel")
    for t, n, k in rows[:40]:
        print(f"{t / per:9.1f} {n / per:14.1f} {t / n:10.2f}  {k[:90]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=0)
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--prefill", type=int, default=0, help="profile forwards of one prompt of this many tokens instead")
    a = ap.parse_args()
    if a.prefill:
        os.environ["FAK_CUDA_GRAPHS"] = "0"
        profile_prefill(a.model, a.prefill, a.steps)
        return
    on = wall_per_step(a.model, a.ctx, a.steps, True, a.seqs)
    off = wall_per_step(a.model, a.ctx, a.steps, False, a.seqs)
    n = a.seqs
    print(f"wall per step ({n} seq): graphs on {on * 1e3:.3f} ms ({n / on:.1f} tok/s), off {off * 1e3:.3f} ms ({n / off:.1f} tok/s)")
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    os.environ["FAK_CUDA_GRAPHS"] = "0"
    m = start(a.model, a.ctx, a.steps, a.seqs)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            m.step()
    report(prof, a.steps, "step")


if __name__ == "__main__":
    main()
