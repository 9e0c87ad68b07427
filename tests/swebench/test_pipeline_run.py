"""``fak swebench run --agent pipeline`` end to end on the tiny ``shapes`` instances against the
rule-based model (``pipeline_fixtures.ShapesModel``): the generating stages alone (as on the GPU
machine), then ``test,rank`` without a model (as where the task env is), resume, a changed budget
redoing only what depends on it, chat mode, and the errors a wrong ``--stages`` gives.

To add a case: add rules to ``ShapesModel``, run ``_run`` with the stages, read the artifacts
under ``OUT/pipeline/ID/STAGE.jsonl``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pipeline_fixtures import (
    RIGHT_FIX,
    WRONG_FIX,
    RuleServer,
    ShapesModel,
    make_shapes,
    shapes_index,
)
from tiny import run_fak


def _run(sh: dict, out: Path, *args: str, server: RuleServer | None = None) -> subprocess.CompletedProcess:
    argv = ["swebench", "run", "--agent", "pipeline", "--dataset", str(sh["dataset"]),
            "--repos", str(sh["repos"]), "--output", str(out), "--no-live", "--workers", "2"]
    if server is not None:
        argv += ["--gateway", server.addr]
    return run_fak(*argv, *args, timeout=300)


def _records(out: Path, iid: str, stage: str) -> list[dict]:
    lines = (out / "pipeline" / iid / f"{stage}.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines]


def _predictions(out: Path) -> dict[str, str]:
    return {p["instance_id"]: p["model_patch"] for p in json.loads((out / "predictions.json").read_text())}


@pytest.fixture()
def shapes(tmp_path: Path) -> dict:
    return make_shapes(tmp_path / "shapes")


@pytest.fixture()
def rules():
    server = RuleServer(ShapesModel(shapes_index())).start()
    yield server
    server.stop()


def test_generate_then_test_and_rank_elsewhere_then_resume(shapes, rules, tmp_path):
    out = tmp_path / "out"
    gen = ("--stages", "gen", "--chat-template", str(shapes["template"]), "--repair-samples", "10",
           "--max-locations", "1", "--repair-forms", "search_replace")
    # 1. the generating stages (the GPU machine): artifacts, no predictions yet
    proc = _run(shapes, out, *gen, server=rules)
    assert proc.returncode == 0, proc.stderr
    assert not (out / "predictions.json").exists()
    iid = "fak-test__shapes-1"
    for stage in ("locate", "choose", "repair", "reproduce"):
        assert (out / "pipeline" / iid / f"{stage}.jsonl").is_file()
    assert {r["mode"] for r in rules.requests} == {"completions"}
    repair_prompts = [r for r in rules.requests if "SEARCH/REPLACE edit" in r["prompt"]]
    assert all(r["prompt"].endswith("### shapes/geometry.py\n<<<<<<< SEARCH\n") for r in repair_prompts)
    assert all(r["prompt"].startswith("<|im_start|>system\n") for r in repair_prompts)
    temps = sorted(r["body"]["temperature"] for r in repair_prompts
                   if r["headers"]["x-fak-conversation"].endswith(iid))
    assert temps == [0.0] + [0.8] * 9
    header = _records(out, iid, "repair")[0]
    assert header["kind"] == "header" and header["usage"]["requests"] == 10
    assert header["model"] == "rules" and header["usage"]["completion_tokens"] > 0
    cands = [r for r in _records(out, iid, "repair") if r["kind"] == "candidate"]
    assert [(c["id"], c["votes"]) for c in cands] == [("c0", 3), ("c1", 1), ("c2", 1)]
    n_requests = len(rules.requests)

    # 2. rank alone, no model and no tests: the most-voted candidate (the wrong fix)
    proc = _run(shapes, out, "--stages", "rank")
    assert proc.returncode == 0, proc.stderr
    assert WRONG_FIX in _predictions(out)[iid]

    # 3. test and rank without a model (where the task env is): the fix that the kept
    # reproduction script confirms wins over the votes
    proc = _run(shapes, out, "--stages", "test,rank", "--test-candidates", "3")
    assert proc.returncode == 0, proc.stderr
    preds = _predictions(out)
    assert RIGHT_FIX in preds[iid]
    assert "if other == 0:" in preds["fak-test__shapes-2"]
    tests = _records(out, iid, "test")
    base = {r["script"]: r for r in tests if r["kind"] == "script_base"}
    assert base["r0"]["kept"] and "AssertionError" in base["r0"]["why"]
    assert not base["r1"]["kept"] and base["r1"]["why"] == "passes on the original code"
    assert not base["r2"]["kept"] and "ModuleNotFoundError" in base["r2"]["why"]
    # a name the script never defined: its own bug, not one a source change can fix
    assert not base["r3"]["kept"] and base["r3"]["why"] == "fails with NameError in its own code"
    assert "r4" not in base  # the script that does not parse never reached the test stage
    reg = next(r for r in tests if r["kind"] == "regression_base")
    assert reg["files"] == ["shapes/tests/test_geometry.py"] and len(reg["passing"]) == 4
    by_id = {r["id"]: r for r in tests if r["kind"] == "candidate_test"}
    assert by_id["c0"]["repro_fixed"] == 0 and by_id["c1"]["repro_fixed"] == 1
    # each run's outcome class (selection by behaviour): the work tree's path never in it
    assert by_id["c1"]["repro_out"] == {"r0": "pass"}
    assert by_id["c0"]["repro_out"]["r0"].startswith("fail: AssertionError")
    assert str(out) not in json.dumps([r.get("repro_out") for r in by_id.values()])
    # the right fix breaks the test that asserted the bug: a lower rank, not an exclusion
    assert by_id["c1"]["regression_failures"] == ["shapes/tests/test_geometry.py::test_scale_y_unchanged"]
    ranked = [r for r in _records(out, iid, "rank") if r["kind"] == "ranked"]
    assert [r["id"] for r in ranked] == ["c1", "c2", "c0"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agent"] == "pipeline" and summary["results"] == {"done": 2}
    line = next(i for i in summary["instances"] if i["instance_id"] == iid)
    assert line["chosen"] == "c1" and line["scripts_kept"] == 1 and line["candidates"] == 3
    assert line["chosen_reason"] == "scripts" and line["script_weights"]["r0"] > 0
    assert line["clusters"] == len(line["cluster_sizes"]) >= 2
    preds_bytes = (out / "predictions.json").read_bytes()
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "pipeline").rglob("*.jsonl")}

    # 4. everything again with the model: every stage is reused, nothing is asked or re-run
    proc = _run(shapes, out, *gen[2:], "--test-candidates", "3", server=rules)
    assert proc.returncode == 0, proc.stderr
    assert len(rules.requests) == n_requests
    assert {p: p.stat().st_mtime_ns for p in (out / "pipeline").rglob("*.jsonl")} == mtimes
    assert json.loads((out / "predictions.json").read_bytes()) == json.loads(preds_bytes)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stage_totals"]["repair"]["reused"] == 2 and summary["stage_totals"]["repair"]["ran"] == 0

    # 5. a larger repair budget redoes repair and what reads it (test, rank), nothing before it
    proc = _run(shapes, out, "--stages", "locate,choose,repair,rank", "--chat-template",
                str(shapes["template"]), "--repair-samples", "12", "--max-locations", "1",
                "--repair-forms", "search_replace", server=rules)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    t = summary["stage_totals"]
    assert (t["locate"]["reused"], t["choose"]["reused"], t["repair"]["ran"], t["rank"]["ran"]) == (2, 2, 2, 2)
    assert len(rules.requests) == n_requests + 24
    # the old test artifact was made from the old candidates: rank does not use it
    ranked = [r for r in _records(out, iid, "rank") if r["kind"] == "ranked"]
    assert not any(r["tested"] for r in ranked)


def test_chat_mode_and_stage_errors(shapes, rules, tmp_path):
    out = tmp_path / "chat"
    proc = _run(shapes, out, "--stages", "test")
    assert proc.returncode == 1
    assert "needs a current repair artifact" in proc.stdout + proc.stderr
    proc = _run(shapes, out, "--stages", "repair")
    assert proc.returncode == 2 and "--gguf MODEL or --gateway" in proc.stderr
    proc = _run(shapes, out, "--stages", "nonsense")
    assert proc.returncode == 2 and "unknown stage" in proc.stderr
    proc = _run(shapes, out, "--stages", "locate,choose,repair,rank", "--prompt-mode", "chat",
                "--filter", "fak-test__shapes-2", "--choose-samples", "3", "--repair-samples", "2",
                server=rules)
    assert proc.returncode == 0, proc.stderr
    assert {r["mode"] for r in rules.requests} == {"chat"}
    assert "if other == 0:" in _predictions(out)["fak-test__shapes-2"]
    # both forms gave the same fix (the rewrite re-indented to the method's column): one candidate
    repair = _records(out, "fak-test__shapes-2", "repair")
    assert [(r["form"], r["status"]) for r in repair if r["kind"] == "sample"] == [
        ("search_replace", "ok"), ("search_replace", "duplicate"), ("rewrite", "duplicate"),
        ("rewrite", "duplicate")]
    cand = [r for r in repair if r["kind"] == "candidate"]
    assert len(cand) == 1 and cand[0]["votes"] == 4 and cand[0]["forms"] == ["search_replace", "rewrite"]
    loc = [r for r in _records(out, "fak-test__shapes-2", "choose") if r["kind"] == "location"]
    assert loc[0]["path"] == "shapes/geometry.py" and loc[0]["symbol"] == "Point.__add__"
    assert loc[0]["votes"] == 3


def test_scripts_on_many_candidates_regressions_on_the_best(shapes, rules, tmp_path):
    """The kept scripts run on ``--test-repro-candidates`` candidates; the regression tests only
    on the best ``--test-candidates`` of them by scripts fixed, so the right fix (1 vote) gets
    them and the most-voted wrong one does not; each is ranked with what ran."""
    out = tmp_path / "out"
    proc = _run(shapes, out, "--stages", "gen", "--chat-template", str(shapes["template"]),
                "--repair-samples", "10", "--max-locations", "1", "--repair-forms", "search_replace",
                server=rules)
    assert proc.returncode == 0, proc.stderr
    iid = "fak-test__shapes-1"
    proc = _run(shapes, out, "--stages", "test,rank", "--test-candidates", "1",
                "--test-repro-candidates", "3")
    assert proc.returncode == 0, proc.stderr
    tests = _records(out, iid, "test")
    by_id = {r["id"]: r for r in tests if r["kind"] == "candidate_test"}
    assert sorted(by_id) == ["c0", "c1", "c2"]
    assert all("repro" in r for r in by_id.values())
    ran = sorted(i for i, r in by_id.items() if "regression_failures" in r)
    assert ran == ["c1"]  # fixes the kept script; c0 has more votes but fixes nothing
    assert [r["files"] for r in tests if r["kind"] == "regression_base"] == [["shapes/tests/test_geometry.py"]]
    ranked = [r for r in _records(out, iid, "rank") if r["kind"] == "ranked"]
    assert ranked[0]["id"] == "c1" and ranked[0]["regression_failures"] == 1
    assert {r["id"]: r["regression_failures"] for r in ranked[1:]} == {"c0": None, "c2": None}
    assert RIGHT_FIX in _predictions(out)[iid]
