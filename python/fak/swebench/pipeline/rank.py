"""Stage 5, ``rank``: order the candidates and choose one patch per instance.

The order (best first), after Agentless's selection: candidates the ``test`` stage ran before
those it did not (or that did not apply, or whose scripts could not start: no ``repro``); then more reproduction scripts fixed (a kept script
that now exits 0); then those whose regression tests ran before those whose did not (or not all
of them: the test stage's budget cut a file); then fewer regression tests broken (a lower rank,
never an exclusion: a right fix sometimes changes asserted behaviour); then more votes (answers
that gave the same normalized patch); then the smaller diff; then the earlier candidate. Without
a ``test`` artifact the order is votes, then diff size. No candidate at all gives the empty
patch.
"""

from __future__ import annotations

from typing import Any


def _tested(result: dict[str, Any] | None) -> bool:
    """Whether a ``candidate_test`` record is a result: applied, and not a record whose scripts
    could none of them start (``repro_env_error`` without ``repro``)."""
    return result is not None and bool(result.get("applied")) and (
        "repro" in result or "repro_env_error" not in result)


def rank_key(c: dict[str, Any], result: dict[str, Any] | None) -> tuple:
    """The sort key of candidate ``c`` with its ``candidate_test`` record (or ``None``)."""
    tested = _tested(result)
    fixed = int(result.get("repro_fixed", 0)) if tested else 0
    ran = tested and "regression_failures" in result
    # tests broken: those its regression runs showed, or, where some of its test files were cut
    # (ranked as not run), those the files that ran showed
    broken = len(result.get("regression_failures", result.get("regression_partial", []))) \
        if tested else 0
    return (0 if tested else 1, -fixed, 0 if ran else 1, broken, -int(c["votes"]), int(c["diff_lines"]),
            int(str(c["id"]).lstrip("c") or 0))


def rank(candidates: list[dict[str, Any]], tests: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The rank stage's records: ``ranked`` per candidate (``rank``, ``id``, ``votes``,
    ``tested``, ``repro_fixed``, ``n_scripts``, ``regression_failures``, ``diff_lines``), then
    ``chosen`` (``id`` or ``None``, ``diff``: the patch)."""
    results = {r["id"]: r for r in (tests or []) if r.get("kind") == "candidate_test"}
    n_scripts = sum(1 for r in (tests or []) if r.get("kind") == "script_base" and r.get("kept"))
    order = sorted(candidates, key=lambda c: rank_key(c, results.get(c["id"])))
    records: list[dict[str, Any]] = []
    for i, c in enumerate(order):
        r = results.get(c["id"])
        tested = _tested(r)
        records.append({"kind": "ranked", "rank": i, "id": c["id"], "votes": c["votes"],
                        "tested": tested, "applied": None if r is None else bool(r.get("applied")),
                        "repro_fixed": r.get("repro_fixed") if tested else None,
                        "n_scripts": n_scripts,
                        "regression_failures": len(r["regression_failures"])
                        if tested and "regression_failures" in r else None,
                        "diff_lines": c["diff_lines"], "files": c["files"]})
    best = order[0] if order else None
    records.append({"kind": "chosen", "id": best["id"] if best else None,
                    "diff": best["diff"] if best else ""})
    return records
