"""Admission control: a bound on the requests in flight, the rest refused (429).

The gateway keeps no queue of its own. ``fak.Engine`` hands every request to the engine core at
once; the core runs up to ``max_batch`` sequences (``--max-concurrency``) and queues the rest until
they fit (ARCHITECTURE.md, "Native engine"). The gateway only counts requests in flight —
from submission until the response is complete (a stream until its last chunk or the client's
disconnect) — and refuses one that would make more than ``max_concurrency + max_queue`` with 429.
A client gone while its request waits in the core's queue cancels its sequence there. In proxy
mode the bound is the same and the upstream server queues.
"""

from __future__ import annotations

from fak.gateway.errors import APIError

__all__ = ["Admission", "QueueFullError"]


class QueueFullError(APIError):
    """429: as many requests are in flight as the engine runs and queues."""

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        super().__init__(
            429,
            f"The server is busy: {max_concurrency + max_queue} requests are in flight, {max_concurrency} running "
            f"and {max_queue} queued (--max-concurrency / --max-queue). Retry after a short wait.",
            type="rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": "1"})


class Admission:
    """A counter of requests in flight, at most ``max_concurrency + max_queue``.

    Args:
        max_concurrency: requests the engine runs at once (>= 1; its ``max_batch``).
        max_queue: requests it may queue beyond those (>= 0).

    Raises:
        ValueError: for bounds out of range.
    """

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError(f"need max_concurrency >= 1 and max_queue >= 0, got {max_concurrency}, {max_queue}")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        #: requests admitted and not finished (running or queued in the engine core)
        self.in_flight = 0

    def acquire(self) -> None:
        """Count one more request in flight.

        Raises:
            QueueFullError: ``max_concurrency + max_queue`` are in flight already.
        """
        if self.in_flight >= self.max_concurrency + self.max_queue:
            raise QueueFullError(self.max_concurrency, self.max_queue)
        self.in_flight += 1

    def release(self) -> None:
        """A request in flight finished (or was refused by the engine, or its client left)."""
        self.in_flight -= 1
