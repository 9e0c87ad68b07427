"""Admission control: N running, Q waiting in arrival order, the rest refused; cancellation-safe."""

from __future__ import annotations

import asyncio

import pytest
from fak.gateway.admission import Admission, QueueFullError


def test_fifo_bound_and_refusal() -> None:
    async def go() -> list[int]:
        adm = Admission(max_concurrency=2, max_queue=3)
        order: list[int] = []
        release = asyncio.Event()

        async def worker(i: int) -> None:
            async with adm.slot():
                order.append(i)
                await release.wait()

        tasks = [asyncio.create_task(worker(i)) for i in range(5)]
        await asyncio.sleep(0.01)
        assert (adm.running, adm.waiting) == (2, 3)
        with pytest.raises(QueueFullError) as exc:
            await adm.acquire()
        assert exc.value.status == 429
        release.set()
        await asyncio.gather(*tasks)
        assert (adm.running, adm.waiting) == (0, 0)
        return order

    assert asyncio.run(go()) == [0, 1, 2, 3, 4]


def test_cancelled_waiter_leaves_the_queue() -> None:
    async def go() -> None:
        adm = Admission(max_concurrency=1, max_queue=2)
        await adm.acquire()
        waiter = asyncio.create_task(adm.acquire())
        second = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0.01)
        assert adm.waiting == 2
        waiter.cancel()  # a client that went away while queued
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert adm.waiting == 1
        adm.release()  # the slot passes to the live waiter, not the cancelled one
        await asyncio.wait_for(second, 1)
        assert (adm.running, adm.waiting) == (1, 0)
        adm.release()
        assert adm.running == 0

    asyncio.run(go())


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        Admission(0, 1)
    with pytest.raises(ValueError):
        Admission(1, -1)
