"""Prefill and decode at depth on the CPU: fak against llama.cpp's own ``llama-bench -d``, same
threads, same machine, alternating rounds (issue 16: the main job's turns run at 4-8k tokens of
context, where attention, not the weights, is most of a token).

Per depth D (tokens already in the KV cache) and per round:

- ``fak``: ``_native.EngineCore`` (2 threads, prefix cache on) holds a D-token context (prefilled once,
  outside the timing); the round adds a sequence that shares those D tokens and brings
  ``--pp`` new ones (a prefix-cache hit: only the new tokens are computed, at depth D), steps
  until its first token (``pp@dD``), then decodes ``--tg`` tokens (``tg@dD``), then removes it.
- ``llama-bench``: ``llama-bench -m MODEL -t T -d D -p PP -n TG -r 1 -o json`` (its own warm-up;
  ``pp PP @ d D`` and ``tg TG @ d D`` as it reports them), once with flash attention off
  (``-fa 0``: the order fak reproduces bit for bit) and once with its default (``-fa auto``).

Wall-clock tok/s, medians over rounds; the CPU model (``lscpu``) and the load average are
recorded. ``PYTHONPATH`` picks the fak build, so two builds compare by running this twice.

Run:  PYTHONPATH=python python benches/bench_cpu_depth.py [--llama-bench /tmp/llama-bench/build/bin/llama-bench] \\
          [--model PATH] [--depths 0 4096 8192] [--pp 512] [--tg 32] [--rounds 2] [--threads 2] [--no-fa-auto]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benches"))  # machine.py
from conftest import MODEL_15B, real_model  # noqa: E402
from machine import cpu_name  # noqa: E402

from fak import _native  # noqa: E402


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1000, 30_000, size=n)]


class FakDepth:
    """A D-token context held in the prefix cache; each round a new sequence extends it."""

    def __init__(self, path: Path, depth: int, pp: int, tg: int, threads: int) -> None:
        n_ctx = depth + pp + tg + 64
        self.m = _native.EngineCore(str(path), n_ctx=n_ctx, threads=threads, kv_cache_tokens=2 * n_ctx,
                               max_batch=2, max_tokens_per_step=512)
        self.base = tokens(depth, 1)
        self.pp, self.tg, self.sid = pp, tg, 0
        if depth:
            self.m.add_sequence(0, self.base, {"temperature": 0.0, "max_tokens": 1})
            while not any(fin for *_, fin in self.m.step()):
                pass
            self.m.remove_sequence(0)

    def round(self) -> tuple[float, float]:
        self.sid += 1
        hit0 = self.m.stats()["prefix_cache_hit_tokens"]
        t0 = time.perf_counter()
        self.m.add_sequence(self.sid, self.base + tokens(self.pp, 100 + self.sid),
                            {"temperature": 0.0, "max_tokens": self.tg + 1})
        while not self.m.step():
            pass
        t1 = time.perf_counter()
        for _ in range(self.tg):
            self.m.step()
        t2 = time.perf_counter()
        self.m.remove_sequence(self.sid)
        hit = self.m.stats()["prefix_cache_hit_tokens"] - hit0
        assert hit >= len(self.base) // 32 * 32 - 32, f"the {len(self.base)}-token context was not reused ({hit})"
        return self.pp / (t1 - t0), self.tg / (t2 - t1)


def llama_bench(binary: str, path: Path, depth: int, pp: int, tg: int, threads: int, fa: str) -> tuple[float, float]:
    cmd = [binary, "-m", str(path), "-t", str(threads), "-d", str(depth), "-p", str(pp), "-n", str(tg),
           "-r", "1", "-fa", fa, "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    pp_ts = next(r["avg_ts"] for r in rows if r["n_prompt"] == pp and r["n_gen"] == 0)
    tg_ts = next(r["avg_ts"] for r in rows if r["n_gen"] == tg and r["n_prompt"] == 0)
    return pp_ts, tg_ts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF (default: the real 1.5B Q4_K_M)")
    ap.add_argument("--llama-bench", help="llama-bench binary (scripts/build-llama-bench); omitted: fak alone")
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 4096, 8192])
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-fa-auto", action="store_true", help="leave out llama-bench's default (-fa auto)")
    a = ap.parse_args()
    path = Path(a.model) if a.model else real_model(MODEL_15B)
    print(f"# {path.name}, {a.threads} threads, {cpu_name()}, fak from {Path(_native.__file__).parent}")
    peers = [("llama.cpp -fa 0", "0")] + ([] if a.no_fa_auto else [("llama.cpp -fa auto", "auto")])
    if not a.llama_bench:
        peers = []
    print(f"| depth | engine | pp{a.pp} tok/s | tg{a.tg} tok/s | load avg |")
    print("|---:|---|---:|---:|---:|")
    for depth in a.depths:
        fak = FakDepth(path, depth, a.pp, a.tg, a.threads)
        res: dict[str, list[tuple[float, float]]] = {"fak": []}
        for _ in range(a.rounds):
            res["fak"].append(fak.round())
            for name, fa in peers:
                res.setdefault(name, []).append(llama_bench(a.llama_bench, path, depth, a.pp, a.tg, a.threads, fa))
        del fak
        load = os.getloadavg()[0]
        for name, rs in res.items():
            pp = statistics.median(r[0] for r in rs)
            tg = statistics.median(r[1] for r in rs)
            print(f"| {depth} | {name} | {pp:.1f} | {tg:.2f} | {load:.1f} |", flush=True)


if __name__ == "__main__":
    main()
