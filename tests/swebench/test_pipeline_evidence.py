"""Evidence only from runs that started (issue 31): the sandbox binds the interpreter it is asked
to run wherever it lives (a venv under ``/tmp``, which the sandbox hides), and a run that could
not start — the interpreter hidden, the harness missing — is an environment error: never a kept
reproduction, never a regression base, no result for a candidate, counted in the instance's
summary; while an import error of the project's own code (a candidate that broke an import) is
evidence.

The rule is ``fak.swebench.pipeline.evidence``'s docstring; ``test_the_rule`` has one row per
clause and per look-alike that must stay evidence (add a row there for a new case). The other
tests run ``testing.test_stage`` on ``calc_repo``'s repository in fak's real sandbox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
from calc_repo import QUICK, SCRIPTS, SLOW, make_calc, of, stage

from fak.sandbox import Sandbox, interpreter_paths
from fak.swebench.envs import SYSTEM_PATH
from fak.swebench.pipeline import testing
from fak.swebench.pipeline.artifacts import Artifact
from fak.swebench.pipeline.evidence import could_not_start, script_record
from fak.swebench.pipeline.execute import RunResult
from fak.swebench.pipeline.instance import _counts
from fak.swebench.pipeline.rank import rank

NOT_FOUND = "bwrap: execvp python: No such file or directory\n"
PYTEST_OUT = "============================= test session starts ==============================\n"

# (exit status, output, killed, an environment error?)
RULE = [
    # 1. could not be run: the shell's and the unshare sandbox's statuses
    (127, "bash: line 1: python: command not found\n", False, True),
    (127, "fak-sandbox: exec python: No such file or directory\n", False, True),
    (126, "bash: line 1: ./bin/test: Permission denied\n", False, True),
    # 2. the sandbox's own set-up failed
    (125, "fak-sandbox: mount /x failed\n", False, True),
    (125, "some program's own status 125\n", False, False),
    # 3. the first line is the machinery's, before the program
    (1, NOT_FOUND, False, True),
    (1, "\n" + NOT_FOUND, False, True),
    (1, "bwrap: Can't find source path /tmp/venv: No such file or directory\n", False, True),
    (1, "/tmp/venv/bin/python: No module named pytest\n", False, True),
    (1, "/root/.pyenv/versions/3.11.7/bin/python3.11: No module named pytest\n", False, True),
    (2, "/tmp/venv/bin/python: can't open file '/w/.fak/repro_r0.py': [Errno 2] No such file or "
        "directory\n", False, True),
    # evidence: the program started and failed, whatever it printed later
    (1, "Traceback (most recent call last):\n  File \"/w/.fak/repro_r0.py\", line 1, in <module>\n"
        "    from calc import double\nModuleNotFoundError: No module named 'calc.missing'\n",
     False, False),
    (1, "Traceback (most recent call last):\nImportError: cannot import name 'helper' from "
        "'calc.core' (/w/calc/core.py)\n", False, False),
    (1, PYTEST_OUT + "E   ModuleNotFoundError: No module named 'pytest_helper'\n", False, False),
    (1, PYTEST_OUT + "    os.execvp(cmd[0], cmd)\nFileNotFoundError: [Errno 2] No such file\n",
     False, False),
    (1, "starting\n" + NOT_FOUND, False, False),  # a script's own output, after it started
    (1, "Traceback (most recent call last):\nAssertionError: 3 != 4\n", False, False),
    (2, PYTEST_OUT + "ERROR collecting calc/tests/test_core.py\n", False, False),
    (0, NOT_FOUND, False, False),
    (None, "", True, False),
    (None, NOT_FOUND, True, False),  # killed: a timeout, whatever it printed
]


@pytest.mark.parametrize(("rc", "output", "killed", "env"), RULE)
def test_the_rule(rc, output, killed, env):
    why = could_not_start(RunResult(rc, output, killed, 0.1))
    assert (why is not None) == env, why
    if env:
        assert why.strip()
        record = script_record("r0", RunResult(rc, output, killed, 0.1))
        assert not record["kept"] and record["env_error"] == why
        assert record["why"] == f"environment error: {why}"


def test_interpreter_paths_of_a_uv_style_venv_and_what_is_never_bound(tmp_path):
    """A venv (``pyvenv.cfg`` ``home``) whose ``bin/python`` links to a base interpreter
    elsewhere: the venv, the base prefix and the executable's real prefix are bound; paths that
    do not exist are left out, and a prefix that is the home directory, above it, a hidden root
    or ``/`` never is."""
    base = tmp_path / "uv" / "python" / "cpython-3.12"
    (base / "bin").mkdir(parents=True)
    (base / "bin" / "python3.12").write_text("")
    venv = tmp_path / "proj" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\nversion = 3.12.0\n")
    os.symlink(base / "bin" / "python3.12", venv / "bin" / "python")
    home = tmp_path / "home"
    home.mkdir()

    got = interpreter_paths(venv, base, venv / "bin" / "python", home=home)
    assert got == [venv, base]
    # a prefix that is no venv (conda), the base prefix gone: the executable's real prefix,
    # found through its link, is what shows the interpreter
    conda = tmp_path / "conda" / "envs" / "x"
    (conda / "bin").mkdir(parents=True)
    os.symlink(base / "bin" / "python3.12", conda / "bin" / "python")
    assert interpreter_paths(conda, tmp_path / "gone", conda / "bin" / "python", home=home) == [conda, base]
    # nothing that would show the home, /tmp, or / whole
    assert interpreter_paths(venv, home, venv / "bin" / "python", home=home) == [venv, base]
    assert interpreter_paths(venv, tmp_path.parent, venv / "bin" / "python", home=home) == [venv, base]
    assert interpreter_paths(venv, "/tmp", "/python3", home=home) == [venv, base]
    # the running interpreter's by default
    assert Path(sys.prefix) in interpreter_paths() and Path(sys.base_prefix) in interpreter_paths()


@pytest.fixture()
def tmp_venv():
    """A real venv under ``/tmp`` (hidden by the sandbox) that sees this interpreter's packages
    (pytest among them) through a ``.pth`` file, as a fresh clone's venv under ``/tmp`` does."""
    root = Path(tempfile.mkdtemp(prefix="fak-venv-", dir="/tmp"))
    try:
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv),
                                                           "platbase": str(venv)}))
        ours = [p for p in sys.path if "site-packages" in p and os.path.isdir(p)]
        (purelib / "host-packages.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
        yield venv
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_venv_under_tmp_runs_in_the_sandbox_with_its_binds(tmp_venv, tmp_path):
    """The sandbox runs the venv's own interpreter once ``interpreter_paths`` binds it; without
    them the venv's folder on ``PATH`` is hidden and its interpreter does not run."""
    ws = tmp_path / "ws"
    ws.mkdir()
    exe = tmp_venv / "bin" / "python"
    env = {"PATH": f"{tmp_venv / 'bin'}:{SYSTEM_PATH}"}
    argv = ["python", "-c", "import sys, pytest; print(sys.prefix)"]

    binds = interpreter_paths(tmp_venv, sys.base_prefix, exe) + interpreter_paths()
    assert tmp_venv in binds
    res = Sandbox(ws, readable=binds, env=env, timeout_s=60).run(argv)
    assert res.returncode == 0 and res.output.strip() == str(tmp_venv), res.output

    hidden = Sandbox(ws, readable=interpreter_paths(), env=env, timeout_s=60).run(argv)
    assert hidden.output.strip() != str(tmp_venv), hidden.output


def _in_venv(tenv: testing.TaskEnv, venv: Path, bind: bool) -> testing.TaskEnv:
    """``tenv`` running ``venv``'s interpreter (first on ``PATH``), with its binds or without."""
    tenv.env["PATH"] = f"{venv / 'bin'}:{SYSTEM_PATH}"
    tenv.readable = interpreter_paths() + (
        interpreter_paths(venv, sys.base_prefix, venv / "bin" / "python") if bind else [])
    return tenv


@pytest.mark.skipif(shutil.which("python", path=SYSTEM_PATH) is not None,
                    reason="a system `python` runs when the venv's is hidden: no start failure")
def test_the_issue_a_hidden_interpreter_is_no_evidence_then_its_binds_make_it_run(tmp_venv, tmp_path):
    """Issue 31 as a user met it: the host mode's interpreter in a venv under ``/tmp``. Unbound,
    every run ends ``bwrap: execvp python`` (or ``command not found``): no script kept, no
    regression base, each run counted as an environment error in the instance's summary. Bound
    (what ``prepare`` does), the same stage keeps the failing scripts and tests the candidates."""
    calc = make_calc(tmp_path / "calc", slow_s=0, pad="slow")
    cands = [calc["cands"]["right"], calc["cands"]["wrong"]]

    def run(work: str, bind: bool) -> list[dict]:
        tenv = testing.prepare(calc["task"], calc["mirror"], tmp_path / work, task_env=False)
        return stage(calc, tmp_path / work, cands, tenv=_in_venv(tenv, tmp_venv, bind), workers=1)

    hidden = run("hidden", bind=False)
    base = of(hidden, "script_base")
    assert [r["script"] for r in base] == ["r0", "r1", "r2"]
    assert not any(r["kept"] for r in base)
    assert all(r["env_error"] and r["why"].startswith("environment error") for r in base), base
    # nothing kept: the candidates' records carry no result, and no file has a regression base
    assert all(r["repro"] == {} and r["repro_fixed"] == 0 for r in of(hidden, "candidate_test"))
    assert all(r["passing"] == [] and r["env_error"] for r in of(hidden, "regression_base"))
    assert all("regression_failures" not in r and r["regression_env_error"]
               for r in of(hidden, "candidate_test"))
    sched = of(hidden, "schedule")[0]
    kinds = {(e["run"], e.get("script") or e.get("file")) for e in sched["env_errors"]}
    assert {("script_base", s["id"]) for s in SCRIPTS} <= kinds
    assert ("regression_base", QUICK) in kinds
    counts = _counts({"test": Artifact(tmp_path / "test.jsonl", {}, hidden)})
    assert counts["test_env_errors"] == len(sched["env_errors"]) >= 4
    assert counts["scripts_kept"] == 0

    bound = run("bound", bind=True)
    assert {r["script"]: r["kept"] for r in of(bound, "script_base")} == {"r0": True, "r1": True,
                                                                           "r2": False}
    assert of(bound, "schedule")[0]["env_errors"] == []
    by_id = {r["id"]: r for r in of(bound, "candidate_test")}
    assert by_id["c0"]["repro_fixed"] == 2 and by_id["c0"]["regression_failures"] == []
    assert by_id["c1"]["regression_failures"] == [f"{QUICK}::test_zero"]
    assert _counts({"test": Artifact(tmp_path / "t.jsonl", {}, bound)})["test_env_errors"] == 0


SITECUSTOMIZE_127 = """diff --git a/sitecustomize.py b/sitecustomize.py
new file mode 100644
--- /dev/null
+++ b/sitecustomize.py
@@ -0,0 +1,2 @@
+import os
+os._exit(127)
"""


def test_a_broken_import_is_evidence_and_a_candidate_that_stops_python_starting_is_not(tmp_path):
    """A candidate that breaks the package's import (``calc.core`` imports a module that does not
    exist) fails the scripts and the tests: evidence, ranked below the right fix with its
    regressions counted. A candidate whose change stops the interpreter starting at all (exit
    127 from a ``sitecustomize``) gives no result: no ``repro``, its script runs listed as
    environment errors, ranked after every candidate that was tested."""
    calc = make_calc(tmp_path / "calc", slow_s=0, pad="slow",
                     cands={"broken": "    return x + x\nfrom calc.missing import helper\n"})
    c = calc["cands"]
    dead = {"id": "c9", "votes": 9, "diff_lines": 7, "files": ["sitecustomize.py"],
            "diff": SITECUSTOMIZE_127}
    cands = [c["right"], c["broken"], dead]
    records = stage(calc, tmp_path / "w", cands, workers=2)

    by_id = {r["id"]: r for r in of(records, "candidate_test")}
    broken = by_id[c["broken"]["id"]]
    assert broken["applied"] and "repro_env_error" not in broken
    assert set(broken["repro"]) == {"r0", "r1"} and broken["repro_fixed"] == 0
    assert all(rc not in (0, None) for rc in broken["repro"].values())
    assert "regression_env_error" not in broken
    assert sorted(broken["regression_failures"]) == [f"{QUICK}::test_int", f"{QUICK}::test_zero",
                                                     f"{SLOW}::test_big"]

    assert by_id["c9"]["applied"] and "repro" not in by_id["c9"]
    assert set(by_id["c9"]["repro_env_error"]) == {"r0", "r1"}
    assert all("exit 127" in why for why in by_id["c9"]["repro_env_error"].values())
    sched = of(records, "schedule")[0]
    assert sorted(e["script"] for e in sched["env_errors"]) == ["r0", "r1"]
    assert {e["candidate"] for e in sched["env_errors"]} == {"c9"}

    ranked = [r for r in rank(cands, records) if r["kind"] == "ranked"]
    assert [r["id"] for r in ranked] == ["c0", c["broken"]["id"], "c9"]  # despite its 9 votes
    assert ranked[1]["regression_failures"] == 3
    assert ranked[2]["tested"] is False and ranked[2]["repro_fixed"] is None
