"""Reply channels from the engine loop to one request's consumer.

Each request carries its own sink: a ``queue.SimpleQueue`` for a thread-blocking consumer; for an
async one a deque whose consumer is woken with ``loop.call_soon_threadsafe`` under asyncio or
``TrioToken.run_sync_soon`` under trio (so anyio works on either backend), one cross-thread call
per event loop per engine step (:class:`Wakes`).
"""

from __future__ import annotations

import asyncio
import queue
from collections import deque
from typing import Any


class SyncSink:
    """Reply channel of a thread-blocking consumer."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, item: Any) -> None:
        self._q.put(item)

    def put_deferred(self, item: Any, wakes: Wakes) -> None:
        self._q.put(item)

    def get_all(self) -> list[Any]:
        """Blocks for one item; returns it and every item queued behind it."""
        items = [self._q.get()]
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                return items


def _wake_all(sinks: list[AsyncSink]) -> None:
    for sink in sinks:
        sink._wake()


class Wakes:
    """Async sinks that received items during one engine step, grouped by event loop."""

    def __init__(self) -> None:
        self._by_loop: dict[Any, list[AsyncSink]] = {}

    def add(self, sink: AsyncSink) -> None:
        group = self._by_loop.setdefault(sink.loop_key, [])
        if not group or group[-1] is not sink:
            group.append(sink)

    def flush(self) -> None:
        by_loop, self._by_loop = self._by_loop, {}
        for sinks in by_loop.values():
            sinks[0].wake_soon(sinks)


class AsyncSink:
    """Reply channel of an async consumer (asyncio, or anyio on asyncio or trio).

    The engine thread appends to a deque and schedules a wake-up on the consumer's event loop;
    the wake-up runs on that loop's thread, so it cannot race with the consumer's wait.
    """

    def __init__(self) -> None:
        self._asyncio: asyncio.AbstractEventLoop | None = None
        try:
            loop: Any = asyncio.get_running_loop()
            self._schedule = loop.call_soon_threadsafe
            self._asyncio = loop
        except RuntimeError:  # not asyncio: anyio's other backend is trio
            try:
                import trio

                loop = trio.lowlevel.current_trio_token()
                self._schedule = loop.run_sync_soon
            except (ImportError, RuntimeError):
                raise RuntimeError("Engine.astream needs a running asyncio or trio event loop") from None
        self.loop_key = id(loop)
        self._items: deque[Any] = deque()
        # the consumer's wait: a bare future of its asyncio loop (an anyio.Event costs an
        # async-library lookup per wait, once per token per stream), an anyio.Event under trio
        self._event: Any = None

    def put(self, item: Any) -> None:
        self._items.append(item)
        self.wake_soon([self])

    def put_deferred(self, item: Any, wakes: Wakes) -> None:
        """Queues ``item``; the consumer is woken by ``wakes.flush()`` (one cross-thread call per
        event loop per engine step instead of one per token)."""
        self._items.append(item)
        wakes.add(self)

    def wake_soon(self, sinks: list[AsyncSink]) -> None:
        try:
            self._schedule(_wake_all, sinks)
        except RuntimeError:  # the consumer's event loop is closed: nobody is listening
            pass

    def _wake(self) -> None:
        event, self._event = self._event, None
        if event is None:
            return
        if isinstance(event, asyncio.Future):
            if not event.done():  # not cancelled with its waiting task
                event.set_result(None)
        else:
            event.set()

    async def get_all(self) -> list[Any]:
        """Waits for one item; returns every item queued."""
        while not self._items:
            if self._asyncio is not None:
                self._event = self._asyncio.create_future()
                await self._event
            else:
                import anyio

                self._event = anyio.Event()
                await self._event.wait()
        items = []
        while self._items:  # popleft: the engine thread may append meanwhile
            items.append(self._items.popleft())
        return items
