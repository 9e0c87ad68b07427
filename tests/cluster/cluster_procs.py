"""Helpers of the cluster tests: ``fak`` servers started as subprocesses, and the Ray check."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from fak_subprocess import fak_argv, fak_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def fak_process(*args: str, timeout: float = 120.0, cwd: Path | None = None) -> Iterator[str]:
    """Run ``fak ARGS --addr 127.0.0.1:PORT`` (``serve`` or ``router``), wait for ``/health``;
    yield its URL (``http://127.0.0.1:PORT``); stop it with SIGTERM (its PID only)."""
    port = free_port()
    proc = subprocess.Popen(fak_argv(*args, "--addr", f"127.0.0.1:{port}", "--log-level", "warning"),
                            env=fak_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"fak {args[0]} exited {proc.returncode}: "
                                     f"{proc.stdout.read().decode()}")  # type: ignore[union-attr]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"fak {args[0]} did not become healthy")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def need_ray():
    """The ``ray`` module, or a failure naming the install command (the test extra has it)."""
    try:
        import ray
    except ImportError:
        pytest.fail("Ray is not installed: pip install 'fak[ray]' (the test extra includes it)")
    return ray
