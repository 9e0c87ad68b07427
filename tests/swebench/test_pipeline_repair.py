"""SEARCH/REPLACE edits and the ``repair`` and ``rank`` stages on the tiny ``shapes`` repository,
with a fake sampler that returns fixed answers (no server).

To add a case: an answer text in ``ShapesModel.REPAIR_1`` (or here) and the status ``repair``
must give it; for ranking, a candidate list and the order expected.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fak.swebench.pipeline.edits import (
    Block,
    EditError,
    apply_block,
    normalized,
    parse_blocks,
    strip_line_numbers,
)
from fak.swebench.pipeline.rank import rank
from fak.swebench.pipeline.repair import RepairConfig, repair
from fak.swebench.pipeline.sampler import Sample, Usage
from fak.swebench.pipeline.source import Repo
from pipeline_fixtures import (
    GEOMETRY,
    RIGHT_FIX,
    SCALE_LINE,
    WRONG_FIX,
    ShapesModel,
    edit,
    make_shapes,
)


class FakeSampler:
    """Returns ``answers`` in order, one per sample (``mode``: ``chat``)."""

    mode = "chat"

    def __init__(self, answers: list[str]):
        self.answers = answers
        self.calls: list[dict] = []

    def sample(self, messages, *, n, key, prefill="", temperature=0.8, max_tokens=512, stop=None,
               greedy_first=True, usage=None):
        self.calls.append({"messages": messages, "n": n, "key": key})
        return [Sample(self.answers[i % len(self.answers)], i, i, 0.0 if i == 0 else temperature,
                       "stop", 10, 10, 0.0) for i in range(n)]


def test_parse_blocks_inherits_the_path_and_takes_several():
    text = ("```python\n### a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n"
            "<<<<<<< SEARCH\ny = 1\n=======\ny = 2\n>>>>>>> REPLACE\n```\n"
            "### b.py\n<<<<<<< SEARCH\nz\n=======\nw\n>>>>>>> REPLACE")
    assert parse_blocks(text) == [Block("a.py", "x = 1", "x = 2"), Block("a.py", "y = 1", "y = 2"),
                                  Block("b.py", "z", "w")]
    assert parse_blocks("<<<<<<< SEARCH\nq\n=======\nr\n>>>>>>> REPLACE", "d.py")[0].path == "d.py"
    assert parse_blocks("no edit here") == []


def test_apply_block_exact_nearest_numbers_and_indentation():
    text = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"
    # two matches: the one nearest the location wins
    assert apply_block(text, Block("", "    return 1", "    return 2"), near_line=6) == \
        "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert apply_block(text, Block("", "    return 1", "    return 2"), near_line=1).startswith(
        "def f():\n    return 2\n")
    # copied line numbers are removed
    assert apply_block(text, Block("", "5  def g():\n6      return 1", "5  def g():\n6      return 3"),
                       near_line=5).endswith("def g():\n    return 3\n")
    # indentation off by four: matched ignoring it, the replacement re-indented
    out = apply_block(text, Block("", "    def g():\n        return 1",
                                  "    def g():\n        if True:\n            return 4"), 5)
    assert out.endswith("def g():\n    if True:\n        return 4\n")
    with pytest.raises(EditError) as e:
        apply_block(text, Block("", "return 99", "return 1"))
    assert e.value.reason == "not_found"
    with pytest.raises(EditError) as e:
        apply_block(text, Block("", "  \n", "x"))
    assert e.value.reason == "empty_search"


def test_strip_line_numbers_needs_most_lines_numbered():
    assert strip_line_numbers(["12      x = 1", "13      y = 2"]) == ["    x = 1", "    y = 2"]
    assert strip_line_numbers(["    x = 1", "12      y = 2", "    z = 3"]) is None


def test_normalized_ignores_comments_and_formatting():
    a = "def f(a, b):\n    return a + b\n"
    assert normalized("m.py", a) == normalized("m.py", "def f(a,b):  # sum\n\n    return (a + b)\n")
    assert normalized("m.py", a) != normalized("m.py", "def f(a, b):\n    return a - b\n")


def test_repair_drops_bad_answers_and_deduplicates(tmp_path: Path):
    sh = make_shapes(tmp_path / "shapes")
    repo = Repo(sh["repos"] / "fak-test" / "shapes", sh["base_commit"])
    loc = {"rank": 0, "path": "shapes/geometry.py", "symbol": "scale", "start": 26, "end": 28}
    answers = ShapesModel.REPAIR_1[:8] + [
        edit("shapes/tests/test_geometry.py", "    assert scale(Point(1, 2), 3).y == 2",
             "    assert True"),                                   # a test file: bad_path
        edit("shapes/geometry.py", SCALE_LINE, RIGHT_FIX + "   # scaled"),  # duplicate of [5]
    ]
    sampler = FakeSampler(answers)
    records = repair(repo, "scale does not scale y", {"repo": "fak-test/shapes"}, [loc], sampler,
                     RepairConfig(samples=len(answers), forms=("search_replace",)), Usage(),
                     "fak-test__shapes-1")
    statuses = [r["status"] for r in records if r["kind"] == "sample"]
    assert statuses == ["ok", "duplicate", "no_apply", "noop", "syntax", "ok", "format", "noop",
                        "bad_path", "duplicate"]
    cands = [r for r in records if r["kind"] == "candidate"]
    assert [(c["id"], c["votes"]) for c in cands] == [("c0", 2), ("c1", 2)]
    assert cands[0]["samples"] == [[0, "search_replace", 0], [0, "search_replace", 1]]
    assert cands[1]["samples"] == [[0, "search_replace", 5], [0, "search_replace", 9]]
    # the prompt shows the region with line numbers, and no placeholder to copy
    prompt = sampler.calls[0]["messages"][1]["content"]
    assert "26  def scale(point, factor):" in prompt and "28      return Point(" in prompt
    assert "<<<<<<< SEARCH\n" not in prompt
    # every candidate is a patch that git applies to the base commit and that parses
    for c, fixed in zip(cands, (WRONG_FIX, RIGHT_FIX)):
        ws = tmp_path / c["id"]
        subprocess.run(["git", "clone", "-q", str(sh["src"]), str(ws)], check=True)
        subprocess.run(["git", "apply", "-"], input=c["diff"].encode(), cwd=ws, check=True)
        text = (ws / "shapes" / "geometry.py").read_text()
        assert fixed in text and text != GEOMETRY
        assert c["files"] == ["shapes/geometry.py"] and c["diff_lines"] == 2


def test_rewrite_answers_replace_the_region(tmp_path: Path):
    sh = make_shapes(tmp_path / "shapes")
    repo = Repo(sh["repos"] / "fak-test" / "shapes", sh["base_commit"])
    loc = {"rank": 0, "path": "shapes/geometry.py", "symbol": "Point.__add__", "start": 11, "end": 14}
    moved = ShapesModel({})("Rewrite these lines", {"body": {}, "headers": {
        "x-fak-conversation": "r/fak-test__shapes-2"}, "mode": "chat"})
    same = "```python\n" + "\n".join(GEOMETRY.splitlines()[10:14]) + "\n```"
    sampler = FakeSampler([moved, same, "```python\n    def __add__(self, other:\n```", "```python\n```"])
    records = repair(repo, "sum of points", {"repo": "fak-test/shapes"}, [loc], sampler,
                     RepairConfig(samples=4, forms=("rewrite",)), Usage(), "fak-test__shapes-2")
    assert [r["status"] for r in records if r["kind"] == "sample"] == ["ok", "noop", "syntax", "format"]
    cand = records[-1]
    assert "+        if other == 0:\n+            return self\n" in cand["diff"]
    assert sampler.calls[0]["key"] == "fak-test__shapes-2/rewrite/0"


def _cand(cid: str, votes: int, lines: int) -> dict:
    return {"id": cid, "votes": votes, "diff_lines": lines, "files": ["m.py"], "diff": f"P{cid}"}


def test_rank_order_method_repro_then_regressions_then_votes_then_size():
    cands = [_cand("c0", 9, 2), _cand("c1", 1, 8), _cand("c2", 1, 2), _cand("c3", 3, 2),
             _cand("c4", 5, 1), _cand("c5", 20, 1)]
    tests = [{"kind": "script_base", "script": "r0", "kept": True},
             {"kind": "candidate_test", "id": "c0", "applied": True, "repro_fixed": 0,
              "regression_failures": []},
             {"kind": "candidate_test", "id": "c1", "applied": True, "repro_fixed": 1,
              "regression_failures": ["t::a"]},
             {"kind": "candidate_test", "id": "c2", "applied": True, "repro_fixed": 1,
              "regression_failures": []},
             {"kind": "candidate_test", "id": "c3", "applied": True, "repro_fixed": 1,
              "regression_failures": []},
             {"kind": "candidate_test", "id": "c5", "applied": False}]
    records = rank(cands, tests, "order")
    order = [r["id"] for r in records if r["kind"] == "ranked"]
    # c3, c2 fix the reproduction with no regression (c3 has more votes); c1 fixes it but breaks
    # a test (ranked lower, not excluded); c0 does not fix it; c4 (untested) and c5 (did not
    # apply) come last, by votes
    assert order == ["c3", "c2", "c1", "c0", "c5", "c4"]
    chosen = records[-1]
    assert chosen == {"kind": "chosen", "id": "c3", "diff": "Pc3"}


def test_rank_without_tests_is_votes_then_diff_size_and_empty_without_candidates():
    for method in ("behaviour", "order"):
        records = rank([_cand("c0", 2, 5), _cand("c1", 2, 3), _cand("c2", 1, 1)], None, method)
        assert [r["id"] for r in records if r["kind"] == "ranked"] == ["c1", "c0", "c2"]
        assert records[-1] == {"kind": "chosen", "id": "c1", "diff": "Pc1"}
        assert rank([], None, method)[-1] == {"kind": "chosen", "id": None, "diff": ""}
        assert [r["kind"] for r in rank([], None, method)] == \
            (["selection", "chosen"] if method == "behaviour" else ["chosen"])
