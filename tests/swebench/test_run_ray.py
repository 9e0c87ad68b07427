"""``fak swebench run --ray``: the fleet's instances as Ray tasks on a local cluster, against the
scripted model: the same predictions as the threaded fleet, the summary's Ray fields, skipping
finished instances, and a worker killed mid-instance (the instance runs again and finishes).

To add a case: run the CLI with ``run_fak(*_run_args(...), "--ray")`` (or ``Popen`` it, as the
kill test does) and compare ``OUTPUT/predictions.json`` and ``summary.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tiny import run_fak, tools_script_fix_add, tools_script_fix_shout

from fak_subprocess import fak_argv, fak_env


def _need_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.fail("Ray is not installed: pip install 'fak[ray]' (the test extra includes it)")


def _run_args(tiny, server, out, *extra):
    return ("swebench", "run", "--agent", "fleet", "--gateway", server.url.removeprefix("http://"),
            "--model", "scripted-1", "--dataset", str(tiny["dataset"]), "--repos",
            str(tiny["repos"]), "--output", str(out), "--no-live", "--run-id", "r", *extra)


def _preds(out) -> dict[str, str]:
    return {p["instance_id"]: p["model_patch"]
            for p in json.loads((out / "predictions.json").read_text())}


def test_ray_fleet_gives_the_threaded_fleets_predictions(tiny, scripted, tmp_path):
    _need_ray()
    server = scripted({"fak-test__calc-1": tools_script_fix_add(),
                       "fak-test__calc-2": tools_script_fix_shout()})
    plain = run_fak(*_run_args(tiny, server, tmp_path / "plain", "--workers", "2"), timeout=180)
    assert plain.returncode == 0, plain.stderr
    ray_out = tmp_path / "ray"
    proc = run_fak(*_run_args(tiny, server, ray_out, "--workers", "2", "--ray"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2/2 finished" in proc.stdout
    assert _preds(ray_out) == _preds(tmp_path / "plain")
    assert "+    return a + b" in _preds(ray_out)["fak-test__calc-1"]
    summary = json.loads((ray_out / "summary.json").read_text())
    assert summary["exit_reasons"] == {"submitted": 2} and summary["final"] is True
    assert summary["ray"]["address"] == "local" and summary["ray"]["max_attempts"] == 3
    assert [i["attempts"] for i in summary["instances"]] == [1, 1]
    assert summary["totals"]["steps"] == 8
    traj = json.loads((ray_out / "trajectories" / "fak-test__calc-1.traj.json").read_text())
    assert traj["exit_reason"] == "submitted" and traj["n_steps"] == 4
    # the same output again: both finished, nothing runs
    again = run_fak(*_run_args(tiny, server, ray_out, "--ray"), timeout=300)
    assert again.returncode == 0, again.stderr
    assert "0/0 finished (2 skipped)" in again.stdout


def test_a_worker_killed_mid_instance_is_retried(tiny, scripted, tmp_path):
    _need_ray()
    slow = tools_script_fix_add()
    slow[2] = {**slow[2], "delay_s": 4.0}  # the edit turn: the worker is killed while it waits
    server = scripted({"fak-test__calc-1": slow, "fak-test__calc-2": tools_script_fix_shout()})
    out = tmp_path / "out"
    proc = subprocess.Popen(fak_argv(*_run_args(tiny, server, out, "--workers", "2", "--ray")),
                            env=fak_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    attempts = out / "ray" / "fak-test__calc-1.attempts.jsonl"
    try:
        deadline = time.monotonic() + 180
        while not any(r["headers"].get("x-fak-conversation") == "r/fak-test__calc-1"
                      and sum(m.get("role") == "assistant" for m in r["body"]["messages"]) == 2
                      for r in list(server.requests)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "calc-1 never reached its slow turn"
            time.sleep(0.1)
        first = json.loads(attempts.read_text().splitlines()[0])
        os.kill(first["pid"], signal.SIGKILL)  # the Ray worker running calc-1 (started by this test's run)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    assert proc.returncode == 0, stderr
    assert "2/2 finished" in stdout, stdout
    lines = [json.loads(x) for x in attempts.read_text().splitlines()]
    assert [x["attempt"] for x in lines] == [1, 2] and lines[1]["pid"] != first["pid"]
    preds = _preds(out)
    assert "+    return a + b" in preds["fak-test__calc-1"]
    summary = json.loads((out / "summary.json").read_text())
    assert {i["instance_id"]: i["attempts"] for i in summary["instances"]} == {
        "fak-test__calc-1": 2, "fak-test__calc-2": 1}
    assert summary["exit_reasons"] == {"submitted": 2}


def test_ray_is_refused_for_the_pipeline(tiny, scripted, tmp_path):
    server = scripted({"*": []})
    proc = run_fak("swebench", "run", "--agent", "pipeline", "--gateway", server.url.removeprefix("http://"),
                   "--dataset", str(tiny["dataset"]), "--output", str(tmp_path / "o"), "--ray",
                   timeout=60)
    assert proc.returncode == 2 and "--ray runs the fleet agent" in proc.stderr
