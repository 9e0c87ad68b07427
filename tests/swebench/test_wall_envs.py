"""Task environments and the wall (issue 26, docs/sandbox.md "Audit"): what model code can write
into a venv never runs on the host and never widens a later sandbox.

- ``eval --local`` installs the model's patch into a per-instance overlay in the sandbox: the
  shared (repo, version) env, whose interpreter fak runs on the host later, stays untouched,
  and neither the install nor the test run (a model's ``conftest.py``) can write ``.git``.
- fak's own host-side run of a venv's interpreter (``envs._purelib``) runs no ``.pth`` file.
- ``venv_paths`` follows only fak's own ``.pth``: a planted one cannot bind a hidden folder of the
  host into later sandboxes.

The planted code is Python text in this file, written into files; it only creates canary files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tiny import GOLD, SPECS, VERSION, run_fak

from fak.sandbox import venv_paths
from fak.swebench.envs import _purelib

#: what a model's ``plant.py`` (run by the install step) does: put a ``.pth`` file that runs
#: code at every interpreter start into every site-packages folder it can reach
PLANT = '''import os, sys
canary = sys.argv[1]
line = "import pathlib; pathlib.Path(%r).touch()\\n" % canary
for p in sys.path:
    if p.endswith("site-packages") and os.path.isdir(p):
        try:
            with open(os.path.join(p, "zz_planted.pth"), "w") as f:
                f.write(line)
            print("planted", p)
        except OSError as e:
            print("refused", p, e)
try:
    with open(".git/config", "a") as f:
        f.write("[core]\\n\\tfsmonitor = planted\\n")
    print("git config planted")
except OSError as e:
    print("git config refused", e)
'''
#: a model's conftest.py: pytest runs it with the tests; it tries to plant a git hook
CONFTEST = '''import os
try:
    os.makedirs(".git/hooks", exist_ok=True)
    with open(".git/hooks/post-checkout", "w") as f:
        f.write("planted")
except OSError:
    open("conftest_refused", "w").close()
'''


def _new_file(path: str, text: str) -> str:
    lines = text.splitlines()
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}\n" for ln in lines))


def test_eval_local_installs_model_code_into_an_overlay_only(tiny, tmp_path):
    canary = tmp_path / "canary"
    spec = dict(SPECS["fak-test/calc"][VERSION], install=f"python plant.py {canary}")
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"fak-test/calc": {VERSION: spec}}))
    patch = GOLD["fak-test__calc-1"] + _new_file("plant.py", PLANT) + _new_file("conftest.py", CONFTEST)
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"instance_id": "fak-test__calc-1", "model_name_or_path": "m",
                                  "model_patch": patch}]))
    envs = tmp_path / "envs"
    out = tmp_path / "eval"
    proc = run_fak("swebench", "eval", "--local", "--predictions", str(preds), "--dataset",
                   str(tiny["dataset"]), "--repos", str(tiny["repos"]), "--specs", str(specs),
                   "--envs", str(envs), "--output", str(out), "--keep-workspaces", timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["resolved_ids"] == ["fak-test__calc-1"], report["instances"]
    log = (out / "logs" / "fak-test__calc-1" / "install.log").read_text()
    assert "planted" in log and "refused" in log, log  # the overlay: yes; the shared env: no
    assert "git config refused" in log, log  # .git is read-only in the install's sandbox
    kept = out / "logs" / "fak-test__calc-1" / "workspace" / "repo" / ".git"
    assert "planted" not in (kept / "config").read_text()
    assert not (kept / "hooks" / "post-checkout").exists()  # nor in the test run's
    assert (kept.parent / "conftest_refused").exists()
    shared = next(p for p in envs.iterdir() if p.is_dir())
    assert not list(shared.rglob("zz_planted.pth"))
    overlay = out / "logs" / "fak-test__calc-1" / "workspace" / "env"
    assert list(overlay.rglob("zz_planted.pth"))
    _purelib(shared / "bin" / "python")
    _purelib(overlay / "bin" / "python")  # fak's own host-side run of a tainted venv
    assert not canary.exists()
    subprocess.run([str(overlay / "bin" / "python"), "-c", "pass"], check=True)
    assert canary.exists()  # control: any ordinary start of that interpreter runs the plant


def test_venv_paths_follows_only_faks_own_pth(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    hidden = tmp_path / "home" / ".ssh"
    hidden.mkdir(parents=True)
    other = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    purelib = _purelib(venv / "bin" / "python")
    (purelib / "zz_planted.pth").write_text(f"{hidden}\n")
    assert hidden not in venv_paths(venv)
    (purelib / "_fak_shared_env.pth").write_text(f"{_purelib(other / 'bin' / 'python')}\n")
    assert other in venv_paths(venv)
