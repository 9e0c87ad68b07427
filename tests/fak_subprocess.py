"""Environments for tests that start ``fak`` in a subprocess.

A child must run the same interpreter and the same ``fak`` package as the pytest process: the
installed package after ``pip install '.[test]'``, or the checkout's ``python/`` when pytest itself
runs with ``PYTHONPATH=python`` (a worktree built with ``scripts/dev-build``). ``fak_env`` puts the
directory that holds the imported ``fak`` on the child's ``PYTHONPATH`` only when a fresh
interpreter would not find it there already (never a site-packages directory, never the
checkout's ``python/`` when the package is installed).

Usage: ``subprocess.run([sys.executable, "-m", "fak.cli", ...], env=fak_env())``; a server:
``with fak_process("serve", ...) as url: ...``; ``stop_process(proc)`` ends one started otherwise.
"""

from __future__ import annotations

import os
import signal
import site
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

import fak
from fak.swebench.serve import free_port

#: the directory that holds the ``fak`` package this pytest process imported
FAK_ROOT = Path(fak.__file__).resolve().parent.parent


def _site_dirs() -> set[Path]:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {Path(d).resolve() for d in dirs if d}


def fak_python_path(*prefix: str | os.PathLike[str]) -> str:
    """The ``PYTHONPATH`` a child needs: ``prefix`` entries first, then (only when the imported
    ``fak`` is not installed in a site directory) the directory holding it, then the caller's
    own ``PYTHONPATH``."""
    parts = [str(p) for p in prefix]
    if FAK_ROOT not in _site_dirs():
        parts.append(str(FAK_ROOT))
    inherited = os.environ.get("PYTHONPATH")
    if inherited:
        parts.extend(p for p in inherited.split(os.pathsep) if p and p not in parts)
    return os.pathsep.join(parts)


def fak_env(*prefix: str | os.PathLike[str], **extra: str) -> dict[str, str]:
    """A copy of ``os.environ`` for a child ``python -m fak...``: ``PYTHONPATH`` from
    ``fak_python_path(*prefix)`` (unset when empty) and ``extra`` variables set."""
    env = dict(os.environ)
    path = fak_python_path(*prefix)
    if path:
        env["PYTHONPATH"] = path
    else:
        env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def fak_argv(*args: str) -> list[str]:
    """``[sys.executable, "-m", "fak.cli", *args]``."""
    return [sys.executable, "-m", "fak.cli", *args]


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """End ``proc`` (one we started, by its PID only): SIGTERM, then SIGKILL after ``timeout``
    seconds; returns once it has exited."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def fak_process(*args: str, timeout: float = 120.0, cwd: Path | None = None) -> Iterator[str]:
    """Run ``fak ARGS --addr 127.0.0.1:PORT`` (``serve`` or ``router``) and wait for its
    ``/health``; yield its URL (``http://127.0.0.1:PORT``); stop it with SIGTERM (its PID only).

    Raises:
        AssertionError: it exited before it was healthy (its output in the message), or it was
            not healthy within ``timeout`` seconds.
    """
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
        stop_process(proc)
