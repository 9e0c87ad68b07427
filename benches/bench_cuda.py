"""fak's CUDA backend speed on the GPU machine, beside llama.cpp (CUDA build) in the same run.

Measured through the engine a user drives (``fak._native.EngineCore``, backend ``cuda``):

- decode: one sequence, 128 greedy tokens after a context of 0, 8192 or 32768 tokens; reported as
  ``step`` (wall time of ``EngineCore.step()``, sampling on the CPU included) and ``forward`` (the
  same minus the sampler's time: the forward pass, the CUDA graph replay and the copy of the
  logits to the host — what llama-bench's ``tg`` measures);
- prefill: a prompt of 512 or 8192 tokens (the engine's 512-token chunks), time to the first
  token;
- VRAM held by fak by kind (weights, KV cache, activations) and in total (``nvidia-smi``).

Each figure is set beside llama-bench's (``-p 512,8192``, ``-n 128``, ``-d 0,8192,32768``, flash
attention on, all layers on the GPU) on the same GGUF file, and beside the memory roofline of
decode: tok/s = copy bandwidth / bytes read per token (every weight matrix once, plus the K/V
of the context), with the copy bandwidth measured in the same run (device-to-device copy of
2 GiB through PyTorch, bytes read + written).

Run on the GPU machine (with ``fak`` importable: the wheel installed, or ``PYTHONPATH=python``)::

    python benches/bench_cuda.py --model m.gguf --label "1.5B" [--llama-bench DIR/llama-bench]
        [--json out.json]

``--yarn 4,32768`` measures a copy of the file that declares YaRN RoPE scaling (factor 4 over an
original context of 32768, as Qwen2.5's model cards give it for 128k; ``fak.synth.edit.with_yarn``):
fak and llama-bench, which has no scaling flags, both read the settings from that file, e.g.
``--depths 32768,65536,131072 --prefills 512``.

The pytest-benchmark entry (``test_decode_step``) times single decode steps of the model named by
``FAK_BENCH_MODEL``. Results: ``benches/results/cuda.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from fak import _native
from fak.gguf import GGUFFile

N_DECODE = 128


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written), median of 20 copies of 2 GiB."""
    import torch

    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / float(np.median(times))


def bytes_per_token(path: str) -> tuple[int, int]:
    """(weight bytes one decode token reads, KV bytes per token of context). A mixture-of-experts
    layer's stacked experts (``*_exps``) count with ``expert_used_count / expert_count`` of their
    bytes: one token reads only its chosen experts' matrices."""
    with GGUFFile(path) as f:
        names = {t.name: t for t in f.tensors}
        md = f.metadata
        arch = md["general.architecture"]
        n_layer = int(md[f"{arch}.block_count"])
        n_head = int(md[f"{arch}.attention.head_count"])
        n_kv = int(md[f"{arch}.attention.head_count_kv"])
        n_embd = int(md[f"{arch}.embedding_length"])
        head_dim = int(md.get(f"{arch}.attention.key_length", n_embd // n_head))
        used = int(md.get(f"{arch}.expert_used_count", 1))
        n_exp = int(md.get(f"{arch}.expert_count", 1))
    tied = "output.weight" not in names
    w = sum(t.n_bytes * (used / n_exp if "_exps." in n else 1) for n, t in names.items() if n != "token_embd.weight" or tied)
    w = int(w)
    return w, n_layer * n_kv * head_dim * 2 * 2


def nvidia_smi_used() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0]) * 2**20
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def decode(model: _native.EngineCore, n_vocab: int, depth: int, rng: np.random.Generator) -> dict:
    """128 greedy decode steps of one sequence after a prompt of max(depth, 1) tokens."""
    prompt = rng.integers(0, n_vocab, max(depth, 1)).tolist()
    model.add_sequence(1, prompt, {"temperature": 0.0})
    while True:  # prefill (chunked) until the first token
        if model.step():
            break
    model.reset_stats()
    t0 = time.perf_counter()
    for _ in range(N_DECODE):
        model.step()
    wall = time.perf_counter() - t0
    s = model.stats()
    model.remove_sequence(1)
    fwd = s["decode_seconds"] - s["sample_seconds"]
    return {"depth": depth, "tokens": s["decode_tokens"], "step_tok_s": N_DECODE / wall, "forward_tok_s": s["decode_tokens"] / fwd,
            "sample_ms": 1e3 * s["sample_seconds"] / max(s["decode_tokens"], 1)}


def prefill(model: _native.EngineCore, n_vocab: int, n: int, rng: np.random.Generator, reps: int = 3) -> dict:
    best = float("inf")
    for r in range(reps):
        prompt = rng.integers(0, n_vocab, n).tolist()
        t0 = time.perf_counter()
        model.add_sequence(10 + r, prompt, {"temperature": 0.0})
        while not model.step():
            pass
        best = min(best, time.perf_counter() - t0)
        model.remove_sequence(10 + r)
    return {"n": n, "tok_s": n / best}


def run_fak(path: str, depths: list[int], prefills: list[int]) -> dict:
    rng = np.random.default_rng(0)
    n_ctx = max(depths + prefills) + N_DECODE + 64
    out: dict = {"decode": [], "prefill": []}
    mem0 = _native.cuda_memory()
    m = _native.EngineCore(path, backend="cuda", n_ctx=n_ctx, kv_cache_tokens=n_ctx, max_batch=1)
    mem = _native.cuda_memory()
    out["vram"] = {k: mem[k] - mem0.get(k, 0) for k in mem}
    out["vram"]["nvidia_smi_used"] = nvidia_smi_used()
    n_vocab = m.n_vocab
    out["rope"] = {k: m.config.get(k) for k in ("rope_scaling", "rope_scale", "rope_orig_ctx", "rope_ext_factor")}
    decode(m, n_vocab, 64, rng)  # warm-up: kernels, graph capture
    for d in depths:
        out["decode"].append(decode(m, n_vocab, d, rng))
    for n in prefills:
        prefill(m, n_vocab, 512, rng, reps=1)
        out["prefill"].append(prefill(m, n_vocab, n, rng))
    del m
    os.environ["FAK_CUDA_GRAPHS"] = "0"
    try:
        m = _native.EngineCore(path, backend="cuda", n_ctx=4096, kv_cache_tokens=4096, max_batch=1)
        decode(m, n_vocab, 64, rng)
        out["decode_no_graphs"] = decode(m, n_vocab, 0, rng)
        del m
    finally:
        os.environ.pop("FAK_CUDA_GRAPHS", None)
    return out


def run_peer(bin_path: str, path: str, depths: list[int], prefills: list[int]) -> dict:
    """llama-bench on the same file: prefill (pp) at depth 0, decode (tg128) at each depth."""
    res: dict = {"decode": {}, "prefill": {}}
    cmds = [
        [bin_path, "-m", path, "-ngl", "99", "-fa", "1", "-p", ",".join(map(str, prefills)), "-n", "0", "-r", "2", "-o", "json"],
        [bin_path, "-m", path, "-ngl", "99", "-fa", "1", "-p", "0", "-n", str(N_DECODE), "-d", ",".join(map(str, depths)), "-r", "2", "-o", "json"],
    ]
    logs = []
    for cmd in cmds:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        logs.append(r.stderr[-2000:])
        if r.returncode != 0:
            res["error"] = f"{' '.join(cmd)} failed: {r.stderr[-1500:]}"
            continue
        for row in json.loads(r.stdout):
            if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
                res["prefill"][row["n_prompt"]] = row["avg_ts"]
            elif row.get("n_gen", 0) > 0:
                res["decode"][row.get("n_depth", 0)] = row["avg_ts"]
        res.setdefault("build", json.loads(r.stdout)[0].get("build_commit") if r.stdout.strip() else None)
    return res


def table(label: str, fak: dict, peer: dict | None, bw: float | None, w_bytes: int, kv_tok: int) -> str:
    lines = [f"### {label}", "", "| measurement | fak tok/s | llama.cpp tok/s | fak / llama.cpp | roofline tok/s | fak / roofline |", "|---|---:|---:|---:|---:|---:|"]
    for d in fak["decode"]:
        depth = d["depth"]
        roof = bw / (w_bytes + kv_tok * depth) if bw else None
        p = (peer or {}).get("decode", {}).get(depth)
        for kind in ("forward", "step"):
            v = d[f"{kind}_tok_s"]
            lines.append(f"| decode tg{N_DECODE} @ ctx {depth} ({kind}) | {v:.1f} | {p or '-'} | {v / p:.2f} |" if p else f"| decode tg{N_DECODE} @ ctx {depth} ({kind}) | {v:.1f} | - | - |")
            lines[-1] += f" {roof:.0f} | {v / roof:.2f} |" if roof else " - | - |"
    for pf in fak["prefill"]:
        p = (peer or {}).get("prefill", {}).get(pf["n"])
        lines.append(f"| prefill pp{pf['n']} | {pf['tok_s']:.0f} | {p or '-'} | " + (f"{pf['tok_s'] / p:.2f} |" if p else "- |") + " - | - |")
    if "decode_no_graphs" in fak:
        lines.append(f"| decode @ ctx 0, CUDA graphs off (forward) | {fak['decode_no_graphs']['forward_tok_s']:.1f} | | | | |")
    v = fak["vram"]
    lines += ["", f"VRAM held by fak: weights {v['weights'] / 2**20:.0f} MiB, KV cache {v['kv_cache'] / 2**20:.0f} MiB, "
                  f"activations {v['activations'] / 2**20:.0f} MiB; nvidia-smi used {((v.get('nvidia_smi_used') or 0) / 2**20):.0f} MiB",
              f"Bytes per decode token: weights {w_bytes / 1e6:.1f} MB + KV {kv_tok} B per context token; copy bandwidth {bw / 1e12 if bw else 0:.2f} TB/s"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", default=None)
    ap.add_argument("--llama-bench", default=None, help="path of llama-bench (CUDA build)")
    ap.add_argument("--depths", default="0,8192,32768")
    ap.add_argument("--prefills", default="512,8192")
    ap.add_argument("--json", default=None)
    ap.add_argument("--yarn", default=None, metavar="FACTOR,ORIG_CTX",
                    help="measure a copy of the model that declares YaRN scaling (written beside it)")
    a = ap.parse_args()
    depths = [int(x) for x in a.depths.split(",")]
    prefills = [int(x) for x in a.prefills.split(",")]
    info = _native.cuda_info(load_kernels=True)
    try:
        bw = copy_bandwidth()
    except Exception as e:  # noqa: BLE001
        print(f"copy bandwidth not measured: {e}", file=sys.stderr)
        bw = None
    w_bytes, kv_tok = bytes_per_token(a.model)
    rope = None
    if a.yarn:
        from fak.synth.edit import with_yarn

        factor, orig = a.yarn.split(",")
        src = Path(a.model)
        a.model = str(with_yarn(src, src.with_name(f"{src.stem}.yarn{factor}x{orig}.gguf"), float(factor), int(orig)))
        rope = {"scaling": "yarn", "factor": float(factor), "orig_ctx": int(orig)}
    fak = run_fak(a.model, depths, prefills)
    peer = run_peer(a.llama_bench, a.model, depths, prefills) if a.llama_bench else None
    label = a.label or Path(a.model).name
    if rope:
        label += f" (YaRN x{rope['factor']:g} over {rope['orig_ctx']})"
    result = {"label": label, "model": a.model, "device": info.get("device"), "driver": info.get("driver_version"),
              "kernel_images": info.get("kernel_images"), "copy_bandwidth": bw, "weight_bytes": w_bytes,
              "kv_bytes_per_token": kv_tok, "rope": rope, "fak": fak, "llama_cpp": peer, "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    print(table(label, fak, peer, bw, w_bytes, kv_tok))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1, default=str))


def test_decode_step(benchmark) -> None:  # type: ignore[no-untyped-def]
    """pytest-benchmark: one decode step (forward + sampling) of FAK_BENCH_MODEL on the GPU."""
    import pytest

    path = os.environ.get("FAK_BENCH_MODEL")
    if not path or not _native.cuda_available():
        pytest.skip("set FAK_BENCH_MODEL and run on a GPU machine")
    m = _native.EngineCore(path, backend="cuda", n_ctx=2048, max_batch=1)
    m.add_sequence(1, [1, 2, 3, 4], {"temperature": 0.0})
    m.step()
    benchmark(m.step)


if __name__ == "__main__":
    main()
