"""Admission control: at most N requests running, at most Q waiting, the rest refused (429).

``fak.Engine`` batches whatever it is given (continuous batching); this bound keeps the gateway
from accepting unbounded work. A running request holds a slot until its response is complete (a
stream holds it until the last chunk or the client's disconnect); waiting requests get slots in
arrival order. A waiter that is cancelled (client gone) leaves the queue without taking a slot.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fak.gateway.errors import APIError

__all__ = ["Admission", "QueueFullError"]


class QueueFullError(APIError):
    """429: every slot is busy and the wait queue is full."""

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        super().__init__(
            429,
            f"The server is busy: {max_concurrency} requests are running and {max_queue} are queued "
            "(--max-concurrency / --max-queue). Retry after a short wait.",
            type="rate_limit_error", code="rate_limit_exceeded", headers={"Retry-After": "1"})


class Admission:
    """A FIFO counting semaphore with a bounded wait queue.

    Args:
        max_concurrency: requests allowed to run at once (>= 1).
        max_queue: requests allowed to wait for a slot (>= 0).

    Raises:
        ValueError: for bounds out of range.
    """

    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError(f"need max_concurrency >= 1 and max_queue >= 0, got {max_concurrency}, {max_queue}")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting in line if needed.

        Raises:
            QueueFullError: the queue is full.
        """
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self.max_queue:
            raise QueueFullError(self.max_concurrency, self.max_queue)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # granted and cancelled in the same instant: pass the slot on
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise

    def release(self) -> None:
        """Give a slot back (to the first live waiter, if any)."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on; running stays the same
                return
        self.running -= 1

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """``async with admission.slot():`` acquire and always release."""
        await self.acquire()
        try:
            yield
        finally:
            self.release()
