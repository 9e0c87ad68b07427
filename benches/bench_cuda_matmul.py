"""The quantized-matmul kernel table's measurement (rust/src/backend/cuda/ops/matmul_plan.rs): every
candidate kernel timed on the GPU at the real layer shapes of the Qwen2.5 1.5B and 7B Q4_K_M
layouts, for the row counts a decode batch (1..256) and a prefill chunk (512) bring.

Candidates: the GEMV (``gemv``: up to 8 rows per launch, more rows in launches of 8) and the int8
tensor-core GEMM ``tc:<BN>:<DEPTH>:<splits>`` (BN tokens per tile 16/32/64, weights fetched DEPTH
k-steps ahead, the K range split over ``splits`` blocks per tile; a few split counts around the
heuristic's), its staged mode ``st:<BN>:<S>:<splits>`` (S stages of 256 values of K copied ahead
to shared memory by cp.async; K % 256 == 0) and, for Q4_K/Q6_K, its fragment mode
``fr:<BN>:<S>:<splits>`` (MMA fragments straight from the staged blocks). Each time is the median
over graph replays of 10 products captured in one CUDA graph (``OpRunner.time_matmul``), so
launch gaps are those of a decode step. Random weights and activations (never zeros); the
weights of a shape are uploaded once.

Output: JSON (``--json``) with every timing, the winner per (format, k, n_out, row bucket), and
the bandwidth each winner reaches (weight bytes / time); ``scripts/gen_matmul_table.py`` turns the
winners into ``rust/src/backend/cuda/ops/matmul_table.rs``. A short table is printed last.

Run on the GPU machine::

    python benches/bench_cuda_matmul.py --json out.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from fak import _native

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests/cuda")
from cuda_util import random_weights  # noqa: E402

# (label, wtype, k, n_out): the matrices of one layer and the LM head (Q4_K_M puts Q6_K on
# attn_v/ffn_down of some layers, Q4_K on the others).
SHAPES = [
    ("1.5b.q|o", "Q4_K", 1536, 1536),
    ("1.5b.k", "Q4_K", 1536, 256),
    ("1.5b.v", "Q6_K", 1536, 256),
    ("1.5b.v4", "Q4_K", 1536, 256),
    ("1.5b.gate|up", "Q4_K", 1536, 8960),
    ("1.5b.down", "Q6_K", 8960, 1536),
    ("1.5b.down4", "Q4_K", 8960, 1536),
    ("1.5b.lm_head", "Q6_K", 1536, 151936),
    ("7b.q|o", "Q4_K", 3584, 3584),
    ("7b.k", "Q4_K", 3584, 512),
    ("7b.v", "Q6_K", 3584, 512),
    ("7b.v4", "Q4_K", 3584, 512),
    ("7b.gate|up", "Q4_K", 3584, 18944),
    ("7b.down", "Q6_K", 18944, 3584),
    ("7b.down4", "Q4_K", 18944, 3584),
    ("7b.lm_head", "Q6_K", 3584, 152064),
    # Qwen3-Coder-30B-A3B (qwen3moe: hidden 2048, 32 query heads and 4 KV heads of 128; the
    # experts run their own kernels)
    ("30b.q", "Q4_K", 2048, 4096),
    ("30b.k", "Q4_K", 2048, 512),
    ("30b.v", "Q6_K", 2048, 512),
    ("30b.o", "Q4_K", 4096, 2048),
    ("30b.lm_head", "Q6_K", 2048, 151936),
]
ROWS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512]
BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512]  # matmul_plan::ROW_BUCKETS (1: single-stream decode alone)
N_SM = 132


def bucket(n: int) -> int:
    return next(b for b in BUCKETS if n <= b)


def auto_splits(k: int, n_out: int, rows: int, bn: int) -> int:
    """matmul_plan::bucket_splits without the prefill cut (the bucket's tiles of bn)."""
    tiles = -(-n_out // 128) * -(-bucket(rows) // bn)
    want = -(-2 * N_SM // tiles)
    return max(1, min(want, max(k // 32 // 16, 1)))


def candidates(k: int, n_out: int, rows: int, quick: bool, wtype: str = "Q4_K") -> list[str]:
    out = []
    if rows <= 64:
        out.append("gemv")
    if rows > 8 or not quick:
        for bn in (16, 32, 64):
            if bn > 2 * max(rows, 16) or (rows > 4 * bn and bn < 64):
                continue
            s = auto_splits(k, n_out, rows, bn)
            staged = (2, 3) if k % 256 == 0 else ()
            for mode, depths in (("tc", (1, 2)), ("st", staged), ("fr", staged if wtype in ("Q4_K", "Q6_K") else ())):
                for depth in depths:
                    for sp in sorted({1, max(1, s // 2), s, 2 * s}):
                        if sp > max(k // 32 // 8, 1):
                            continue
                        out.append(f"{mode}:{bn}:{depth}:{sp}")
    return out


def winners(results: list[dict]) -> dict:
    """Winners per (wtype, k, n_out, bucket): the variant with the least time summed over the
    bucket's measured row counts (timed at all of them; a shape listed under two labels, e.g.
    attn_k and a Q4_K attn_v, counts the mean of its timings)."""
    per: dict = {}
    for e in results:
        key = (e["wtype"], e["k"], e["n_out"], bucket(e["rows"]))
        per.setdefault(key, {}).setdefault(e["variant"], {}).setdefault(e["rows"], []).append(e["seconds"])
    best: dict = {}
    for key, by_v in per.items():
        rows_in = sorted({r for v in by_v.values() for r in v})
        tot = {v: sum(float(np.mean(t)) for t in by_r.values()) for v, by_r in by_v.items()
               if v != "table" and sorted(by_r) == rows_in}
        if not tot:
            continue
        v = min(tot, key=tot.get)  # type: ignore[arg-type]
        table_t = sum(float(np.mean(t)) for t in by_v.get("table", {}).values())
        best["|".join(map(str, key))] = {"variant": v, "seconds": tot[v], "table_seconds": table_t, "rows": rows_in}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer candidates (no GEMM below 9 rows)")
    ap.add_argument("--shapes", default=None, help="comma list of labels (default: all)")
    ap.add_argument("--rebucket", default=None, metavar="JSON",
                    help="no GPU use: recompute the winners of an earlier run's JSON with today's BUCKETS into --json")
    a = ap.parse_args()
    if a.rebucket:
        d = json.load(open(a.rebucket))
        d["best"] = winners(d["results"])
        d["rebucketed"] = f"winners recomputed from {a.rebucket} for buckets {BUCKETS}"
        with open(a.json or a.rebucket, "w") as f:
            json.dump(d, f, indent=0)
        print(f"{len(d['best'])} winners")
        return
    r = _native.OpRunner("cuda")
    rng = np.random.default_rng(1)
    shapes = [s for s in SHAPES if a.shapes is None or s[0] in a.shapes.split(",")]
    results: list[dict] = []
    t_start = time.time()
    for label, wtype, k, n_out in shapes:
        w = random_weights(wtype, n_out, k, rng)
        x = rng.standard_normal(max(ROWS) * k).astype(np.float32)
        cases = [(rows, v) for rows in ROWS for v in candidates(k, n_out, rows, a.quick, wtype)]
        cases += [(rows, None) for rows in ROWS]  # the current table/heuristic
        t0 = time.time()
        times = r.time_matmul(wtype, w, n_out, k, x, cases, iters=10, reps=3)
        for (rows, v), t in zip(cases, times):
            results.append({"label": label, "wtype": wtype, "k": k, "n_out": n_out, "rows": rows,
                            "variant": v or "table", "seconds": t, "weight_bytes": int(w.nbytes)})
        print(f"{label}: {len(cases)} cases in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        if a.json:  # what is measured so far survives a time limit
            with open(a.json + ".partial", "w") as f:
                json.dump({"results": results}, f)
    best = winners(results)
    out = {"device": _native.cuda_info(load_kernels=False).get("device"), "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "elapsed_s": time.time() - t_start, "results": results, "best": best}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=0)
    # Short table: per shape and row count, the best time (µs), its variant and GB/s of weights.
    print("| shape | rows | best µs | variant | GB/s | table µs |")
    print("|---|---:|---:|---|---:|---:|")
    for label, wtype, k, n_out in shapes:
        for rows in (1, 8, 16, 32, 64, 128, 256):
            es = [e for e in results if e["label"] == label and e["rows"] == rows]
            if not es:
                continue
            b = min((e for e in es if e["variant"] != "table"), key=lambda e: e["seconds"])
            tb = next(e for e in es if e["variant"] == "table")
            print(f"| {label} | {rows} | {b['seconds'] * 1e6:.1f} | {b['variant']} | {b['weight_bytes'] / b['seconds'] / 1e9:.0f} | {tb['seconds'] * 1e6:.1f} |")


if __name__ == "__main__":
    main()
