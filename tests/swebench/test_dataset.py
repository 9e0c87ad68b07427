"""Dataset loading and selection on the shared Verified rows: the smoke slice, ids, regex,
difficulty labels (meta JSONL, JSON map, rows' own field)."""

from __future__ import annotations

import json

import pytest
from test_real_instance import SHARED

from fak.swebench.dataset import DatasetError, load_rows, select, slice_ids, parse_test_list

SMOKE = SHARED / "verified-smoke.jsonl"
DEV = SHARED / "verified-dev.jsonl"
META = SHARED / "verified-smoke.meta.jsonl"


def test_rows_have_official_fields_and_json_test_lists():
    rows = load_rows(DEV)
    assert len(rows) == 85
    assert list(rows[0]) == ["repo", "instance_id", "base_commit", "patch", "test_patch",
                             "problem_statement", "hints_text", "created_at", "version",
                             "FAIL_TO_PASS", "PASS_TO_PASS", "environment_setup_commit"]
    assert isinstance(rows[0]["FAIL_TO_PASS"], str)
    assert all(isinstance(t, str) for t in parse_test_list(rows[0]["FAIL_TO_PASS"]))
    assert parse_test_list(["a"]) == ["a"] and parse_test_list("") == []


def test_smoke_slice_is_the_shared_smoke_file():
    ids = [json.loads(ln)["instance_id"] for ln in SMOKE.read_text().splitlines()]
    assert slice_ids("smoke") == ids and len(ids) == 16
    rows, _ = select(DEV, "smoke")
    assert sorted(r["instance_id"] for r in rows) == sorted(ids)


def test_ids_and_regex_filters():
    rows, _ = select(DEV, "psf__requests-2931,pytest-dev__pytest-7236")
    assert sorted(r["instance_id"] for r in rows) == ["psf__requests-2931", "pytest-dev__pytest-7236"]
    rows, _ = select(DEV, r"^django__")
    assert len(rows) == 26 and all(r["repo"] == "django/django" for r in rows)
    with pytest.raises(DatasetError, match="matches no instance"):
        select(DEV, "nonexistent__repo-1")
    with pytest.raises(DatasetError, match="not in the dataset"):
        select(load_smoke_minus_one(), "smoke")


def load_smoke_minus_one():
    import tempfile
    from pathlib import Path

    lines = SMOKE.read_text().splitlines()[1:]
    path = Path(tempfile.mkdtemp()) / "partial.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_difficulty_from_meta_jsonl_and_map(tmp_path):
    rows, labels = select(SMOKE, None, META, ["easy"])
    assert labels["pytest-dev__pytest-7236"] == "15 min - 1 hour"
    assert rows and all(labels[r["instance_id"]] == "<15 min fix" for r in rows)
    medium, _ = select(SMOKE, None, META, ["15 min - 1 hour"])
    assert {r["instance_id"] for r in medium} >= {"pytest-dev__pytest-7236", "psf__requests-2931"}
    assert len(rows) + len(medium) <= 16
    mapping = tmp_path / "d.json"
    mapping.write_text(json.dumps({"psf__requests-2931": "1-4 hours"}))
    rows, _ = select(SMOKE, None, mapping, ["hard"])
    assert [r["instance_id"] for r in rows] == ["psf__requests-2931"]


def test_difficulty_from_rows_own_field(tmp_path):
    rows = [json.loads(ln) for ln in SMOKE.read_text().splitlines()[:3]]
    rows[0]["difficulty"] = "<15 min fix"
    rows[1]["difficulty"] = ">4 hours"
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    selected, _ = select(path, None, None, ["very_hard"])
    assert [r["instance_id"] for r in selected] == [rows[1]["instance_id"]]
