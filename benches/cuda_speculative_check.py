"""Speculative decoding on CUDA (issue 32): every draft source's greedy output against decoding
without speculation on the same CUDA engine, token for token (and the log-probabilities within
float noise), KV blocks of both models returned; acceptance printed. Tiny synthetic models
(fak.synth), the jobs of tests/test_speculative.py. Run on the GPU machine:

    python benches/cuda_speculative_check.py

Exits 1 when any source changes a token. Written 2026-12-07 with the draft-model source and run
on the CPU only (its ``backend="cpu"`` twin: all seven cases identical); no device time was left
to run it on CUDA, where the verify step's multi-row forward may round differently from one-row
decoding, which is exactly what it is there to show.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fak import synth  # noqa: E402
from test_speculative import PROMPTS, run_all  # noqa: E402


def main() -> int:
    d = Path(tempfile.mkdtemp())
    models = {"target": str(synth.write_tiny_model(d / "target.gguf", "qwen2", seed=3)),
              "layer0": str(synth.write_tiny_model(d / "layer0.gguf", "qwen2", n_layer=1, seed=3)),
              "other": str(synth.write_tiny_model(d / "other.gguf", "qwen2", seed=7))}
    jobs = [(p, {"temperature": 0.0, "max_tokens": 48, "n_logprobs": 3}) for p in PROMPTS]
    base, _ = run_all(models["target"], jobs, backend="cuda")
    bad = 0
    cases = [("ngram", None), ("suffix", None), ("draft", "target"), ("draft", "layer0"), ("draft", "other"),
             ("draft:1", "layer0"), ("draft:8", "target")]
    for spec, draft in cases:
        kw = {"draft_model": models[draft]} if draft else {}
        out, st = run_all(models["target"], jobs, speculative=spec, backend="cuda", **kw)
        same_tokens = all([t[0] for t in out[i]] == [t[0] for t in base[i]] for i in base)
        worst_lp = max(abs(a[1] - b[1]) for i in base for a, b in zip(out[i], base[i]))
        blocks = st.get("draft_kv_blocks_free") == st.get("draft_kv_blocks_total")
        ok = same_tokens and blocks
        bad += not ok
        print(f"{spec:8s} draft={draft!s:7s} identical_tokens={same_tokens} max|dlogprob|={worst_lp:.2e} "
              f"draft_blocks_returned={blocks} steps={st['spec_steps']} drafted={st['spec_draft_tokens']} "
              f"accepted={st['spec_accepted_tokens']} -> {'OK' if ok else 'FAIL'}", flush=True)
    print("ALL OK" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
