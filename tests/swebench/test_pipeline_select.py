"""Selection by behaviour (issue 31): the outcome class of a script run, clusters of candidates by
what they were observed to do, script weights, the order of the criteria, ties, and what the
``rank`` stage and the summary report. CPU only: hand-made ``test`` records, no sandbox."""

from __future__ import annotations

import math

import pytest

from fak.swebench.pipeline.artifacts import Artifact
from fak.swebench.pipeline.behaviour import clusters, outcome, outcome_of_status
from fak.swebench.pipeline.execute import RunResult
from fak.swebench.pipeline.instance import _counts
from fak.swebench.pipeline.rank import rank
from fak.swebench.pipeline.selection import CRITERIA, entropy, order_clusters, reason, script_weights


def cand(cid: str, votes: int = 1, lines: int = 5) -> dict:
    return {"id": cid, "votes": votes, "diff_lines": lines, "files": ["m.py"], "diff": f"P{cid}"}


def kept(*sids: str) -> list[dict]:
    return [{"kind": "script_base", "script": s, "kept": True} for s in sids]


def ran(cid: str, out: dict[str, str], failures: list[str] | None = None, **extra) -> dict:
    """A ``candidate_test`` record with outcomes ``out`` ({script: outcome}) and, unless
    ``None``, regression tests that all ran and broke ``failures``."""
    rec = {"kind": "candidate_test", "id": cid, "applied": True,
           "repro": {s: 0 if o == "pass" else (None if o == "timeout" else 1) for s, o in out.items()},
           "repro_out": dict(out), "repro_fixed": sum(o == "pass" for o in out.values()), **extra}
    if failures is not None:
        rec["regression_failures"] = list(failures)
    return rec


def of(records: list[dict], kind: str) -> list[dict]:
    return [r for r in records if r["kind"] == kind]


def selection(records: list[dict]) -> dict:
    return of(records, "selection")[0]


# -- outcome classes ---------------------------------------------------------------------------

def test_outcome_classes_normalise_the_work_tree_and_addresses():
    root = "/w/slots/3/repo"
    tb = (f'Traceback (most recent call last):\n  File "{root}/.fak/repro_r0.py", line 3\n'
          f"AssertionError: got <Poly at 0x7f12ab> from {root}/m.py\n")
    assert outcome(RunResult(0, "anything", False, 1.0), root) == "pass"
    assert outcome(RunResult(None, "partial", True, 60.0), root) == "timeout"
    assert outcome(RunResult(1, tb, False, 1.0), root) == "fail: AssertionError: got <Poly at 0x?> from ./m.py"
    # the same failure in another worker's copy is the same outcome
    assert outcome(RunResult(1, tb.replace(root, "/w/repo"), False, 1.0), "/w/repo") == \
        outcome(RunResult(1, tb, False, 1.0), root)
    assert outcome(RunResult(1, "x\nsympy.polys.polyerrors.GeneratorsError: bad  gens\n", False, 1.0)) \
        == "fail: sympy.polys.polyerrors.GeneratorsError: bad gens"
    assert outcome(RunResult(2, "Issue reproduced: 3 != 4\n", False, 1.0)) == "exit 2: Issue reproduced: 3 != 4"
    assert outcome(RunResult(1, "", False, 1.0)) == "exit 1"
    assert outcome(RunResult(1, "x" * 500 + "Error: y", False, 1.0)).startswith("exit 1: xxx")
    assert len(outcome(RunResult(1, "ValueError: " + "z" * 500, False, 1.0))) == len("fail: ") + 160
    assert [outcome_of_status(s) for s in (0, None, 1, 3)] == ["pass", "timeout", "exit 1", "exit 3"]


# -- clusters ----------------------------------------------------------------------------------

def test_clusters_by_outcomes_and_regressions_with_the_most_voted_smallest_representative():
    cands = [cand("c0", 1, 9), cand("c1", 3, 9), cand("c2", 3, 4), cand("c3", 2), cand("c4", 2),
             cand("c5", 1), cand("c6", 5), cand("c7", 1)]
    fail_a, fail_b = "fail: AssertionError", "fail: TypeError: bad"
    results = {r["id"]: r for r in [
        ran("c0", {"r0": "pass", "r1": fail_a}, []),
        ran("c1", {"r0": "pass", "r1": fail_a}, []),
        ran("c2", {"r0": "pass", "r1": fail_a}, []),
        ran("c3", {"r0": "pass", "r1": fail_b}, []),   # fails r1 otherwise: its own cluster
        ran("c4", {"r0": "pass", "r1": fail_a}, ["t::x"]),  # breaks a test: its own cluster
        ran("c5", {"r0": "pass", "r1": fail_a}),  # regression tests not run: not put with c0-c2
        {"kind": "candidate_test", "id": "c6", "applied": False},  # no cluster
        {"kind": "candidate_test", "id": "c7", "applied": True, "repro_env_error": {"r0": "x"}},
    ]}
    found = clusters(cands, results, ["r0", "r1"])
    assert [[c["id"] for c in cl.members] for cl in found] == [["c2", "c1", "c0"], ["c3"], ["c4"], ["c5"]]
    first = found[0]
    assert first.representative["id"] == "c2"  # 3 votes as c1, the smaller diff
    assert first.votes == 7 and first.fixed == ["r0"] and first.regression == ("ran", ())
    assert found[3].regression is None
    # a script that did not run on a candidate (cut) is unobserved, not a failure
    cut = ran("c8", {"r0": "pass"}, [])
    assert clusters([cand("c8")], {"c8": cut}, ["r0", "r1"])[0].outcomes == {"r0": "pass", "r1": None}


def test_records_without_outcome_classes_cluster_by_exit_status():
    """``test`` artifacts written before ``repro_out`` existed: the exit statuses."""
    old = [{"kind": "candidate_test", "id": c, "applied": True, "repro": rp, "repro_fixed": 0,
            "regression_failures": []}
           for c, rp in (("c0", {"r0": 1}), ("c1", {"r0": 1}), ("c2", {"r0": 2}), ("c3", {"r0": None}))]
    found = clusters([cand(f"c{i}") for i in range(4)], {r["id"]: r for r in old}, ["r0"])
    assert [(cl.outcomes["r0"], len(cl.members)) for cl in found] == [("exit 1", 2), ("exit 2", 1),
                                                                      ("timeout", 1)]


# -- weights -----------------------------------------------------------------------------------

def test_a_script_every_candidate_fixes_or_none_does_weighs_nothing():
    cands = [cand(f"c{i}") for i in range(4)]
    results = {f"c{i}": ran(f"c{i}", {"all": "pass", "none": "fail: AssertionError",
                                      "half": "pass" if i < 2 else "exit 1",
                                      "one": "pass" if i == 0 else "timeout"}, [])
               for i in range(4)}
    scripts = ["all", "none", "half", "one"]
    w = script_weights(clusters(cands, results, scripts), scripts)
    assert w["all"]["weight"] == 0.0 and w["all"]["fixed_by"] == 4
    assert w["none"]["weight"] == 0.0 and w["none"]["fixed_by"] == 0
    assert w["half"]["weight"] == pytest.approx(1.0)
    assert w["one"]["weight"] == pytest.approx(entropy(0.25)) == pytest.approx(0.8113, abs=1e-4)
    assert {s: v["ran_on"] for s, v in w.items()} == dict.fromkeys(scripts, 4)
    assert entropy(0.0) == entropy(1.0) == 0.0 and math.isclose(entropy(0.5), 1.0)


def test_a_script_that_fixes_everyone_does_not_decide():
    """Two clusters, both fixing the same script every candidate fixes: not ``scripts`` but the
    next criterion decides."""
    cands = [cand("c0", 1), cand("c1", 4)]
    tests = kept("r0") + [ran("c0", {"r0": "pass"}, []), ran("c1", {"r0": "pass"}, ["t::a"])]
    records = rank(cands, tests)
    assert records[-1]["id"] == "c0" and selection(records)["reason"] == "regressions"
    assert selection(records)["scripts"] == [{"script": "r0", "weight": 0.0, "fixed_by": 2, "ran_on": 2}]


# -- the order of the criteria -----------------------------------------------------------------

def _two(a: dict, b: dict, ca: dict, cb: dict) -> tuple[str, str]:
    records = rank([ca, cb], kept("r0", "r1") + [a, b])
    return records[-1]["id"], selection(records)["reason"]


def test_weighted_scripts_before_regressions_before_size_before_diff_before_order():
    fa, p = "fail: AssertionError", "pass"
    # 1. scripts: the candidate that fixes the separating script wins despite a regression and
    # fewer votes
    assert _two(ran("c0", {"r0": p, "r1": fa}, ["t::a"]), ran("c1", {"r0": fa, "r1": fa}, []),
                cand("c0", 1), cand("c1", 9)) == ("c0", "scripts")
    # 2. regressions (same scripts): all ran and fewer broken; a run before one not run
    assert _two(ran("c0", {"r0": fa, "r1": fa}, ["t::a"]), ran("c1", {"r0": fa, "r1": "exit 1"}, []),
                cand("c0", 9), cand("c1", 1)) == ("c1", "regressions")
    assert _two(ran("c0", {"r0": fa, "r1": fa}), ran("c1", {"r0": fa, "r1": "exit 1"}, ["t::a"]),
                cand("c0", 9), cand("c1", 1)) == ("c1", "regressions")
    # 3. cluster size: the votes of its members summed
    records = rank([cand("c0", 3), cand("c1", 2), cand("c2", 2)],
                   kept("r0") + [ran("c0", {"r0": fa}, []), ran("c1", {"r0": "exit 1"}, []),
                                 ran("c2", {"r0": "exit 1"}, [])])
    assert records[-1]["id"] == "c1" and selection(records)["reason"] == "cluster size"
    assert [r["id"] for r in of(records, "ranked")] == ["c1", "c2", "c0"]
    assert selection(records)["cluster_sizes"] == [2, 1]
    # 4. diff size of the representatives; 5. then the earlier candidate
    assert _two(ran("c0", {"r0": fa, "r1": fa}, []), ran("c1", {"r0": "exit 1", "r1": fa}, []),
                cand("c0", 2, 9), cand("c1", 2, 3)) == ("c1", "diff size")
    assert _two(ran("c1", {"r0": fa, "r1": fa}, []), ran("c0", {"r0": "exit 1", "r1": fa}, []),
                cand("c1", 2, 3), cand("c0", 2, 3)) == ("c0", "order")
    assert CRITERIA == ("scripts", "regressions", "cluster size", "diff size", "order")


def test_equal_weighted_scores_tie_and_untested_candidates_come_last():
    """Sums of float weights that are equal on paper compare equal (0.1 + 0.2 == 0.3 here);
    candidates without a result follow every cluster, by votes then diff size."""
    cands = [cand("c0", 1, 3), cand("c1", 1, 3), cand("c2", 5, 3), cand("c3", 9), cand("c4", 9, 1)]
    tests = kept("a", "b", "c") + [
        ran("c0", {"a": "pass", "b": "pass", "c": "exit 1"}, []),
        ran("c1", {"a": "exit 1", "b": "exit 1", "c": "pass"}, []),
        ran("c2", {"a": "exit 1", "b": "exit 1", "c": "exit 1"}, []),
        {"kind": "candidate_test", "id": "c3", "applied": False}]
    found = clusters(cands, {r["id"]: r for r in tests if r["kind"] == "candidate_test"}, ["a", "b", "c"])
    weights = {"a": {"weight": 0.1}, "b": {"weight": 0.2}, "c": {"weight": 0.3}}
    ordered = order_clusters(found, weights)
    assert [cl.representative["id"] for cl in ordered] == ["c0", "c1", "c2"]
    assert reason(ordered) == "order" and reason(ordered[:1]) == "only cluster" and reason([]) == "no cluster"
    records = rank(cands, tests)
    assert [r["id"] for r in of(records, "ranked")] == ["c0", "c1", "c2", "c4", "c3"]
    assert [r["cluster"] for r in of(records, "ranked")] == [0, 1, 2, None, None]


def test_without_any_tested_candidate_the_most_voted_smallest_wins():
    tests = kept("r0") + [{"kind": "candidate_test", "id": "c0", "applied": False}]
    records = rank([cand("c0", 9), cand("c1", 2, 7), cand("c2", 2, 3)], tests)
    sel = selection(records)
    assert records[-1]["id"] == "c2"
    assert (sel["clusters"], sel["tested"], sel["reason"]) == (0, 0, "untested: votes, then diff size")
    assert [r["id"] for r in of(records, "ranked")] == ["c2", "c1", "c0"]  # c0 did not apply
    assert selection(rank([], kept("r0")))["reason"] == "no candidate"


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown rank method"):
        rank([cand("c0")], None, "vibes")


# -- the report --------------------------------------------------------------------------------

def test_the_rank_records_and_the_summary_report_the_selection():
    p, fa = "pass", "fail: AssertionError"
    cands = [cand("c0", 4, 2), cand("c1", 1, 3), cand("c2", 2, 1), cand("c3", 1)]
    tests = kept("r0", "r1") + [
        ran("c0", {"r0": fa, "r1": fa}, []), ran("c1", {"r0": p, "r1": fa}, []),
        ran("c2", {"r0": p, "r1": fa}, []), ran("c3", {"r0": fa, "r1": fa})]
    records = rank(cands, tests)
    sel = selection(records)
    assert {k: sel[k] for k in ("method", "candidates", "tested", "clusters", "cluster_sizes",
                                "chosen", "chosen_cluster", "runner_up", "reason")} == {
        "method": "behaviour", "candidates": 4, "tested": 4, "clusters": 3,
        "cluster_sizes": [2, 1, 1], "chosen": "c2", "chosen_cluster": 0, "runner_up": "c0",
        "reason": "scripts"}
    assert sel["scripts"] == [{"script": "r0", "weight": 1.0, "fixed_by": 2, "ran_on": 4},
                              {"script": "r1", "weight": 0.0, "fixed_by": 0, "ran_on": 4}]
    first = of(records, "cluster")[0]
    assert first == {"kind": "cluster", "index": 0, "members": ["c2", "c1"], "size": 2, "votes": 3,
                     "representative": "c2", "fixed": ["r0"], "score": 1.0,
                     "regression": {"run": "ran", "broken": 0}, "outcomes": {"r0": p, "r1": fa}}
    assert of(records, "cluster")[2]["regression"] is None
    assert records[-1] == {"kind": "chosen", "id": "c2", "diff": "Pc2"}

    art = Artifact(None, {"kind": "header"}, records)  # type: ignore[arg-type]
    counts = _counts({"rank": art})
    assert {k: counts[k] for k in ("chosen", "clusters", "cluster_sizes", "script_weights",
                                   "chosen_cluster", "chosen_reason", "runner_up")} == {
        "chosen": "c2", "clusters": 3, "cluster_sizes": [2, 1, 1],
        "script_weights": {"r0": 1.0, "r1": 0.0}, "chosen_cluster": 0,
        "chosen_reason": "scripts", "runner_up": "c0"}


def test_the_order_method_is_the_previous_rank():
    """``--rank-select order``: scripts fixed first, whatever separates; no clusters reported."""
    p, fa = "pass", "fail: AssertionError"
    cands = [cand("c0", 9), cand("c1", 1)]
    tests = kept("r0", "r1") + [ran("c0", {"r0": fa, "r1": fa}, []), ran("c1", {"r0": p, "r1": fa}, ["t"])]
    records = rank(cands, tests, "order")
    assert records[-1]["id"] == "c1" and not of(records, "cluster") and not of(records, "selection")
