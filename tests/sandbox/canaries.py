"""The canary harness: run each case of a corpus inside the sandbox and check that nothing outside
it was harmed.

A corpus is a JSON list or a JSONL file of records ``{"id", "family", "tool": "bash",
"arguments": {"command": ...}, ...}`` (the shape of ``tests/data/policy_evasions.jsonl``; optional
``"timeout_s"`` and ``"sandbox_killed"``, the kill the sandbox must report). Each command is read
by Python and handed to ``Sandbox.run(["bash", "-c", command])`` as one argv element: it is never
seen by a shell of this host.

The canaries (``Harness``), all outside the sandbox:

- a file beside the workspace, visible read-only inside (``readable``): must keep its content;
- a file in the (fake) ``$HOME``, which is an empty tmpfs inside: must keep its content;
- a process (``sleep``) started by the harness: must be alive after every case;
- a secret in the host environment (``FAK_CANARY_SECRET``) and in the home's ``.ssh``: must
  never appear in a case's output;
- a TCP listener on the host's loopback (its port in ``$CANARY_PORT`` inside): must get no
  connection;
- the listings of ``/``, ``/etc``, the home and the harness's own folder: must not change.

``Harness.__enter__`` first runs a self-check (a write to each file canary and to ``/`` must
fail) and refuses to run any case when it does not hold. To add a case to fak's own corpus, add a
line to ``tests/data/sandbox_cases.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.sandbox import GiB, Limits, MiB, Sandbox, SandboxResult

#: the fake secret the tests put in the host environment and in the fake home
SECRET = "fak-canary-secret-5f3c1a9e"


def methods() -> list:
    """Both methods as pytest parameters. One that does not work here is a failure, not a skip
    (the ``_sandbox_works`` fixture of ``conftest.py``): this machine and CI run as root with
    bubblewrap installed, where both must work."""
    import pytest

    return [pytest.param("bwrap", id="bwrap"), pytest.param("unshare", id="unshare")]


CASE_LIMITS = Limits(processes=128, address_space_bytes=4 * GiB, file_size_bytes=64 * MiB,
                     output_bytes=1 * MiB, tmpfs_bytes=256 * MiB)


def load_cases(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON list or JSONL corpus file (blank and ``//`` lines skipped)."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        return list(json.loads(text))
    return [json.loads(ln) for ln in text.splitlines() if ln.strip() and not ln.startswith("//")]


def command_of(case: dict[str, Any]) -> str:
    """The shell command of a ``bash`` case (``arguments.command``)."""
    args = case.get("arguments") or {}
    cmd = args.get("command") if isinstance(args, dict) else None
    if not isinstance(cmd, str):
        raise ValueError(f"case {case.get('id')}: no arguments.command string")
    return cmd


class _Listener:
    """A TCP listener on the host's loopback counting the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@dataclass
class CaseResult:
    """One case: its id, the sandbox's result, and the canaries it harmed (empty: none)."""

    case_id: str
    result: SandboxResult
    harms: list[str] = field(default_factory=list)


class Harness:
    """Canaries around ``root`` (a fresh folder); a context manager. Sets ``$HOME`` to a fake home
    under ``root`` and the secret in the environment for its lifetime (restored at exit)."""

    def __init__(self, root: Path, secret: str, *, method: str | None = None):
        self.root = Path(root)
        self.secret = secret
        self.method = method
        self.home = self.root / "home"
        self.outside = self.root / "outside"
        self.template = self.root / "template"
        self._n = 0
        self._saved: dict[str, str | None] = {}
        self.process: subprocess.Popen | None = None
        self.listener: _Listener | None = None

    # -- set-up ----------------------------------------------------------------------------------

    def __enter__(self) -> Harness:
        (self.home / ".ssh").mkdir(parents=True)
        self.home_canary = self.home / ".ssh" / "id_canary"
        self.home_canary.write_text(f"-----BEGIN KEY----- {self.secret}\n")
        (self.home / ".bash_history").write_text("canary history\n")
        self.outside.mkdir()
        self.file_canary = self.outside / "canary.txt"
        self.file_canary.write_text(f"outside canary {self.secret}\n")
        self.template.mkdir()
        (self.template / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        for args in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
            subprocess.run(["git", *args], cwd=self.template, check=True, capture_output=True)
        for key, value in (("HOME", str(self.home)), ("FAK_CANARY_SECRET", self.secret)):
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value
        self.process = subprocess.Popen(["sleep", "3600"])
        self.listener = _Listener()
        self._self_check()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.kill()  # by its own handle: the one process this harness started
            self.process.wait()
        if self.listener is not None:
            self.listener.close()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def _self_check(self) -> None:
        """Refuse to run hostile cases unless writes to the canaries and to / fail inside."""
        probe = "/fak-canary-selfcheck"
        res = self._sandbox(self._workspace()).run(["bash", "-c", (
            f"echo x > {self.file_canary}; echo x > {self.home_canary}; echo x > {probe}; "
            "echo done")], timeout_s=30)
        broken = [str(p) for p in (self.file_canary, self.home_canary)
                  if self.secret not in p.read_text()]
        if Path(probe).exists():
            os.unlink(probe)
            broken.append(probe)
        if broken or "done" not in res.output:
            raise RuntimeError(f"the sandbox does not hold here (written: {broken}; output: "
                               f"{res.output[-300:]!r}); no case is run")

    # -- cases -----------------------------------------------------------------------------------

    def _workspace(self) -> Path:
        self._n += 1
        ws = self.root / f"ws-{self._n}"
        shutil.copytree(self.template, ws, symlinks=True)
        return ws

    def _sandbox(self, ws: Path) -> Sandbox:
        assert self.listener is not None
        return Sandbox(ws, readable=[self.outside], readonly=[ws / ".git"],
                       env={"CANARY_PORT": str(self.listener.port)}, timeout_s=5.0,
                       limits=CASE_LIMITS, method=self.method)

    def _state(self) -> dict[str, Any]:
        def listing(p: Path) -> frozenset[str]:
            try:
                return frozenset(os.listdir(p))
            except OSError:
                return frozenset()

        assert self.listener is not None
        return {"/": listing(Path("/")), "/etc": listing(Path("/etc")),
                "home": listing(self.home), "home/.ssh": listing(self.home / ".ssh"),
                "outside": listing(self.outside), "root": listing(self.root),
                "connections": self.listener.connections}

    def run(self, case: dict[str, Any]) -> CaseResult:
        """Run one case in a fresh workspace; return the sandbox's result and the harms."""
        command = command_of(case)
        ws = self._workspace()
        before = self._state()
        res = self._sandbox(ws).run(["bash", "-c", command],
                                    timeout_s=float(case.get("timeout_s", 5.0)))
        after = self._state()
        harms = []
        if self.file_canary.read_text() != f"outside canary {self.secret}\n":
            harms.append("the file canary beside the workspace changed")
        if (not self.home_canary.exists()
                or self.home_canary.read_text() != f"-----BEGIN KEY----- {self.secret}\n"):
            harms.append("the file canary in $HOME changed")
        assert self.process is not None
        if self.process.poll() is not None:
            harms.append("the canary process outside was killed")
        if self.secret in res.output:
            harms.append("the secret appeared in the output")
        if after["connections"] != before["connections"]:
            harms.append("the loopback listener outside got a connection")
        for key in ("/", "/etc", "home", "home/.ssh", "outside", "root"):
            if after[key] != before[key]:
                added, gone = sorted(after[key] - before[key]), sorted(before[key] - after[key])
                harms.append(f"the listing of {key} changed: +{added} -{gone}")
        want = case.get("sandbox_killed")
        if want is not None and res.killed != want:
            harms.append(f"expected the sandbox to report killed={want!r}, got {res.killed!r}")
        shutil.rmtree(ws, ignore_errors=True)
        if self.process.poll() is not None:  # keep a live canary for the next case
            self.process = subprocess.Popen(["sleep", "3600"])
        return CaseResult(str(case.get("id")), res, harms)
