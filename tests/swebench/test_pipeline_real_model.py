"""The pipeline with the real Qwen2.5-Coder-0.5B-Instruct served by ``fak serve`` on the CPU
(``--gguf``: the run starts and stops the server), on the tiny ``shapes`` instance, with budgets
small enough for a shared 2-core machine: the stages run, the model's own chat template and the
pre-filled edit format reach ``/v1/completions``, and every artifact is well formed. Whether the
small model fixes the bug is measured, not asserted.
"""

from __future__ import annotations

import json

import pytest
from pipeline_fixtures import make_shapes
from tiny import run_fak


@pytest.mark.slow
def test_pipeline_with_the_real_small_model(model_05b, tmp_path):
    sh = make_shapes(tmp_path / "shapes")
    out = tmp_path / "out"
    proc = run_fak("swebench", "run", "--agent", "pipeline", "--gguf", str(model_05b),
                   "--backend", "cpu", "--n-ctx", "4096", "--dataset", str(sh["dataset"]),
                   "--filter", "fak-test__shapes-1", "--repos", str(sh["repos"]),
                   "--output", str(out), "--no-live", "--stages", "locate,choose,repair,rank",
                   "--choose-samples", "2", "--max-locations", "1", "--repair-samples", "3",
                   "--repair-max-tokens", "64", "--repair-forms", "search_replace", "--concurrency", "3",
                   timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    iid = "fak-test__shapes-1"
    rows = [json.loads(ln) for ln in (out / "pipeline" / iid / "repair.jsonl").read_text().splitlines()]
    header, samples = rows[0], [r for r in rows if r["kind"] == "sample"]
    assert header["config"]["mode"] == "completions" and header["usage"]["requests"] == 3
    assert len(samples) == 3 and samples[0]["temperature"] == 0.0
    assert all(s["text"].startswith("```python\n### shapes/geometry.py\n<<<<<<< SEARCH\n") for s in samples)
    assert all(s["completion_tokens"] > 0 for s in samples)
    preds = json.loads((out / "predictions.json").read_text())
    assert [p["instance_id"] for p in preds] == [iid]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"] == {"done": 1}
    print("statuses:", [s["status"] for s in samples], "chosen patch bytes:",
          len(preds[0]["model_patch"]))
