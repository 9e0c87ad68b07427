#!/usr/bin/env python3
"""Write llama.cpp golden files for the parity tests (tests/test_parity_llamacpp.py).

llama.cpp runs through the PyPI package ``llama-cpp-python`` built from its sdist for the CPU. On
these machines build it with AMX off (its AMX path segfaults here) and with AVX-VNNI (the VEX form)
off: these AMD EPYC (Zen 4) cores have AVX512-VNNI but not AVX-VNNI, and a build with
``-DGGML_AVX_VNNI=ON`` dies with SIGILL at the first matmul:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \
      -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=OFF" \
      pip install --no-binary :all: llama-cpp-python==0.3.36

Usage: scripts/make_goldens.py MODEL.gguf [MODEL.gguf ...] [--out tests/data/goldens] [--threads 2]

For each model and each prompt of tests/data/golden_prompts.json it records:
- ``prompt_tokens``: llama.cpp's tokenization (``add_special=True``, ``parse_special=True``);
- ``top10``: the 10 largest next-token logits after prefill (ids and values);
- ``greedy``: the greedy 32-token continuation, and at each step the top-10 logits;
and writes the full next-token logits after prefill as float16 in ``<model>.logits.npz`` (key = prompt
id) for the cosine check. Re-running the script regenerates the same files.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
N_GREEDY = 32


def topk(logits: np.ndarray, k: int = 10) -> dict:
    idx = np.argsort(-logits, kind="stable")[:k]
    return {"ids": [int(i) for i in idx], "logits": [float(logits[i]) for i in idx]}


def last_logits(llm) -> np.ndarray:
    """The logits of the last evaluated token, read from the llama.cpp context (llama-cpp-python
    0.3.x no longer copies them into ``Llama.scores`` unless ``logits_all`` is set)."""
    n_vocab = llm.n_vocab()
    out = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float32)
    assert np.isfinite(out).all() and np.abs(out).max() > 0, "llama.cpp returned no logits"
    return out


def run_model(model_path: Path, prompts: list[dict], threads: int) -> tuple[dict, dict]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=4096, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False, seed=0)
    records, logits_out = [], {}
    for p in prompts:
        t0 = time.perf_counter()
        toks = llm.tokenize(p["text"].encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(toks)
        first = last_logits(llm)
        logits_out[p["id"]] = first.astype(np.float16)
        steps, cur = [], first
        for _ in range(N_GREEDY):
            tok = int(np.argmax(cur))
            steps.append({"token": tok, "top10": topk(cur)})
            if llm.n_tokens + 1 >= llm.n_ctx():
                break
            llm.eval([tok])
            cur = last_logits(llm)
        records.append({
            "id": p["id"], "kind": p["kind"], "prompt_tokens": [int(t) for t in toks],
            "top10": topk(first), "greedy": [s["token"] for s in steps], "greedy_steps": steps,
            "greedy_text": llm.detokenize([s["token"] for s in steps]).decode("utf-8", "replace"),
            "seconds": round(time.perf_counter() - t0, 3),
        })
        print(f"  {p['id']:<16} {len(toks):5d} tokens  {records[-1]['seconds']:6.2f} s", file=sys.stderr)
    return {"records": records, "llama_cpp_python": llama_cpp.__version__}, logits_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--prompts", type=Path, default=REPO / "tests/data/golden_prompts.json")
    ap.add_argument("--out", type=Path, default=REPO / "tests/data/goldens")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    prompts = json.loads(a.prompts.read_text())["prompts"]
    a.out.mkdir(parents=True, exist_ok=True)
    for model in a.models:
        name = model.name.removesuffix(".gguf")
        print(f"{name}:", file=sys.stderr)
        data, logits = run_model(model, prompts, a.threads)
        data.update({
            "model": model.name, "n_greedy": N_GREEDY,
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "command": "scripts/make_goldens.py " + " ".join(str(m) for m in a.models),
        })
        (a.out / f"{name}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        np.savez_compressed(a.out / f"{name}.logits.npz", **logits)
        print(f"wrote {a.out / name}.json and .logits.npz", file=sys.stderr)


if __name__ == "__main__":
    main()
