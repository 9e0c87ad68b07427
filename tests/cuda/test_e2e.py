"""End to end: the real 0.5B and 1.5B models on the CUDA backend against the CPU backend (the
reference, computed in the same run), on the fixed prompt set ``tests/data/golden_prompts.json``:
greedy 32-token continuations identical, and next-token logits after the prompt with cosine
≥ 0.9999 — with the decode CUDA graphs on and off (``FAK_CUDA_GRAPHS``).

Prompt token ids come from llama.cpp's goldens (``tests/data/goldens/<model>.json``,
``prompt_tokens``) when present, else from ``tests/data/golden_prompt_tokens.json`` (fak's
tokenizer, same Qwen2.5 vocabulary for both models).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from fak import _native

DATA = Path(__file__).resolve().parents[1] / "data"
N_GREEDY = 32
N_CTX = 4096
# Logits of prompts longer than this are compared through the greedy tokens only (a logits() call
# returns every position: [n_tokens, 151936] floats).
LOGITS_MAX_TOKENS = 600


def prompts(model_name: str) -> list[tuple[str, list[int]]]:
    spec = json.loads((DATA / "golden_prompts.json").read_text())["prompts"]
    goldens = DATA / "goldens" / f"{model_name}.json"
    from_goldens: dict[str, list[int]] = {}
    if goldens.exists():
        g = json.loads(goldens.read_text())
        recs = g.get("prompts", g.get("records", [])) if isinstance(g, dict) else g
        for r in recs:
            if isinstance(r, dict) and "prompt_tokens" in r:
                from_goldens[str(r.get("id"))] = [int(t) for t in r["prompt_tokens"]]
    fallback = json.loads((DATA / "golden_prompt_tokens.json").read_text())["tokens"]
    out = []
    for p in spec:
        ids = from_goldens.get(p["id"]) or fallback.get(p["id"])
        assert ids, f"no token ids for prompt {p['id']}"
        out.append((p["id"], ids))
    return out


def greedy(model: _native.Model, items: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
    """Greedy continuations of every prompt, run as concurrent sequences (continuous batching)."""
    out: dict[str, list[int]] = {}
    ids = {}
    for i, (name, toks) in enumerate(items):
        model.add_sequence(i, toks, {"temperature": 0.0})
        ids[i] = name
        out[name] = []
    while len(out) and any(len(v) < N_GREEDY for v in out.values()):
        for seq, tok, _lp, _top in model.step():
            name = ids[seq]
            out[name].append(tok)
            if len(out[name]) >= N_GREEDY:
                model.remove_sequence(seq)
    return out


@functools.lru_cache(maxsize=2)
def cpu_reference(path: str, model_name: str) -> tuple[dict[str, list[int]], dict[str, np.ndarray]]:
    items = prompts(model_name)
    m = _native.Model(path, backend="cpu", n_ctx=N_CTX, max_batch=len(items))
    toks = greedy(m, items)
    logits = {name: m.logits(ids)[-1].copy() for name, ids in items if len(ids) <= LOGITS_MAX_TOKENS}
    return toks, logits


MODELS = {"0.5b": ("model_05b", "qwen2.5-coder-0.5b-instruct-mixed"), "1.5b": ("model_15b", "qwen2.5-coder-1.5b-instruct-q4_k_m")}


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("graphs", ["on", "off"])
@pytest.mark.parametrize("model", ["0.5b", "1.5b"])
def test_cuda_matches_cpu(model: str, graphs: str, require_cuda: None, request: pytest.FixtureRequest) -> None:
    fixture, name = MODELS[model]
    path = str(request.getfixturevalue(fixture))
    ref_tokens, ref_logits = cpu_reference(path, name)
    items = prompts(name)
    old = os.environ.get("FAK_CUDA_GRAPHS")
    os.environ["FAK_CUDA_GRAPHS"] = "1" if graphs == "on" else "0"
    try:
        m = _native.Model(path, backend="cuda", n_ctx=N_CTX, max_batch=4)
    finally:
        if old is None:
            os.environ.pop("FAK_CUDA_GRAPHS", None)
        else:
            os.environ["FAK_CUDA_GRAPHS"] = old
    assert m.backend == "cuda"
    toks = greedy(m, items)
    report = []
    mismatched = []
    for pname, ids in items:
        a, b = ref_tokens[pname], toks[pname]
        if a != b:
            i = next(j for j in range(min(len(a), len(b))) if a[j] != b[j])
            lg = _native.Model.logits(m, ids + b[:i])[-1]
            top = np.sort(lg)[-2:]
            mismatched.append(f"{pname}: first difference at token {i} (cpu {a[i]}, cuda {b[i]}; cuda top-2 margin {top[1] - top[0]:.4f})")
    cos_min = 1.0
    low = []
    for pname, ids in items:
        if pname not in ref_logits:
            continue
        got = m.logits(ids)[-1].astype(np.float64)
        ref = ref_logits[pname].astype(np.float64)
        assert np.isfinite(got).all(), pname
        cos = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)))
        cos_min = min(cos_min, cos)
        report.append(f"{pname}: cosine {cos:.6f}")
        if cos < 0.9999:
            low.append(f"{pname}: next-token logits cosine {cos:.6f} < 0.9999")
    # Every prompt is checked before failing, so one run reports all of them.
    print(f"\n{model} graphs={graphs}: {len(items)} prompts, min cosine {cos_min:.6f}, {len(mismatched)} greedy mismatches")
    print("\n".join(report + mismatched))
    problems = low + [f"greedy continuation differs from CPU: {x}" for x in mismatched]
    assert not problems, f"{model} graphs={graphs}:\n" + "\n".join(problems)


@pytest.mark.cuda
def test_backend_selection(require_cuda: None, model_05b: Path) -> None:
    """backend="auto" picks the GPU here; the engine reports it; memory is reported per kind."""
    before = _native.cuda_memory()
    m = _native.Model(str(model_05b), backend="auto", n_ctx=512, max_batch=2)
    assert m.backend == "cuda"
    after = _native.cuda_memory()
    size = model_05b.stat().st_size
    # Weights stay in their block formats: the device copy is about the file's tensor data
    # (the file also holds the tokenizer's metadata).
    weights = after["weights"] - before["weights"]
    assert 0.9 * size <= weights <= size, (weights, size)
    # KV cache: n_ctx · min(max_batch, 8) tokens × 24 layers × 2 (K, V) × 2 KV heads × 64 × f16.
    assert after["kv_cache"] - before["kv_cache"] == 512 * 2 * 24 * 2 * 2 * 64 * 2
    assert after["activations"] > before["activations"]
