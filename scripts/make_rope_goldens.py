#!/usr/bin/env python3
"""Write llama.cpp golden files for RoPE scaling (tests/test_rope_scaling.py).

llama.cpp runs through ``llama-cpp-python`` built for the CPU as ``scripts/make_goldens.py``
describes, with the same scaling settings fak is given:

- ``yarn``: YaRN as Qwen2.5's model cards set it for 128k (``rope_scaling_type`` YaRN,
  ``rope_freq_scale`` 1/4, ``yarn_orig_ctx`` 32768; ``yarn_ext_factor`` left at llama.cpp's
  default, which is 1 for YaRN), on short prompts and on a ~4k-token needle-in-a-haystack prompt;
- ``linear``: linear interpolation, ``rope_freq_scale`` 1/2, on short prompts;
- ``llama3``: Llama 3.1's NTK-by-parts on a tiny random-weight ``llama`` model (``fak.synth``)
  to which this script adds the ``rope_freqs.weight`` tensor llama.cpp's converter would write
  (factor 8, low 1, high 4, original 8192; computed here in numpy from the published formula),
  so llama.cpp runs it exactly as it runs Llama 3.1; fak is given the same model without the tensor
  and ``rope_scaling="llama3"`` (it computes the factors itself) and with it (the file's tensor).

Usage: scripts/make_rope_goldens.py MODEL_05B.gguf [--out tests/data/goldens] [--threads 2]

It writes ``rope-scaling.json`` (per case and prompt: the settings, llama.cpp's tokens, the top-10
next-token logits after prefill and the greedy 8-token continuation with its top-10 logits per
step) and ``rope-scaling.logits.npz`` (the full next-token logits after prefill, float16, key
``<case>__<prompt id>``). Re-running it regenerates the same files (the tiny model is rebuilt from
its seed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
N_GREEDY = 8
SHORT_IDS = ("code-fib", "code-class", "code-rust", "chat-explain")
NEEDLE = "The secret passphrase is violet-harbor-42."
LONG_TOKENS = 4096
#: Llama 3.1's rope_scaling (config.json of Llama-3.1-8B).
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
TINY_LLAMA = {"n_layer": 2, "n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": 512, "weight_type": "Q8_0",
              "seed": 14, "rope_freq_base": 500000.0, "ctx": 131072}


def topk(logits: np.ndarray, k: int = 10) -> dict:
    idx = np.argsort(-logits, kind="stable")[:k]
    return {"ids": [int(i) for i in idx], "logits": [float(logits[i]) for i in idx]}


def last_logits(llm) -> np.ndarray:
    n_vocab = llm.n_vocab()
    out = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).astype(np.float32)
    assert np.isfinite(out).all() and np.abs(out).max() > 0, "llama.cpp returned no logits"
    return out


def long_prompt(llm, prompts: list[dict], n_tokens: int = LONG_TOKENS) -> list[int]:
    """A ChatML needle-in-a-haystack prompt of about LONG_TOKENS tokens: the needle, then the golden
    prompts' code as filler, then the question."""
    filler = "\n\n".join(p["text"] for p in prompts if p["kind"] == "code")
    head = f"<|im_start|>user\n{NEEDLE}\n\nHere is some code to ignore:\n\n"
    tail = "\n\nWhat is the secret passphrase? Answer with the passphrase only.<|im_end|>\n<|im_start|>assistant\n"
    n_fixed = len(llm.tokenize((head + tail).encode(), add_bos=True, special=True))
    body, n_filler = "", len(llm.tokenize(filler.encode(), add_bos=False, special=False))
    for _ in range(max(1, (n_tokens - n_fixed) // max(n_filler, 1))):
        body += filler + "\n\n"
    return llm.tokenize((head + body + tail).encode(), add_bos=True, special=True)


def run_prompt(llm, toks: list[int]) -> tuple[dict, np.ndarray]:
    t0 = time.perf_counter()
    llm.reset()
    llm.eval(toks)
    first = last_logits(llm)
    steps, cur = [], first
    for _ in range(N_GREEDY):
        tok = int(np.argmax(cur))
        steps.append({"token": tok, "top10": topk(cur)})
        llm.eval([tok])
        cur = last_logits(llm)
    rec = {"prompt_tokens": [int(t) for t in toks], "top10": topk(first),
           "greedy": [s["token"] for s in steps], "greedy_steps": steps,
           "greedy_text": llm.detokenize([s["token"] for s in steps]).decode("utf-8", "replace"),
           "seconds": round(time.perf_counter() - t0, 3)}
    return rec, first


def llama3_freq_factors(n_rot: int, base: float) -> np.ndarray:
    """Llama 3.1's per-pair frequency factors (Meta's apply_scaling, as the GGUF converter writes
    rope_freqs.weight): 1 above the high-frequency wavelength, ``factor`` below the low one, a
    smooth blend between."""
    f, lo, hi, orig = (LLAMA3[k] for k in ("factor", "low_freq_factor", "high_freq_factor",
                                            "original_max_position_embeddings"))
    freqs = (1.0 / base ** (np.arange(0, n_rot, 2, dtype=np.float32) / n_rot)).astype(np.float32)
    out = []
    for freq in freqs.astype(np.float64):
        wavelen = 2 * math.pi / freq
        if wavelen < orig / hi:
            out.append(1.0)
        elif wavelen > orig / lo:
            out.append(f)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / f + smooth))
    return np.array(out, dtype=np.float32)


def tiny_llama3(dir_: Path) -> tuple[Path, Path]:
    """The tiny llama model (fak.synth, seeded) and a copy with rope_freqs.weight added."""
    from fak.synth import write_tiny_model
    from fak.synth.edit import copy_gguf

    plain = write_tiny_model(dir_ / "tiny-llama.gguf", "llama", **TINY_LLAMA)
    head_dim = TINY_LLAMA["n_embd"] // TINY_LLAMA["n_head"]
    ff = llama3_freq_factors(head_dim, TINY_LLAMA["rope_freq_base"])
    return plain, copy_gguf(plain, dir_ / "tiny-llama-rope-freqs.gguf", tensors={"rope_freqs.weight": ff})


def main() -> None:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="qwen2.5-coder-0.5b-instruct-mixed.gguf")
    ap.add_argument("--out", type=Path, default=REPO / "tests/data/goldens")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    prompts = {p["id"]: p for p in json.loads((REPO / "tests/data/golden_prompts.json").read_text())["prompts"]}
    base = {"n_batch": 512, "n_threads": a.threads, "n_threads_batch": a.threads, "logits_all": False,
            "verbose": False, "seed": 0}
    cases, logits = {}, {}

    def run_case(name: str, model: Path, settings: dict, fak_settings: dict, texts: dict, long: int = 0,
                 n_ctx: int = 1024) -> None:
        print(f"{name}:", file=sys.stderr)
        llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_ctx, **base, **settings)
        recs = {}
        todo = {pid: llm.tokenize(t.encode(), add_bos=True, special=True) for pid, t in texts.items()}
        if long:
            todo[f"needle-{long // 1024}k"] = long_prompt(llm, list(prompts.values()), long)
        for pid, toks in todo.items():
            rec, first = run_prompt(llm, toks)
            recs[pid] = rec
            logits[f"{name}__{pid}"] = first.astype(np.float16)
            print(f"  {pid:<12} {len(toks):5d} tokens {rec['seconds']:7.2f} s  {rec['greedy_text']!r}", file=sys.stderr)
        cases[name] = {"model": model.name, "llama_cpp": {k: v for k, v in settings.items()},
                       "fak": fak_settings, "records": recs}
        del llm

    short = {pid: prompts[pid]["text"] for pid in SHORT_IDS}
    y = llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN
    run_case("yarn", a.model, {"rope_scaling_type": y, "rope_freq_scale": 0.25, "yarn_orig_ctx": 32768},
             {"rope_scaling": "yarn", "rope_scale": 4.0, "yarn_orig_ctx": 32768}, short, long=LONG_TOKENS, n_ctx=8192)
    run_case("linear", a.model, {"rope_scaling_type": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
                                 "rope_freq_scale": 0.5},
             {"rope_scaling": "linear", "rope_scale": 2.0}, short)
    with tempfile.TemporaryDirectory() as tmp:
        _, with_freqs = tiny_llama3(Path(tmp))
        run_case("llama3", with_freqs, {}, {"rope_scaling": "llama3", "rope_scale": LLAMA3["factor"],
                                            "yarn_orig_ctx": LLAMA3["original_max_position_embeddings"]},
                 {pid: prompts[pid]["text"] for pid in ("code-fib", "code-class")}, long=2048, n_ctx=4096)
        cases["llama3"]["tiny_llama"] = TINY_LLAMA
        cases["llama3"]["model_sha256"] = hashlib.sha256(with_freqs.read_bytes()).hexdigest()
        cases["llama3"]["rope_scaling"] = LLAMA3
    data = {"cases": cases, "n_greedy": N_GREEDY, "llama_cpp_python": llama_cpp.__version__,
            "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "command": f"scripts/make_rope_goldens.py {a.model.name} --threads {a.threads}"}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "rope-scaling.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    np.savez_compressed(a.out / "rope-scaling.logits.npz", **logits)
    print(f"wrote {a.out}/rope-scaling.json and .logits.npz", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "python"))
    main()
