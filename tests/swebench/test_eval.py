"""``fak swebench eval``: local grading on the tiny instances (gold resolves, empty/wrong patches
do not, a patch that does not apply is an error, not a crash), and the harness fallback.

The tiny repository is not in ``swebench``'s spec tables; its spec (``tiny.SPECS``) is registered
with ``--specs`` and graded with the package's own ``parse_log_pytest``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from fak_subprocess import fak_env
from tiny import GOLD, run_fak




def _preds(path, patches: dict[str, str]):
    path.write_text(json.dumps([{"instance_id": k, "model_name_or_path": "m", "model_patch": v}
                                for k, v in patches.items()]))
    return path


def _eval_local(tiny, preds, out, envs, *extra):
    return run_fak("swebench", "eval", "--local", "--predictions", str(preds), "--dataset",
                   str(tiny["dataset"]), "--repos", str(tiny["repos"]), "--specs",
                   str(tiny["specs"]), "--envs", str(envs), "--output", str(out), "--run-id", "t1",
                   *extra, timeout=300)


def test_local_gold_resolves_and_bad_patches_do_not(tiny, tmp_path, envs):
    wrong = GOLD["fak-test__calc-1"].replace("a + b", "a * b")  # applies, does not fix
    preds = _preds(tmp_path / "preds.json", {"fak-test__calc-1": GOLD["fak-test__calc-1"],
                                             "fak-test__calc-2": wrong})  # leaves shout() broken
    proc = _eval_local(tiny, preds, tmp_path / "eval", envs, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["grading"] == "local"
    assert report["resolved_ids"] == ["fak-test__calc-1"]
    assert report["unresolved_ids"] == ["fak-test__calc-2"]
    assert report["completed_ids"] == ["fak-test__calc-1", "fak-test__calc-2"]
    assert report["error_ids"] == [] and report["empty_patch_ids"] == []
    assert report["resolved_instances"] == 1 and report["total_instances"] == 2
    assert report["schema_version"] == 2
    ts = report["instances"]["fak-test__calc-1"]["tests_status"]
    assert ts["FAIL_TO_PASS"]["success"] == ["tests/test_calc.py::test_add"]
    assert ts["PASS_TO_PASS"]["success"] == ["tests/test_calc.py::test_mul"]
    ts2 = report["instances"]["fak-test__calc-2"]["tests_status"]
    assert ts2["FAIL_TO_PASS"]["failure"] == ["tests/test_text.py::test_shout"]
    log = (tmp_path / "eval" / "logs" / "fak-test__calc-1" / "test_output.txt").read_text()
    assert ">>>>> Start Test Output" in log and "PASSED tests/test_calc.py::test_add" in log
    assert "resolved 1/2 submitted" in proc.stdout


def test_local_empty_and_unappliable_patches(tiny, tmp_path, envs):
    broken = GOLD["fak-test__calc-1"].replace("return a - b", "return a ** b")  # context mismatch
    preds = _preds(tmp_path / "preds.json", {"fak-test__calc-1": "", "fak-test__calc-2": broken})
    proc = _eval_local(tiny, preds, tmp_path / "eval", envs)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["empty_patch_ids"] == ["fak-test__calc-1"]
    assert report["error_ids"] == ["fak-test__calc-2"]
    assert report["patch_apply_failed_ids"] == ["fak-test__calc-2"]
    assert report["resolved_ids"] == [] and report["completed_ids"] == []
    assert report["instances"]["fak-test__calc-2"]["status"] == "patch_apply_failed"


def test_local_no_prediction_is_incomplete_and_env_is_reused(tiny, tmp_path, envs):
    preds = _preds(tmp_path / "p.json", {"fak-test__calc-2": GOLD["fak-test__calc-2"]})
    assert _eval_local(tiny, preds, tmp_path / "e1", envs).returncode == 0
    stamp = next(envs.glob("*/.fak-env.json"))
    mtime = stamp.stat().st_mtime
    proc = _eval_local(tiny, preds, tmp_path / "e2", envs)
    assert proc.returncode == 0, proc.stderr
    assert stamp.stat().st_mtime == mtime  # built once, reused
    report = json.loads((tmp_path / "e2" / "report.json").read_text())
    assert report["resolved_ids"] == ["fak-test__calc-2"]
    assert report["incomplete_ids"] == ["fak-test__calc-1"]


def test_local_tests_run_without_network(tiny, tmp_path, envs):
    """A test patch whose test needs a network sees only loopback."""
    row = tiny["rows"][0]
    body = ("import subprocess\n\n\ndef test_only_loopback():\n"
            "    out = subprocess.run(['ip', '-o', 'link', 'show'], capture_output=True, text=True).stdout\n"
            "    names = [l.split(':')[1].strip() for l in out.splitlines()]\n"
            "    assert names == ['lo']\n")
    lines = body.splitlines()
    probe = ("diff --git a/tests/test_net.py b/tests/test_net.py\nnew file mode 100644\n"
             "--- /dev/null\n+++ b/tests/test_net.py\n"
             f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}\n" for ln in lines))
    row = dict(row, instance_id="fak-test__calc-net", test_patch=probe,
               FAIL_TO_PASS=json.dumps(["tests/test_net.py::test_only_loopback"]),
               PASS_TO_PASS=json.dumps([]))
    dataset = tmp_path / "net.jsonl"
    dataset.write_text(json.dumps(row) + "\n")
    preds = _preds(tmp_path / "p.json", {"fak-test__calc-net": GOLD["fak-test__calc-1"]})
    proc = run_fak("swebench", "eval", "--local", "--predictions", str(preds), "--dataset",
                   str(dataset), "--repos", str(tiny["repos"]), "--specs", str(tiny["specs"]),
                   "--envs", str(envs), "--output", str(tmp_path / "eval"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["resolved_ids"] == ["fak-test__calc-net"], report["instances"]
    assert report["sandbox"]["method"] in ("bwrap", "unshare")  # the tests ran in fak's sandbox


def test_harness_mode_without_docker_prints_command(tiny, tmp_path, monkeypatch):
    preds = _preds(tmp_path / "preds.json", {"fak-test__calc-1": GOLD["fak-test__calc-1"]})
    env_path = tmp_path / "bin"
    env_path.mkdir()
    fake_docker = env_path / "docker"  # a client whose engine is not running, as on this machine
    fake_docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake_docker.chmod(0o755)
    import os
    monkeypatch.setenv("PATH", f"{env_path}:{os.environ['PATH']}")
    proc = run_fak("swebench", "eval", "--predictions", str(preds), "--dataset",
                   str(tiny["dataset"]), "--run-id", "r9", "--workers", "3", "--output",
                   str(tmp_path / "ev"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "a Docker engine" in proc.stdout
    cmd_line = next(ln for ln in proc.stdout.splitlines() if "swebench.harness.run_evaluation" in ln)
    for part in ("--dataset_name", str(tiny["dataset"]), "--predictions_path", str(preds),
                 "--run_id r9", "--max_workers 3", "--report_dir", sys.executable):
        assert part in cmd_line


def test_harness_mode_runs_official_command_and_reads_its_report(tiny, tmp_path, monkeypatch):
    """With a Docker engine and the package present, the official module runs in the output
    folder and its run report is read. Both are stand-ins here (no Docker engine on this machine):
    a `docker` that answers `info`, and a `swebench.harness.run_evaluation` that records its argv
    and writes a report the way the real one does (``{model}.{run_id}.json`` in its cwd)."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "docker").chmod(0o755)
    fake = tmp_path / "fake" / "swebench" / "harness"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "run_evaluation.py").write_text(
        "import json, sys, os\n"
        "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd()}, open('argv.json', 'w'))\n"
        "a = sys.argv[1:]\n"
        "run_id = a[a.index('--run_id') + 1]\n"
        "json.dump({'total_instances': 2, 'submitted_instances': 2, 'resolved_instances': 1,\n"
        "           'error_instances': 0, 'empty_patch_instances': 0},\n"
        "          open(f'my__model.{run_id}.json', 'w'))\n")
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"instance_id": k, "model_name_or_path": "my/model",
                                  "model_patch": v} for k, v in GOLD.items()]))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    out = tmp_path / "ev"
    proc = subprocess.run([sys.executable, "-m", "fak.cli", "swebench", "eval", "--predictions",
                           str(preds), "--dataset", str(tiny["dataset"]), "--run-id", "r7",
                           "--workers", "2", "--output", str(out)], capture_output=True, text=True,
                          env=fak_env(tmp_path / "fake"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "resolved 1/2" in proc.stdout
    recorded = json.loads((out / "argv.json").read_text())
    assert recorded["cwd"] == str(out.resolve())
    assert recorded["argv"] == ["--dataset_name", str(tiny["dataset"]), "--predictions_path",
                                str(preds.resolve()), "--run_id", "r7", "--max_workers", "2",
                                "--report_dir", str(out.resolve())]
