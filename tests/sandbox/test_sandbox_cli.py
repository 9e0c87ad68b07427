"""``fak sandbox run`` / ``fak sandbox probe`` through a subprocess: output, exit status, and the
one-line reason on stderr for a sandbox kill."""

from __future__ import annotations

import json
import subprocess

from fak_subprocess import fak_argv, fak_env


def _fak(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(fak_argv(*args), capture_output=True, text=True,
                          env=fak_env(**(env or {})), timeout=timeout)


def test_run_prints_output_and_exits_with_the_status(ws):
    p = _fak("sandbox", "run", "--workspace", str(ws), "--", "bash", "-c",
             "echo out; echo err >&2; echo made > f.txt; exit 3")
    assert p.returncode == 3, p.stderr
    assert p.stdout == "out\nerr\n" and p.stderr == ""
    assert (ws / "f.txt").read_text() == "made\n"


def test_run_timeout_is_124_with_one_line(ws):
    p = _fak("sandbox", "run", "--workspace", str(ws), "--timeout", "1", "--", "sleep", "30")
    assert p.returncode == 124
    assert p.stderr.splitlines() == ["fak sandbox: killed: timeout after 1 s"]


def test_run_process_limit_is_137(ws):
    (ws / "many.sh").write_text("for i in $(seq 40); do sleep 5 & done\nwait\n")
    p = _fak("sandbox", "run", "--workspace", str(ws), "--max-processes", "16", "--",
             "bash", "many.sh")
    assert p.returncode == 137, (p.stdout, p.stderr)
    assert p.stderr.splitlines()[-1] == "fak sandbox: killed: process limit (16 processes)"


def test_run_output_cap_is_137(ws):
    p = _fak("sandbox", "run", "--workspace", str(ws), "--max-output", "1000", "--", "yes")
    assert p.returncode == 137 and len(p.stdout) == 1000
    assert p.stderr.strip() == "fak sandbox: killed: output cut at 1000 bytes"


def test_run_without_a_sandbox_is_125(ws):
    p = _fak("sandbox", "run", "--workspace", str(ws), "--", "true",
             env={"FAK_SANDBOX_METHOD": "none-such"})
    assert p.returncode == 125
    assert "no sandbox can be made here" in p.stderr and "FAK_SANDBOX_METHOD" in p.stderr


def test_probe_json():
    p = _fak("sandbox", "probe", "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["ok"] and info["method"] == "bwrap"
    assert info["bwrap_version"].startswith("bubblewrap")
    assert info["methods"] == {"bwrap": None, "unshare": None}
    assert "pids" in info["limits"]["processes"]


def test_doctor_reports_the_sandbox():
    p = _fak("doctor", "--no-kernels", "--json")
    assert p.returncode == 0, p.stderr
    sb = json.loads(p.stdout)["sandbox"]
    assert sb["ok"] and sb["method"] == "bwrap" and sb["bwrap_version"]
    assert set(sb["limits"]) >= {"processes", "cpu", "address_space", "file_size", "open_files",
                                 "output"}
    p = _fak("doctor", "--no-kernels", env={"FAK_SANDBOX_METHOD": "none-such"})
    assert "Sandbox: NOT AVAILABLE" in p.stdout
