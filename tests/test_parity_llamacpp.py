"""Parity of fak's CPU backend with llama.cpp on the real models (issue 3, "Parity with llama.cpp").

The goldens in ``tests/data/goldens/`` are written by ``scripts/make_goldens.py`` (llama.cpp through
``llama-cpp-python``, CPU). For every prompt of ``tests/data/golden_prompts.json`` they hold llama.cpp's
tokenization, the full next-token logits after prefill (float16, ``*.logits.npz``), and the greedy
32-token continuation with the top-10 logits at each step.

Issue 3 requires:
- tokenization identical on every prompt (asserted);
- next-token logits cosine >= 0.999 on every prompt (asserted);
- where a first token or a greedy continuation diverges, llama.cpp's two top logits at that step
  are within 1% of each other, a near tie (asserted);
- first-token argmax identical on every prompt, and greedy continuations identical on at least
  90% of prompts (asserted by ``test_exact_bars``).

fak's CPU backend computes what llama.cpp's x86 CPU build computes, bit for bit: the same
activation quantizers, ggml's f32 accumulation order in every quantized kernel (including the
repacked Q4_K GEMM/GEMV and the tiled Q6_K kernel, chosen per token from its position in
llama.cpp's 512-token ubatches), ggml's attention (tinyBLAS / ``ggml_vec_dot_f16``), softmax and SiLU
(``ggml_v_expf``) and GCC's FMA contraction of RoPE. Measured 2026-11-30 (x86 AVX-512 VNNI, Zen 4):
next-token logits equal to the float16 goldens on every prompt (cosine 0.99999998, the goldens'
float16 rounding), first tokens and greedy continuations identical on 24/24 prompts, both models.

The margins and cosines are printed (``pytest -s``) and written to ``benches/results/parity-*.json``
when ``FAK_PARITY_REPORT=1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from fak import _native
from fak.tokenizer import Tokenizer
from native_greedy import greedy_batched

GOLDENS = Path(__file__).parent / "data" / "goldens"
PROMPTS = json.loads((Path(__file__).parent / "data" / "golden_prompts.json").read_text())["prompts"]
REPORT_DIR = Path(__file__).resolve().parents[1] / "benches" / "results"


def _golden(model_path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    name = model_path.name.removesuffix(".gguf")
    data = json.loads((GOLDENS / f"{name}.json").read_text())
    with np.load(GOLDENS / f"{name}.logits.npz") as z:
        logits = {k: z[k].astype(np.float32) for k in z.files}
    return data, logits


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


@pytest.fixture(scope="module", params=["model_05b", "model_15b"])
def parity(request):
    path: Path = request.getfixturevalue(request.param)
    golden, golden_logits = _golden(path)
    assert [r["id"] for r in golden["records"]] == [p["id"] for p in PROMPTS], "goldens are stale: re-run scripts/make_goldens.py"
    tok = Tokenizer.from_gguf(path)
    model = _native.Model(str(path), backend="cpu", n_ctx=4096, threads=os.cpu_count())
    return path, golden, golden_logits, tok, model


def test_tokenization_identical(parity):
    _, golden, _, tok, _ = parity
    for p, rec in zip(PROMPTS, golden["records"]):
        assert tok.encode(p["text"], add_special=True, parse_special=True) == rec["prompt_tokens"], p["id"]


@pytest.fixture(scope="module")
def measured(parity):
    """Cosines, first-token agreement and greedy divergences of one model (computed once)."""
    path, golden, golden_logits, _, model = parity
    records = golden["records"]
    cosines, first_ok, first_margin = {}, {}, {}
    for rec in records:
        ours = model.logits(rec["prompt_tokens"])[-1]
        assert np.isfinite(ours).all(), rec["id"]
        cosines[rec["id"]] = _cosine(ours, golden_logits[rec["id"]])
        first_ok[rec["id"]] = int(np.argmax(ours)) == rec["greedy"][0]
        if not first_ok[rec["id"]]:
            top = rec["greedy_steps"][0]["top10"]["logits"]
            first_margin[rec["id"]] = abs(top[0] - top[1]) / max(abs(top[0]), 1e-6)

    n_new = golden["n_greedy"]
    conts = greedy_batched(model, [r["prompt_tokens"] for r in records], n_new)
    identical, divergences = 0, {}
    for rec, ours in zip(records, conts):
        ref = rec["greedy"]
        if ours[: len(ref)] == ref:
            identical += 1
            continue
        step = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
        top = rec["greedy_steps"][step]["top10"]["logits"]
        margin = abs(top[0] - top[1]) / max(abs(top[0]), 1e-6)
        divergences[rec["id"]] = {"step": step, "ours": ours[step], "llama.cpp": ref[step],
                                  "top2_rel_margin": margin}

    report = {"model": path.name, "cosine_min": min(cosines.values()), "cosines": cosines,
              "first_token_identical": sum(first_ok.values()), "greedy_identical": identical,
              "n_prompts": len(records), "first_token_margins": first_margin,
              "divergences": divergences}
    print(json.dumps(report, indent=1))
    if os.environ.get("FAK_PARITY_REPORT") == "1":
        REPORT_DIR.mkdir(parents=True, exist_ok=True)
        (REPORT_DIR / f"parity-{path.name.removesuffix('.gguf')}.json").write_text(json.dumps(report, indent=1) + "\n")

    return report


def test_next_token_logits_cosine(measured):
    assert measured["cosine_min"] >= 0.999, measured["cosines"]


def test_divergences_are_near_ties(measured):
    for pid, margin in measured["first_token_margins"].items():
        assert margin <= 0.01, ("first token", pid, margin)
    for pid, d in measured["divergences"].items():
        assert d["top2_rel_margin"] <= 0.01, (pid, d)


def test_exact_bars(measured):
    n = measured["n_prompts"]
    assert measured["first_token_identical"] == n, measured["first_token_margins"]
    assert measured["greedy_identical"] >= 0.9 * n, measured["divergences"]
