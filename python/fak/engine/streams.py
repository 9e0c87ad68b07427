"""The iterators a caller reads one request from: :class:`TokenStream` (sync) and
:class:`AsyncTokenStream` (asyncio, anyio), the output processor's consumer end.

A stream submits its request on the first ``next()``, runs the request's text state
(``request.py``) over the token outputs it receives, and ends the request in the core through
its ``abort`` callback: when a stop string finishes it, when its text cannot be made (a token
outside the vocabulary), and when the stream is closed, dropped, or its task cancelled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fak.engine.channels import AsyncSink, SyncSink
from fak.engine.loop import CoreRequest, TokenOutput
from fak.engine.request import RequestState
from fak.engine.results import Delta, merge


class _Stream:
    """State shared by the sync and async streams: the request and the items received.

    Args:
        request: the request's text state (its ``core`` is what the loop runs).
        submit: hands the core request to the engine loop.
        abort: ends the core request in the loop (``stopped``: a stop string finished it).
    """

    def __init__(self, request: RequestState, submit: Callable[[CoreRequest], None],
                 abort: Callable[[CoreRequest, bool], None]) -> None:
        self._request = request
        self._submit = submit
        self._abort = abort
        self._started = False
        self._done = False
        self._aborted = False
        self._pending: deque[Any] = deque()

    def _take(self) -> Delta:
        """Merges the deltas of the outputs received so far, up to the last one or an error
        (raised; after the deltas before it, if any)."""
        deltas: list[Delta] = []
        while self._pending:
            item = self._pending.popleft()
            if isinstance(item, TokenOutput):
                try:
                    delta = self._request.on_output(item)
                except Exception as e:
                    self._end_in_core(stopped=False)
                    item = e
                else:
                    deltas.append(delta)
                    if delta.finish_reason is not None:
                        self._done = True
                        if item.finish is None:  # a stop string: the core still runs it
                            self._end_in_core(stopped=True)
                        break
                    continue
            if deltas:  # an error: raised by the next call
                self._pending.appendleft(item)
                break
            self._done = True
            raise item
        return merge(deltas)

    def _end_in_core(self, stopped: bool) -> None:
        if not self._aborted:
            self._aborted = True
            self._abort(self._request.core, stopped)

    def _start(self, sink: Any) -> None:
        self._request.core.sink = sink
        self._submit(self._request.core)
        self._started = True

    def _cancel(self) -> None:
        if self._started and not self._done:
            self._end_in_core(stopped=False)
        self._done = True

    def __del__(self) -> None:
        try:
            self._cancel()
        except Exception:  # interpreter shutdown
            pass


class TokenStream(_Stream, Iterator[Delta]):
    """Iterator of :class:`Delta` for one request (``Engine.stream``).

    The request is submitted on the first ``next()``. Deltas that queued up while the consumer was
    busy are merged into one. ``close()`` (or leaving a ``with`` block, or dropping the iterator)
    cancels the request and frees its KV cache.
    """

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> Delta:
        if self._done:
            raise StopIteration
        if not self._started:
            self._start(SyncSink())
        if not self._pending:
            self._pending.extend(self._request.core.sink.get_all())
        return self._take()

    def close(self) -> None:
        """Cancels the request if it is still running; idempotent."""
        self._cancel()

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cancel()


class AsyncTokenStream(_Stream, AsyncIterator[Delta]):
    """Async iterator of :class:`Delta` for one request (``Engine.astream``), for asyncio and anyio.

    Submitted on the first ``__anext__``. ``aclose()``, leaving an ``async with`` block, dropping
    the iterator, or cancelling the task while it awaits a delta cancels the request and frees its
    KV cache.
    """

    def __aiter__(self) -> AsyncTokenStream:
        return self

    async def __anext__(self) -> Delta:
        if self._done:
            raise StopAsyncIteration
        if not self._started:
            self._start(AsyncSink())
        if not self._pending:
            try:
                self._pending.extend(await self._request.core.sink.get_all())
            except BaseException:
                self._cancel()
                raise
        return self._take()

    async def aclose(self) -> None:
        """Cancels the request if it is still running; idempotent."""
        self._cancel()

    async def __aenter__(self) -> AsyncTokenStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._cancel()
