"""``fak swebench run --ray``: the fleet's instances as Ray tasks over a cluster.

Each instance is one Ray task (``run_instance``) with its resources declared (``num_cpus``,
``memory``); the task does what one fleet thread does (``Fleet._run_instance``: clone at
``base_commit``, run the agent, save the trajectory) in a worker process and returns the
instance's final state and patch to the driver, which writes ``predictions.json`` and
``summary.json`` and draws the live table, as the threaded fleet does. The model servers are
separate (``--gateway``, or the router of ``fak serve --replicas``).

What reaches the workers: the row without the fields that hold the answer or the grading
(``HIDDEN_FIELDS``), the ``FleetConfig``, and the paths of ``--output``, ``--repos`` and the env
cache, which must be shared by every node (one machine, or a shared file system): the workspaces
are cloned from the mirrors there, and the trajectories are written there.

A worker (or its node) that dies loses only its in-flight instance: Ray runs the task again, up
to ``max_attempts`` in all (``ray.remote(max_retries=...)``; errors raised by the agent are not
retried, they are results). Each attempt appends ``{attempt, pid, node, started}`` to
``OUTPUT/ray/<instance_id>.attempts.jsonl``; ``summary.json`` gives each instance's ``attempts``.
An instance whose every attempt died ends ``worker_lost`` (no prediction: a re-run tries it again).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from fak.cluster.raycluster import require_ray
from fak.swebench.run import HIDDEN_FIELDS, Fleet, FleetConfig, InstanceState

__all__ = ["RayFleet", "run_instance"]


class _InstanceRun(Fleet):
    """A one-row fleet inside a worker: the driver records the prediction, not the worker."""

    patch: str | None = None

    def _record(self, iid: str, patch: str) -> None:
        self.patch = patch


def run_instance(config: FleetConfig, row: dict[str, Any]) -> tuple[InstanceState, str | None]:
    """The body of one instance's Ray task: ``(final state, patch or None)``. The patch is
    ``None`` unless the instance finished (``FINISHED_REASONS``)."""
    import ray

    iid = row["instance_id"]
    attempts = Path(config.output) / "ray" / f"{iid}.attempts.jsonl"
    attempts.parent.mkdir(parents=True, exist_ok=True)
    ctx = ray.get_runtime_context()
    n = sum(1 for _ in attempts.open()) + 1 if attempts.exists() else 1
    with attempts.open("a") as f:
        f.write(json.dumps({"attempt": n, "pid": os.getpid(), "node": ctx.get_node_id(),
                            "started": time.time()}) + "\n")
    fleet = _InstanceRun(config, [row], console=Console(stderr=True, quiet=True))
    state = fleet.states[iid]
    try:
        fleet._run_instance(row)
    except Exception as exc:  # noqa: BLE001 - reported as the threaded fleet reports it
        state.exit_reason, state.message = "error", f"{type(exc).__name__}: {exc}"
        state.traceback = traceback.format_exc()
    return state, fleet.patch


class RayFleet(Fleet):
    """The fleet with its instances as Ray tasks (the module docstring says how).

    Args:
        config: as ``Fleet``; ``config.workers`` is the most instances in flight at once.
        rows: the instances.
        num_cpus: CPUs each instance task reserves.
        memory_bytes: memory each instance task reserves (``None``: none declared).
        max_attempts: runs of an instance's task at most when its worker dies.
        address: what the summary records as the cluster's address.

    Raises:
        fak.cluster.raycluster.RayMissing: Ray is not installed.
        As ``Fleet`` (sandbox, protocol).
    """

    def __init__(self, config: FleetConfig, rows: list[dict[str, Any]], *, num_cpus: float = 1.0,
                 memory_bytes: int | None = None, max_attempts: int = 3, address: str = "local",
                 console: Console | None = None) -> None:
        if config.attempts != 1:
            raise ValueError("--ray runs one attempt per instance; run --attempts "
                             f"{config.attempts} without --ray (the threaded fleet)")
        self._ray = require_ray()
        super().__init__(config, rows, console)
        self.num_cpus = num_cpus
        self.memory_bytes = memory_bytes
        self.max_attempts = max(1, max_attempts)
        self.address = address

    def attempts(self, iid: str) -> int:
        """How many times instance ``iid``'s task started."""
        path = self.out / "ray" / f"{iid}.attempts.jsonl"
        try:
            return sum(1 for _ in path.open())
        except FileNotFoundError:
            return 0

    def summary(self, final: bool = True) -> dict[str, Any]:
        """As ``Fleet.summary``, plus the cluster (``ray``) and each instance's ``attempts``."""
        out = super().summary(final)
        for inst in out["instances"]:
            inst["attempts"] = self.attempts(inst["instance_id"])
        out["ray"] = {"address": self.address, "num_cpus_per_instance": self.num_cpus,
                      "memory_bytes_per_instance": self.memory_bytes,
                      "max_attempts": self.max_attempts}
        return out

    def _run(self) -> dict[str, Any]:
        ray = self._ray
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": self.max_attempts - 1,
                                   "retry_exceptions": False}
        if self.memory_bytes:
            options["memory"] = self.memory_bytes
        task = ray.remote(run_instance).options(**options)
        live_on = self.config.live if self.config.live is not None else self.console.is_terminal
        if self.skipped:
            self.console.print(f"skipping {len(self.skipped)} finished instance(s) in {self.out}")
        queue = list(self.todo)
        in_flight: dict[Any, str] = {}
        reported: set[str] = set()
        interrupted = False
        live = Live(self.table(), console=self.console, refresh_per_second=2) if live_on else None
        try:
            if live:
                live.start()
            while queue or in_flight:
                while queue and len(in_flight) < max(1, self.config.workers):
                    row = queue.pop(0)
                    public = {k: v for k, v in row.items() if k not in HIDDEN_FIELDS}
                    st = self.states[row["instance_id"]]
                    st.started = time.time()
                    st.stats.status = "running"
                    in_flight[task.remote(self.config, public)] = row["instance_id"]
                done, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for ref in done:
                    iid = in_flight.pop(ref)
                    self._collect(iid, ref)
                    if not live and iid not in reported:
                        reported.add(iid)
                        self._print_line(iid)
                if live:
                    live.update(self.table())
        except KeyboardInterrupt:
            interrupted = True
            self.stop.set()
            for ref in in_flight:
                ray.cancel(ref, force=True)
            for st in self.states.values():
                if st.exit_reason is None:
                    st.exit_reason = "interrupted"
        finally:
            if live:
                live.update(self.table())
                live.stop()
        summary = self._write_summary(final=True)
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _collect(self, iid: str, ref: Any) -> None:
        ray = self._ray
        started = self.states[iid].started
        try:
            state, patch = ray.get(ref)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.RayTaskError, ray.exceptions.TaskCancelledError) as exc:
            st = self.states[iid]
            st.exit_reason = "worker_lost"
            st.stats.status = "worker_lost"
            st.message = (f"{type(exc).__name__} after {self.attempts(iid)} attempt(s): "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}")
            st.ended = time.time()
            return
        state.started = state.started or started
        self.states[iid] = state
        if patch is not None:
            self._record(iid, patch)
        if state.traceback:
            self.console.print(f"{iid}: {state.message}")
