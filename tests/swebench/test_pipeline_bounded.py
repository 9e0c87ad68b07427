"""The test stage's bounds and schedule (issue 31): a per-instance budget that cuts the runs that
do not fit and records them, a per-candidate limit, parallel workers on copies of the work tree
giving the same records as one, and the order (scripts before test files, test files by their
measured base run, candidates in their order).

The repository is ``fak-test/calc`` (``calc_repo.make_calc``): ``calc.core.double`` returns
``x + x + 1`` (the bug); a quick test file next to it and one whose test sleeps (the slow suite);
three candidates: the right fix, a wrong one that breaks a quick test, and one that hangs. Each
test calls ``testing.test_stage`` on a real clone in fak's sandbox.

To add a case: give ``make_calc`` the files and candidates (``files``, ``cands``), and read the
records.
"""

from __future__ import annotations

import json
import sys

import pytest
from calc_repo import CORE, QUICK, SLOW, make_calc, of, stage
from pipeline_fixtures import RuleServer, ShapesModel, make_shapes, shapes_index
from tiny import run_fak

from fak.swebench.pipeline import testing
from fak.swebench.pipeline.artifacts import _stable, digest
from fak.swebench.pipeline.rank import rank


def test_parallel_workers_give_the_records_of_one_and_runs_go_cheapest_first(tmp_path):
    calc = make_calc(tmp_path / "calc", slow_s=1.5, pad="quick")  # the slow file is the smaller
    cands = [calc["cands"]["right"], calc["cands"]["wrong"]]
    one = stage(calc, tmp_path / "w1", cands, workers=1)
    three = stage(calc, tmp_path / "w3", cands, workers=3)

    # the same records, verdicts and all (timings, output excerpts and the timeline aside)
    assert digest(_stable(one)) == digest(_stable(three))
    sched1, sched3 = of(one, "schedule")[0], of(three, "schedule")[0]
    assert (sched1["workers"], sched3["workers"]) == (1, 3)
    assert sched1["cut"] == sched3["cut"] == []
    assert len({t["worker"] for t in sched3["timeline"]}) > 1  # the copies did run
    assert not (tmp_path / "w3" / "slots").exists()  # the copies are gone
    base = {r["script"]: r["kept"] for r in of(one, "script_base")}
    assert base == {"r0": True, "r1": True, "r2": False}
    by_id = {r["id"]: r for r in of(one, "candidate_test")}
    assert by_id["c0"]["repro"] == {"r0": 0, "r1": 0} and by_id["c0"]["regression_failures"] == []
    assert by_id["c1"]["repro_fixed"] == 0
    assert by_id["c1"]["regression_failures"] == [f"{QUICK}::test_zero"]
    assert [r["files"] for r in of(one, "regression_base")] == [[QUICK], [SLOW]]

    # one worker: the order is the schedule's: scripts on the original code, scripts on the
    # candidates (their order; on each, the script quickest on the original code first), base
    # runs (the smaller file first: nothing measured yet), then the candidates' runs of the file
    # whose base run was quicker first
    runs = [(t["run"], t.get("candidate"), t.get("script") or t.get("file"))
            for t in sched1["timeline"]]
    a, b = sorted(["r0", "r1"], key=lambda sid: next(
        r["seconds"] for r in of(one, "script_base") if r["script"] == sid))
    assert runs == [
        ("script_base", None, "r0"), ("script_base", None, "r1"), ("script_base", None, "r2"),
        ("script", "c0", a), ("script", "c0", b), ("script", "c1", a), ("script", "c1", b),
        ("regression_base", None, SLOW), ("regression_base", None, QUICK),
        ("regression", "c0", QUICK), ("regression", "c1", QUICK),
        ("regression", "c0", SLOW), ("regression", "c1", SLOW)]
    secs = {r["files"][0]: r["seconds"] for r in of(one, "regression_base")}
    assert secs[QUICK] < secs[SLOW]


def test_scripts_run_on_a_candidate_quickest_first(tmp_path):
    """On a candidate the kept scripts run in the order of their runs on the original code,
    quickest first (the candidate's limit then cuts the slowest), whatever order they came in."""
    calc = make_calc(tmp_path / "calc", slow_s=0, pad="slow")
    scripts = [{"id": "r0", "code": "import time\ntime.sleep(1.5)\nfrom calc import double\n"
                                    "assert double(1) == 2\n"},
               {"id": "r1", "code": "from calc import double\nassert double(0) == 0\n"}]
    records = stage(calc, tmp_path / "w", [calc["cands"]["right"]], scripts=scripts, workers=1,
                    candidates=0)
    assert [r["kept"] for r in of(records, "script_base")] == [True, True]
    on_c0 = [t["script"] for t in of(records, "schedule")[0]["timeline"] if t["run"] == "script"]
    assert on_c0 == ["r1", "r0"]
    assert of(records, "candidate_test")[0]["repro"] == {"r0": 0, "r1": 0}


def test_a_slow_suite_is_cut_by_the_budget_and_a_hanging_candidate_by_its_limit(tmp_path):
    calc = make_calc(tmp_path / "calc", slow_s=120, pad="slow")  # the quick file runs first
    c = calc["cands"]
    records = stage(calc, tmp_path / "w", [c["right"], c["hang"], c["wrong"]], workers=2,
                     budget_s=30.0, candidate_limit_s=3.0)
    sched = of(records, "schedule")[0]
    # the stage ended at its budget, not after the slow test's 120 s
    assert sched["wall_s"] < 45
    cuts = {(x["run"], x.get("candidate"), x.get("script") or x.get("file")): x for x in sched["cut"]}
    slow_base = cuts.pop(("regression_base", None, SLOW))
    assert slow_base["why"] == "budget" and "during the run" in slow_base["detail"]
    first, second = sorted(["r0", "r1"], key=lambda sid: next(  # quickest on the original code
        r["seconds"] for r in of(records, "script_base") if r["script"] == sid))
    limit_cut = cuts.pop(("script", "c2", second))  # the hanging candidate's second script
    assert limit_cut["why"] == "candidate_limit"
    assert {k: v["why"] for k, v in cuts.items()} == {
        ("regression", cid, SLOW): "no_base" for cid in ("c0", "c1", "c2")}

    assert [r["files"] for r in of(records, "regression_base")] == [[QUICK]]
    by_id = {r["id"]: r for r in of(records, "candidate_test")}
    # the hanging candidate's first script was killed at its limit: a timeout, not a fix
    assert by_id["c2"]["repro"] == {first: None} and by_id["c2"]["repro_fixed"] == 0
    assert by_id["c0"]["repro_fixed"] == 2 and by_id["c1"]["repro_fixed"] == 0
    # a test file cut: no regression_failures (not ranked as run), what the quick file showed
    for r in by_id.values():
        assert "regression_failures" not in r
        assert {(x["file"], x["why"]) for x in r["cut"] if "file" in x} == {(SLOW, "no_base")}
    assert by_id["c0"]["regression_partial"] == []
    assert by_id["c1"]["regression_partial"] == [f"{QUICK}::test_zero"]
    # the hanging candidate's quick run was killed at its limit (4x the base run, at least 3 s)
    assert by_id["c2"]["regression_killed"] is True
    assert sorted(by_id["c2"]["regression_partial"]) == [f"{QUICK}::test_int", f"{QUICK}::test_zero"]
    hang_run = next(t for t in sched["timeline"] if t["run"] == "regression" and t["candidate"] == "c2")
    assert hang_run["seconds"] < 20

    ranked = [r["id"] for r in rank([c["right"], c["hang"], c["wrong"]], records) if r["kind"] == "ranked"]
    assert ranked == ["c0", "c1", "c2"]  # c1 broke one quick test, c2 both


def test_a_copy_of_the_work_tree_is_its_own_workspace(tmp_path):
    """``TaskEnv.copy``: the objects hard-linked, files copied, a link kept as a link (never
    followed), a FIFO left out (reading it would block), the environment's paths moved; a
    candidate applied in the copy is not in the original, and resetting the copy clears it."""
    import os

    calc = make_calc(tmp_path / "calc", slow_s=0, pad="slow")
    tenv = testing.prepare(calc["task"], calc["mirror"], tmp_path / "w", task_env=False)
    os.mkfifo(tenv.root / "calc" / "pipe")
    os.symlink("/etc/hostname", tenv.root / "calc" / "host")
    copy = tenv.copy(tmp_path / "w" / "slots" / "1")
    assert copy.root == tmp_path / "w" / "slots" / "1"
    assert copy.env["HOME"] == str(copy.root / ".fak" / "home") != tenv.env["HOME"]
    assert copy.env["PATH"] == tenv.env["PATH"] and copy.readable == tenv.readable
    assert not (copy.root / "calc" / "pipe").exists()
    assert os.readlink(copy.root / "calc" / "host") == "/etc/hostname"
    objs = [p for p in (tenv.root / ".git" / "objects").rglob("*") if p.is_file()]
    assert objs and all(os.stat(p).st_ino == os.stat(copy.root / p.relative_to(tenv.root)).st_ino
                        for p in objs)
    assert copy.apply(calc["cands"]["right"]["diff"])
    assert (copy.root / "calc/core.py").read_text() != (tenv.root / "calc/core.py").read_text() == CORE
    copy.reset()
    assert (copy.root / "calc/core.py").read_text() == CORE


def test_the_host_mode_reads_the_pytest_log_whatever_the_repository(tmp_path):
    """The host mode runs pytest: its log is read with pytest's parser, not the repository's
    harness parser (sympy's reads bin/test's log and found no test in pytest's)."""
    calc = make_calc(tmp_path / "calc", slow_s=0, pad="slow")
    tenv = testing.prepare(calc["task"], calc["mirror"], tmp_path / "w", task_env=False)
    tenv.info["repo"] = "sympy/sympy"
    statuses, res, _ = testing.run_tests(tenv, [QUICK], 60)
    assert statuses == {f"{QUICK}::test_zero": "PASSED", f"{QUICK}::test_int": "PASSED"}, res.output


def test_the_pool_runs_lowest_priority_first_adds_jobs_and_raises_what_a_job_raised():
    from fak.swebench.pipeline.schedule import Pool, Slot

    pool = Pool([Slot(None, 0)])
    seen = []

    def job(name, slot, then=None):
        seen.append(name)
        if then:
            pool.submit((0,), then, partial_job(then))
        return name.upper()

    def partial_job(name):
        return lambda slot: job(name, slot)

    out = pool.run([((2,), "b", lambda s: job("b", s)), ((1,), "a", lambda s: job("a", s, "z")),
                    ((3,), "c", lambda s: job("c", s))])
    # one worker: a (1), then z, which a added with priority 0, then b (2), then c (3)
    assert seen == ["a", "z", "b", "c"] and out == {"a": "A", "z": "Z", "b": "B", "c": "C"}

    def boom(slot):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Pool([Slot(None, 0), Slot(None, 1)]).run([((0,), "x", boom), ((1,), "y", lambda s: 1)])


def test_cli_budget_cuts_are_in_the_summary(tmp_path):
    """``--test-budget`` and ``--test-workers`` reach the stage; what was cut is in
    ``test.jsonl``'s schedule record, ``summary.json`` and the instance's line."""
    sh = make_shapes(tmp_path / "shapes")
    server = RuleServer(ShapesModel(shapes_index())).start()
    out = tmp_path / "out"
    common = ["swebench", "run", "--agent", "pipeline", "--dataset", str(sh["dataset"]),
              "--repos", str(sh["repos"]), "--output", str(out), "--no-live", "--workers", "1",
              "--filter", "fak-test__shapes-1"]
    try:
        proc = run_fak(*common, "--stages", "gen", "--gateway", server.addr, "--chat-template",
                       str(sh["template"]), "--repair-samples", "10", "--max-locations", "1",
                       "--repair-forms", "search_replace", timeout=300)
        assert proc.returncode == 0, proc.stderr
    finally:
        server.stop()
    proc = run_fak(*common, "--stages", "test,rank", "--test-budget", "1", "--test-workers", "2",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    iid = "fak-test__shapes-1"
    rows = [json.loads(ln) for ln in (out / "pipeline" / iid / "test.jsonl").read_text().splitlines()]
    assert rows[0]["config"]["budget_s"] == 1.0 and "workers" not in rows[0]["config"]
    sched = next(r for r in rows if r["kind"] == "schedule")
    assert sched["workers"] == 2 and sched["budget_s"] == 1.0
    assert sched["cut"] and {x["why"] for x in sched["cut"]} == {"budget"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["test"]["workers"] == 2
    line = next(i for i in summary["instances"] if i["instance_id"] == iid)
    assert line["test_cut"] == len(sched["cut"]) and line["test_cut_why"] == {"budget": len(sched["cut"])}
    assert f"cut={len(sched['cut'])} (budget {len(sched['cut'])})" in " ".join((proc.stdout + proc.stderr).split())
    # nothing tested: rank falls back to votes, and a prediction is still written
    assert json.loads((out / "predictions.json").read_text())[0]["instance_id"] == iid


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
