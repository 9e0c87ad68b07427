"""The sandbox's promises, each checked on both methods (bwrap and the unshare fallback).

Hostile programs are written into a file in the workspace by Python (``_script``) and executed
only inside the sandbox. To add a case: write its program with ``_script`` and assert on the
``SandboxResult`` and on the host afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from canaries import SECRET, methods

from fak.sandbox import GiB, Limits, MiB, Sandbox, SandboxUnavailable, probe, venv_paths
from fak.sandbox.config import build_env, plan_mounts

pytestmark = pytest.mark.parametrize("method", methods())


def _script(ws: Path, name: str, body: str) -> list[str]:
    """Write ``body`` to ``ws/name`` and return the argv that runs it inside the sandbox."""
    (ws / name).write_text(body)
    return ["python3" if name.endswith(".py") else "bash", name]


def _procs_with(marker: str) -> list[int]:
    """PIDs of host processes whose command line contains ``marker``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def test_workspace_writes_persist_and_outside_writes_fail(method, ws, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "canary.txt"
    canary.write_text("keep me\n")
    sb = Sandbox(ws, readable=[outside], method=method)
    r = sb.run(_script(ws, "w.sh", f"""
echo made > made.txt && mkdir -p sub && echo deep > sub/f.txt && echo ws-ok
echo x > {canary} 2>/dev/null && echo canary-written
rm -f {canary} 2>/dev/null; test -e {canary} && echo canary-kept
touch /fak-root-write 2>/dev/null && echo root-written
echo x > /etc/fak-etc-write 2>/dev/null && echo etc-written
echo x > {tmp_path}/beside-ws 2>/dev/null && echo beside-private
echo x > /tmp/private && cat /tmp/private
"""))
    assert r.returncode == 0, r.output
    lines = r.output.split()
    assert "ws-ok" in lines and "canary-kept" in lines
    assert not {"canary-written", "root-written", "etc-written"} & set(lines)
    assert (ws / "made.txt").read_text() == "made\n" and (ws / "sub" / "f.txt").exists()
    assert canary.read_text() == "keep me\n"
    assert not Path("/fak-root-write").exists() and not Path("/etc/fak-etc-write").exists()
    assert not (tmp_path / "beside-ws").exists()  # /tmp inside is a private tmpfs


def test_home_is_empty_and_secrets_stay_out(method, ws, home):
    r = Sandbox(ws, method=method).run(_script(ws, "h.sh", """
echo "home=$HOME"; ls -A ~ | wc -l
cat ~/.ssh/id_canary 2>&1
env; cat /proc/self/environ /proc/1/environ 2>/dev/null | tr '\\0' '\\n'
cat /etc/shadow 2>/dev/null | wc -c
"""))
    assert r.returncode == 0, r.output
    assert f"home={home}" in r.output
    assert r.output.splitlines()[1].strip() == "0"  # empty home
    assert SECRET not in r.output and "FAK_CANARY_SECRET" not in r.output
    assert (home / ".ssh" / "id_canary").read_text() == SECRET + "\n"


def test_kill_all_reaches_only_the_sandbox(method, ws, canary_process):
    r = Sandbox(ws, method=method).run(_script(ws, "k.sh", """
sleep 100 &
kill -9 -1; kill -- -1
echo still-here
"""), timeout_s=20)
    assert "still-here" in r.output
    assert canary_process.poll() is None
    assert os.getppid() > 1  # and this process is alive to say so


def test_fork_bomb_dies_alone_at_the_process_limit(method, ws, canary_process):
    # the first shell stays alive: with a plain ``wait`` it can exit before the bomb grows, which
    # ends the PID namespace and the bomb with it (harmless, but not the limit checked here)
    sb = Sandbox(ws, method=method, limits=Limits(processes=64))
    t0 = time.monotonic()
    r = sb.run(_script(ws, "bomb.sh", "bomb() { bomb | bomb & }\nbomb\nsleep 50\n"), timeout_s=60)
    assert r.killed == "process limit", (r.killed, r.output[-500:])
    assert r.note == "killed: process limit (64 processes)"
    assert time.monotonic() - t0 < 20
    assert canary_process.poll() is None
    assert not _procs_with("bomb.sh")


def test_ten_gigabyte_allocation_fails(method, ws):
    r = Sandbox(ws, method=method, limits=Limits(address_space_bytes=4 * GiB)).run(
        _script(ws, "hog.py", "buf = bytearray(10 * 10**9)\nprint('allocated', len(buf))\n"))
    assert "allocated" not in r.output and "MemoryError" in r.output
    assert r.returncode == 1 and r.killed == "memory limit"
    assert r.note == "killed: memory limit (address space 4 GiB)"


def test_timeout_kills_grandchildren(method, ws):
    marker = f"313.{os.getpid()}"
    t0 = time.monotonic()
    r = Sandbox(ws, method=method).run(_script(ws, "t.sh", f"""
setsid sleep {marker} &
( nohup sleep {marker} >/dev/null 2>&1 & )
bash -c 'sleep {marker} & wait' &
echo started
sleep {marker}
"""), timeout_s=1.5)
    assert r.killed == "timeout" and r.returncode is None
    assert r.note == "killed: timeout after 1.5 s"
    assert "started" in r.output and time.monotonic() - t0 < 10
    assert not _procs_with(marker)


def test_background_processes_end_with_the_command(method, ws):
    marker = f"314.{os.getpid()}"
    r = Sandbox(ws, method=method).run(_script(ws, "bg.sh", f"(setsid sleep {marker} &)\n"
                                                          "echo done\n"), timeout_s=20)
    assert r.returncode == 0 and r.output.strip() == "done" and r.duration_s < 10
    time.sleep(0.2)
    assert not _procs_with(marker)


class _Listener:
    """A TCP listener on the host's loopback that counts the connections it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def test_no_network_but_its_own_loopback(method, ws):
    listener = _Listener()
    try:
        r = Sandbox(ws, method=method).run(_script(ws, "net.py", f"""
import socket, subprocess
print(len(subprocess.run(['ip', '-o', 'link'], capture_output=True, text=True).stdout.splitlines()))
try:
    socket.create_connection(('127.0.0.1', {listener.port}), timeout=2)
    print('outside-reached')
except OSError as e:
    print('refused', type(e).__name__)
try:
    socket.create_connection(('1.1.1.1', 53), timeout=2)
    print('internet-reached')
except OSError as e:
    print('no-route', type(e).__name__)
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()
c = socket.create_connection(s.getsockname(), timeout=2)
print('own-loopback-ok')
"""))
        assert r.returncode == 0, r.output
        lines = r.output.splitlines()
        assert lines[0] == "1", r.output  # one interface: lo
        assert "outside-reached" not in r.output and "internet-reached" not in r.output
        assert "own-loopback-ok" in r.output
        assert listener.connections == 0
    finally:
        listener.close()


def test_net_setup_tarpit_stays_inside(method, ws):
    from fak.swebench.local import NETNS_SETUP

    sb = Sandbox(ws, method=method, net_setup=NETNS_SETUP["psf/requests"])
    r = sb.run(_script(ws, "tarpit.py", """
import socket, subprocess
try:
    socket.create_connection(('10.255.255.1', 80), timeout=1)
    print('connected')
except socket.timeout:
    print('timed-out')
except OSError as e:
    print('error', e)
print(subprocess.run(['ip', 'link', 'del', 'fak-tarpit'], capture_output=True).returncode != 0)
"""), timeout_s=30)
    assert r.output.split() == ["timed-out", "True"], r.output
    host = subprocess.run(["ip", "link", "show", "fak-tarpit"], capture_output=True)
    assert host.returncode != 0  # the veth pair never existed outside


def test_output_cap_kills_the_run(method, ws):
    r = Sandbox(ws, method=method, limits=Limits(output_bytes=100_000)).run(
        ["bash", "-c", "yes fak"], timeout_s=30)
    assert r.killed == "output limit" and r.returncode is None
    assert r.output_bytes == 100_000 and len(r.output) == 100_000
    assert r.note == "killed: output cut at 100000 bytes"
    assert r.duration_s < 10


def test_cpu_and_file_size_limits(method, ws):
    sb = Sandbox(ws, method=method, limits=Limits(cpu_s=1, file_size_bytes=1 * MiB))
    r = sb.run(_script(ws, "spin.py", "while True:\n    pass\n"), timeout_s=30)
    assert r.killed == "cpu limit" and r.returncode == 128 + 24, (r.returncode, r.output)
    assert r.duration_s < 15
    r = sb.run(["dd", "if=/dev/zero", "of=big.bin", "bs=1M", "count=4"], timeout_s=30)
    assert r.killed == "file size limit", (r.returncode, r.output)
    assert (ws / "big.bin").stat().st_size <= MiB


def test_git_dir_can_be_made_read_only(method, ws):
    r = Sandbox(ws, method=method, readonly=[ws / ".git"]).run(
        ["bash", "-c", "git status --short; git log --oneline | wc -l; "
                       "( echo '[core]' >> .git/config ) 2>/dev/null || echo git-ro"])
    assert r.output.split()[-2:] == ["1", "git-ro"], r.output


def test_stdin_stdout_path_and_exit_status(method, ws, tmp_path):
    log = tmp_path / "log.txt"
    r = Sandbox(ws, method=method).run(["bash", "-c", "cat; echo err >&2; exit 3"],
                                       stdin=b"from-stdin\n", stdout_path=log)
    assert r.returncode == 3 and r.killed is None and not r.ok
    assert r.output == "from-stdin\nerr\n" == log.read_text()
    r = Sandbox(ws, method=method).run(["no-such-command-fak"])
    assert r.returncode not in (0, None) and "no-such-command-fak" in r.output


def test_task_venv_is_readable_and_runs(method, ws, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    paths = venv_paths(venv)
    assert paths[0] == venv and len(paths) == 2  # the venv and its base interpreter
    sb = Sandbox(ws, readable=paths, method=method,
                 env={"VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:/usr/bin:/bin"})
    r = sb.run(["bash", "-c", "python -c 'import sys; print(sys.prefix)'; "
                              "touch $VIRTUAL_ENV/x 2>/dev/null || echo venv-ro"])
    assert r.output.split() == [str(venv), "venv-ro"], r.output
    r = Sandbox(ws, writable=[venv], method=method).run(["touch", str(venv / "x")])
    assert r.returncode == 0 and (venv / "x").exists()


def test_unavailable_says_what_is_missing(method, ws, monkeypatch):
    info = probe()
    broken = type(info)(ok=False, method=None, detail="bwrap: not installed; unshare: EPERM",
                        methods={"bwrap": "not installed", "unshare": "EPERM"})
    monkeypatch.setattr("fak.sandbox.run.probe", lambda: broken)
    with pytest.raises(SandboxUnavailable, match="not installed"):
        Sandbox(ws)
    with pytest.raises(SandboxUnavailable, match=f"the {method} sandbox does not work"):
        Sandbox(ws, method=method)


def test_env_allow_list_and_mount_plan(method, tmp_path):
    if method != "bwrap":
        pytest.skip("no sandbox run: once is enough")
    env = build_env({"EXTRA": "1"}, home=tmp_path, net="none", host_env={
        "PATH": "/usr/bin", "LC_ALL": "C", "PYTHONHASHSEED": "0", "PYTHONPATH": "/host/src",
        "AWS_SECRET_ACCESS_KEY": "x", "GITHUB_TOKEN": "y", "PIP_INDEX_URL": "https://u:p@h/s",
        "https_proxy": "http://proxy:3128", "SSH_AUTH_SOCK": "/tmp/agent"})
    assert env == {"PATH": "/usr/bin", "LC_ALL": "C", "PYTHONHASHSEED": "0", "LANG": "C.UTF-8",
                   "TERM": "dumb", "HOME": str(tmp_path), "EXTRA": "1"}
    assert build_env(None, home=tmp_path, net="host",
                     host_env={"https_proxy": "http://proxy:3128"})["https_proxy"]
    ws = tmp_path / "h" / "ws"
    ws.mkdir(parents=True)
    mounts = plan_mounts(ws, readonly=[ws], home=tmp_path / "h", limits=Limits(), net="none")
    order = [(m.kind, m.dest) for m in mounts]
    assert ("tmpfs", "/tmp") in order and ("tmpfs", str(tmp_path / "h")) in order
    # deeper paths last: the home's tmpfs, then the workspace inside it (read-only wins)
    assert order.index(("tmpfs", str(tmp_path / "h"))) < order.index(("ro", str(ws)))
    assert ("rw", str(ws)) not in order
