"""Tensor parallelism on the CPU backend: speed of 1, 2 and 4 shards, the collectives' share of a
step, and the CPU backend's own summation-order noise that tests/test_tensor_parallel.py's bounds
come from.

Run from the checkout root (after ``scripts/dev-build``)::

    PYTHONPATH=python python benches/bench_tensor_parallel.py                 # speed, 0.5B, TP = 1, 2, 4
    PYTHONPATH=python python benches/bench_tensor_parallel.py --noise         # noise vs TP 2, 3, 4, 0.5B
    PYTHONPATH=python python benches/bench_tensor_parallel.py --noise --model qwen2.5-coder-1.5b-instruct-q4_k_m

Speed: through ``fak._native.Model`` directly, greedy, prefix cache off, ``--threads`` threads in
all (divided among the shards' pools): prefill of one ``--prompt``-token prompt, decode of
``--decode`` tokens for 1 sequence and for 8 at once; tok/s on the wall clock and per process
CPU-second, and from the engine's counters the seconds shard 0 spent in the collectives (two
all-reduces per layer, the logits gather) and, of those, waiting at their barriers for the other
shards (imbalance and scheduling, not data movement). Every configuration runs ``--rounds`` times;
the best round is reported (the machine is shared). Prints a markdown table and the machine
(``/proc/cpuinfo`` model name, logical cores, load average before and after).

Noise: logits of three texts (the test's ``TEXTS``) at one shard on the SIMD path and on the
scalar path (``FAK_CPU_SIMD=scalar``, a subprocess: same integer block sums, another f32 order),
and at 2, 3, 4 shards (``--tp``); prints max and mean |dlogit| of each against the one-shard SIMD logits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from conftest import MODEL_05B, real_model  # noqa: E402
from test_tensor_parallel import TEXTS  # noqa: E402

from fak import _native  # noqa: E402
from fak.tokenizer import Tokenizer, read_gguf_metadata  # noqa: E402


def machine() -> dict:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"cpu": cpu, "logical_cores": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2),
            "simd": _native.simd_level()}


def prompt_ids(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(1000, 100_000, size=n)]


def run_once(path: Path, tp: int, threads: int, n_prompt: int, n_decode: int, batch: int) -> dict:
    m = _native.Model(str(path), backend="cpu", n_ctx=n_prompt + n_decode + 8, threads=threads, max_batch=8,
                      prefix_cache=False, tensor_parallel=tp, kv_cache_tokens=8 * (n_prompt + n_decode + 8))
    out = {}
    # prefill alone
    m.reset_stats()
    m.add_sequence(0, prompt_ids(n_prompt), {"temperature": 0.0, "max_tokens": 1})
    t0, c0 = time.perf_counter(), time.process_time()
    while m.step():
        pass
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = m.stats()
    out["prefill"] = {"tok_s": n_prompt / wall, "tok_cpu_s": n_prompt / cpu,
                      "coll_share": s["tp_collective_seconds"] / wall,
                      "coll_wait_share": s["tp_collective_wait_seconds"] / wall}
    # decode: `batch` sequences of 16-token prompts, n_decode tokens each
    for i in range(batch):
        m.add_sequence(100 + i, prompt_ids(16 + i), {"temperature": 0.0, "max_tokens": n_decode + 1})
    m.step()  # their prefill
    m.reset_stats()
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    while steps := m.step():
        n += len(steps)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = m.stats()
    out["decode"] = {"tok_s": n / wall, "tok_cpu_s": n / cpu, "steps": s["steps"],
                     "coll_share": s["tp_collective_seconds"] / wall,
                     "coll_wait_share": s["tp_collective_wait_seconds"] / wall,
                     "ms_per_step": 1e3 * wall / max(1, s["steps"])}
    return out


def speed(args: argparse.Namespace) -> None:
    path = real_model(args.model)
    before = machine()
    rows = []
    for tp in args.tp:
        for batch in (1, 8):
            best: dict | None = None
            for _ in range(args.rounds):
                r = run_once(path, tp, args.threads, args.prompt, args.decode, batch)
                if best is None or r["decode"]["tok_s"] > best["decode"]["tok_s"]:
                    best = r
            assert best is not None
            rows.append((tp, batch, best))
            print(json.dumps({"tp": tp, "batch": batch, **best}), file=sys.stderr)
    after = machine()
    print(f"machine: {before['cpu']}, {before['logical_cores']} logical cores, SIMD {before['simd']}, "
          f"{args.threads} threads; load average (1 min) {before['loadavg_1m']} before, {after['loadavg_1m']} after")
    print(f"model: {args.model}; prefill {args.prompt} tokens; decode {args.decode} tokens per sequence; "
          f"best of {args.rounds}\n")
    print("| TP | prefill tok/s (wall) | prefill tok/CPU-s | collectives / prefill (wait) | decode batch | "
          "decode tok/s (wall) | decode tok/CPU-s | ms/step | collectives / decode step (wait) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tp, batch, r in rows:
        p, d = r["prefill"], r["decode"]
        print(f"| {tp} | {p['tok_s']:.1f} | {p['tok_cpu_s']:.1f} | {100 * p['coll_share']:.1f} % "
              f"({100 * p['coll_wait_share']:.1f} %) | {batch} | {d['tok_s']:.1f} | {d['tok_cpu_s']:.1f} | "
              f"{d['ms_per_step']:.1f} | {100 * d['coll_share']:.1f} % ({100 * d['coll_wait_share']:.1f} %) |")


def dump_logits(path: Path, tp: int, out: str) -> None:
    tok = Tokenizer.from_gguf_metadata(read_gguf_metadata(path))
    m = _native.Model(str(path), backend="cpu", n_ctx=512, max_batch=4, tensor_parallel=tp)
    np.savez(out, *[m.logits(tok.encode(t)) for t in TEXTS])


def noise(args: argparse.Namespace) -> None:
    path = real_model(args.model)
    with tempfile.TemporaryDirectory() as d:
        def run(tag: str, tp: int, env: dict[str, str]) -> list[np.ndarray]:
            f = os.path.join(d, f"{tag}.npz")
            subprocess.run([sys.executable, __file__, "--model", args.model, "--dump-logits", f, "--dump-tp", str(tp)],
                           env={**os.environ, **env}, check=True)
            z = np.load(f)
            return [z[f"arr_{i}"] for i in range(len(TEXTS))]
        ref = run("simd", 1, {})
        rows = [("scalar vs SIMD, 1 shard", run("scalar", 1, {"FAK_CPU_SIMD": "scalar"}))]
        rows += [(f"{tp} shards vs 1 (SIMD)", run(f"tp{tp}", tp, {})) for tp in args.tp if tp > 1]
    print(f"machine: {machine()}; model {args.model}; texts of {[len(r) for r in ref]} tokens\n")
    print("| comparison | " + " | ".join(f"text {i}: max / mean abs dlogit" for i in range(len(TEXTS))) + " |")
    print("|---|" + "---|" * len(TEXTS))
    for name, got in rows:
        cells = [f"{np.abs(g - r).max():.3f} / {np.abs(g - r).mean():.4f}" for g, r in zip(got, ref)]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL_05B)
    ap.add_argument("--tp", type=int, nargs="+", help="shard counts (default: 1 2 4; with --noise 2 3 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--noise", action="store_true", help="measure the summation-order noise instead of speed")
    ap.add_argument("--dump-logits", help=argparse.SUPPRESS)
    ap.add_argument("--dump-tp", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.tp = args.tp or ([2, 3, 4] if args.noise else [1, 2, 4])
    if args.dump_logits:
        dump_logits(real_model(args.model), args.dump_tp, args.dump_logits)
    elif args.noise:
        noise(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
