"""``fak-test/calc``, the repository of the test stage's tests (``test_pipeline_bounded``,
``test_pipeline_evidence``): ``calc.core.double`` returns ``x + x + 1`` (the bug); a quick test
file next to it and one whose test sleeps (the slow suite); three candidates: the right fix, a
wrong one that breaks a quick test, and one that hangs; reproduction scripts ``SCRIPTS``.

``make_calc`` takes more files and candidates (``files``, ``cands``) for a test's own case.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from fak.swebench.pipeline import testing
from fak.swebench.pipeline.source import Repo

CORE = "def double(x):\n    return x + x + 1\n"
QUICK = "calc/tests/test_core.py"  # nearest to calc/core.py: found first
SLOW = "tests/test_core.py"
SCRIPTS = [{"id": "r0", "code": "from calc import double\nassert double(1) == 2, double(1)\n"},
           {"id": "r1", "code": "from calc import double\nassert double(0) == 0, double(0)\n"},
           {"id": "r2", "code": "from calc import double\nassert double(1) > 0\n"}]  # passes


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def make_calc(root: Path, *, slow_s: float, pad: str, files: dict[str, str] | None = None,
              cands: dict[str, str] | None = None) -> dict:
    """The repo (``src``), its bare mirror and the three candidates (``cands``: more, name →
    the body of ``double``); ``slow_s``: how long the slow test sleeps; ``pad``: which test file
    is made the larger (``"quick"`` or ``"slow"``); ``files``: more files (path → text)."""
    extra_files, extra_cands = files or {}, cands or {}
    src = root / "src"
    files = {
        "calc/__init__.py": "from calc.core import double\n",
        "calc/core.py": CORE,
        "calc/tests/__init__.py": "",
        QUICK: ("from calc.core import double\n\n\n"
                "def test_zero():\n    assert double(0) in (0, 1)\n\n\n"
                "def test_int():\n    assert isinstance(double(2), int)\n"),
        SLOW: (f"import time\n\nfrom calc.core import double\n\n\n"
               f"def test_big():\n    time.sleep({slow_s})\n    assert double(5) > 9\n"),
    }
    files.update(extra_files)
    big = QUICK if pad == "quick" else SLOW
    files[big] += "\n" + "# padding\n" * 200
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    _git(src, "init", "-q", "-b", "main")
    _git(src, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "add", "-A")
    _git(src, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-qm", "calc")
    base = _git(src, "rev-parse", "HEAD").strip()
    mirror = root / "repos" / "fak-test" / "calc"
    mirror.parent.mkdir(parents=True)
    _git(root, "clone", "-q", "--bare", str(src), str(mirror))

    def cand(cid: str, votes: int, body: str) -> dict:
        (src / "calc/core.py").write_text(f"def double(x):\n{body}")
        diff = _git(src, "diff")
        (src / "calc/core.py").write_text(CORE)
        return {"id": cid, "votes": votes, "diff_lines": diff.count("\n"),
                "files": ["calc/core.py"], "diff": diff}

    cands = {"right": cand("c0", 3, "    return x + x\n"),
             "hang": cand("c2", 2, "    import time\n    time.sleep(30)\n    return x + x\n"),
             "wrong": cand("c1", 1, "    return x + x + 2\n")}
    for i, (name, body) in enumerate(extra_cands.items()):
        cands[name] = cand(f"c{3 + i}", 0, body)
    task = {"instance_id": "fak-test__calc-1", "repo": "fak-test/calc", "base_commit": base,
            "version": "0.1"}
    return {"src": src, "mirror": mirror, "task": task, "cands": cands}




def stage(calc: dict, work: Path, cands: list[dict], scripts: list[dict] | None = None,
          tenv: testing.TaskEnv | None = None, **cfg) -> list[dict]:
    """The test stage's records for ``cands`` (and ``scripts``, ``SCRIPTS`` by default) in the
    host mode (``tenv``: ``testing.prepare``'s by default), ``cfg`` the ``TestConfig``."""
    task = calc["task"]
    tenv = tenv or testing.prepare(task, calc["mirror"], work, task_env=False)
    repo = Repo(calc["mirror"], task["base_commit"])
    return testing.test_stage(repo, task, cands, SCRIPTS if scripts is None else scripts, tenv,
                              testing.TestConfig(**cfg))


def of(records: list[dict], kind: str) -> list[dict]:
    """The records of ``kind``."""
    return [r for r in records if r["kind"] == kind]
