"""Stage 5, ``rank``: order the candidates and choose one patch per instance.

``behaviour`` (the default, issue 31): the tested candidates are put in clusters by what they
were observed to do (``behaviour.py``: each kept reproduction script's outcome — passes, fails
with which exception and message, times out — and their regression tests' result), the kept
scripts weighed by how well they separate the candidates (a script every candidate passes, or
none does, weighs 0), and the clusters ordered by the weighted scripts they pass, then
regressions, then cluster size (votes summed), then the representative's diff size
(``selection.py``). The chosen patch is the best cluster's representative (most votes, then the
smallest diff). Candidates follow cluster by cluster; then those the ``test`` stage did not
test (not run, or whose scripts could none start), by votes then diff size; last those that did
not apply.

``order`` (the previous rank, after Agentless's selection): tested before untested; then more
reproduction scripts fixed (a kept script that now exits 0); then those whose regression tests
ran before those whose did not (or not all of them: the test stage's budget cut a file); then
fewer regression tests broken (a lower rank, never an exclusion); then more votes; then the
smaller diff; then the earlier candidate.

Without a ``test`` artifact both are votes, then diff size. No candidate at all gives the empty
patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fak.swebench.pipeline.behaviour import Cluster, candidate_number, candidate_order, clusters, tested
from fak.swebench.pipeline.selection import order_clusters, reason, script_weights

#: the selection methods of ``RankConfig.method``
METHODS = ("behaviour", "order")


@dataclass
class RankConfig:
    """``method``: ``behaviour`` (clusters of observed behaviour) or ``order`` (the previous
    lexicographic rank); see the module docstring."""

    method: str = "behaviour"


def rank_key(c: dict[str, Any], result: dict[str, Any] | None) -> tuple:
    """The ``order`` method's sort key of candidate ``c`` with its ``candidate_test`` record
    (or ``None``)."""
    is_tested = tested(result)
    fixed = int(result.get("repro_fixed", 0)) if is_tested else 0
    ran = is_tested and "regression_failures" in result
    # tests broken: those its regression runs showed, or, where some of its test files were cut
    # (ranked as not run), those the files that ran showed
    broken = len(result.get("regression_failures", result.get("regression_partial", []))) \
        if is_tested else 0
    return (0 if is_tested else 1, -fixed, 0 if ran else 1, broken, -int(c["votes"]),
            int(c["diff_lines"]), candidate_number(c["id"]))


def _not_applied(result: dict[str, Any] | None) -> bool:
    return result is not None and not result.get("applied")


def _kept(tests: list[dict[str, Any]] | None) -> list[str]:
    return [r["script"] for r in (tests or []) if r.get("kind") == "script_base" and r.get("kept")]


def _ranked(i: int, c: dict[str, Any], r: dict[str, Any] | None, n_scripts: int,
            cluster: int | None) -> dict[str, Any]:
    ok = tested(r)
    return {"kind": "ranked", "rank": i, "id": c["id"], "votes": c["votes"], "tested": ok,
            "applied": None if r is None else bool(r.get("applied")),
            "repro_fixed": r.get("repro_fixed") if ok else None, "n_scripts": n_scripts,
            "regression_failures": len(r["regression_failures"])
            if ok and "regression_failures" in r else None,
            "cluster": cluster, "diff_lines": c["diff_lines"], "files": c["files"]}


def _cluster_record(cl: Cluster) -> dict[str, Any]:
    reg = cl.regression
    return {"kind": "cluster", "index": cl.index, "members": [c["id"] for c in cl.members],
            "size": len(cl.members), "votes": cl.votes, "representative": cl.representative["id"],
            "fixed": cl.fixed, "score": round(cl.score, 4),
            "regression": None if reg is None else {"run": reg[0], "broken": len(reg[1])},
            "outcomes": cl.outcomes}


def rank(candidates: list[dict[str, Any]], tests: list[dict[str, Any]] | None,
         method: str = "behaviour") -> list[dict[str, Any]]:
    """The rank stage's records. ``behaviour``: ``cluster`` per cluster (``index``, ``members``,
    ``size``, ``votes``, ``representative``, ``fixed``, ``score``, ``regression``,
    ``outcomes``), one ``selection`` (``method``, ``candidates``, ``tested``, ``clusters``,
    ``cluster_sizes``, ``scripts`` [{``script``, ``weight``, ``fixed_by``, ``ran_on``}],
    ``chosen``, ``runner_up``, ``reason``: the criterion that decided); both methods then
    ``ranked`` per candidate (``rank``, ``id``, ``votes``, ``tested``, ``repro_fixed``,
    ``n_scripts``, ``regression_failures``, ``cluster``, ``diff_lines``), last ``chosen``
    (``id`` or ``None``, ``diff``: the patch)."""
    if method not in METHODS:
        raise ValueError(f"unknown rank method {method!r}; one of {', '.join(METHODS)}")
    results = {r["id"]: r for r in (tests or []) if r.get("kind") == "candidate_test"}
    kept = _kept(tests)
    records: list[dict[str, Any]] = []
    if method == "order":
        order = sorted(candidates, key=lambda c: rank_key(c, results.get(c["id"])))
        member_of: dict[str, int] = {}
    else:
        found = clusters(candidates, results, kept)
        weights = script_weights(found, kept)
        ordered = order_clusters(found, weights)
        member_of = {c["id"]: cl.index for cl in ordered for c in cl.members}
        # then the untested: a candidate that did not apply on the original code last
        rest = sorted((c for c in candidates if c["id"] not in member_of),
                      key=lambda c: (_not_applied(results.get(c["id"])), *candidate_order(c)))
        order = [c for cl in ordered for c in cl.members] + rest
        records += [_cluster_record(cl) for cl in ordered]
        why = reason(ordered) if ordered else ("no candidate" if not candidates
                                                else "untested: votes, then diff size")
        records.append({
            "kind": "selection", "method": method, "candidates": len(candidates),
            "tested": len(member_of), "clusters": len(ordered),
            "cluster_sizes": [len(cl.members) for cl in ordered],
            "scripts": [{"script": s, "weight": round(w["weight"], 4), "fixed_by": w["fixed_by"],
                         "ran_on": w["ran_on"]} for s, w in weights.items()],
            "chosen": order[0]["id"] if order else None,
            "chosen_cluster": ordered[0].index if ordered else None,
            "runner_up": ordered[1].representative["id"] if len(ordered) > 1 else None,
            "reason": why})
    for i, c in enumerate(order):
        records.append(_ranked(i, c, results.get(c["id"]), len(kept), member_of.get(c["id"])))
    best = order[0] if order else None
    records.append({"kind": "chosen", "id": best["id"] if best else None,
                    "diff": best["diff"] if best else ""})
    return records
