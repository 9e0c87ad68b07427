"""The one driver of ``fak swebench run``: runs a job's units on a pool, draws the live table,
handles Ctrl-C, and writes ``predictions.json`` and ``summary.json`` as results come.

A *job* (``Job``: the fleet, ``fak.swebench.fleet.Fleet``; the staged pipeline,
``fak.swebench.pipeline.runner.PipelineRun``) says what its units are (one instance, or one
attempt of one) and what a unit's result means; ``Driver(job, pool).run()`` does the rest:

- the pool: ``ThreadPool`` (the units on ``workers`` threads of this process) or ``RayPool``
  (each unit a Ray task; a task whose worker died ends as ``WorkerLost``). At most ``workers``
  units are in flight; the others wait in the job's order.
- the live table (``job.table()``, twice a second) when ``live`` (default: on a terminal), else
  one line per finished unit (``job.line(key)``).
- Ctrl-C: the first one stops the run cleanly (the job's ``stop`` is set, no new unit starts,
  running units end at their next check: the threads are waited for, Ray tasks are cancelled;
  finished results are kept, the final summary written, ``KeyboardInterrupt`` raised); a second
  one writes the summary and exits at once (status 130). From the main thread a SIGTERM stops the
  run as the first Ctrl-C does.
- ``Results``: the job's ``predictions.json`` (the harness's format) and ``summary.json``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fak.agent.trajectory import write_json_atomic

__all__ = ["Driver", "Job", "RayPool", "Results", "ThreadPool", "Unit", "WorkerLost",
           "load_json", "new_table", "status_markup"]


def load_json(path: Path, default: Any) -> Any:
    """``path`` parsed as JSON, or ``default`` when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, ValueError):
        return default


def new_table(title: str, columns: Sequence[str], right: Collection[str]) -> Table:
    """A live table with ``columns``, those in ``right`` right-justified."""
    t = Table(title=title, expand=False)
    for col in columns:
        t.add_column(col, justify="right" if col in right else "left")
    return t


def status_markup(status: str, styles: dict[str, str], red: Sequence[str]) -> str:
    """``status`` in its colour: ``styles[status]``, else red when it contains a word of ``red``."""
    style = styles.get(status, "red" if status and any(w in status for w in red) else "")
    return f"[{style}]{status}[/]" if style else status


class Results:
    """A run's ``predictions.json`` and ``summary.json`` in ``out``, written as results come.

    ``predictions`` starts as the file holds it (a re-run keeps earlier instances' entries).
    ``record`` replaces one instance's entry; with ``order`` (instance ids) the list is kept in
    that order (the same bytes whatever order the workers finish in), else a new entry goes last.
    ``summary(final)`` builds the summary dict. Hold ``lock`` to write several files as one step.
    """

    def __init__(self, out: Path, summary: Callable[[bool], dict[str, Any]],
                 order: Sequence[str] | None = None):
        self.out = Path(out)
        self.lock = threading.RLock()
        self.predictions: list[dict[str, Any]] = load_json(self.out / "predictions.json", [])
        self._summary = summary
        self._order = {iid: i for i, iid in enumerate(order)} if order is not None else None

    def record(self, iid: str, model: str, patch: str) -> None:
        """Instance ``iid``'s prediction (``model_name_or_path`` ``model``), then the summary so far."""
        with self.lock:
            preds = [p for p in self.predictions if p["instance_id"] != iid]
            preds.append({"instance_id": iid, "model_name_or_path": model, "model_patch": patch})
            if self._order is not None:
                n = len(self._order)
                preds.sort(key=lambda p: (self._order.get(p["instance_id"], n), p["instance_id"]))
            self.replace(preds)
            self.write_summary(final=False)

    def replace(self, predictions: list[dict[str, Any]]) -> None:
        """Write ``predictions`` as the whole file."""
        with self.lock:
            self.predictions = predictions
            write_json_atomic(self.out / "predictions.json", predictions)

    def write_summary(self, final: bool) -> dict[str, Any]:
        """Write and return the summary (``final``: the run is over)."""
        summary = self._summary(final)
        write_json_atomic(self.out / "summary.json", summary)
        return summary


@dataclass
class Unit:
    """One unit of work: ``fn(*args, **kwargs)`` returns its result (for Ray: a function of a
    module and picklable arguments); ``key`` names it in the job."""

    key: str
    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class Job(ABC):
    """What the driver runs. A job has ``stop`` (set on Ctrl-C; its units check it) and
    ``results`` (its ``Results``)."""

    stop: threading.Event
    results: Results

    @abstractmethod
    def units(self) -> list[Unit]:
        """The units to run, in order."""

    @abstractmethod
    def done(self, key: str, result: Any) -> None:
        """Unit ``key`` returned ``result`` (called on its thread, or on the driver for Ray)."""

    @abstractmethod
    def failed(self, key: str, exc: BaseException) -> None:
        """Unit ``key`` raised ``exc`` (``WorkerLost``: its Ray task died every time)."""

    @abstractmethod
    def table(self) -> Table:
        """The live table now."""

    @abstractmethod
    def line(self, key: str) -> str:
        """The console line of finished unit ``key`` (without the live table)."""

    def started(self, key: str) -> None:
        """Unit ``key`` was handed to the pool."""

    def abort(self) -> None:
        """First Ctrl-C, after ``stop`` was set: end the running units' waits (close clients)."""

    def interrupted(self) -> None:
        """After a stop, once nothing runs any more: mark what did not end."""


class WorkerLost(RuntimeError):
    """A unit's Ray task did not return: its worker (or node) died on every run, or it was
    cancelled. ``kind`` is Ray's exception's class name, ``detail`` its first line."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def _finish(unit: Unit, done: Callable[[str, Any], None]) -> None:
    done(unit.key, unit.fn(*unit.args, **unit.kwargs))


class ThreadPool:
    """Units on threads of this process (named ``name``-N); ``done`` runs on the unit's thread."""

    def __init__(self, name: str):
        self.name = name
        self._ex: cf.ThreadPoolExecutor | None = None
        self._futs: dict[cf.Future, str] = {}

    def start(self, workers: int) -> None:
        self._ex = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=self.name)

    def __len__(self) -> int:
        return len(self._futs)

    def submit(self, unit: Unit, done: Callable[[str, Any], None]) -> None:
        assert self._ex is not None
        self._futs[self._ex.submit(_finish, unit, done)] = unit.key

    def wait(self, timeout: float) -> list[tuple[str, BaseException | None]]:
        """The units that ended within ``timeout`` seconds, with the exception each raised."""
        ended, _ = cf.wait(self._futs, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return [(self._futs.pop(f), f.exception()) for f in ended]

    def cancel(self) -> None:
        """Threads are not cancelled: running units end by their job's ``stop``."""

    def close(self, wait: bool) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=wait, cancel_futures=True)


class RayPool:
    """Units as Ray tasks (``ray.remote(fn).options(**options)``: ``num_cpus``, ``memory``,
    ``max_retries``, ...) on the cluster this process joined (``fak.cluster.raycluster.connect``);
    ``done`` runs on the driver with the task's return value.

    Raises:
        fak.cluster.raycluster.RayMissing: Ray is not installed.
    """

    def __init__(self, **options: Any):
        from fak.cluster.raycluster import require_ray

        self._ray = require_ray()
        self._options = options
        self._tasks: dict[Callable, Any] = {}
        self._refs: dict[Any, tuple[str, Callable[[str, Any], None]]] = {}

    def start(self, workers: int) -> None:
        """Nothing to start: the cluster is there."""

    def __len__(self) -> int:
        return len(self._refs)

    def submit(self, unit: Unit, done: Callable[[str, Any], None]) -> None:
        if unit.fn not in self._tasks:
            self._tasks[unit.fn] = self._ray.remote(unit.fn).options(**self._options)
        self._refs[self._tasks[unit.fn].remote(*unit.args, **unit.kwargs)] = (unit.key, done)

    def wait(self, timeout: float) -> list[tuple[str, BaseException | None]]:
        """The units whose task returned within ``timeout`` seconds (``WorkerLost`` when it
        died), with the exception ``done`` raised."""
        ray = self._ray
        ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
        out: list[tuple[str, BaseException | None]] = []
        for ref in ready:
            key, done = self._refs.pop(ref)
            try:
                value = ray.get(ref)
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.RayTaskError, ray.exceptions.TaskCancelledError) as exc:
                text = str(exc)
                out.append((key, WorkerLost(type(exc).__name__,
                                            text.splitlines()[0] if text else "")))
                continue
            try:
                done(key, value)
            except Exception as exc:  # noqa: BLE001 - the job records it
                out.append((key, exc))
                continue
            out.append((key, None))
        return out

    def cancel(self) -> None:
        """Cancel every task in flight (their workers are killed); none of them reports."""
        for ref in self._refs:
            self._ray.cancel(ref, force=True)
        self._refs.clear()

    def close(self, wait: bool) -> None:
        """Nothing to close: the cluster stays."""


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    """SIGTERM handler of a run: stop as Ctrl-C does (finished results kept, summary final)."""
    raise KeyboardInterrupt


class Driver:
    """Runs ``job``'s units on ``pool`` (the module docstring says how).

    Args:
        job: what to run.
        pool: ``ThreadPool`` or ``RayPool``.
        workers: units in flight at most.
        console: where the table and the lines go.
        live: draw the live table (``None``: when ``console`` is a terminal).
        stopping: what happens to running units on Ctrl-C, in words for the console.
    """

    def __init__(self, job: Job, pool: ThreadPool | RayPool, *, workers: int, console: Console,
                 live: bool | None, stopping: str):
        self.job = job
        self.pool = pool
        self.workers = max(1, workers)
        self.console = console
        self.live_on = live if live is not None else console.is_terminal
        self.stopping = stopping

    def run(self) -> dict[str, Any]:
        """Run every unit; returns the final summary.

        Raises ``KeyboardInterrupt`` after a clean stop (summary written) when interrupted: by
        Ctrl-C (SIGINT) or, from the main thread, by SIGTERM, which stops the same way.
        """
        previous_term = None
        if threading.current_thread() is threading.main_thread():
            previous_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        try:
            return self._run()
        finally:
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)

    def _run(self) -> dict[str, Any]:
        job, pool = self.job, self.pool
        queue = deque(job.units())
        interrupted = False
        pool.start(self.workers)
        live = Live(job.table(), console=self.console, refresh_per_second=2) if self.live_on else None
        try:
            if live:
                live.start()
            while queue or len(pool):
                while queue and len(pool) < self.workers:
                    unit = queue.popleft()
                    job.started(unit.key)
                    pool.submit(unit, job.done)
                self._ended(pool.wait(0.5), report=live is None)
                if live:
                    live.update(job.table())
        except KeyboardInterrupt:
            interrupted = True
            self._interrupt(live)
        finally:
            pool.close(wait=not interrupted)
            if live:
                live.update(job.table())
                live.stop()
        summary = job.results.write_summary(final=True)
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _ended(self, ended: list[tuple[str, BaseException | None]], report: bool) -> None:
        for key, exc in ended:
            if exc is not None:
                self.job.failed(key, exc)
            if report:
                self.console.print(self.job.line(key))

    def _interrupt(self, live: Live | None) -> None:
        """First Ctrl-C: stop cleanly. A second one during the wait exits at once."""
        job = self.job
        job.stop.set()
        self.console.print(f"[magenta]stopping: {self.stopping} (Ctrl-C again to quit now)[/]")

        def hard_exit(*_: object) -> None:
            job.results.write_summary(final=True)
            os._exit(130)

        previous = signal.signal(signal.SIGINT, hard_exit)
        try:
            self.pool.cancel()
            job.abort()
            while len(self.pool):
                self._ended(self.pool.wait(0.5), report=False)
                if live:
                    live.update(job.table())
        finally:
            signal.signal(signal.SIGINT, previous)
        job.interrupted()
