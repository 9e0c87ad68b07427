"""Run the gateway app under uvicorn: in the foreground (``fak serve``) or in a thread.

``BackgroundServer`` binds a loopback socket first (port 0 picks a free port), runs uvicorn on
it in a daemon thread and stops it on exit; tests and benchmarks use it to talk to a real HTTP
server with real clients.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

__all__ = ["BackgroundServer", "bind", "parse_addr", "serve_forever"]


def parse_addr(addr: str) -> tuple[str, int]:
    """``"127.0.0.1:8080"`` → ``("127.0.0.1", 8080)``; ``"[::1]:8080"`` for IPv6.

    Raises:
        ValueError: no port, or a port outside 0..65535.
    """
    host, sep, port = addr.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address must be HOST:PORT, got {addr!r}")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port out of range: {number}")
    return host, number


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``SO_REUSEADDR``; port 0 = any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _config(app: Any, log_level: str, access_log: bool) -> uvicorn.Config:
    # timeout_graceful_shutdown bounds how long open streams keep a stopping server alive.
    return uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                          timeout_keep_alive=30, timeout_graceful_shutdown=5, backlog=2048)


def serve_forever(app: Any, addr: str, *, log_level: str = "info", access_log: bool = True,
                  sock: socket.socket | None = None) -> None:
    """Serve ``app`` on ``addr`` (or on the already bound ``sock``) until interrupted
    (SIGINT/SIGTERM handled by uvicorn). Raises ``OSError`` when ``addr`` cannot be bound."""
    if sock is None:
        sock = bind(*parse_addr(addr))
    uvicorn.Server(_config(app, log_level, access_log)).run(sockets=[sock])


class BackgroundServer:
    """Uvicorn serving ``app`` on a loopback port in a daemon thread.

    ``with BackgroundServer(app) as srv: httpx.get(srv.url + "/health")``. ``url`` is
    ``http://127.0.0.1:PORT``; ``base_url`` adds ``/v1`` (what OpenAI clients take).

    Raises:
        RuntimeError: the server did not start within ``start_timeout`` seconds.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                 start_timeout: float = 30.0) -> None:
        self.app = app
        self.sock = bind(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(_config(app, log_level, access_log=False))
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        name=f"uvicorn:{self.port}", daemon=True)
        self.start_timeout = start_timeout

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``."""
        return self.url + "/v1"

    def start(self) -> BackgroundServer:
        """Start serving; returns once uvicorn reports it has started."""
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for the thread."""
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
