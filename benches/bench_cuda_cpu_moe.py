"""Experts in host memory (issue 27): fak's ``n_cpu_moe`` (``fak serve --n-cpu-moe N``: the first N
layers' experts stay in host memory and the CPU computes them) beside llama.cpp's
``llama-bench -ncmoe N`` on the same GGUF, at several N, with the GPU memory each holds — so that a
user with a 24 GB card can read off what to expect.

Per N: decode (``bench_cuda.decode``: 128 greedy tokens of one sequence, forward tok/s as
llama-bench's tg128) and prefill (``bench_cuda.prefill``: one ``--prefill``-token prompt, time to
the first token, best of 3 after a warm-up; with ``--upload-min-rows R`` (default 32, 0: off) the
host layers' experts are copied to the GPU and run there from R rows, ``ops/moe_host.rs``,
``FAK_MOE_UPLOAD_MIN_ROWS``), with ``--compare`` also the prefill with the host experts left
pageable (``FAK_MOE_HOST_PIN=0``: the driver stages each copy) and with the upload off (the CPU
computes the host experts at every row count, as before 2026-12-08);
fak's device memory by kind (``fak._native.cuda_memory()``) and ``nvidia-smi``'s used memory with
the model loaded; llama.cpp's peak ``nvidia-smi`` used memory while its run lasts (sampled every
0.2 s; the GPU is otherwise idle). The CPU that computes the offloaded experts is named in the
output (``benches/machine.py``): it decides the speed as much as the GPU does.

Run on the GPU machine::

    python benches/bench_cuda_cpu_moe.py --model twin.gguf --n-cpu-moe 0,12,24,48 \\
        [--upload-min-rows 32] [--compare] [--llama-bench DIR/llama-bench] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda import N_DECODE, decode, nvidia_smi_used, prefill  # noqa: E402
from machine import machine as describe  # noqa: E402

from fak import _native  # noqa: E402


def run_fak(path: str, n_cpu_moe: int, n_prefill: int) -> dict:
    """fak on CUDA with the first ``n_cpu_moe`` layers' experts on the host: ``{"n_cpu_moe",
    "host_expert_layers", "vram" (bytes by kind, fak._native.cuda_memory), "nvidia_smi_used"
    (bytes), "prefill_tok_s" (bench_cuda.prefill: best of 3 after a warm-up, time to the first
    token of an ``n_prefill``-token prompt), "decode_tok_s" (bench_cuda.decode: N_DECODE greedy
    steps of one sequence, forward tok/s as llama-bench's tg)}``."""
    rng = np.random.default_rng(0)
    n_ctx = n_prefill + N_DECODE + 64
    mem0 = _native.cuda_memory()
    m = _native.EngineCore(path, backend="cuda", n_ctx=n_ctx, kv_cache_tokens=n_ctx, max_batch=1, n_cpu_moe=n_cpu_moe)
    mem = _native.cuda_memory()
    out: dict = {"n_cpu_moe": n_cpu_moe, "host_expert_layers": m.config.get("host_expert_layers"),
                 "vram": {k: mem[k] - mem0.get(k, 0) for k in mem}, "nvidia_smi_used": nvidia_smi_used()}
    prefill(m, m.n_vocab, n_prefill, rng, reps=1)  # warm-up
    out["prefill_tok_s"] = prefill(m, m.n_vocab, n_prefill, rng)["tok_s"]
    out["decode_tok_s"] = decode(m, m.n_vocab, 0, rng)["forward_tok_s"]
    del m
    gc.collect()
    return out


def run_peer(bin_path: str, path: str, n_cpu_moe: int, n_prefill: int) -> dict:
    """``llama-bench -ngl 99 -fa 1 -ncmoe N -p n_prefill -n N_DECODE -r 2`` on the same file:
    ``{"n_cpu_moe", "nvidia_smi_peak" (bytes, sampled every 0.2 s), "command", "decode_tok_s",
    "prefill_tok_s"}`` (its ``avg_ts``), or ``"error"`` with its stderr's tail."""
    cmd = [bin_path, "-m", path, "-ngl", "99", "-fa", "1", "-ncmoe", str(n_cpu_moe), "-p", str(n_prefill), "-n", str(N_DECODE),
           "-r", "2", "-o", "json"]
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], nvidia_smi_used() or 0)
            time.sleep(0.2)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    done.set()
    t.join()
    out: dict = {"n_cpu_moe": n_cpu_moe, "nvidia_smi_peak": peak[0], "command": " ".join(cmd)}
    if r.returncode != 0:
        out["error"] = r.stderr[-1500:]
        return out
    for row in json.loads(r.stdout):
        if row.get("n_gen", 0) > 0:
            out["decode_tok_s"] = row["avg_ts"]
        elif row.get("n_prompt", 0) > 0:
            out["prefill_tok_s"] = row["avg_ts"]
    return out


def table(rows: list[dict], peers: dict[int, dict], n_prefill: int) -> str:
    """The markdown table of ``run_fak`` rows beside ``run_peer`` results by N (MiB, tok/s, ratios)."""
    mib = 2**20
    lines = [f"| n_cpu_moe | fak decode tok/s | llama.cpp tg | ratio | fak pp{n_prefill} tok/s | llama.cpp pp{n_prefill} | ratio "
             "| fak pp, pageable | fak pp, CPU experts | page-locked (MiB) "
             "| fak VRAM (weights / all, MiB) | nvidia-smi with fak loaded (MiB) | llama.cpp peak nvidia-smi (MiB) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a and b else "-"

    for f in rows:
        p = peers.get(f["n_cpu_moe"], {})
        v = f["vram"]
        total = v.get("total", 0)
        lines.append(
            f"| {f['n_cpu_moe']} | {f['decode_tok_s']:.1f} | {p.get('decode_tok_s', 0):.1f} | {ratio(f['decode_tok_s'], p.get('decode_tok_s'))} "
            f"| {f['prefill_tok_s']:.0f} | {p.get('prefill_tok_s', 0):.0f} | {ratio(f['prefill_tok_s'], p.get('prefill_tok_s'))} "
            f"| {f.get('prefill_tok_s_pageable', 0):.0f} | {f.get('prefill_tok_s_cpu', 0):.0f} | {v.get('host_experts_pinned', 0) // mib:,} "
            f"| {v.get('weights', 0) // mib:,} / {total // mib:,} | {(f['nvidia_smi_used'] or 0) // mib:,} | {p.get('nvidia_smi_peak', 0) // mib:,} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n-cpu-moe", default="0,12,24,48", help="comma list of N")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--llama-bench", default=None)
    ap.add_argument("--upload-min-rows", type=int, default=32, help="FAK_MOE_UPLOAD_MIN_ROWS for fak's rows (0: unset, the upload off)")
    ap.add_argument("--compare", action="store_true",
                    help="per N > 0 also the prefill with the host experts pageable (FAK_MOE_HOST_PIN=0) and with the upload off")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    ns = [int(x) for x in a.n_cpu_moe.split(",")]
    machine = describe()
    print(f"machine: {machine}", flush=True)
    rows = []
    def with_env(env: dict[str, str], n: int) -> dict:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return run_fak(a.model, n, a.prefill)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    upload = {"FAK_MOE_UPLOAD_MIN_ROWS": str(a.upload_min_rows)} if a.upload_min_rows > 0 else {}
    for n in ns:
        rows.append(with_env(upload, n))
        rows[-1]["upload_min_rows"] = a.upload_min_rows
        if a.compare and n > 0 and upload:
            rows[-1]["prefill_tok_s_pageable"] = with_env({**upload, "FAK_MOE_HOST_PIN": "0"}, n)["prefill_tok_s"]
            rows[-1]["prefill_tok_s_cpu"] = with_env({"FAK_MOE_UPLOAD_MIN_ROWS": str(2**62)}, n)["prefill_tok_s"]
        print(json.dumps(rows[-1]), flush=True)
    peers: dict[int, dict] = {}
    if a.llama_bench:
        for n in ns:
            peers[n] = run_peer(a.llama_bench, a.model, n, a.prefill)
            print(json.dumps(peers[n]), flush=True)
    print(table(rows, peers, a.prefill))
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": machine, "model": a.model, "fak": rows, "llama.cpp": list(peers.values())}, indent=1))


if __name__ == "__main__":
    main()
