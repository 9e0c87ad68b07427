"""Tensor parallelism on the CPU backend: speed of 1, 2 and 4 shards, the collectives' share of a
step, and the CPU backend's own summation-order noise that tests/test_tensor_parallel.py's bounds
come from.

Run from the checkout root (after ``scripts/dev-build``)::

    PYTHONPATH=python python benches/bench_tensor_parallel.py                 # speed, 0.5B, TP = 1, 2, 4
    PYTHONPATH=python python benches/bench_tensor_parallel.py --noise         # noise vs TP 2, 3, 4, 0.5B
    PYTHONPATH=python python benches/bench_tensor_parallel.py --noise --model qwen2.5-coder-1.5b-instruct-q4_k_m
    PYTHONPATH=python python benches/bench_tensor_parallel.py --moe --moe-layers 1 --threads 1 --tp 1 2 3   # qwen3moe
    PYTHONPATH=python python benches/bench_tensor_parallel.py --moe --moe-layers 1 --threads 1 --moe-ff 1024 --tp 1 2 4

Speed: through ``fak._native.EngineCore`` directly, greedy, prefix cache off, ``--threads`` threads in
all (divided among the shards' pools): prefill of one ``--prompt``-token prompt, decode of
``--decode`` tokens for 1 sequence and for 8 at once; tok/s on the wall clock and per process
CPU-second, and from the engine's counters the seconds shard 0 spent in the collectives (two
all-reduces per layer, the logits gather) and, of those, waiting at their barriers for the other
shards (imbalance and scheduling, not data movement). Every configuration runs ``--rounds`` times;
the best round is reported (the machine is shared). Prints a markdown table and the machine
(``/proc/cpuinfo`` model name, logical cores, load average before and after).

MoE (``--moe``): a ``qwen3moe`` model with the layers of Qwen3-Coder-30B-A3B (n_embd 2048, 32 query
heads of 128 over 4 KV heads, 128 experts, 8 per token, ``--moe-ff`` columns each: 768 as the real
model, 1024 to split evenly 4 ways), ``--moe-layers`` of them, Q4_K_M, and the synthetic tokenizer's
704-token vocabulary (so the step is the layers, not the LM head), written by ``fak.synth`` into a
temporary folder. Besides the rates it reads, after every engine step, each shard's CPU time from its
pool's threads (``/proc/self/task/*/schedstat``, threads ``fak-tp{rank}-*``, nanoseconds): the
"critical path" is the sum over steps of the busiest shard's time, what a step would take with a
core for each shard (the others wait for the busiest at the all-reduces; their copies aside), and
much less disturbed by the machine's other load than the wall clock. With ``--moe-layers 1`` a step
is one layer, so a shard that is busiest in one layer cannot hide behind another in the next. Each
TP > 1 runs with every ``--moe-split`` (``FAK_TP_MOE``: ``experts``, whole experts per shard;
``columns``, columns of every expert), the rounds interleaved.

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
    m = _native.EngineCore(str(path), backend="cpu", n_ctx=n_prompt + n_decode + 8, threads=threads, max_batch=8,
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


def shard_cpu_seconds() -> dict[int, float]:
    """CPU seconds so far of each tensor-parallel shard's pool threads (``fak-tp{rank}-{i}``), by
    rank; ``{-1: seconds}`` of the one-shard engine pool (``fak-cpu-*``). From the scheduler's
    nanosecond run time of each thread (``/proc/self/task/*/schedstat``)."""
    out: dict[int, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue  # the thread ended
        if comm.startswith("fak-tp"):
            rank = int(comm[6:].split("-")[0])
        elif comm.startswith("fak-cpu-"):
            rank = -1
        else:
            continue
        out[rank] = out.get(rank, 0.0) + ns * 1e-9
    if any(r >= 0 for r in out):
        out.pop(-1, None)  # the engine's own pool only samples then
    return out


def write_moe_model(folder: Path, n_ff_exp: int, n_layer: int) -> Path:
    """The layers of Qwen3-Coder-30B-A3B (PRESETS["qwen3-coder-30b-a3b-q4_k_m"]) with ``n_ff_exp``
    columns per expert, ``n_layer`` of them, Q4_K_M, the synthetic 704-token vocabulary."""
    from fak.synth import write_tiny_model
    return write_tiny_model(folder / f"qwen3moe-a3b-layers-{n_layer}x-ff{n_ff_exp}.gguf", "qwen3moe", n_layer=n_layer,
                            n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128, n_expert_used=8,
                            n_ff_exp=n_ff_exp, weight_type="Q4_K_M")


def run_moe_once(path: Path, tp: int, threads: int, n_prompt: int, n_decode: int) -> dict:
    m = _native.EngineCore(str(path), backend="cpu", n_ctx=n_prompt + n_decode + 32, threads=threads, max_batch=8,
                      prefix_cache=False, tensor_parallel=tp, kv_cache_tokens=8 * (n_prompt + n_decode + 32))
    vocab = m.n_vocab
    ids = lambda n, seed: [int(t) for t in np.random.default_rng(seed).integers(10, vocab, size=n)]  # noqa: E731
    out: dict = {"held": [s["experts"] or s["ffn"] for s in m.shard_plan]}

    def measure(name: str, n_tokens_of) -> None:  # type: ignore[no-untyped-def]
        m.reset_stats()
        t0, c0 = time.perf_counter(), time.process_time()
        n, crit, shards = 0, 0.0, None
        s0 = shard_cpu_seconds()
        while steps := m.step():
            s1 = shard_cpu_seconds()
            step = [s1.get(r, 0.0) - s0.get(r, 0.0) for r in sorted(s1)]
            crit += max(step)  # the step's busiest shard: the others wait for it
            shards = step if shards is None else [a + b for a, b in zip(shards, step)]
            n += n_tokens_of(steps)
            s0 = shard_cpu_seconds()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        st = m.stats()
        out[name] = {"tokens": n, "tok_s": n / wall, "tok_cpu_s": n / cpu, "shard_cpu_s": shards,
                     "tok_per_crit_s": n / max(crit, 1e-9),
                     "coll_share": st["tp_collective_seconds"] / wall,
                     "coll_wait_share": st["tp_collective_wait_seconds"] / wall}

    m.add_sequence(0, ids(n_prompt, 0), {"temperature": 0.0, "max_tokens": 1})
    measure("prefill", lambda steps: n_prompt)
    for batch in (1, 8):
        for i in range(batch):
            m.add_sequence(100 + i, ids(16 + i, 1 + i), {"temperature": 0.0, "max_tokens": n_decode + 1})
        m.step()  # their prefill
        measure(f"decode{batch}", len)
    return out


def moe_speed(args: argparse.Namespace) -> None:
    splits = args.moe_split
    with tempfile.TemporaryDirectory() as d:
        path = write_moe_model(Path(args.moe_dir or d), args.moe_ff, args.moe_layers)
        before = machine()
        configs = [(tp, split) for tp in args.tp for split in (splits if tp > 1 else ["-"])]
        best: dict = {}
        # rounds interleave the configurations, so that a change in the machine's load touches all
        for _ in range(args.rounds):
            for tp, split in configs:
                if split != "-":
                    os.environ["FAK_TP_MOE"] = split
                r = run_moe_once(path, tp, args.threads, args.prompt, args.decode)
                key = (tp, split)
                if key not in best or r["decode1"]["tok_per_crit_s"] > best[key]["decode1"]["tok_per_crit_s"]:
                    best[key] = r
                print(json.dumps({"tp": tp, "split": split, **r}), file=sys.stderr)
    after = machine()
    print(f"machine: {before['cpu']}, {before['logical_cores']} logical cores, SIMD {before['simd']}, "
          f"{args.threads} threads; load average (1 min) {before['loadavg_1m']} before, {after['loadavg_1m']} after")
    print(f"model: {path.name} (n_ff_exp {args.moe_ff}, {args.moe_layers} layers); prefill {args.prompt} tokens; "
          f"decode {args.decode} tokens per sequence; best of {args.rounds} interleaved rounds by batch-1 tok/s on "
          "the critical path\n")
    print("| TP | MoE split | per shard | phase | tok/s (wall) | tok/CPU-s | shards' CPU s (sum) | critical path s "
          "(Σ steps' busiest shard) | tok/s on the critical path | collectives (wait) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for tp, split in configs:
        r = best[(tp, split)]
        held = "all" if tp == 1 else "/".join(f"{b - a}" for a, b in r["held"])
        held += "" if tp == 1 else (" experts" if split == "experts" else " columns")
        for phase in ("prefill", "decode1", "decode8"):
            p = r[phase]
            sh = p["shard_cpu_s"]
            print(f"| {tp} | {split} | {held} | {phase} | {p['tok_s']:.1f} | {p['tok_cpu_s']:.1f} | "
                  f"{' / '.join(f'{x:.3f}' for x in sh)} ({sum(sh):.3f}) | {p['tokens'] / p['tok_per_crit_s']:.3f} | "
                  f"{p['tok_per_crit_s']:.1f} | {100 * p['coll_share']:.1f} % ({100 * p['coll_wait_share']:.1f} %) |")


def dump_logits(path: Path, tp: int, out: str) -> None:
    tok = Tokenizer.from_gguf_metadata(read_gguf_metadata(path))
    m = _native.EngineCore(str(path), backend="cpu", n_ctx=512, max_batch=4, tensor_parallel=tp)
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
    ap.add_argument("--moe", action="store_true", help="speed of a qwen3moe model with Qwen3-Coder-30B-A3B's layers")
    ap.add_argument("--moe-ff", type=int, default=768, help="--moe: columns per expert (n_ff_exp)")
    ap.add_argument("--moe-layers", type=int, default=4, help="--moe: layers")
    ap.add_argument("--moe-dir", help="--moe: write the model here (kept) instead of a temporary folder")
    ap.add_argument("--moe-split", nargs="+", default=["experts", "columns"], choices=["experts", "columns"],
                    help="--moe: the MoE splits to run at TP > 1 (FAK_TP_MOE)")
    ap.add_argument("--dump-logits", help=argparse.SUPPRESS)
    ap.add_argument("--dump-tp", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.tp = args.tp or ([2, 3, 4] if args.noise else [1, 2, 4])
    if args.dump_logits:
        dump_logits(real_model(args.model), args.dump_tp, args.dump_logits)
    elif args.noise:
        noise(args)
    elif args.moe:
        moe_speed(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
