"""Batched decode on the GPU: fak (``_native.EngineCore``, backend ``cuda``) beside llama.cpp's
``llama-batched-bench`` (CUDA build) on the same GGUF file, in the same run.

For each number of sequences N (default 1, 8, 16, 32, 64, 128, 256): N random 512-token prompts
are added at once and the engine steps until every sequence has its first token (prefill, the
forwards of up to 4096 rows; sequences prefilled early already decode meanwhile, as continuous
batching does); then 128 steps are timed in which every sequence decodes one token each step.
Reported: decode tok/s of all sequences (tokens returned / wall time of the 128 steps), the
tokens returned against the N·128 expected, the step's wall time split into forward
(``decode_seconds − sample_seconds`` of the engine's stats) and the rest (greedy read-back, token
bookkeeping, Python), and the prefill rate (N·512 / time to the last first token).

n_ctx is sized so that no sequence reaches it inside the window (a sequence at n_ctx is finished
by the engine — before, it was left unscheduled: the cause of the missing tokens of the first
measurement, see docs/cuda-notes.md), the KV cache holds every sequence whole, max_batch = N.
``--temperature T`` (> 0) samples instead of the GPU's greedy argmax, by default on the device
(``engine/device_sample.rs``: the top-256 candidates, penalties and whole-row draws on the GPU,
the token finished on the host from them); ``--host-sampling`` copies every logits row back and
samples on the host instead (``FAK_DEVICE_SAMPLING=0``, the path before device sampling), and
``--sampling JSON`` adds settings (``'{"top_p": 0.95}'``). llama-batched-bench samples nothing, so
the ratio to it then includes fak's sampling.

The peer: ``llama-batched-bench -m FILE -ngl 99 -fa on -npp 512 -ntg 128 -npl 1,8,...
-c N·640 --output-format jsonl`` (S_TG: decode tok/s of all sequences).

Run on the GPU machine::

    python benches/bench_cuda_batched.py --model m.gguf --label "1.5B twin" \\
        [--llama-batched-bench DIR/llama-batched-bench] [--json out.json] [--seqs 1,8,16]
        [--fak-json earlier.json]   # the peer only, beside fak's results of an earlier run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from fak import _native

PROMPT = 512
STEPS = 128


def run_fak(path: str, n: int, rng: np.random.Generator, temperature: float = 0.0,
            extra: dict | None = None) -> dict:
    # Prefill in forwards of up to 4096 rows (llama-batched-bench prefills in 2048-token batches);
    # sequences prefilled first decode while later ones prefill: up to ~N·512/(rows − N) steps.
    rows = max(512, min(4096, n * PROMPT))
    prefill_steps = int(np.ceil(n * PROMPT / max(rows - n, 256))) + 8
    n_ctx = PROMPT + STEPS + prefill_steps + 64
    m = _native.EngineCore(path, backend="cuda", n_ctx=n_ctx, kv_cache_tokens=n * n_ctx, max_batch=n, max_tokens_per_step=rows)
    n_vocab = m.n_vocab
    # Warm-up: kernels loaded, the decode graph of N rows captured (N short sequences).
    for i in range(n):
        m.add_sequence(10_000 + i, rng.integers(0, n_vocab, 8).tolist(), {"temperature": temperature, "seed": i, **(extra or {})})
    for _ in range(4):
        m.step()
    for i in range(n):
        m.remove_sequence(10_000 + i)
    m.reset_stats()
    t0 = time.perf_counter()
    for i in range(n):
        m.add_sequence(i, rng.integers(0, n_vocab, PROMPT).tolist(), {"temperature": temperature, "seed": i, **(extra or {})})
    have: set[int] = set()
    pre_steps = 0
    while len(have) < n:
        for sid, *_ in m.step():
            have.add(sid)
        pre_steps += 1
    t_prefill = time.perf_counter() - t0
    m.reset_stats()
    got = 0
    step_times = []
    t1 = time.perf_counter()
    for _ in range(STEPS):
        ts = time.perf_counter()
        got += len(m.step())
        step_times.append(time.perf_counter() - ts)
    wall = time.perf_counter() - t1
    s = m.stats()
    del m
    fwd = s["decode_seconds"] - s["sample_seconds"]
    return {
        "n_seqs": n, "n_ctx": n_ctx, "prefill_steps": pre_steps, "prefill_tok_s": n * PROMPT / t_prefill,
        "tokens": got, "expected": n * STEPS, "decode_tok_s": got / wall,
        "step_ms_median": 1e3 * float(np.median(step_times)), "forward_ms_per_step": 1e3 * fwd / STEPS,
        "host_ms_per_step": 1e3 * (wall - fwd) / STEPS, "preemptions": s["preemptions"],
        "sample_ms_per_step": 1e3 * s["sample_seconds"] / STEPS, "temperature": temperature,
        "sampling": extra or {}, "device_sampling": os.environ.get("FAK_DEVICE_SAMPLING", "") != "0",
        "device_sampled_rows": s["device_sampled_rows"], "device_sampled_host_rows": s["device_sampled_host_rows"],
    }


def run_peer(bin_path: str, path: str, seqs: list[int]) -> dict:
    cmd = [bin_path, "-m", path, "-ngl", "99", "-fa", "on", "-npp", str(PROMPT), "-ntg", str(STEPS),
           "-npl", ",".join(map(str, seqs)), "-c", str(max(seqs) * (PROMPT + STEPS) + 256), "--output-format", "jsonl"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    out: dict = {"cmd": " ".join(cmd), "rows": {}}
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            row = json.loads(line)
            out["rows"][row["pl"]] = {"S_TG": row["speed_tg"], "S_PP": row["speed_pp"]}
    if r.returncode != 0 or not out["rows"]:
        out["error"] = (r.stderr or r.stdout)[-2000:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", default=None)
    ap.add_argument("--seqs", default="1,8,16,32,64,128,256")
    ap.add_argument("--llama-batched-bench", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--fak-json", default=None, help="take fak's results from this earlier --json output; run the peer only")
    ap.add_argument("--peer-seqs", default=None, help="sequence counts for the peer (default: --seqs)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="fak's sampling temperature (0: greedy, decided on the GPU; > 0: sampled, on the device "
                         "unless --host-sampling; llama-batched-bench samples nothing)")
    ap.add_argument("--host-sampling", action="store_true",
                    help="sample on the host (every logits row copied back: FAK_DEVICE_SAMPLING=0)")
    ap.add_argument("--sampling", default=None, help="more sampling settings, a JSON object")
    a = ap.parse_args()
    if a.host_sampling:
        os.environ["FAK_DEVICE_SAMPLING"] = "0"
    extra = json.loads(a.sampling) if a.sampling else None
    seqs = [int(x) for x in a.seqs.split(",")]
    info = _native.cuda_info(load_kernels=True)
    rng = np.random.default_rng(0)
    fak = []
    if a.fak_json:
        with open(a.fak_json) as f:
            fak = json.load(f)["fak"]
    else:
        for n in seqs:
            r = run_fak(a.model, n, rng, a.temperature, extra)
            fak.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    if a.peer_seqs:
        seqs = [int(x) for x in a.peer_seqs.split(",")]
    peer = run_peer(a.llama_batched_bench, a.model, seqs) if a.llama_batched_bench else None
    label = a.label or a.model
    res = {"label": label, "model": a.model, "device": info.get("device"), "driver": info.get("driver_version"),
           "kernel_images": info.get("kernel_images"), "fak": fak, "llama_cpp": peer, "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    rows = (peer or {}).get("rows", {})
    print(f"### {label}")
    print("| sequences | fak decode tok/s | llama.cpp S_TG | ratio | tokens / expected | step ms | forward ms | host ms | fak prefill tok/s | llama.cpp S_PP |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in fak:
        p = rows.get(r["n_seqs"]) or rows.get(str(r["n_seqs"])) or {}
        tg, pp = p.get("S_TG"), p.get("S_PP")
        ratio = f"{r['decode_tok_s'] / tg:.2f}" if tg else "-"
        tg_s = f"{tg:,.0f}" if tg else "-"
        pp_s = f"{pp:,.0f}" if pp else "-"
        print(f"| {r['n_seqs']} | {r['decode_tok_s']:,.0f} | {tg_s} | {ratio} | {r['tokens']}/{r['expected']} | "
              f"{r['step_ms_median']:.2f} | {r['forward_ms_per_step']:.2f} | {r['host_ms_per_step']:.2f} | "
              f"{r['prefill_tok_s']:,.0f} | {pp_s} |")
    if peer and peer.get("error"):
        print("peer error:", peer["error"][-500:])


if __name__ == "__main__":
    main()
