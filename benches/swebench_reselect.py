"""Re-rank recorded pipeline artifacts with the rank stage's methods and compare the choices
with an oracle file (issue 31, selection by behaviour). Offline: no model, no test run, no
grading; reads only the artifacts (``repair``, ``test``, the recorded ``rank``) and the oracle.

    python benches/swebench_reselect.py ARTIFACTS_DIR ORACLE.json [--out FILE.json]

``ARTIFACTS_DIR`` holds ``pipeline/ID/STAGE.jsonl`` (or is that ``pipeline`` folder). The oracle
(``benches/swebench_oracle.py``) lists per instance the ranks, in the *recorded* rank order,
whose candidate resolved among the ``k`` graded: a choice is ``resolves`` / ``does not`` when the
recorded rank of that candidate is below ``k``, else ``not graded``. Oracle figures are labelled
as such: never a resolve rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fak.swebench.pipeline.artifacts import Store
from fak.swebench.pipeline.rank import rank


def verdict(cid: str | None, recorded: list[str], k: int, resolving: set[str]) -> str:
    if cid is None or cid not in recorded[:k]:
        return "not graded"
    return "resolves" if cid in resolving else "does not"


def reselect(root: Path, oracle: dict[str, Any]) -> list[dict[str, Any]]:
    store = Store(root / "pipeline" if (root / "pipeline").is_dir() else root)
    k = int(oracle.get("k", 8))
    rows = []
    for iid in sorted(p.name for p in store.root.iterdir() if p.is_dir()):
        repair, test, old = (store.load(iid, s) for s in ("repair", "test", "rank"))
        if repair is None or old is None:
            continue
        cands = repair.of_kind("candidate")
        tests = test.records if test is not None else None
        recorded = [r["id"] for r in old.of_kind("ranked")]
        resolving = {recorded[i] for i in oracle["instances"].get(iid, []) if i < len(recorded)}
        order = rank(cands, tests, "order")
        new = rank(cands, tests, "behaviour")
        sel = next(r for r in new if r["kind"] == "selection")
        cl_of = {r["id"]: r["cluster"] for r in new if r["kind"] == "ranked"}
        before, after = old.of_kind("chosen")[0]["id"], new[-1]["id"]
        rows.append({
            "instance_id": iid, "candidates": sel["candidates"], "tested": sel["tested"],
            "clusters": sel["clusters"], "cluster_sizes": sel["cluster_sizes"],
            "scripts": sel["scripts"], "before": before, "order_method": order[-1]["id"],
            "after": after, "reason": sel["reason"], "runner_up": sel["runner_up"],
            "changed": before != after,
            "before_graded": verdict(before, recorded, k, resolving),
            "after_graded": verdict(after, recorded, k, resolving),
            "oracle_had_fix": bool(resolving),
            "fix_clusters": sorted({cl_of.get(c) for c in resolving},
                                   key=lambda x: (x is None, x if x is not None else 0)),
        })
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| instance | candidates (tested) | clusters: sizes | kept scripts (weight > 0 / all) "
           "| before | after | reason | graded before / after | oracle@8 had a fix (clusters of the fixes) |",
           "|---|---:|---|---|---|---|---|---|---|"]
    for r in rows:
        w = [f"{s['script']} {s['weight']:.2f} ({s['fixed_by']}/{s['ran_on']})"
             for s in r["scripts"] if s["weight"] > 0]
        fix = ("yes (" + ", ".join("untested" if c is None else f"#{c}" for c in r["fix_clusters"])
               + ")") if r["oracle_had_fix"] else "no"
        out.append(f"| {r['instance_id']} | {r['candidates']} ({r['tested']}) | {r['clusters']}: "
                   f"{', '.join(map(str, r['cluster_sizes']))} | {'; '.join(w) or '—'} / "
                   f"{len(r['scripts'])} | {r['before']} | {r['after']} | {r['reason']} | "
                   f"{r['before_graded']} / {r['after_graded']} | {fix} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("oracle", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = reselect(a.artifacts, json.loads(a.oracle.read_text()))
    if a.out:
        a.out.write_text(json.dumps({"label": "re-ranking of recorded artifacts; oracle figures "
                                              "are not a resolve rate", "rows": rows}, indent=1) + "\n")
    print(table(rows))
    n = len(rows)
    print(f"\nchanged {sum(r['changed'] for r in rows)} of {n}; chosen resolves (oracle-graded): "
          f"before {sum(r['before_graded'] == 'resolves' for r in rows)}, after "
          f"{sum(r['after_graded'] == 'resolves' for r in rows)}; not graded after: "
          f"{sum(r['after_graded'] == 'not graded' for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
