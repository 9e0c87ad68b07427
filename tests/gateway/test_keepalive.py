"""``fak.gateway.keepalive``: chunks in order, pings while the source is silent, errors after the
chunks before them, the source fetched at most one chunk ahead, closing closes the source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fak.gateway.keepalive import keepalive

PING = b": ping\n\n"


def test_chunks_pass_in_order_without_pings() -> None:
    async def source() -> AsyncIterator[bytes]:
        for i in range(50):
            await asyncio.sleep(0)
            yield b"%d" % i

    async def main() -> list[bytes]:
        return [c async for c in keepalive(source(), 10.0, PING)]

    assert asyncio.run(main()) == [b"%d" % i for i in range(50)]


def test_pings_while_the_source_is_silent() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        await asyncio.sleep(0.35)
        yield b"b"

    async def main() -> list[bytes]:
        return [c async for c in keepalive(source(), 0.1, PING)]

    out = asyncio.run(main())
    assert out[0] == b"a" and out[-1] == b"b"
    assert 2 <= out.count(PING) <= 4 and len(out) == out.count(PING) + 2


def test_an_error_comes_after_the_chunks_before_it() -> None:
    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"
        raise ValueError("boom")

    async def main() -> list[bytes]:
        got = []
        with pytest.raises(ValueError, match="boom"):
            async for c in keepalive(source(), 10.0, PING):
                got.append(c)
        return got

    assert asyncio.run(main()) == [b"a", b"b"]


def test_the_source_runs_at_most_one_chunk_ahead_and_closing_closes_it() -> None:
    produced: list[int] = []
    closed: list[bool] = []

    async def source() -> AsyncIterator[bytes]:
        try:
            for i in range(100):
                produced.append(i)
                yield b"%d" % i
        finally:
            closed.append(True)

    async def main() -> None:
        it = keepalive(source(), 10.0, PING)
        assert await it.__anext__() == b"0"
        for _ in range(5):
            await asyncio.sleep(0)  # the fetcher may run: it fetches one chunk, then waits
        assert produced == [0, 1]
        assert await it.__anext__() == b"1"
        await it.aclose()  # type: ignore[attr-defined]
        assert closed == [True] and len(produced) <= 3

    asyncio.run(main())


def test_closing_while_the_source_waits_cancels_it() -> None:
    cancelled: list[bool] = []

    async def source() -> AsyncIterator[bytes]:
        yield b"a"
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        yield b"b"

    async def main() -> None:
        it = keepalive(source(), 10.0, PING)
        assert await it.__anext__() == b"a"
        await asyncio.sleep(0.01)
        await asyncio.wait_for(it.aclose(), 5)  # type: ignore[attr-defined]

    asyncio.run(main())
    assert cancelled == [True]
