"""Choosing among behaviour clusters (issue 31): how much each kept reproduction script says, the
order of the clusters, and which criterion decided.

Script weights (``script_weights``). A kept script fails on the original code; on a candidate it
passes or not. A script that every tested candidate passes, or none does, separates no candidates
and weighs 0. Otherwise its weight is the binary entropy (bits) of its pass share ``p`` over the
tested candidates on which it ran, ``-p log2 p - (1-p) log2 (1-p)``: 1 when half pass, 0.23
when 1 of 27 does. (Counted over candidates, not votes: a distinct patch is one observation.)

The order of the clusters (``cluster_key``), best first:

1. ``scripts``: the summed weight of the kept scripts the cluster passes (higher first);
2. ``regressions``: clusters whose regression tests all ran before the others (some cut, none ran,
   could not start), then fewer tests broken (a lower rank, never an exclusion: a right fix
   sometimes changes asserted behaviour);
3. ``cluster size``: the votes of its members summed (answers that gave one of its patches);
4. ``diff size``: the representative's diff lines (smaller first);
5. ``order``: the representative's candidate number (earlier first).

The representative of a cluster (its first member, ``behaviour.candidate_order``): most votes,
then the smallest diff, then the earlier candidate. The chosen patch is the best cluster's
representative; the ``reason`` is the first criterion on which it differs from the runner-up
cluster (``only cluster`` when there is one). Not built here: a model judgement between the top
few clusters (the issue's step between cluster size and diff size).
"""

from __future__ import annotations

import math
from typing import Any

from fak.swebench.pipeline.behaviour import Cluster, candidate_number

#: the criteria of ``cluster_key``, in order (a ``reason``)
CRITERIA = ("scripts", "regressions", "cluster size", "diff size", "order")


def entropy(p: float) -> float:
    """The binary entropy of ``p`` in bits (0 at 0 and 1)."""
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def script_weights(clusters: list[Cluster], scripts: list[str]) -> dict[str, dict[str, Any]]:
    """Per kept script: ``weight`` (module docstring), ``fixed_by`` (tested candidates it passes
    on), ``ran_on`` (tested candidates it ran on)."""
    out: dict[str, dict[str, Any]] = {}
    for s in scripts:
        ran = fixed = 0
        for cl in clusters:
            o = cl.outcomes.get(s)
            if o is None:
                continue
            ran += len(cl.members)
            fixed += len(cl.members) if o == "pass" else 0
        out[s] = {"weight": entropy(fixed / ran) if ran else 0.0, "fixed_by": fixed, "ran_on": ran}
    return out


def regression_rank(cl: Cluster) -> tuple[int, int]:
    """Criterion 2: (0 when all its regression tests ran, else 1; tests broken)."""
    obs = cl.regression
    if obs is None:
        return (1, 0)
    return (0 if obs[0] == "ran" else 1, len(obs[1]))


def cluster_key(cl: Cluster) -> tuple:
    """The sort key of a scored cluster (``cl.score`` set): the criteria of ``CRITERIA``."""
    rep = cl.representative
    return (-round(cl.score, 9) + 0.0, regression_rank(cl), -cl.votes,
            int(rep["diff_lines"]), candidate_number(rep["id"]))


def order_clusters(clusters: list[Cluster], weights: dict[str, dict[str, Any]]) -> list[Cluster]:
    """Score each cluster (the summed weight of the scripts it passes), sort them best first and
    number them (``index``)."""
    for cl in clusters:
        cl.score = sum(weights[s]["weight"] for s in cl.fixed if s in weights)
    ordered = sorted(clusters, key=cluster_key)
    for i, cl in enumerate(ordered):
        cl.index = i
    return ordered


def reason(ordered: list[Cluster]) -> str:
    """Which criterion put the first cluster before the second: one of ``CRITERIA``, or
    ``only cluster``, or ``no cluster`` (nothing was tested)."""
    if not ordered:
        return "no cluster"
    if len(ordered) == 1:
        return "only cluster"
    a, b = cluster_key(ordered[0]), cluster_key(ordered[1])
    return next((name for name, x, y in zip(CRITERIA, a, b) if x != y), "order")
