"""Keep-alives of a streamed response: ``keepalive`` passes a source's chunks on and sends a ping
whenever nothing was sent for an interval.

The source runs in one task for the whole stream, one chunk ahead of the consumer (it fetches the
next chunk when the consumer takes one, so a consumer that falls behind still leaves the deltas
to group upstream), and it keeps running across pings. A chunk costs two futures; the one timer
is armed while the consumer waits and fires at most once per interval. A task and an ``asyncio.wait`` per chunk cost more than the
chunk itself on a fast model (benches/results/gateway.md, 2026-12-08).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio

from fak.gateway.disconnect import cancel_and_wait

__all__ = ["keepalive"]

_EMPTY = object()  # no chunk fetched yet
_END = object()  # the source is exhausted


class _Raised:
    """What the source raised, handed to the consumer in order."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _release(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class _Prefetch:
    """Fetches ``it``'s chunks in a task, one ahead of the consumer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, it: AsyncIterator[bytes]) -> None:
        self._loop = loop
        self._it = it
        self._item: Any = _EMPTY
        self._demand: asyncio.Future[None] | None = None  # the fetcher waits for the consumer
        self.waiter: asyncio.Future[None] | None = None  # the consumer waits for a chunk or a ping
        self.task = loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                item: Any = await self._it.__anext__()
            except StopAsyncIteration:
                item = _END
            except (Exception, asyncio.CancelledError) as exc:  # the consumer raises it
                item = _Raised(exc)
            self._item = item
            _release(self.waiter)
            if item is _END or isinstance(item, _Raised):
                return
            self._demand = self._loop.create_future()
            await self._demand

    def take(self) -> Any:
        """The fetched item (and the next fetch starts), or ``_EMPTY``."""
        item, self._item = self._item, _EMPTY
        if item is not _EMPTY:
            _release(self._demand)
        return item

    async def wait(self) -> None:
        """Until a chunk is fetched or ``wake`` is called."""
        self.waiter = self._loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def wake(self) -> None:
        _release(self.waiter)


async def keepalive(source: AsyncIterator[bytes], interval: float, ping: bytes) -> AsyncIterator[bytes]:
    """``source``'s chunks, with ``ping`` sent whenever ``interval`` seconds pass without one.

    Server-sent-event clients ignore comment lines (``: keep-alive``) and Anthropic's ``ping``
    events; both keep proxies and clients with idle timeouts from closing a stream whose prompt is
    still in prefill, or whose forced tool call is held until it is decided. What ``source``
    raises is raised here after the chunks before it. Closing the returned iterator closes
    ``source``.
    """
    loop = asyncio.get_running_loop()
    it = source.__aiter__()
    fetch = _Prefetch(loop, it)
    last_sent = loop.time()
    timer: asyncio.TimerHandle | None = None

    def tick() -> None:
        # Armed while the consumer waits (at most one timer): a ping is due an interval after
        # the last chunk; a consumer not waiting sends something anyway, and re-arms when it waits.
        nonlocal timer
        timer = None
        if fetch.waiter is None:
            return
        if loop.time() >= last_sent + interval:
            fetch.wake()
        else:
            timer = loop.call_at(last_sent + interval, tick)

    try:
        while True:
            item = fetch.take()
            if item is _EMPTY:
                if timer is None:
                    timer = loop.call_at(last_sent + interval, tick)
                await fetch.wait()
                item = fetch.take()
                if item is _EMPTY:  # woken by the timer: nothing for an interval
                    last_sent = loop.time()
                    yield ping
                    continue
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            last_sent = loop.time()
            yield item
    finally:
        if timer is not None:
            timer.cancel()
        await cancel_and_wait(fetch.task)
        close = getattr(it, "aclose", None)
        if close is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await close()
                except RuntimeError:  # already running: closed by its own cancellation
                    pass
