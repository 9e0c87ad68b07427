"""The per-instance table of a pipeline run, graded: what each stage made and what was chosen.

    python benches/swebench_pipeline_report.py RUN_DIR [EVAL_REPORT.json] > table.md

``RUN_DIR`` is a ``fak swebench run --agent pipeline --output`` folder (its ``pipeline/ID/*.jsonl``
artifacts); ``EVAL_REPORT.json`` is ``fak swebench eval``'s ``report.json`` for the run's
``predictions.json``. Prints a Markdown table to stdout; exit status 2 on wrong arguments. Per instance: locations chosen, samples asked, candidates that applied and
parsed, reproduction scripts written / kept (they fail on the original code), candidates the
scripts ran on and whose regression tests ran, how many candidates fixed every kept script, the
chosen candidate (its votes, scripts fixed, regression failures) and the graded result. Reads
only the run's own artifacts and the grader's report: nothing of the dataset's tests or patch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fak.swebench.pipeline.artifacts import Store


def instance_row(store: Store, iid: str) -> dict[str, Any]:
    """The table row of one instance's artifacts (a stage not run yet counts as empty)."""
    def kind(stage: str, k: str) -> list[dict[str, Any]]:
        art = store.load(iid, stage)
        return art.of_kind(k) if art else []

    kept = [r for r in kind("test", "script_base") if r.get("kept")]
    tried = kind("test", "candidate_test")
    chosen = next(iter(kind("rank", "chosen")), None)
    ranked = {r["id"]: r for r in kind("rank", "ranked")}
    c = ranked.get(chosen["id"]) if chosen and chosen.get("id") else None
    return {
        "instance_id": iid,
        "locations": len(kind("choose", "location")),
        "samples": len(kind("repair", "sample")),
        "candidates": len(kind("repair", "candidate")),
        "scripts": len(kind("reproduce", "script")),
        "kept": len(kept),
        "repro_tried": len(tried),
        "regression_tried": sum(1 for r in tried if "regression_failures" in r),
        "fixed_all": sum(1 for r in tried if kept and r.get("applied") and r.get("repro_fixed") == len(kept)),
        "chosen": chosen.get("id") if chosen else None,
        "chosen_votes": c["votes"] if c else None,
        "chosen_fixed": c.get("repro_fixed") if c else None,
        "chosen_regressions": c.get("regression_failures") if c else None,
        "patch_lines": len((chosen or {}).get("diff", "").splitlines()),
    }


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    run = Path(argv[0])
    report = json.loads(Path(argv[1]).read_text()) if len(argv) == 2 else None
    store = Store(run / "pipeline")
    rows = [instance_row(store, p.name) for p in sorted(store.root.iterdir()) if p.is_dir()]
    cols = ["instance", "locations", "samples", "candidates", "scripts / kept",
            "scripts ran on / regression on", "fixed every kept script", "chosen (votes, fixed, regressions)",
            "patch lines", "graded"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        graded = "-"
        if report is not None:
            iid = r["instance_id"]
            graded = ("**resolved**" if iid in report.get("resolved_ids", []) else
                      "unresolved" if iid in report.get("unresolved_ids", []) else
                      "empty patch" if iid in report.get("empty_patch_ids", []) else
                      "error" if iid in report.get("error_ids", []) else "not graded")
        chosen = (f"{r['chosen']} ({r['chosen_votes']}, {r['chosen_fixed']}, {r['chosen_regressions']})"
                  if r["chosen"] else "none")
        print(f"| {r['instance_id']} | {r['locations']} | {r['samples']} | {r['candidates']} | "
              f"{r['scripts']} / {r['kept']} | {r['repro_tried']} / {r['regression_tried']} | "
              f"{r['fixed_all']} | {chosen} | {r['patch_lines']} | {graded} |")
    if report is not None:
        print(f"\nresolved {report.get('resolved_instances')} of {len(rows)} "
              f"(submitted {report.get('submitted_instances')}, completed "
              f"{report.get('completed_instances')}, empty {report.get('empty_patch_instances')}, "
              f"errors {report.get('error_instances')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
