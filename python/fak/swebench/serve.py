"""A ``fak serve`` the fleet starts and stops itself (``fak swebench run --gguf MODEL``).

``ManagedGateway`` runs ``python -m fak.cli serve --gguf MODEL`` as a child process on a free
loopback port, with the coding-agent policy (``examples/swebench-coding-agent-policy.json``, or the
copy packaged in ``fak/swebench/data/``) unless another is given, its audit log and its console log
in the run's output folder; waits until ``GET /health`` answers 200; reads the served model id
from ``GET /v1/models``; and on exit stops it (SIGTERM: uvicorn's graceful shutdown, then SIGKILL
after ``stop_timeout_s``). The child runs in its own session, so a Ctrl-C at the terminal reaches
the fleet (which stops cleanly) and not the server, which the fleet then stops.

The port is picked by binding port 0 and releasing it; if another process takes it in between,
``fak serve`` fails to bind and the start is retried on a new port (``port_attempts``).

For the commands that run with it (``fak swebench run``, the fleet's and the pipeline's):
``managed_gateway`` starts one for the length of a ``with`` block, saying so on the console, and
records how it ended in the run's ``summary.json``; ``gateway_model`` asks a running server for
its model's name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import click
import httpx

__all__ = ["DEFAULT_POLICY", "GatewayStartError", "ManagedGateway", "default_policy_path",
           "free_port", "gateway_model", "managed_gateway"]

_HERE = Path(__file__).resolve().parent
#: The coding-agent policy shipped with the package (a copy of the repository's example).
DEFAULT_POLICY = _HERE / "data" / "swebench-coding-agent-policy.json"


class GatewayStartError(RuntimeError):
    """``fak serve`` exited or did not answer ``/health`` in time; the message quotes its log."""


def default_policy_path() -> Path:
    """The coding-agent policy: the checkout's ``examples/`` file when running from a checkout
    (so edits there apply), else the packaged copy."""
    example = _HERE.parents[2] / "examples" / "swebench-coding-agent-policy.json"
    return example if example.is_file() else DEFAULT_POLICY


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (bind port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n_chars: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-n_chars:]


@dataclass
class ManagedGateway:
    """``fak serve --gguf gguf`` in a child process for the length of a ``with`` block.

    Args:
        gguf: the model file.
        out_dir: where ``serve.log`` (its console) and ``audit.jsonl`` (policy decisions) go.
        backend: ``auto`` | ``cpu`` | ``cuda`` (``--backend``).
        n_ctx: context window in tokens (``--n-ctx``).
        policy: policy file; ``None`` → ``default_policy_path()``.
        kv_cache_tokens: KV cache size in tokens (``--kv-cache-tokens``); ``None``: the server's.
        max_concurrency: requests generating at once (``--max-concurrency``).
        threads: CPU threads of the engine; ``None``: the server's default.
        start_timeout_s: seconds to wait for ``/health`` (model load included).

    After ``start()``: ``addr`` (``127.0.0.1:PORT``), ``base_url``, ``model`` (the served id),
    ``pid``. Raises ``GatewayStartError`` when the server does not come up.
    """

    gguf: Path
    out_dir: Path
    backend: str = "auto"
    n_ctx: int = 16384
    policy: Path | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: int = 64
    threads: int | None = None
    start_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    port_attempts: int = 3
    host: str = "127.0.0.1"
    addr: str = ""
    model: str = ""
    returncode: int | None = None
    stopped_by: str | None = None  # "sigterm" | "sigkill" once stop() signalled it
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def log_path(self) -> Path:
        return Path(self.out_dir) / "serve.log"

    @property
    def audit_path(self) -> Path:
        return Path(self.out_dir) / "audit.jsonl"

    @property
    def policy_path(self) -> Path:
        return Path(self.policy) if self.policy is not None else default_policy_path()

    @property
    def base_url(self) -> str:
        return f"http://{self.addr}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def argv(self, port: int) -> list[str]:
        """The ``fak serve`` command line for ``port``."""
        argv = [sys.executable, "-m", "fak.cli", "serve", "--gguf", str(self.gguf),
                "--backend", self.backend, "--n-ctx", str(self.n_ctx),
                "--addr", f"{self.host}:{port}", "--policy", str(self.policy_path),
                "--audit-log", str(self.audit_path), "--max-concurrency", str(self.max_concurrency),
                "--log-level", "warning"]
        if self.kv_cache_tokens is not None:
            argv += ["--kv-cache-tokens", str(self.kv_cache_tokens)]
        if self.threads is not None:
            argv += ["--threads", str(self.threads)]
        return argv

    def info(self) -> dict[str, Any]:
        """What the summary records about the server (JSON-able)."""
        return {"managed": True, "addr": self.addr, "pid": self.pid, "model": self.model,
                "gguf": str(self.gguf), "backend": self.backend, "n_ctx": self.n_ctx,
                "kv_cache_tokens": self.kv_cache_tokens, "policy": str(self.policy_path),
                "audit_log": str(self.audit_path), "serve_log": str(self.log_path),
                "returncode": self.returncode,
                "ended": self.exit_description() if self.returncode is not None else None}

    def start(self) -> ManagedGateway:
        """Start the server and wait for it to be ready (see the class docstring)."""
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        last = ""
        for _ in range(max(1, self.port_attempts)):
            port = free_port(self.host)
            self.addr = f"{self.host}:{port}"
            with self.log_path.open("ab") as log:
                log.write(f"# {' '.join(self.argv(port))}\n".encode())
                log.flush()
                self._proc = subprocess.Popen(self.argv(port), stdin=subprocess.DEVNULL,
                                              stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, env=dict(os.environ))
            try:
                self._wait_ready()
                return self
            except GatewayStartError as e:
                last = str(e)
                bind_failed = "address already in use" in _tail(self.log_path).lower()
                self.stop()
                if not bind_failed:
                    raise
        raise GatewayStartError(last)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        url = f"http://{self.addr}"
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise GatewayStartError(f"fak serve exited with status {code} before it was "
                                            f"ready; {self.log_path} ends with:\n{_tail(self.log_path)}")
                try:
                    if client.get(url + "/health").status_code == 200:
                        models = client.get(url + "/v1/models").json()
                        self.model = str(models["data"][0]["id"])
                        return
                except (httpx.HTTPError, ValueError, KeyError, IndexError):
                    pass
                if time.monotonic() > deadline:
                    raise GatewayStartError(f"fak serve did not answer {url}/health within "
                                            f"{self.start_timeout_s:g} s; see {self.log_path}")
                time.sleep(0.25)

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after ``stop_timeout_s``); returns its exit
        status (``None`` if it was never started). Idempotent."""
        proc = self._proc
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            self.stopped_by = "sigterm"
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.stopped_by = "sigkill"
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        self.returncode = proc.returncode
        return self.returncode

    def exit_description(self) -> str:
        """How the server ended, in words: ``"stopped"`` (it ended on the SIGTERM of ``stop``;
        uvicorn re-raises the signal, so its status is 0 or -15), ``"killed after N s"`` (it
        ignored SIGTERM), or ``"had exited by itself with status N"`` before ``stop``."""
        code = self.returncode
        if self.stopped_by == "sigterm" and code in (0, -signal.SIGTERM):
            return "stopped"
        if self.stopped_by == "sigkill":
            return f"killed after {self.stop_timeout_s:g} s (it did not stop on SIGTERM)"
        if self.stopped_by is None:
            return f"had exited by itself with status {code}"
        return f"stopped with exit status {code}"

    def __enter__(self) -> ManagedGateway:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def managed_gateway(server: ManagedGateway | None, output: Path,
                    live: bool | None = None) -> Iterator[ManagedGateway | None]:
    """``server`` running for the ``with`` block (``None``: nothing to start; yields ``server``).

    Its start is said on the console (a progress bar with the elapsed time while the model loads
    and the kernels compile, on a terminal unless ``live`` is False); a SIGTERM from then on stops
    the run as Ctrl-C does, so that the server is stopped too. At the end it is stopped, how it
    ended goes into ``output/summary.json`` (``server``) and on the console.

    Raises:
        click.ClickException: it did not start (its log's tail in the message).
    """
    if server is None:
        yield None
        return
    from fak.progress import progress_bar

    click.echo(f"starting fak serve {server.gguf.name} (backend {server.backend}, n_ctx "
               f"{server.n_ctx}, policy {server.policy_path.name}; log {server.log_path}) ...",
               err=True)
    try:
        with progress_bar(f"fak serve: loading {server.gguf.name} (and compiling kernels)",
                          live=live, transient=True):
            server.start()
    except GatewayStartError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"fak serve ready on {server.addr} (pid {server.pid}, model {server.model})", err=True)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield server
    finally:
        server.stop()
        _record_server_exit(Path(output), server.info())
        click.echo(f"fak serve {server.exit_description()}; policy audit log {server.audit_path}",
                   err=True)


def _record_server_exit(output: Path, info: dict) -> None:
    """Put the stopped server's details (exit status included) into ``summary.json``."""
    from fak.agent.trajectory import write_json_atomic

    path = output / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    summary["server"] = info
    write_json_atomic(path, summary)


def gateway_model(gateway: str) -> str:
    """The first model id the gateway lists (``GET /v1/models``).

    Raises:
        click.ClickException: it did not answer with a model (the message says to pass --model).
    """
    from fak.agent.model import normalize_base_url

    try:
        data = httpx.get(normalize_base_url(gateway) + "/models", timeout=10.0).json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise click.ClickException(f"could not read the model name from {gateway}/v1/models "
                                   f"({type(e).__name__}: {e}); pass --model") from None
