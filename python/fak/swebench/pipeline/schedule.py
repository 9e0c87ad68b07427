"""Bounded, scheduled runs for the ``test`` stage (issue 31): an instance's budget, its workers'
work trees and the pool that runs the stage's jobs, cheapest first.

- ``Budget``: the instance's test budget, a wall-clock deadline ``budget_s`` seconds after the
  stage began (the environment's set-up before it is not counted), and the timeline of the runs
  that started (what, which worker, when, how long).
- ``limit``: the timeout of the next run — its own limit, clipped to what is left of a
  candidate's limit and of the budget — or a ``Cut`` when it cannot start (under ``MIN_RUN_S``
  left). A run killed at a clip of the *budget* is a ``Cut`` too (``budget_killed``): it says
  nothing about the code. A run killed at the candidate's limit is a result, as a timeout is.
- ``Slot``: one worker's work tree (``testing.TaskEnv``: the task's clone, or a copy of it made
  by ``TaskEnv.copy`` before anything ran) and what is applied in it.
- ``Pool``: one thread per slot takes the job with the lowest priority tuple from one queue; a
  job may add jobs (the base run of a test file adds the candidates' runs of that file, ordered
  by how long the base run took). Results come back by key, whatever order the workers ended in.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: no run starts with less than this many seconds of its budget or its candidate's limit left
MIN_RUN_S = 1.0
#: what a cut says: the instance's budget was spent; the candidate's limit was; the test file's
#: run on the original code was cut, so there is nothing to compare a candidate's run with
CUT_REASONS = ("budget", "candidate_limit", "no_base")


@dataclass
class Cut:
    """A run that was not run, or whose result is not used: ``why`` (one of ``CUT_REASONS``)
    and ``detail`` (one line for a person)."""

    why: str
    detail: str

    def to_json(self, **what: Any) -> dict[str, Any]:
        """The record of the cut: ``what`` (``run``, ``script``/``candidate``/``file``),
        ``why``, ``detail``."""
        return {**what, "why": self.why, "detail": self.detail}


class Budget:
    """An instance's test budget: ``budget_s`` wall seconds from now (``time.monotonic``), and
    ``timeline``, the runs started (``log``)."""

    def __init__(self, budget_s: float):
        self.budget_s = float(budget_s)
        self.start = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        """Seconds since the budget began."""
        return time.monotonic() - self.start

    def left(self) -> float:
        """Seconds of the budget left (negative once it is spent)."""
        return self.budget_s - self.elapsed()

    def log(self, what: dict[str, Any], worker: int, started: float, seconds: float) -> None:
        """Add a run to ``timeline``: ``what`` it ran, on which ``worker``, ``start_s`` (seconds
        after the budget began, from ``started``, a ``time.monotonic`` value) and ``seconds``."""
        with self._lock:
            self.timeline.append({**what, "worker": worker,
                                  "start_s": round(started - self.start, 3),
                                  "seconds": round(seconds, 3)})


def limit(budget: Budget, own_s: float, candidate_left: float | None = None
          ) -> tuple[float, str | None] | Cut:
    """The timeout of the next run (seconds) and what clipped it (``None``: its own ``own_s``;
    ``"candidate_limit"``: ``candidate_left``, what is left of the candidate's limit;
    ``"budget"``: what is left of the instance's budget), or a ``Cut`` when less than
    ``MIN_RUN_S`` of either is left."""
    left = budget.left()
    if left < MIN_RUN_S:
        return Cut("budget", f"the test budget ({budget.budget_s:g} s) was spent before it started")
    if candidate_left is not None and candidate_left < MIN_RUN_S:
        return Cut("candidate_limit", "the candidate's limit was spent on its earlier runs")
    timeout, by = float(own_s), None
    if candidate_left is not None and candidate_left < timeout:
        timeout, by = candidate_left, "candidate_limit"
    if left < timeout:
        timeout, by = left, "budget"
    return timeout, by


def budget_killed(killed: bool, duration_s: float, timeout: float, by: str | None) -> Cut | None:
    """A ``Cut`` when a run that the budget clipped (``by == "budget"``) was killed at that clip:
    the budget ran out during it, so its result is not evidence; else ``None``."""
    if by == "budget" and killed and duration_s >= 0.9 * timeout:
        return Cut("budget", f"the test budget ran out during the run ({timeout:.0f} s were left "
                             "when it started)")
    return None


@dataclass
class Slot:
    """One worker's work tree: ``tenv`` (a ``testing.TaskEnv``), the worker's ``index`` and
    ``applied``: ``""`` for the original code, a candidate's id, ``None`` when unknown (reset
    before use)."""

    tenv: Any
    index: int
    applied: str | None = ""

    def checkout(self, key: str, diff: str | None, fresh: bool) -> bool:
        """Put the work tree at the original code (``key`` ``""``, ``diff`` ``None``) or with the
        candidate ``key``'s ``diff`` applied: reset and applied when ``fresh`` or when something
        else is there; kept as it is otherwise (the original code's scripts run one after the
        other in one tree, as they did serially). Returns whether the diff applied."""
        if fresh or self.applied != key:
            self.applied = None
            self.tenv.reset()
            if diff is not None and not self.tenv.apply(diff):
                return False
            self.applied = key
        return True


@dataclass(order=True)
class _Job:
    priority: tuple
    seq: int
    key: Hashable = field(compare=False)
    fn: Callable[[Slot], Any] = field(compare=False)


class Pool:
    """Workers over ``slots`` (one thread each) taking jobs, the lowest priority first."""

    def __init__(self, slots: list[Slot]):
        if not slots:
            raise ValueError("a pool needs at least one slot")
        self.slots = slots
        self._cv = threading.Condition()
        self._heap: list[_Job] = []
        self._seq = 0
        self._pending = 0
        self._results: dict[Hashable, Any] = {}
        self._error: BaseException | None = None

    def submit(self, priority: tuple, key: Hashable, fn: Callable[[Slot], Any]) -> None:
        """Queue ``fn(slot)`` under ``key`` (its result's key) with ``priority`` (lower first;
        ties in the order submitted). Callable from a running job."""
        with self._cv:
            heapq.heappush(self._heap, _Job(priority, self._seq, key, fn))
            self._seq += 1
            self._pending += 1
            self._cv.notify()

    def run(self, jobs: Iterable[tuple[tuple, Hashable, Callable[[Slot], Any]]]) -> dict[Hashable, Any]:
        """Run ``jobs`` (``(priority, key, fn)``) and the jobs they add; returns ``{key: result}``
        once every job has ended. The first exception a job raised is raised here after the
        other workers stopped (each ends the job it is in, then takes no other)."""
        self._results, self._error = {}, None
        for priority, key, fn in jobs:
            self.submit(priority, key, fn)
        threads = [threading.Thread(target=self._work, args=(s,), name=f"fak-test-{s.index}",
                                    daemon=True) for s in self.slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._error is not None:
            raise self._error
        return self._results

    def _work(self, slot: Slot) -> None:
        while True:
            with self._cv:
                while not self._heap and self._pending and self._error is None:
                    self._cv.wait()
                if self._error is not None or not self._heap:
                    self._cv.notify_all()
                    return
                job = heapq.heappop(self._heap)
            try:
                value = job.fn(slot)
            except BaseException as e:  # noqa: BLE001 - raised again by run
                with self._cv:
                    self._error = self._error or e
                    self._pending -= 1
                    self._cv.notify_all()
                return
            with self._cv:
                self._results[job.key] = value
                self._pending -= 1
                self._cv.notify_all()
