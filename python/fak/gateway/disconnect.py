"""Run a request's work until it finishes or the client disconnects, whichever comes first.

A non-streaming generation (or the wait for a stream's first token) would otherwise run to the
end for a client that has gone away, holding a batch slot and KV cache. After the request body
has been read, the next ASGI ``receive()`` message is ``http.disconnect`` when the client closes
the connection (ASGI spec, HTTP connection scope); this module races the work against it and
cancels the work on disconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import anyio
from litestar import Request

__all__ = ["ClientDisconnected", "cancel_and_wait", "run_until_disconnect"]

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def _wait_disconnect(request: Request[Any, Any, Any]) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Await ``work``; cancel it and raise ``ClientDisconnected`` if the client goes away first.

    The request body must have been read already.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the client is gone either way
        pass
    raise ClientDisconnected()


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` unless it has finished and wait for it to end, shielded from the caller's
    own cancellation (a disconnect or a closed stream must not leave the work running); what it
    raised or returned is dropped: the caller has given up on it."""
    if task.done():
        return
    task.cancel()
    with anyio.CancelScope(shield=True):
        try:
            await task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001
            pass
