"""Make the small run folders that tests/report/test_report_page.py renders, from real runs kept
in benches/results (2026-12-06 fleet run j2-w14 on an H100, 2026-12-02 pipeline run on an H200):
three fleet instances and two pipeline instances, long texts cut, every field as the run wrote it.

    python tests/data/report_runs/make_fixtures.py     # rewrites fleet/ and pipeline/ here
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[2] / "benches" / "results"
FLEET = ["psf__requests-2931", "pytest-dev__pytest-7236", "sympy__sympy-14711"]
PIPE = ["pytest-dev__pytest-7236", "sympy__sympy-14711"]


def cut(s, n):
    return s if not isinstance(s, str) or len(s) <= n else s[:n] + f"\n[... cut for the fixture: {len(s) - n} more characters]"


def dump(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")


def trim_grading(r: dict, keep: list[str]) -> dict:
    r = dict(r)
    for k, v in list(r.items()):
        if k.endswith("_ids"):
            r[k] = [i for i in v if i in keep]
    r["instances"] = {k: v for k, v in r["instances"].items() if k in keep}
    for v in r["instances"].values():
        v.pop("log_dir", None)
        for grp in (v.get("tests_status") or {}).values():
            grp["success"] = grp["success"][:5]
    return r


def fleet(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["tar", "xJf", str(RESULTS / "fleet-gpu-2026-12-06" / "j2-fleet-w14.tar.xz"),
                        "-C", tmp], check=True)
        src = Path(tmp) / "w14"
        s = json.loads((src / "run" / "summary.json").read_text())
        s["instances"] = [i for i in s["instances"] if i["instance_id"] in FLEET]
        s["note"] = "fixture: 3 of the run's 14 instances (totals are the whole run's)"
        dump(out / "summary.json", s)
        preds = json.loads((src / "run" / "predictions.json").read_text())
        dump(out / "predictions.json", [p for p in preds if p["instance_id"] in FLEET])
        ids = set()
        for iid in FLEET:
            t = json.loads((src / "run" / "trajectories" / f"{iid}.traj.json").read_text())
            t["messages"] = [dict(m, content=cut(m.get("content"), 1500)) for m in t["messages"][:2]]
            t["steps"] = t["steps"][:8]
            for st in t["steps"]:
                for a in st.get("actions") or []:
                    a["output"] = cut(a.get("output"), 500)
                    ids.add(a.get("id"))
            t["info"] = {}
            dump(out / "trajectories" / f"{iid}.traj.json", t)
        audit = [json.loads(x) for x in (src / "audit.jsonl").read_text().splitlines()]
        keep = [a for a in audit if a.get("tool_call_id") in ids or
                (a.get("conversation", "").split("/")[-1] in FLEET and a.get("event") is None)][:80]
        (out / "audit.jsonl").write_text("".join(json.dumps(a) + "\n" for a in keep))
        shutil.copy(src / "health.json", out / "health.json")
    g = json.loads((RESULTS / "fleet-gpu-2026-12-06" / "j2-w14-eval-report.json").read_text())
    dump(out / "eval" / "report.json", trim_grading(g, FLEET))


def pipeline(out: Path) -> None:
    base = RESULTS / "swebench-gpu-2026-12-02"
    s = json.loads((base / "summary-exec.json").read_text())
    s["instances"] = [i for i in s["instances"] if i["instance_id"] in PIPE]
    s["note"] = "fixture: 2 of the run's 14 instances (totals are the whole run's)"
    dump(out / "summary.json", s)
    preds = json.loads((base / "predictions.json").read_text())
    dump(out / "predictions.json", [p for p in preds if p["instance_id"] in PIPE])
    dump(out / "eval" / "report.json", trim_grading(json.loads((base / "report.json").read_text()), PIPE))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["tar", "xJf", str(base / "pipeline-artifacts.tar.xz"), "-C", tmp], check=True)
        for iid in PIPE:
            for f in sorted((Path(tmp) / "pipeline" / iid).glob("*.jsonl")):
                recs = [json.loads(x) for x in f.read_text().splitlines()]
                kept, samples = [], 0
                for r in recs:
                    if r.get("kind") == "sample":
                        samples += 1
                        if samples > 6:
                            continue
                    if r.get("kind") == "file":
                        r["hits"] = r.get("hits", [])[:2]
                        if r.get("rank", 0) >= 4:
                            continue
                    for k in ("text", "output_tail", "code"):
                        if k in r:
                            r[k] = cut(r[k], 300)
                    if r.get("kind") == "candidate":
                        r["samples"] = r.get("samples", [])[:3]
                    if "passing" in r:
                        r["passing"] = r["passing"][:5]
                    kept.append(r)
                dst = out / "pipeline" / iid / f.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))


if __name__ == "__main__":
    for name, fn in (("fleet", fleet), ("pipeline", pipeline)):
        shutil.rmtree(HERE / name, ignore_errors=True)
        fn(HERE / name)
    print(subprocess.run(["du", "-sh", str(HERE / "fleet"), str(HERE / "pipeline")],
                         capture_output=True, text=True).stdout)
