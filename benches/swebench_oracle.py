"""Oracle pass@k of a pipeline run: does any of its k best-ranked candidates resolve the instance?

    python benches/swebench_oracle.py RUN_DIR --k 8 --dataset ROWS.jsonl --repos MIRRORS \
        [--workers 2] [--only ID,ID] [--out DIR]

For each rank r < k, the r-th candidate of every instance's ``rank`` artifact
(``RUN_DIR/pipeline/ID/rank.jsonl`` and the diffs of ``repair.jsonl``) becomes one predictions file,
graded by ``fak swebench eval --local`` into ``RUN_DIR/oracle/rank-R``; the summary
``RUN_DIR/oracle/oracle.json`` lists per instance the ranks that resolved. This is an upper bound
on what a better selection could reach with the same candidates, labelled as such: never the
resolve rate, which is the graded result of the one chosen patch (rank 0). It runs the grader,
which reads the dataset's tests; the pipeline run itself never does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fak.swebench.pipeline.artifacts import Store


def ranked_diffs(store: Store, iid: str) -> list[str]:
    """The instance's candidate diffs in the rank stage's order (``[]`` before ``rank`` ran)."""
    repair, rank = store.load(iid, "repair"), store.load(iid, "rank")
    if repair is None or rank is None:
        return []
    diffs = {r["id"]: r["diff"] for r in repair.of_kind("candidate")}
    return [diffs[r["id"]] for r in rank.of_kind("ranked") if r["id"] in diffs]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--repos", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated instance ids (default: all)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/oracle)")
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    store = Store(args.run / "pipeline")
    ranked = {p.name: ranked_diffs(store, p.name) for p in sorted(store.root.iterdir())
              if p.is_dir() and (not only or p.name in only)}
    out = args.out or args.run / "oracle"
    out.mkdir(parents=True, exist_ok=True)
    resolved: dict[str, list[int]] = {iid: [] for iid in ranked}
    for r in range(args.k):
        preds = [{"instance_id": iid, "model_name_or_path": f"oracle-rank-{r}", "model_patch": d[r]}
                 for iid, d in ranked.items() if len(d) > r]
        if not preds:
            break
        folder = out / f"rank-{r}"
        folder.mkdir(exist_ok=True)
        (folder / "predictions.json").write_text(json.dumps(preds, indent=1))
        report = folder / "report.json"
        if not report.exists():
            cmd = [sys.executable, "-m", "fak.cli", "swebench", "eval", "--local", "--repos", args.repos,
                   "--predictions", str(folder / "predictions.json"), "--dataset", args.dataset,
                   "--workers", str(args.workers), "--timeout", "600", "--run-id", f"oracle-{r}",
                   "--output", str(folder)]
            with (folder / "eval.log").open("w") as log:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
        rep = json.loads(report.read_text()) if report.exists() else {}
        for iid in rep.get("resolved_ids", []):
            resolved.setdefault(iid, []).append(r)
        print(f"rank {r}: {len(preds)} graded, resolved {sorted(rep.get('resolved_ids', []))}", flush=True)
    summary = {"k": args.k, "label": f"oracle pass@{args.k} over the ranked candidates (not the resolve rate)",
               "instances": resolved,
               "any_resolved": sorted(i for i, rs in resolved.items() if rs),
               "candidates": {iid: len(d) for iid, d in ranked.items()}}
    (out / "oracle.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({"any_resolved": summary["any_resolved"], "label": summary["label"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
