"""Admission control: requests in flight bounded by max_concurrency + max_queue, the rest refused
(the waiting happens in the engine core's queue)."""

from __future__ import annotations

import pytest
from fak.gateway.admission import Admission, QueueFullError


def test_bound_and_refusal() -> None:
    adm = Admission(max_concurrency=2, max_queue=3)
    for _ in range(5):
        adm.acquire()
    assert adm.in_flight == 5
    with pytest.raises(QueueFullError) as exc:
        adm.acquire()
    assert exc.value.status == 429 and adm.in_flight == 5
    adm.release()
    adm.acquire()  # a finished request makes room for the next
    for _ in range(5):
        adm.release()
    assert adm.in_flight == 0


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        Admission(0, 1)
    with pytest.raises(ValueError):
        Admission(1, -1)
