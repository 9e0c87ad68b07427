"""What a new user sees when something is missing: one line, a non-zero exit, no traceback.

Each case runs the real ``fak`` CLI in a subprocess (``sys.executable -m fak.cli``, the package
pytest imports). A missing ``swebench`` package is simulated by a directory on ``PYTHONPATH``
whose ``swebench`` package raises ``ImportError`` on import, as an absent one does.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from fak_subprocess import fak_argv, fak_env
from tiny import GOLD


def _no_swebench(tmp_path: Path) -> Path:
    fake = tmp_path / "no-swebench" / "swebench"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'swebench'\")\n")
    return fake.parent


def _run(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300,
         ) -> subprocess.CompletedProcess:
    return subprocess.run(fak_argv(*args), capture_output=True, text=True, env=env or fak_env(),
                          timeout=timeout, check=False)


def _one_line_error(proc: subprocess.CompletedProcess, needle: str) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    hits = [ln for ln in lines if needle in ln]
    assert len(hits) == 1, proc.stderr
    return hits[0]


def _preds(path: Path, iid: str = "fak-test__calc-1") -> Path:
    path.write_text(json.dumps([{"instance_id": iid, "model_name_or_path": "m",
                                 "model_patch": GOLD[iid]}]))
    return path


def test_eval_local_without_the_task_python_fails_and_says_where_it_looked(tiny, tmp_path):
    specs = json.loads(Path(tiny["specs"]).read_text())
    for spec in next(iter(specs.values())).values():
        spec["python"] = "2.4"  # no such interpreter anywhere
    bad_specs = tmp_path / "specs.json"
    bad_specs.write_text(json.dumps(specs))
    empty = tmp_path / "nowhere"
    empty.mkdir()
    env = fak_env(FAK_PYENV_ROOT=str(empty), UV_PYTHON_INSTALL_DIR=str(empty))
    proc = _run(["swebench", "eval", "--local", "--predictions", str(_preds(tmp_path / "p.json")),
                 "--dataset", str(tiny["dataset"]), "--repos", str(tiny["repos"]),
                 "--specs", str(bad_specs), "--envs", str(tmp_path / "envs"),
                 "--output", str(tmp_path / "eval")], env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("fak-test__calc-1:"))
    assert "error (EnvError: no Python 2.4 found" in line
    for place in (f"pyenv {empty / 'versions'}", f"uv {empty}", "conda ", "PATH (python2.4)"):
        assert place in line, line
    assert "install it with `" in line
    assert "0 graded of 1 run" in proc.stdout
    assert "1 of 1 could not be graded" in proc.stderr


def test_eval_local_with_the_task_python_grades(tiny, tmp_path, envs):
    proc = _run(["swebench", "eval", "--local", "--predictions", str(_preds(tmp_path / "p.json")),
                 "--dataset", str(tiny["dataset"]), "--repos", str(tiny["repos"]),
                 "--specs", str(tiny["specs"]), "--envs", str(envs),
                 "--output", str(tmp_path / "eval")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fak-test__calc-1: resolved" in proc.stdout
    assert "resolved 1/1 submitted (1 graded of 1 run;" in proc.stdout


def test_eval_local_without_swebench_is_one_line(tiny, tmp_path):
    proc = _run(["swebench", "eval", "--local", "--predictions", str(_preds(tmp_path / "p.json")),
                 "--dataset", str(tiny["dataset"]), "--output", str(tmp_path / "eval")],
                env=fak_env(_no_swebench(tmp_path)))
    line = _one_line_error(proc, "needs the swebench package")
    assert "pip install 'fak[swebench]'" in line
    assert not (tmp_path / "eval" / "report.json").exists()


def test_run_task_env_and_specs_without_swebench_are_one_line(tiny, tmp_path):
    env = fak_env(_no_swebench(tmp_path))
    base = ["swebench", "run", "--gateway", "127.0.0.1:9", "--dataset", str(tiny["dataset"]),
            "--output", str(tmp_path / "out")]
    line = _one_line_error(_run([*base, "--task-env"], env=env), "needs the swebench package")
    assert line.startswith("Error: --task-env needs")
    line = _one_line_error(_run([*base, "--specs", str(tiny["specs"])], env=env),
                           "needs the swebench package")
    assert line.startswith("Error: --specs needs")


def test_run_that_writes_no_predictions_does_not_point_at_them(tiny, tmp_path, scripted):
    server = scripted({})
    out = tmp_path / "out"
    proc = _run(["swebench", "run", "--gateway", server.url, "--model", "scripted",
                 "--dataset", str(tiny["dataset"]), "--repos", str(tmp_path / "no-mirrors"),
                 "--output", str(out), "--no-live"])
    assert proc.returncode == 1, proc.stdout + proc.stderr  # nothing could run
    assert not (out / "predictions.json").exists()
    assert "→" not in proc.stdout and "no predictions written" in proc.stdout
    # and why each instance did not run is on the console, not only in summary.json
    for iid in ("fak-test__calc-1", "fak-test__calc-2"):
        assert any(ln.startswith(f"{iid}: setup_error (") for ln in proc.stderr.splitlines()), \
            proc.stderr


def test_serve_on_a_busy_port_is_one_line_and_never_says_serving(tmp_path):
    model = tmp_path / "tiny.gguf"
    made = _run(["synth", str(model), "--tiny", "qwen2"])
    assert made.returncode == 0, made.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = _run(["serve", "--gguf", str(model), "--addr", f"127.0.0.1:{port}"], timeout=120)
    line = _one_line_error(proc, "cannot listen on")
    assert line.startswith(f"Error: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in line
    assert "fak serve:" not in proc.stderr  # the "serving on ..." line


def test_the_fleet_runs_without_the_swebench_package(tiny, tmp_path, scripted):
    """Plain ``pip install .`` runs the agent: without ``--task-env`` nothing needs the harness
    package (the fleet's choice of Python asks for the spec and goes on without one)."""
    from tiny import tools_script_fix_add

    server = scripted({"fak-test__calc-1": tools_script_fix_add()})
    out = tmp_path / "out"
    proc = _run(["swebench", "run", "--gateway", server.url, "--model", "scripted", "--allow-exec",
                 "--dataset", str(tiny["dataset"]), "--repos", str(tiny["repos"]),
                 "--filter", "fak-test__calc-1", "--output", str(out), "--no-live"],
                env=fak_env(_no_swebench(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_reasons"] == {"submitted": 1}, summary["instances"]
