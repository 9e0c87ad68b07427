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
       scripts/make_goldens.py --tiny [--synth-python PYTHON] [--out tests/data/goldens]

``--tiny`` makes the goldens of the tiny synthetic models of ``tests/data/tiny_goldens.json``
(qwen3, qwen3moe, and the Qwen3.5/3.6 hybrids qwen35, qwen35moe: architectures fak adds after
qwen2). Each model is written by
``fak.synth.write_tiny_model`` from the listed arguments and seed (in this process when ``fak``
imports here, else by ``--synth-python``, a Python that has fak installed), and the golden records
the file's sha256: the test rebuilds the file and checks the hash before comparing. The llama.cpp
build needs only its own venv then, e.g. ``/work/oracle-venv/bin/python scripts/make_goldens.py
--tiny --synth-python /work/venv/bin/python``. For these models the script also records:

- ``self_noise``: llama.cpp's own noise, the largest |difference| between the next-token logits
  after prefilling the prompt in one batch and after feeding it one token at a time (other kernels:
  GEMM against GEMV, other accumulation orders); the test's logit tolerance is a multiple of it;
- logits float32 (not float16: the tiny models' logits are small, f16 would round them by more than
  the noise), and with ``all_positions`` the logits of every prompt position (``<id>|all``);
- the prompts named by ``prompts`` (ids of ``--prompts``, or ``"all"``) and ``extra_prompts``
  (ids of ``tests/data/tiny_prompts.json``: conversations in the hybrids' own chat template, among
  them an agent conversation whose turns extend each other, all longer than one 512-token ubatch);
- with ``router``: llama.cpp's expert choice per layer and token, read from its graph through a
  ``cb_eval`` callback (the tensors ``ffn_moe_topk-<layer>``, and with ``full`` also
  ``ffn_moe_probs-<layer>``, the softmax it sorted), in ``<id>|topk|<layer>`` ([n_tokens,
  n_expert_used] int32, llama.cpp's order) and ``<id>|probs|<layer>`` ([n_tokens, n_expert]
  float32). The trace run asks for the outputs of every position, so the last layer's experts run
  for every token (llama.cpp otherwise computes the last layer only for the output rows);
- with ``trace`` (``{"prompt": ID, "tensors": [NAME, ...]}``): llama.cpp's intermediate tensors of
  that prompt's prefill, read through ``cb_eval`` (graph names ``NAME-<layer>``, e.g. the Gated
  DeltaNet's ``conv_output_silu``, ``gate``, ``beta_sigmoid``, its core output ``attn_output``,
  ``linear_attn_out``, each layer's ``l_out``), in ``<id>|trace|<NAME>|<layer>`` as
  ``[n_tokens, ...]`` float32 (ggml's dims reversed, the token axis first): for finding the first op
  where a reimplementation departs from llama.cpp.

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

import ctypes
import hashlib
import re
import subprocess
import tempfile
from collections.abc import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
N_GREEDY = 32
TINY_SPEC = REPO / "tests/data/tiny_goldens.json"
TINY_PROMPTS = REPO / "tests/data/tiny_prompts.json"


def topk(logits: np.ndarray, k: int = 10) -> dict:
    idx = np.argsort(-logits, kind="stable")[:k]
    return {"ids": [int(i) for i in idx], "logits": [float(logits[i]) for i in idx]}


def last_logits(llm) -> np.ndarray:
    """The logits of the last evaluated token, read from the llama.cpp context (llama-cpp-python
    0.3.x no longer copies them into ``Llama.scores`` unless ``logits_all`` is set;
    ``llama_get_logits_ith(-1)``: the last output row, also when every position is an output)."""
    n_vocab = llm.n_vocab()
    out = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).astype(np.float32)
    assert np.isfinite(out).all() and np.abs(out).max() > 0, "llama.cpp returned no logits"
    return out


def run_model(model_path: Path, prompts: list[dict], threads: int, *, tiny: bool = False,
              all_positions: bool = False) -> tuple[dict, dict]:
    """llama.cpp's tokens, logits and greedy continuation of ``model_path`` for each prompt.

    ``tiny``: logits kept as float32 and llama.cpp's own noise measured (``self_noise``: prefill
    in one batch against one token at a time). ``all_positions``: also every position's logits.
    """
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=4096, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=all_positions, verbose=False, seed=0)
    records, logits_out = [], {}
    for p in prompts:
        t0 = time.perf_counter()
        toks = llm.tokenize(p["text"].encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(toks)
        first = last_logits(llm)
        logits_out[p["id"]] = first if tiny else first.astype(np.float16)
        extra = {}
        if all_positions:
            n_vocab = llm.n_vocab()
            rows = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(toks), n_vocab)).astype(np.float32)
            assert np.array_equal(rows[-1], first), "all-position logits disagree with the last row"
            logits_out[f"{p['id']}|all"] = rows.copy()
        if tiny:
            llm.reset()
            for t in toks:
                llm.eval([t])
            one_by_one = last_logits(llm)
            extra["self_noise"] = float(np.abs(one_by_one - first).max())
            llm.reset()
            llm.eval(toks)
            assert np.array_equal(last_logits(llm), first), "llama.cpp is not deterministic on this prompt"
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
            "seconds": round(time.perf_counter() - t0, 3), **extra,
        })
        print(f"  {p['id']:<16} {len(toks):5d} tokens  {records[-1]['seconds']:6.2f} s", file=sys.stderr)
    return {"records": records, "llama_cpp_python": llama_cpp.__version__}, logits_out


# --- router trace (llama.cpp's graph through cb_eval) -------------------------------------------

class _GgmlTensor(ctypes.Structure):
    """ggml.h's ``struct ggml_tensor`` of llama-cpp-python 0.3.36 (GGML_MAX_DIMS 4,
    GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64), as scripts/llama_dump_intermediates.py."""


_GgmlTensor._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(_GgmlTensor) * 10), ("view_src", ctypes.POINTER(_GgmlTensor)),
    ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
    ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8),
]
_ROUTER_NAME = re.compile(r"^ffn_moe_(topk|probs)-(\d+)$")
_LAYER_NAME = re.compile(r"^(.+)-(\d+)$")


def _read_tensor(t: _GgmlTensor) -> np.ndarray:
    """A host tensor's data (F32 or I32) as numpy of shape ``ne[::-1]``, following its strides."""
    dtype, size = {0: (np.float32, 4), 26: (np.int32, 4)}[t.type]
    ne, nb = list(t.ne), list(t.nb)
    extent = sum((ne[i] - 1) * nb[i] for i in range(4)) + size
    buf = (ctypes.c_char * extent).from_address(t.data)
    return np.array(np.ndarray(shape=tuple(ne[::-1]), dtype=dtype, buffer=buf, strides=tuple(nb[::-1])))


def router_trace(model_path: Path, tokens: list[int], threads: int, want: set[str]) -> tuple[dict, np.ndarray]:
    """llama.cpp's router tensors for ``tokens`` (one decode, every position an output):
    ``{(kind, layer): array}`` with kind ``topk`` ([n_tokens, n_expert_used] int32) and, when
    ``"probs"`` is in ``want``, ``probs`` ([n_tokens, n_expert] float32); and the logits
    [n_tokens, n_vocab]. The context is configured as ``run_model``'s (flash attention off, F16 KV)."""
    def pick(name: str) -> tuple[str, int] | None:
        m = _ROUTER_NAME.match(name)
        return (m.group(1), int(m.group(2))) if m and m.group(1) in want else None
    seen, logits = graph_trace(model_path, tokens, threads, pick)
    return {key: a.reshape(len(tokens), -1) for key, a in seen.items()}, logits


def graph_trace(model_path: Path, tokens: list[int], threads: int,
                pick: Callable[[str], tuple[str, int] | None]) -> tuple[dict, np.ndarray]:
    """llama.cpp's graph tensors for ``tokens`` (one ``llama_decode``, every position an output,
    512-token ubatches): ``{(name, layer): array}`` for each tensor whose graph name ``pick`` maps to
    ``(name, layer)``, the ubatches' parts joined along the token axis (ggml's dims reversed, so
    ``[n_tokens, ...]``; F32 or I32); and the logits [n_tokens, n_vocab]. The context is configured as
    ``run_model``'s (flash attention off, F16 KV)."""
    import llama_cpp

    parts: dict[tuple[str, int], list[np.ndarray]] = {}

    @ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
    def callback(tp, ask, _user):  # type: ignore[no-untyped-def]
        t = ctypes.cast(tp, ctypes.POINTER(_GgmlTensor)).contents
        key = pick(t.name.decode())
        if ask:
            return key is not None
        if key is not None:  # one call per ubatch
            parts.setdefault(key, []).append(_read_tensor(t))
        return True

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), llama_cpp.llama_model_default_params())
    cp = llama_cpp.llama_context_default_params()
    # one llama_decode of the whole prompt, in llama.cpp's 512-token ubatches as run_model's
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 4096, 4096, 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.cb_eval, cp.cb_eval_user_data = callback, None
    if hasattr(cp, "flash_attn_type"):
        cp.flash_attn_type = 0
    ctx = llama_cpp.llama_init_from_model(model, cp)
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, i, 1, 1
            batch.seq_id[i][0] = 0
        rc = llama_cpp.llama_decode(ctx, batch)
        assert rc == 0, f"llama_decode returned {rc}"
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        logits = np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
                           for i in range(len(tokens))])
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    seen = {key: np.concatenate([_tokens_first(a) for a in arrs]) for key, arrs in parts.items()}
    assert all(len(a) == len(tokens) for a in seen.values()), "graph trace does not cover every token"
    return seen, logits


def _tokens_first(a: np.ndarray) -> np.ndarray:
    """A ubatch's part of a traced tensor with its token axis first: ggml's ``[..., n_tokens]``
    reversed (``[n_tokens, ...]``); a 3-D/4-D ``[..., n_tokens, 1]`` (one sequence) loses its
    leading 1s."""
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    return a


# --- tiny synthetic models ------------------------------------------------------------------------

def write_tiny(spec: dict, path: Path, synth_python: str | None) -> Path:
    """Write ``spec``'s model with ``fak.synth.write_tiny_model`` (here, or in ``synth_python``)."""
    if synth_python is None:
        from fak.synth import write_tiny_model
        return write_tiny_model(path, spec["arch"], **spec["args"])
    code = ("import json, sys; from fak.synth import write_tiny_model; "
            "s = json.loads(sys.argv[1]); write_tiny_model(sys.argv[2], s['arch'], **s['args'])")
    subprocess.run([synth_python, "-c", code, json.dumps(spec), str(path)], check=True)
    return path


def make_tiny_goldens(prompts: list[dict], out: Path, threads: int, synth_python: str | None,
                      only: list[str] | None) -> None:
    import llama_cpp

    specs = json.loads(TINY_SPEC.read_text())["models"]
    extra = {p["id"]: p for p in json.loads(TINY_PROMPTS.read_text())["prompts"]}
    by_id = {p["id"]: p for p in prompts}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            if only and spec["name"] not in only:
                continue
            path = write_tiny(spec, Path(tmp) / f"{spec['name']}.gguf", synth_python)
            chosen = prompts if spec["prompts"] == "all" else [by_id[i] for i in spec["prompts"]]
            chosen = chosen + [{k: extra[i][k] for k in ("id", "kind", "text")} for i in spec.get("extra_prompts", [])]
            print(f"{spec['name']} ({path.stat().st_size:,} bytes):", file=sys.stderr)
            data, logits = run_model(path, chosen, threads, tiny=True, all_positions=spec.get("all_positions", False))
            if spec.get("router"):
                want = {"topk", "probs"} if spec["router"] == "full" else {"topk"}
                for rec in data["records"]:
                    seen, rows = router_trace(path, rec["prompt_tokens"], threads, want)
                    # every position an output: the same graph as the all_positions run, bit for bit;
                    # otherwise the last layer runs on more rows than in run_model (other kernels)
                    if spec.get("all_positions"):
                        assert np.array_equal(rows, logits[f"{rec['id']}|all"]), f"{rec['id']}: trace logits differ"
                    rec["trace_logits_max_diff"] = float(np.abs(rows[-1] - logits[rec["id"]]).max())
                    layers = sorted({layer for _, layer in seen})
                    for (kind, layer), arr in seen.items():
                        logits[f"{rec['id']}|{kind}|{layer}"] = arr
                    rec["router_layers"] = layers
                    rec["experts_chosen"] = sorted({int(e) for (kind, _), a in seen.items() if kind == "topk"
                                                    for e in a.ravel()})
            if spec.get("trace"):
                names = set(spec["trace"]["tensors"])
                rec = next(r for r in data["records"] if r["id"] == spec["trace"]["prompt"])

                def pick(name: str) -> tuple[str, int] | None:
                    m = _LAYER_NAME.match(name)
                    return (m.group(1), int(m.group(2))) if m and m.group(1) in names else None
                seen, _ = graph_trace(path, rec["prompt_tokens"], threads, pick)
                for (name, layer), arr in sorted(seen.items()):
                    logits[f"{rec['id']}|trace|{name}|{layer}"] = arr.astype(np.float32)
                rec["trace"] = sorted(f"{name}|{layer}" for name, layer in seen)
            data.update({
                "model": f"{spec['name']}.gguf", "spec": spec, "n_greedy": N_GREEDY,
                "model_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "model_bytes": path.stat().st_size, "llama_cpp_python": llama_cpp.__version__,
                "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                "command": "scripts/make_goldens.py --tiny",
            })
            (out / f"{spec['name']}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
            np.savez_compressed(out / f"{spec['name']}.logits.npz", **logits)
            print(f"wrote {out / spec['name']}.json and .logits.npz", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--tiny", action="store_true", help="the tiny synthetic models of tests/data/tiny_goldens.json")
    ap.add_argument("--only", nargs="+", help="with --tiny: these model names only")
    ap.add_argument("--synth-python", help="with --tiny: a Python with fak installed, to write the models")
    ap.add_argument("--prompts", type=Path, default=REPO / "tests/data/golden_prompts.json")
    ap.add_argument("--out", type=Path, default=REPO / "tests/data/goldens")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if bool(a.models) == a.tiny:
        ap.error("give MODEL.gguf files or --tiny")
    prompts = json.loads(a.prompts.read_text())["prompts"]
    a.out.mkdir(parents=True, exist_ok=True)
    if a.tiny:
        synth_python = a.synth_python
        if synth_python is None:
            try:
                import fak.synth  # noqa: F401
            except ImportError:
                ap.error("fak does not import here: give --synth-python (a Python with fak installed)")
        make_tiny_goldens(prompts, a.out, a.threads, synth_python, a.only)
        return
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
