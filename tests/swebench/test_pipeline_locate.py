"""The pipeline's ``locate`` stage and its parts, without a model: clues from issue texts, paths
mapped to the repository, files and functions ranked in the tiny ``shapes`` repository.

To add a case: an issue text and what ``extract`` must find, or a shapes issue and the file and
symbol ``locate`` must rank first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fak.swebench.pipeline.clues import error_fragments, extract
from fak.swebench.pipeline.locate import locate, resolve_path
from fak.swebench.pipeline.source import Repo, is_source_path, outline_of
from pipeline_fixtures import ISSUES, make_shapes


@pytest.fixture()
def shapes(tmp_path: Path) -> dict:
    return make_shapes(tmp_path / "shapes")


def test_clues_from_tracebacks_errors_links_and_names():
    text = (
        "Calling `Widget.bar_baz()` fails, see https://github.com/o/r/blob/main/pkg/mod.py#L12\n"
        "```\nTraceback (most recent call last):\n"
        '  File "/usr/lib/python3.9/site-packages/pkg/core.py", line 40, in evaluate\n'
        "    x = table[key]\nKeyError: Max\n"
        "UnboundLocalError: local variable 'reprec' referenced before assignment\n```\n"
        "/opt/env/lib/site-packages/pkg/vector.py in __add__(self, other)\n"
        "---> 61         other = _check_vector(other)\n"
        "D:\\envs\\lib\\site-packages\\pkg\\groups.py:2207: in minimal_blocks\n")
    c = extract(text)
    assert ("/usr/lib/python3.9/site-packages/pkg/core.py", 40, "evaluate") in c.frames
    assert ("/opt/env/lib/site-packages/pkg/vector.py", 61, "__add__") in c.frames
    assert ("pkg/mod.py", 12) in c.links
    assert "local variable 'reprec' referenced before assignment" in c.errors
    assert "referenced before assignment" in c.errors
    for name in ("Widget", "bar_baz", "evaluate", "_check_vector", "__add__"):
        assert name in c.identifiers, name
    # keywords, builtins and prose are not searched
    for name in ("self", "other", "Traceback", "most", "None", "print"):
        assert name not in c.identifiers, name


def test_error_fragments_split_at_formatted_parts():
    frags = error_fragments("Expecting sequence of coordinates, not `Mul`")
    assert frags[0] == "Expecting sequence of coordinates, not `Mul`"
    assert "Expecting sequence of coordinates, not" in frags


def test_resolve_path_by_longest_suffix():
    files = ["sympy/core/evalf.py", "sympy/physics/vector/vector.py", "setup.py",
             "src/_pytest/unittest.py", "sympy/tensor/array/__init__.py"]
    fs = set(files)
    assert resolve_path("/usr/local/lib/python3.6/site-packages/sympy/core/evalf.py", files, fs) \
        == "sympy/core/evalf.py"
    assert resolve_path("D:/env/Lib/site-packages/sympy/physics/vector/vector.py", files, fs) \
        == "sympy/physics/vector/vector.py"
    assert resolve_path("./sympy/core/evalf.py", files, fs) == "sympy/core/evalf.py"
    assert resolve_path("_pytest/unittest.py", files, fs) == "src/_pytest/unittest.py"
    assert resolve_path("sympy/tensor/array", files, fs) == "sympy/tensor/array/__init__.py"
    assert resolve_path("evalf.py", files, fs) == "sympy/core/evalf.py"  # unique file name
    assert resolve_path("/home/me/test_repro.py", files, fs) is None


def test_source_paths_exclude_tests_and_docs():
    assert is_source_path("shapes/geometry.py")
    for p in ("shapes/tests/test_geometry.py", "docs/geometry.rst", "tests/test_x.py",
              "testing/python/approx.py", "conftest.py", "setup.py", "doc/conf.py"):
        assert not is_source_path(p), p


def test_outline_maps_lines_to_the_innermost_symbol():
    o = outline_of("shapes/geometry.py", make_shapes.__globals__["GEOMETRY"])
    names = [s.name for s in o.symbols]
    assert names[:3] == ["Point", "Point.__init__", "Point.__add__"]
    assert o.enclosing(13).name == "Point.__add__"
    assert o.enclosing(28).name == "scale"
    assert o.find("__add__").name == "Point.__add__"


def test_locate_follows_the_traceback_to_the_method(shapes):
    repo = Repo(shapes["repos"] / "fak-test" / "shapes", shapes["base_commit"])
    found = locate(repo, ISSUES["fak-test__shapes-2"])
    top = found["files"][0]
    assert top["path"] == "shapes/geometry.py"
    assert any(r.startswith("traceback") for r in top["reasons"])
    assert any("error text" in r for r in top["reasons"])
    assert top["symbols"][0]["name"] == "Point.__add__"
    hit = next(h for h in top["hits"] if h["line"] == 13)
    assert hit["symbol"] == "Point.__add__"
    paths = [f["path"] for f in found["files"]]
    assert all(is_source_path(p) for p in paths)
    assert "shapes/tests/test_geometry.py" not in paths and "docs/geometry.rst" not in paths


def test_locate_ranks_the_named_function_first(shapes):
    repo = Repo(shapes["repos"] / "fak-test" / "shapes", shapes["base_commit"])
    found = locate(repo, ISSUES["fak-test__shapes-1"])
    assert found["files"][0]["path"] == "shapes/geometry.py"
    assert found["files"][0]["symbols"][0]["name"] == "scale"
    # deterministic: the same tree and issue give the same ranking
    assert locate(repo, ISSUES["fak-test__shapes-1"]) == found
