"""``benches/swebench_localization.py``: the offline analysis of where a pipeline run lost the gold
location (read after a run, never in one)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("swebench_localization",
                                               Path(__file__).resolve().parents[2] / "benches" / "swebench_localization.py")
loc = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(loc)

GOLD = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -40,6 +40,7 @@ def f():
     x = 1
+    y = 2
@@ -90 +91 @@ def g():
-    return 1
+    return 2
diff --git a/pkg/tests/test_mod.py b/pkg/tests/test_mod.py
--- a/pkg/tests/test_mod.py
+++ b/pkg/tests/test_mod.py
@@ -1,2 +1,3 @@
+import x
"""


def test_hunks():
    h = loc.hunks(GOLD)
    assert h == {"pkg/mod.py": [(40, 45), (90, 90)], "pkg/tests/test_mod.py": [(1, 2)]}


def _write(d: Path, stage: str, records: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stage}.jsonl").write_text("\n".join(json.dumps(r) for r in [{"kind": "header"}, *records]) + "\n")


def test_analyse_stage_by_stage(tmp_path):
    d = tmp_path / "pipeline" / "o__r-1"
    _write(d, "locate", [{"kind": "file", "rank": 0, "path": "pkg/other.py"}, {"kind": "file", "rank": 1, "path": "pkg/mod.py"}])
    _write(d, "choose", [{"kind": "file_votes", "votes": {"pkg/other.py": 5, "pkg/mod.py": 2}},
                         {"kind": "location", "path": "pkg/mod.py", "start": 1, "end": 39},   # the file, not the hunk
                         {"kind": "location", "path": "pkg/other.py", "start": 30, "end": 50}])
    cand = "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -88,3 +88,3 @@\n-a\n+b\n"
    _write(d, "repair", [{"kind": "candidate", "id": "c0", "diff": cand},
                         {"kind": "candidate", "id": "c1", "diff": cand.replace("pkg/mod.py", "pkg/other.py")}])
    _write(d, "rank", [{"kind": "chosen", "id": "c1", "diff": ""}])
    r = loc.analyse(d, {"instance_id": "o__r-1", "patch": GOLD})
    assert r["gold_files"] == ["pkg/mod.py"], "test files are left out"
    assert r["locate_rank"] == 1
    assert r["vote_top_is_gold"] is False and r["vote_has_gold"] is True
    assert r["location_in_gold_file"] is True and r["location_on_gold_hunk"] is False
    assert r["candidates_in_gold_file"] == 1 and r["candidate_on_gold_hunk"] is True  # 88–90 meets 90
    assert r["chosen_in_gold_file"] is False, "the chosen id's diff is looked up among the candidates"
    s = loc.summary([r])
    assert s["locate_hit@1"] == 0 and s["locate_hit@3"] == 1 and s["any_candidate_on_gold_hunk"] == 1
