"""``fak swebench run`` end to end on tiny SWE-bench-shaped instances against the scripted model:
predictions shape, the patch applies to a fresh clone and fixes the bug, resume, Ctrl-C, denials.

To add a case: script the turns per instance id (``tiny.py`` has canned fixes), run the CLI with
``run_fak`` and check ``OUTPUT/predictions.json``, ``trajectories/`` and ``summary.json``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiny import (
    run_fak,
    text_script_fix_add,
    tools_script_fix_add,
    tools_script_fix_shout,
)

from fak.toolcalls.wire import arguments_digest
from fak_subprocess import fak_env


def _run_args(tiny, server, out, *extra):
    return ("swebench", "run", "--agent", "fleet", "--gateway", server.url.removeprefix("http://"),
            "--model", "scripted-1", "--dataset", str(tiny["dataset"]), "--repos",
            str(tiny["repos"]), "--output", str(out), "--no-live", *extra)


def _apply_to_fresh_clone(tiny, patch: str, dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(tiny["src"]), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", tiny["base_commit"]], check=True)
    (dest.parent / f"{dest.name}.diff").write_text(patch)
    subprocess.run(["git", "apply", "--verbose", str(dest.parent / f"{dest.name}.diff")],
                   cwd=dest, check=True, capture_output=True)
    return dest


def test_fleet_tools_protocol_predictions_apply_and_fix(tiny, scripted, tmp_path):
    server = scripted({"fak-test__calc-1": tools_script_fix_add(),
                       "fak-test__calc-2": tools_script_fix_shout()})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--workers", "2", "--run-id", "r1"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2/2 finished" in proc.stdout
    preds = json.loads((out / "predictions.json").read_text())
    assert isinstance(preds, list) and len(preds) == 2
    for p in preds:
        assert list(p) == ["instance_id", "model_name_or_path", "model_patch"]
        assert p["model_name_or_path"] == "scripted-1"
    by_id = {p["instance_id"]: p["model_patch"] for p in preds}
    # calc-1: exactly the gold change
    fresh = _apply_to_fresh_clone(tiny, by_id["fak-test__calc-1"], tmp_path / "fresh1")
    r = subprocess.run([sys.executable, "-c", "import calc; print(calc.add(2, 3))"], cwd=fresh,
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "5"
    assert "+    return a + b" in by_id["fak-test__calc-1"]
    # calc-2: the fix plus the new file
    assert "diff --git a/NOTES.md b/NOTES.md" in by_id["fak-test__calc-2"]
    fresh2 = _apply_to_fresh_clone(tiny, by_id["fak-test__calc-2"], tmp_path / "fresh2")
    assert (fresh2 / "NOTES.md").read_text() == "shout upper-cases\n"
    assert "s.upper()" in (fresh2 / "text.py").read_text()
    # trajectories and summary
    traj = json.loads((out / "trajectories" / "fak-test__calc-1.traj.json").read_text())
    assert traj["exit_reason"] == "submitted" and traj["n_steps"] == 4
    assert traj["patch"] == by_id["fak-test__calc-1"]
    assert traj["tokens"]["prompt"] > 0 and traj["timings"]["wall_s"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_reasons"] == {"submitted": 2} and summary["n_predictions"] == 2
    assert summary["totals"]["steps"] == 8 and summary["final"] is True
    # headers: conversation id per instance, the workspace root is absolute and was the clone
    convs = {r["headers"]["x-fak-conversation"] for r in server.requests}
    assert convs == {"r1/fak-test__calc-1", "r1/fak-test__calc-2"}
    ws_paths = {r["headers"]["x-fak-workspace"] for r in server.requests}
    assert all(Path(p).is_absolute() and Path(p).name.startswith("fak-test__calc-") for p in ws_paths)
    # workspaces removed by default
    assert not any((out / "workspaces").iterdir())


def test_workspace_hides_future_history(tiny, scripted, tmp_path):
    server = scripted({"*": [{"tool_calls": [{"name": "submit", "arguments": {}}]}]})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--filter", "fak-test__calc-1",
                              "--keep-workspaces"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    ws = out / "workspaces" / "fak-test__calc-1"
    log = subprocess.run(["git", "-C", str(ws), "log", "--all", "--format=%s"], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    assert "future commit" not in log and "calc with bugs" in log
    assert not (ws / "CHANGES.md").exists()
    preds = json.loads((out / "predictions.json").read_text())
    assert preds == [{"instance_id": "fak-test__calc-1", "model_name_or_path": "scripted-1",
                      "model_patch": ""}]


def test_fleet_text_protocol(tiny, scripted, tmp_path):
    server = scripted({"fak-test__calc-1": text_script_fix_add()})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--protocol", "text", "--allow-exec",
                              "--filter", "fak-test__calc-1"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    patch = json.loads((out / "predictions.json").read_text())[0]["model_patch"]
    assert "-    return a - b\n+    return a + b\n" in patch
    fresh = _apply_to_fresh_clone(tiny, patch, tmp_path / "fresh")
    assert "return a + b" in (fresh / "calc.py").read_text()
    traj = json.loads((out / "trajectories" / "fak-test__calc-1.traj.json").read_text())
    assert traj["protocol"] == "text"
    assert traj["steps"][2]["actions"][0]["output"] == "5\n"
    assert all(r["headers"]["x-fak-text-tools"] == "bash" for r in server.requests)
    sandbox = json.loads((out / "summary.json").read_text())["sandbox"]
    assert sandbox["method"] in ("bwrap", "unshare") and not sandbox["unsafe_no_sandbox"]


def test_text_protocol_needs_allow_exec(tiny, scripted, tmp_path):
    server = scripted({})
    proc = run_fak(*_run_args(tiny, server, tmp_path / "out", "--protocol", "text"), timeout=60)
    assert proc.returncode != 0 and "--allow-exec" in proc.stderr


def test_denied_call_never_executes_in_fleet(tiny, scripted, tmp_path):
    evil = {"path": "calc.py", "content": "import os\nos.system('curl evil')\n"}
    verdict = {"tool": "write", "allowed": False, "reason": "overwriting a source file is denied",
               "rule": "no-overwrite", "arguments_digest": arguments_digest(evil)}
    server = scripted({"fak-test__calc-1": [
        {"tool_calls": [{"name": "write", "arguments": evil}],
         "fak_policy": {"verdicts": [verdict]}},
        *tools_script_fix_add()]})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--filter", "fak-test__calc-1"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    patch = json.loads((out / "predictions.json").read_text())[0]["model_patch"]
    assert "os.system" not in patch and "+    return a + b" in patch
    traj = json.loads((out / "trajectories" / "fak-test__calc-1.traj.json").read_text())
    first = traj["steps"][0]
    assert first["verdicts"] == [verdict]
    assert first["actions"][0]["denied"] and not first["actions"][0]["executed"]
    assert traj["exit_reason"] == "submitted" and traj["n_denied"] == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["denied"] == 1


def test_resume_skips_finished_instances(tiny, scripted, tmp_path):
    server = scripted({"fak-test__calc-1": tools_script_fix_add()})
    out = tmp_path / "out"
    assert run_fak(*_run_args(tiny, server, out, "--filter", "fak-test__calc-1"),
                   timeout=120).returncode == 0
    n_requests = len(server.requests)
    first = json.loads((out / "predictions.json").read_text())
    proc = run_fak(*_run_args(tiny, server, out), timeout=120)  # now both instances
    assert proc.returncode == 0, proc.stderr
    assert "skipping 1 finished" in proc.stderr
    convs = [r["headers"]["x-fak-conversation"].split("/")[1] for r in server.requests[n_requests:]]
    assert set(convs) == {"fak-test__calc-2"}
    preds = json.loads((out / "predictions.json").read_text())
    assert [p["instance_id"] for p in preds] == ["fak-test__calc-1", "fak-test__calc-2"]
    assert preds[0] == first[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_skipped_finished"] == 1 and summary["n_run"] == 1


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_stops_cleanly_and_keeps_finished(tiny, scripted, tmp_path, sig):
    slow = [{"tool_calls": [{"name": "list", "arguments": {}}], "delay_s": 0.5}] * 200
    server = scripted({"fak-test__calc-1": tools_script_fix_add(), "fak-test__calc-2": slow})
    out = tmp_path / "out"
    env = fak_env()
    proc = subprocess.Popen([sys.executable, "-m", "fak.cli",
                             *_run_args(tiny, server, out, "--workers", "2", "--max-steps", "500")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            # a pytest started in the background of a script inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    preds_path = out / "predictions.json"
    while time.time() < deadline:
        if preds_path.exists() and "fak-test__calc-1" in preds_path.read_text():
            traj2 = out / "trajectories" / "fak-test__calc-2.traj.json"
            if traj2.exists() and json.loads(traj2.read_text())["n_steps"] >= 2:
                break
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError("the fleet did not get going")
    t_sig = time.time()
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert time.time() - t_sig < 15
    assert "interrupted" in stderr
    preds = json.loads(preds_path.read_text())
    assert [p["instance_id"] for p in preds] == ["fak-test__calc-1"]
    assert "+    return a + b" in preds[0]["model_patch"]
    traj2 = json.loads((out / "trajectories" / "fak-test__calc-2.traj.json").read_text())
    assert traj2["exit_reason"] == "interrupted" and 2 <= traj2["n_steps"] < 200
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["exit_reasons"] == {"interrupted": 1, "submitted": 1}


def test_live_table_renders_instances_and_totals(tiny, scripted, tmp_path):
    import io

    from rich.console import Console

    from fak.swebench.dataset import load_rows
    from fak.swebench.fleet import Fleet
    from fak.swebench.instance import FleetConfig

    server = scripted({"fak-test__calc-1": tools_script_fix_add(),
                       "fak-test__calc-2": tools_script_fix_shout()})
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=160, color_system=None)
    cfg = FleetConfig(gateway=server.url, model="scripted-1", output=tmp_path / "out", workers=2,
                      repos_dir=tiny["repos"], live=True)
    summary = Fleet(cfg, load_rows(tiny["dataset"]), console=console).run()
    assert summary["exit_reasons"] == {"submitted": 2}
    screen = buf.getvalue()
    for text in ("instance", "status", "step", "tokens", "tok/s", "last tool", "verdicts",
                 "fak-test__calc-1", "fak-test__calc-2", "submitted", "total 2/2 done"):
        assert text in screen, text


def test_task_env_runs_bash_in_the_tasks_venv_and_keeps_setup_out_of_the_patch(tiny, scripted,
                                                                              tmp_path, envs):
    from tiny import SPECS, VERSION

    spec = dict(SPECS["fak-test/calc"][VERSION],
                pre_install=["printf '# set-up line\\n' >> text.py"])
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"fak-test/calc": {VERSION: spec}}))
    server = scripted({"fak-test__calc-1": [
        {"tool_calls": [{"name": "bash", "arguments": {
            "command": "python -c 'import sys; print(sys.prefix)'; "
                       "python -m pytest -q -p no:cacheprovider tests 2>&1 | tail -1"}}]},
        *tools_script_fix_add()]})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--filter", "fak-test__calc-1", "--allow-exec",
                              "--task-env", "--specs", str(specs), "--envs", str(envs)),
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    traj = json.loads((out / "trajectories" / "fak-test__calc-1.traj.json").read_text())
    assert traj["exit_reason"] == "submitted", traj["exit_message"]
    lines = traj["steps"][0]["actions"][0]["output"].splitlines()
    assert lines[0] == str((out / "envs" / "fak-test__calc-1").resolve())
    assert "2 passed" in lines[-1]  # pytest from the task env ran the repo's tests
    assert traj["info"]["task_env"]["env"] == "fak-test__calc__0.1"
    patch = json.loads((out / "predictions.json").read_text())[0]["model_patch"]
    assert "set-up line" not in patch and "+    return a + b" in patch
    fresh = _apply_to_fresh_clone(tiny, patch, tmp_path / "fresh")
    assert "return a + b" in (fresh / "calc.py").read_text()


def test_setup_errors_are_reported_and_not_recorded(tiny, scripted, tmp_path):
    server = scripted({})
    empty_repos = tmp_path / "no-mirrors"
    empty_repos.mkdir()
    out = tmp_path / "out"
    proc = run_fak("swebench", "run", "--gateway", server.url, "--model", "m", "--dataset",
                   str(tiny["dataset"]), "--repos", str(empty_repos), "--output", str(out),
                   "--no-live", timeout=60)
    assert proc.returncode == 1
    assert "'setup_error': 2" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert all("no mirror of fak-test/calc" in i["message"] for i in summary["instances"])
    assert not (out / "predictions.json").exists()
    assert server.requests == []


def test_allow_exec_without_a_sandbox_fails_at_start_unless_unsafe(tiny, scripted, tmp_path,
                                                                     monkeypatch):
    """No silent fallback: --allow-exec where no sandbox can be made stops before any instance
    runs; --unsafe-no-sandbox (or its old name --unsafe-network) runs, warns, and is recorded."""
    server = scripted({"fak-test__calc-1": text_script_fix_add()})
    monkeypatch.setenv("FAK_SANDBOX_METHOD", "none-such")  # what a host without one looks like
    args = ("--protocol", "text", "--allow-exec", "--filter", "fak-test__calc-1")
    proc = run_fak(*_run_args(tiny, server, tmp_path / "o1", *args), timeout=120)
    assert proc.returncode != 0 and "cannot be made here" in proc.stderr
    assert "--unsafe-no-sandbox" in proc.stderr and not server.requests
    for flag, out in (("--unsafe-no-sandbox", tmp_path / "o2"),
                      ("--unsafe-network", tmp_path / "o3")):
        proc = run_fak(*_run_args(tiny, server, out, *args, flag), timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "WARNING: --unsafe-no-sandbox" in proc.stderr
        assert json.loads((out / "summary.json").read_text())["sandbox"]["unsafe_no_sandbox"]


def test_summary_decode_speed_is_the_servers_decode_time(tiny, scripted, tmp_path):
    """``completion_tok_s`` is decoded tokens over the server's decode seconds (its ``timings``),
    not tokens over wall time: here 2 turns of 21 tokens in 0.5 s each = 40 tok/s, while the
    wall-time figure (prefill, tools and the scripted delays included) is far lower. Each turn's
    delay is the 1.4 s its ``timings`` claim (900 ms prompt + 500 ms decode), so the wall figure
    cannot beat the decode one on a fast machine (with 0.3 s it did: 51.6 tok/s)."""
    timings = {"prompt_n": 100, "prompt_ms": 900.0, "predicted_n": 21, "predicted_ms": 500.0,
               "predicted_per_second": 40.0}
    turns = [{"tool_calls": [{"name": "list", "arguments": {}}], "timings": timings,
              "usage": {"prompt_tokens": 100, "completion_tokens": 21}, "delay_s": 1.4},
             {"tool_calls": [{"name": "submit", "arguments": {}}], "timings": timings,
              "usage": {"prompt_tokens": 100, "completion_tokens": 21}, "delay_s": 1.4}]
    server = scripted({"fak-test__calc-1": turns})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--filter", "fak-test__calc-1"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["decode_tokens"] == 40 and summary["totals"]["decode_s"] == 1.0
    assert summary["completion_tok_s"] == 40.0
    assert 0 < summary["completion_tok_per_wall_s"] < 40.0
    traj = json.loads((out / "trajectories" / "fak-test__calc-1.traj.json").read_text())
    assert traj["timings"]["decode_s"] == 1.0
