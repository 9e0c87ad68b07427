"""Long context on the GPU (issue 14): YaRN as Qwen2.5's model card sets it for 128k (factor 4 over
32768 trained tokens) on the CUDA backend.

- ``test_yarn_cuda_matches_llamacpp``: the 0.5B on CUDA with YaRN against llama.cpp's goldens
  (``tests/data/goldens/rope-scaling.*``, ``scripts/make_rope_goldens.py``), including the
  3863-token needle prompt, at the parity tests' bound (cosine ≥ 0.999, first token identical).
- ``test_yarn_needle_64k``: needle-in-a-haystack retrieval at 64k tokens on the 1.5B: a passphrase
  a third of the way into ~64k tokens of code, asked for at the end; the greedy answer must hold
  it. Prefill and decode speeds are printed (not asserted: benches/ measures them).

Both need a GPU (skipped without one; failures under ``FAK_REQUIRE_CUDA=1``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from fak import _native
from fak.tokenizer import Tokenizer

pytestmark = pytest.mark.cuda

DATA = Path(__file__).resolve().parents[1] / "data"
YARN = {"rope_scaling": "yarn", "rope_scale": 4.0, "yarn_orig_ctx": 32768}
NEEDLE = "The secret passphrase is violet-harbor-42."


def _greedy(model: _native.EngineCore, prompt: list[int], n_new: int) -> tuple[np.ndarray, list[int], float, float]:
    t0 = time.perf_counter()
    model.add_sequence(1, prompt, {"temperature": 0.0, "n_logprobs": 1})
    first, toks, t_first = None, [], 0.0
    while len(toks) < n_new:
        for _sid, tok, _lp, _top, _fin in model.step():
            if first is None:
                first, t_first = np.array(model.last_logits(1)), time.perf_counter()
            toks.append(tok)
    model.remove_sequence(1)
    assert first is not None
    return first, toks, t_first - t0, time.perf_counter() - t_first


def test_yarn_cuda_matches_llamacpp(require_cuda, model_05b: Path) -> None:
    golden = json.loads((DATA / "goldens" / "rope-scaling.json").read_text())["cases"]["yarn"]
    with np.load(DATA / "goldens" / "rope-scaling.logits.npz") as z:
        ref = {k: z[k].astype(np.float64) for k in z.files}
    model = _native.EngineCore(str(model_05b), backend="cuda", n_ctx=8192, max_batch=1, kv_cache_tokens=8192, **YARN)
    for pid, rec in golden["records"].items():
        ours, toks, _, _ = _greedy(model, rec["prompt_tokens"], 1)
        r = ref[f"yarn__{pid}"]
        cos = float(ours @ r / (np.linalg.norm(ours) * np.linalg.norm(r)))
        print(pid, len(rec["prompt_tokens"]), "cosine", cos)
        assert cos >= 0.999, (pid, cos)
        assert toks[0] == rec["greedy"][0], (pid, toks[0], rec["greedy"][0])


def test_yarn_needle_64k(require_cuda, model_15b: Path) -> None:
    tok = Tokenizer.from_gguf(model_15b)
    prompts = json.loads((DATA / "golden_prompts.json").read_text())["prompts"]
    filler = "\n\n".join(p["text"] for p in prompts if p["kind"] == "code")
    n_filler = len(tok.encode(filler + "\n\n", add_special=False, parse_special=False))
    reps = 64000 // n_filler
    body = [filler] * reps
    body.insert(reps // 3, NEEDLE)
    text = ("<|im_start|>user\nHere is some code; somewhere in it is a secret passphrase.\n\n" + "\n\n".join(body)
            + "\n\nWhat is the secret passphrase? Answer with the passphrase only.<|im_end|>\n<|im_start|>assistant\n")
    prompt = tok.encode(text, add_special=True, parse_special=True)
    assert 60000 <= len(prompt) <= 65536 - 32, len(prompt)
    model = _native.EngineCore(str(model_15b), backend="cuda", n_ctx=65536, max_batch=1, kv_cache_tokens=65536, **YARN)
    _, toks, t_prefill, t_decode = _greedy(model, prompt, 16)
    answer = b"".join(tok.token_bytes(t) for t in toks).decode("utf-8", "replace")
    print(f"needle at 64k: {len(prompt)} tokens, prefill {len(prompt) / t_prefill:.0f} tok/s, "
          f"decode {(len(toks) - 1) / t_decode:.1f} tok/s, answer {answer!r}")
    assert "violet-harbor-42" in answer, answer
