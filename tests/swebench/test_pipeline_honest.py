"""Honest selection: nothing the pipeline does depends on a row's grading fields.

The same run twice, once on rows whose grading fields are poisoned — a gold patch that would win
if it were read, test lists and a test patch that point elsewhere, hints that name another file —
must give byte-identical predictions, the same artifacts (timings, test-output excerpts and the
output folder's own path aside) and the same requests to the model. ``--hints`` is the only switch that lets
``hints_text`` in, and it shows in the prompts. The pipeline's source does not even name the
grading fields.

To add a case: poison another field in ``POISON`` (the run must not change), or add a field to
``TASK_FIELDS`` only with a reason (a developer has it when the issue is filed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import fak.swebench.pipeline as pipeline_pkg
from fak.swebench.pipeline.artifacts import VOLATILE
from pipeline_fixtures import (
    RIGHT_FIX,
    RuleServer,
    ShapesModel,
    make_shapes,
    shapes_index,
)
from tiny import run_fak

GRADING_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS", "test_patch", "patch")
POISON = {
    # the right fix as the gold patch: a pipeline that read it would choose it for shapes-1
    "patch": ("diff --git a/shapes/util.py b/shapes/util.py\n--- a/shapes/util.py\n+++ b/shapes/util.py\n"
              "@@ -1,5 +1,5 @@\n from shapes.geometry import Point\n \n \n def origin():\n"
              "-    return Point(0, 0)\n+    return Point(0, 1)\n"),
    "test_patch": "diff --git a/shapes/tests/test_geometry.py b/shapes/tests/test_geometry.py\n"
                  "--- a/shapes/tests/test_geometry.py\n+++ b/shapes/tests/test_geometry.py\n"
                  "@@ -1,1 +1,1 @@\n-from shapes.geometry import Point, scale\n+import garbage\n",
    "FAIL_TO_PASS": json.dumps(["shapes/tests/test_geometry.py::test_add", "x::garbage"]),
    "PASS_TO_PASS": json.dumps(["shapes/tests/test_geometry.py::test_scale_y_unchanged"]),
    "hints_text": "The bug is in shapes/util.py, in origin(); see `origin_point_factory`.",
}


def _run(sh, dataset: Path, out: Path, server: RuleServer, *extra: str):
    return run_fak("swebench", "run", "--agent", "pipeline", "--gateway", server.addr,
                   "--dataset", str(dataset), "--repos", str(sh["repos"]), "--output", str(out),
                   "--no-live", "--chat-template", str(sh["template"]), "--repair-samples", "10",
                   "--max-locations", "1", "--test-candidates", "2", "--workers", "1", *extra,
                   timeout=300)


def _artifacts(out: Path) -> dict[str, list]:
    """Every artifact's records, with timings and output excerpts (``VOLATILE``: test durations
    in pytest's summary) dropped and the output folder's path replaced."""
    def clean(obj):
        if isinstance(obj, dict):
            return {k: clean(v) for k, v in obj.items() if k not in VOLATILE}
        if isinstance(obj, list):
            return [clean(v) for v in obj]
        if isinstance(obj, str):
            return obj.replace(str(out.resolve()), "OUT").replace(str(out), "OUT")
        return obj

    arts = {}
    for p in sorted((out / "pipeline").rglob("*.jsonl")):
        rows = [json.loads(ln) for ln in p.read_text().splitlines()]
        header = {k: rows[0][k] for k in ("stage", "input_digest", "config", "model")}
        arts[str(p.relative_to(out))] = [header, *clean(rows[1:])]
    return arts


def _requests(server: RuleServer) -> list[str]:
    return sorted(json.dumps({"prompt": r["prompt"], "body": r["body"],
                              "conversation": r["headers"].get("x-fak-conversation", "").split("/")[-1]},
                             sort_keys=True) for r in server.requests)


def test_poisoned_grading_fields_change_nothing(tmp_path):
    sh = make_shapes(tmp_path / "shapes")
    clean_rows = sh["rows"]
    poisoned = tmp_path / "poisoned.jsonl"
    poisoned.write_text("".join(json.dumps({**r, **POISON}) + "\n" for r in clean_rows))

    outs, reqs = [], []
    for name, dataset in (("clean", sh["dataset"]), ("poisoned", poisoned)):
        server = RuleServer(ShapesModel(shapes_index())).start()
        try:
            proc = _run(sh, dataset, tmp_path / name, server)
            assert proc.returncode == 0, proc.stderr
            reqs.append(_requests(server))
        finally:
            server.stop()
        outs.append(tmp_path / name)
    clean, dirty = outs
    assert (clean / "predictions.json").read_bytes() == (dirty / "predictions.json").read_bytes()
    assert _artifacts(clean) == _artifacts(dirty)
    assert reqs[0] == reqs[1]
    # the run did choose (so the comparison is not between two empty runs), and not the poison
    preds = {p["instance_id"]: p["model_patch"] for p in json.loads((dirty / "predictions.json").read_text())}
    assert RIGHT_FIX in preds["fak-test__shapes-1"] and "shapes/util.py" not in preds["fak-test__shapes-1"]
    for text in reqs[1]:
        for value in POISON.values():
            assert value not in text and "origin_point_factory" not in text

    # --hints lets hints_text in (and only then)
    server = RuleServer(ShapesModel(shapes_index())).start()
    try:
        proc = _run(sh, poisoned, tmp_path / "hints", server, "--hints", "--stages", "locate,choose")
        assert proc.returncode == 0, proc.stderr
        assert any("origin_point_factory" in r["prompt"] for r in server.requests)
    finally:
        server.stop()


def test_pipeline_source_never_names_the_grading_fields():
    root = Path(pipeline_pkg.__file__).resolve().parent
    sources = list(root.rglob("*.py")) + list(root.rglob("*.j2"))
    assert len(sources) > 10
    pattern = re.compile(r"\b(" + "|".join(GRADING_FIELDS) + r")\b")
    for path in sources:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            names = [m for m in pattern.findall(line) if m != "patch"]
            # "patch" is an ordinary word (a candidate's patch); reading it from a row would matter
            row_access = re.search(r"""\b(row|task|r)\s*(\[|\.get\()\s*["']patch["']""", line)
            assert not names and not row_access, f"{path}:{i}: {line.strip()}"


def test_task_view_keeps_only_the_task():
    from fak.swebench.pipeline.task import TASK_FIELDS, task_view

    row = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "problem_statement": "x",
           "version": 1.0, **POISON}
    view = task_view(row)
    assert set(view) <= set(TASK_FIELDS) and not set(view) & set(POISON)
    assert view["version"] == "1.0"
    assert task_view(row, hints=True)["hints_text"] == POISON["hints_text"]

