"""Tiny SWE-bench-shaped instances made by the tests: a git repo with two bugs, a local mirror
``REPOS/fak-test/calc`` (bare), rows with the official field names, gold patches, test patches,
FAIL_TO_PASS / PASS_TO_PASS, and a harness spec registered for the repo.

To add a case: add a bug to ``FILES``, its fixing diff to ``GOLD``, the test that exposes it to
``TEST_PATCHES`` and a row in ``make_instances``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = "fak-test/calc"
VERSION = "0.1"

FILES = {
    "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "text.py": "def shout(s):\n    return s.lower() + '!'\n",
    "tests/__init__.py": "",
    "tests/test_calc.py": "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n",
    "tests/test_text.py": "def test_nothing():\n    assert True\n",
}

GOLD = {
    "fak-test__calc-1": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n"
                        "@@ -1,5 +1,5 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n \n \n"
                        " def mul(a, b):\n",
    "fak-test__calc-2": "diff --git a/text.py b/text.py\n--- a/text.py\n+++ b/text.py\n"
                        "@@ -1,2 +1,2 @@\n def shout(s):\n-    return s.lower() + '!'\n"
                        "+    return s.upper() + '!'\n",
}

TEST_PATCHES = {
    "fak-test__calc-1": "diff --git a/tests/test_calc.py b/tests/test_calc.py\n"
                        "--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n"
                        "@@ -1,5 +1,9 @@\n-from calc import mul\n+from calc import add, mul\n \n \n"
                        " def test_mul():\n     assert mul(2, 3) == 6\n+\n+\n+def test_add():\n"
                        "+    assert add(2, 3) == 5\n",
    "fak-test__calc-2": "diff --git a/tests/test_text.py b/tests/test_text.py\n"
                        "--- a/tests/test_text.py\n+++ b/tests/test_text.py\n"
                        "@@ -1,2 +1,9 @@\n+from text import shout\n+\n+\n def test_nothing():\n"
                        "     assert True\n+\n+\n+def test_shout():\n+    assert shout('hi') == 'HI!'\n",
}

SPECS = {REPO: {VERSION: {
    "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    "system_site_packages": True,  # pytest from the interpreter's site-packages: no download
    "install": "",
    "test_cmd": "pytest -rA -p no:cacheprovider",
    "log_parser": "parse_log_pytest",
}}}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def make_instances(root: Path) -> dict:
    """Build the repo, its bare mirror under ``root/repos``, the dataset and spec files.

    Returns a dict: ``repos`` (mirror folder), ``dataset`` (JSONL path), ``specs`` (JSON path),
    ``rows`` (list), ``base_commit``, ``src`` (the non-bare source repo).
    """
    src = root / "src"
    src.mkdir(parents=True)
    _git(src, "init", "-q", "-b", "main")
    _git(src, "config", "user.email", "t@example.invalid")
    _git(src, "config", "user.name", "t")
    for rel, text in FILES.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "calc with bugs")
    base = _git(src, "rev-parse", "HEAD")
    # a later commit (the "future") that a workspace must not expose
    (src / "CHANGES.md").write_text("fixed later\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "future commit")
    repos = root / "repos"
    (repos / "fak-test").mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(repos / "fak-test" / "calc")],
                   check=True, capture_output=True)
    rows = []
    problems = {"fak-test__calc-1": "add(2, 3) returns -1 instead of 5.",
                "fak-test__calc-2": "shout('hi') returns 'hi!' but should return 'HI!'."}
    f2p = {"fak-test__calc-1": ["tests/test_calc.py::test_add"],
           "fak-test__calc-2": ["tests/test_text.py::test_shout"]}
    p2p = {"fak-test__calc-1": ["tests/test_calc.py::test_mul"],
           "fak-test__calc-2": ["tests/test_text.py::test_nothing"]}
    for iid in GOLD:
        rows.append({"repo": REPO, "instance_id": iid, "base_commit": base, "patch": GOLD[iid],
                     "test_patch": TEST_PATCHES[iid], "problem_statement": problems[iid],
                     "hints_text": "", "created_at": "2024-01-01T00:00:00Z", "version": VERSION,
                     "FAIL_TO_PASS": json.dumps(f2p[iid]), "PASS_TO_PASS": json.dumps(p2p[iid]),
                     "environment_setup_commit": base})
    dataset = root / "dataset.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = root / "specs.json"
    specs.write_text(json.dumps(SPECS))
    return {"repos": repos, "dataset": dataset, "specs": specs, "rows": rows, "base_commit": base,
            "src": src}


def tools_script_fix_add() -> list[dict]:
    """Canned tool calls that fix ``add`` (tool-call protocol)."""
    return [
        {"tool_calls": [{"name": "search", "arguments": {"pattern": "def add"}}]},
        {"tool_calls": [{"name": "read", "arguments": {"path": "calc.py", "start_line": 1,
                                                       "end_line": 3}}]},
        {"tool_calls": [{"name": "edit", "arguments": {"path": "calc.py", "old": "return a - b",
                                                       "new": "return a + b"}}]},
        {"tool_calls": [{"name": "submit", "arguments": {}}]},
    ]


def tools_script_fix_shout() -> list[dict]:
    """Canned tool calls that fix ``shout`` and add a new file (tool-call protocol)."""
    return [
        {"tool_calls": [{"name": "list", "arguments": {}}]},
        {"tool_calls": [{"name": "edit", "arguments": {"path": "text.py", "old": "s.lower()",
                                                       "new": "s.upper()"}}]},
        {"tool_calls": [{"name": "write", "arguments": {"path": "NOTES.md",
                                                        "content": "shout upper-cases\n"}}]},
        {"tool_calls": [{"name": "submit", "arguments": {}}]},
    ]


def text_script_fix_add() -> list[dict]:
    """Canned ```bash turns that fix ``add`` (text protocol)."""
    return [
        {"content": "Find it.\n\n```bash\ngrep -n 'def add' calc.py\n```"},
        {"content": "Fix it.\n\n```bash\nsed -i 's/return a - b/return a + b/' calc.py\n```"},
        {"content": "Check.\n\n```bash\npython -c 'import calc; print(calc.add(2, 3))'\n```"},
        {"content": "Done.\n\n```bash\nsubmit\n```"},
    ]


def run_fak(*args: str, **kw) -> subprocess.CompletedProcess:
    """``python -m fak.cli ARGS`` with the interpreter and ``fak`` package pytest runs."""
    from fak_subprocess import fak_env

    return subprocess.run([sys.executable, "-m", "fak.cli", *args], capture_output=True, text=True,
                          env=fak_env(), **kw)
