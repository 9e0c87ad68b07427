"""The bounded, scheduled test stage (issue 31) on a real repository: sympy's own test files.

    python benches/swebench_test_stage_bounds.py MIRROR COMMIT VENV OUT workers=1,budget=900 \\
        workers=2,budget=900 workers=2,budget=60

``MIRROR``: a bare sympy repository holding ``COMMIT`` (``git clone --bare --depth 1``);
``VENV``: a venv whose ``python`` has pytest, hypothesis and mpmath (sympy's test needs), put
first on the sandbox's ``PATH`` (the host mode, ``--task-env`` off); ``OUT``: a folder for the
work trees and ``results.json``. Each ``workers=N,budget=S`` runs ``testing.test_stage`` once
with three made-up candidates on ``sympy/core/numbers.py`` (``c0`` an equivalent rewrite of
``Rational.__neg__``, ``c1`` a wrong ``Integer.__abs__``, ``c2`` a ``Rational.__neg__`` that
never returns) and three scripts; their test files are ``sympy/core/tests/test_numbers.py`` and
``sympy/polys/numberfields/tests/test_numbers.py``. Prints per setting the wall seconds, runs,
cuts and verdicts; ``results.json`` has the timelines. A check of the machinery, not a resolve
rate: the candidates and scripts are not a SWE-bench instance's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fak.gitsafe import git
from fak.sandbox.venv import venv_paths
from fak.swebench.pipeline import testing
from fak.swebench.pipeline.source import Repo

EDITS = [
    ("c0", 3, "    def __neg__(self):\n        return Rational(-self.p, self.q)\n",
     "    def __neg__(self):\n        return Rational(-self.p, self.q, 1)\n"),
    ("c1", 2, "        else:\n            return Integer(-self.p)\n",
     "        else:\n            return Integer(self.p)\n"),
    ("c2", 1, "    def __neg__(self):\n        return Rational(-self.p, self.q)\n",
     "    def __neg__(self):\n        while True:\n            pass\n"),
]
SCRIPTS = [{"id": "r0", "code": "from sympy import Rational\nassert -Rational(1, 2) == Rational(1, 2)\n"},
           {"id": "r1", "code": "from sympy import Integer\nassert abs(Integer(-3)) == -3\n"},
           {"id": "r2", "code": "from sympy import Integer\nassert Integer(2) + 2 == 4\n"}]


def main(argv: list[str]) -> int:
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    mirror, commit, venv, out = Path(argv[0]), argv[1], Path(argv[2]), Path(argv[3])
    task = {"instance_id": "sympy-bounds", "repo": "sympy/sympy", "base_commit": commit,
            "version": ""}

    def task_env(work: Path) -> testing.TaskEnv:
        t = testing.prepare(task, mirror, work, task_env=False)
        t.env["PATH"] = f"{venv}/bin:{t.env['PATH']}"
        t.readable = list(dict.fromkeys([*venv_paths(venv), *t.readable]))
        return t

    scratch = task_env(out / "scratch")
    path = scratch.root / "sympy/core/numbers.py"
    orig = path.read_text()
    cands = []
    for cid, votes, old, new in EDITS:
        if orig.count(old) != 1:
            print(f"{cid}: the code it edits is not in {path} at {commit}", file=sys.stderr)
            return 1
        path.write_text(orig.replace(old, new))
        diff = git(scratch.root, "diff").stdout
        path.write_text(orig)
        cands.append({"id": cid, "votes": votes, "diff_lines": diff.count("\n"),
                      "files": ["sympy/core/numbers.py"], "diff": diff})
    testing.cleanup(out / "scratch")
    repo = Repo(mirror, commit)
    results = {}
    for setting in argv[4:]:
        kw = dict(x.split("=", 1) for x in setting.split(","))
        cfg = testing.TestConfig(workers=int(kw["workers"]), budget_s=float(kw["budget"]))
        t0 = time.time()
        records = testing.test_stage(repo, task, cands, SCRIPTS, task_env(out / "w"), cfg)
        testing.cleanup(out / "w")
        sched = records[-1]
        results[setting] = {
            "wall_s": round(time.time() - t0, 1), "runs": sched["runs"],
            "cut": [{k: x.get(k) for k in ("run", "candidate", "script", "file", "why")}
                    for x in sched["cut"]],
            "base": {r["files"][0]: [r["seconds"], len(r["passing"])]
                     for r in records if r["kind"] == "regression_base"},
            "candidates": {r["id"]: {"repro": r.get("repro"),
                                     "regression_failures": len(r["regression_failures"])
                                     if "regression_failures" in r else None,
                                     "regression_killed": r.get("regression_killed")}
                           for r in records if r["kind"] == "candidate_test"},
            "timeline": sched["timeline"]}
        print(setting, json.dumps({k: v for k, v in results[setting].items() if k != "timeline"}),
              flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
