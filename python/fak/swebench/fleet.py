"""``fak swebench run``: the fleet — N agents at once over SWE-bench instances, against one gateway.

Each instance (each attempt of one) is ``fak.swebench.instance.run_instance`` on one of
``workers`` threads, or a Ray task (``--ray``, below); ``fak.swebench.driver.Driver`` runs them,
draws the live table and handles Ctrl-C; ``Fleet`` records what they return.

Output folder (``--output``)::

    predictions.json            [{"instance_id", "model_name_or_path", "model_patch"}, ...]
                                (what ``swebench.harness.run_evaluation --predictions_path`` reads)
    trajectories/<id>.traj.json one per instance (see ``fak.agent.trajectory``), saved every step
                                (with attempts: also <id>.a<k>.traj.json, below)
    attempts.json               with attempts only: the finished attempts (below)
    summary.json                counts by exit reason, totals (tokens, steps, verdicts, times),
                                throughput, and one line per instance
    workspaces/<id>/            the clone the agent worked in (removed when done unless
                                ``keep_workspaces``)
    envs/<id>/                  with ``task_env``: the instance's venv over the shared
                                (repo, version) env, the repository installed in it; bash runs
                                with it first on PATH (removed when done unless ``keep_workspaces``)

What one instance does (clone, Python for bash, seed locations, the agent): ``fak.swebench.instance``.

An instance is *finished* when its agent ended by ``submitted``, ``max_steps``, ``context_limit``
or ``error``: its prediction is written (possibly an empty patch) and a re-run with the same output
skips it.
Instances that ended ``interrupted`` (Ctrl-C), ``model_error`` (the gateway kept failing) or
``setup_error`` (repository not available) get no prediction and run again next time.

Several attempts per instance (``FleetConfig.attempts`` N > 1, ``--attempts N``): the unit of work
is (instance, attempt k), k = 0..N-1, all units sharing the ``workers`` threads (attempt-major
order: every instance's attempt 0 first). Attempt k is named ``unit_key(ID, k)`` — ``ID`` for k = 0
(the names above), ``ID.a{k}`` for k >= 1 — in ``trajectories/``, ``workspaces/``, ``envs/`` and
the conversation id ``RUN_ID/ID.a{k}``; every request of an attempt carries its seed
``attempt_seed(ID, k)`` (and the agent's resamples derive theirs from it). A finished attempt is
recorded in ``attempts.json`` (``{"format", "attempts", "instances": {ID: [{"attempt", "seed",
"exit_reason", "patch", "patch_bytes", "steps", "prompt_tokens", "completion_tokens",
"trajectory"}]}}``), which a re-run reads to skip it; ``predictions.json`` keeps one patch per
instance, chosen by ``select_attempt`` from the finished attempts only (never the dataset's
grading fields); ``summary.json`` adds ``attempts`` and ``selection`` (per instance: the chosen
attempt, why, and every attempt's exit reason, patch size and tokens). With N = 1 nothing of this
is written and everything is as described above.

Ctrl-C: the first one stops the fleet cleanly (no new instance starts, running agents stop after
their current step, finished results are kept, summary written, exit status 130); a second one
exits at once.

Ray (``--ray``, ``RaySettings``; docs/cluster.md): each instance is one Ray task (``ray_instance``)
reserving ``num_cpus`` and ``memory_bytes``; it gets the row without ``HIDDEN_FIELDS`` and the
``FleetConfig``, and returns the instance's final state to this process, which records it as
above. ``--output``, ``--repos`` and the env cache must be paths every node shares. A worker (or
its node) that dies loses only its in-flight instance: Ray runs the task again, up to
``max_attempts`` runs in all (errors of the agent are results, not retried). Each run appends
``{attempt, pid, node, started}`` to ``OUTPUT/ray/<instance_id>.attempts.jsonl``;
``summary.json`` gives each instance's ``attempts`` and a ``ray`` section. An instance whose every
run died ends ``worker_lost`` (no prediction: a re-run tries it again). One attempt per instance.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fak.agent import AgentStats, get_protocol
from fak.agent.trajectory import write_json_atomic
from fak.sandbox import SandboxUnavailable, probe
from fak.swebench.attempts import (
    ATTEMPTS_FILE,
    ATTEMPTS_FORMAT,
    attempt_seed,
    check_attempts,
    read_ledger,
    recorded_attempts,
    select_attempt,
    unit_key,
)
from fak.swebench.driver import (
    Driver,
    Job,
    RayPool,
    Results,
    ThreadPool,
    Unit,
    WorkerLost,
    load_json,
    new_table,
    status_markup,
)
from fak.swebench.instance import (
    FINISHED_REASONS,
    FleetConfig,
    InstanceState,
    RunContext,
    public_row,
    run_instance,
)
from fak.terminal import markup_safe, printable

log = logging.getLogger(__name__)

#: colours of the live table's status column (other statuses with "error" in red)
STATUS_STYLES = {"submitted": "green", "max_steps": "yellow", "interrupted": "magenta"}


@dataclass
class RaySettings:
    """``--ray``: the fleet's instances as Ray tasks (the module docstring says how).

    Args:
        address: what the summary records as the cluster's address.
        num_cpus: CPUs each instance task reserves.
        memory_bytes: memory each instance task reserves (``None``: none declared).
        max_attempts: runs of an instance's task at most when its worker dies.
    """

    address: str = "local"
    num_cpus: float = 1.0
    memory_bytes: int | None = None
    max_attempts: int = 3

    def __post_init__(self) -> None:
        self.max_attempts = max(1, self.max_attempts)

    def pool(self) -> RayPool:
        """The driver's pool: one Ray task per instance with these reservations."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_retries": self.max_attempts - 1,
                                   "retry_exceptions": False}
        if self.memory_bytes:
            options["memory"] = self.memory_bytes
        return RayPool(**options)

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "num_cpus_per_instance": self.num_cpus,
                "memory_bytes_per_instance": self.memory_bytes, "max_attempts": self.max_attempts}


def ray_instance(row: dict[str, Any], config: FleetConfig) -> InstanceState:
    """The body of one instance's Ray task: this run appended to
    ``OUTPUT/ray/<instance_id>.attempts.jsonl``, then ``run_instance`` (``row``: its public
    fields)."""
    from fak.cluster.raycluster import require_ray

    ctx = require_ray().get_runtime_context()
    runs = Path(config.output) / "ray" / f"{row['instance_id']}.attempts.jsonl"
    runs.parent.mkdir(parents=True, exist_ok=True)
    n = sum(1 for _ in runs.open()) + 1 if runs.exists() else 1
    with runs.open("a") as f:
        f.write(json.dumps({"attempt": n, "pid": os.getpid(), "node": ctx.get_node_id(),
                            "started": time.time()}) + "\n")
    return run_instance(row, config)


class Fleet(Job):
    """Runs ``rows`` with ``config``; ``run()`` returns the summary dict.

    Args:
        config: the run's settings.
        rows: the instances (dataset rows).
        console: where the live table and the lines go (default: standard error).
        ray: run the instances as Ray tasks on the cluster this process joined
            (``fak.cluster.raycluster.connect``); ``None``: on ``config.workers`` threads.

    Raises:
        ValueError: ``--attempts`` refused (``attempts.check_attempts``), instance ids that
            clash with attempt names, or attempts > 1 with ``ray``.
        fak.sandbox.SandboxUnavailable: ``allow_exec`` and fak's sandbox cannot be made here.
        fak.cluster.raycluster.RayMissing: ``ray`` and Ray is not installed.
    """

    def __init__(self, config: FleetConfig, rows: list[dict[str, Any]], console: Console | None = None,
                 *, ray: RaySettings | None = None):
        if ray is not None and config.attempts != 1:
            raise ValueError("--ray runs one attempt per instance; run --attempts "
                             f"{config.attempts} without --ray (the threaded fleet)")
        self.config = config
        self.rows = rows
        self.ray = ray
        self.pool = ray.pool() if ray is not None else ThreadPool("fak-agent")
        self.console = console or Console(stderr=True)
        self.out = Path(config.output)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "trajectories").mkdir(exist_ok=True)
        self.run_id = config.run_name
        self.ctx = RunContext.of(config)
        self.stop = self.ctx.stop
        self.n_attempts = int(config.attempts)
        check_attempts(self.out, self.n_attempts, float(config.sampling.get("temperature") or 0.0))
        self.results = Results(self.out, self.summary)
        #: finished attempts (attempts > 1): instance id -> attempt -> record (``ATTEMPTS_FILE``)
        self.ledger: dict[str, dict[int, dict[str, Any]]] = {}
        if self.n_attempts == 1:
            done = {p["instance_id"] for p in self.results.predictions}
            self.skipped = [r["instance_id"] for r in rows if r["instance_id"] in done]
            self.todo = [(r, 0) for r in rows if r["instance_id"] not in done]
        else:
            self._init_attempts(rows)
        self.states = {unit_key(r["instance_id"], k): InstanceState.of(r["instance_id"], k, config)
                       for r, k in self.todo}
        if self.ledger:  # as the ledger says (it may hold attempts imported from a plain run)
            self.results.replace(self._chosen_predictions())
        self.started_at = time.time()
        # the protocol is checked once, before any work (text protocol needs --allow-exec)
        get_protocol(config.protocol, allow_exec=config.allow_exec, tool_choice=config.tool_choice)
        self.sandbox: dict[str, Any] = {"required": config.allow_exec,
                                        "unsafe_no_sandbox": config.unsafe_no_sandbox}
        if config.allow_exec and not config.unsafe_no_sandbox:
            info = probe()
            if not info.ok:
                raise SandboxUnavailable(
                    f"--allow-exec runs the model's commands in fak's sandbox, and it cannot be "
                    f"made here: {info.detail}. Install bubblewrap (apt-get install bubblewrap) "
                    "or allow user namespaces; --unsafe-no-sandbox runs them on this host with "
                    "your privileges instead (never for untrusted models).")
            self.sandbox.update(method=info.method, detail=info.detail, limits=info.limits)

    def _init_attempts(self, rows: list[dict[str, Any]]) -> None:
        """``attempts`` > 1: read what earlier runs finished (``ATTEMPTS_FILE``, or attempt 0 of a
        run without attempts: its predictions and trajectories), then the units still to run,
        attempt-major (every instance's attempt 0 first)."""
        ids = {r["instance_id"] for r in rows}
        clash = sorted(unit_key(i, k) for i in ids for k in range(1, self.n_attempts)
                       if unit_key(i, k) in ids)
        if clash:
            raise ValueError(f"instance ids clash with attempt names: {', '.join(clash)}")
        data = read_ledger(self.out)
        if data is not None:
            for iid, recs in (data.get("instances") or {}).items():
                self.ledger[iid] = {int(r["attempt"]): r for r in recs}
        else:
            self._import_single_run()
        self.skipped = [unit_key(r["instance_id"], k) for k in range(self.n_attempts) for r in rows
                        if k in self.ledger.get(r["instance_id"], {})]
        self.todo = [(r, k) for k in range(self.n_attempts) for r in rows
                     if k not in self.ledger.get(r["instance_id"], {})]
        self._write_ledger()  # records the attempts now: a later run with fewer is refused

    def _import_single_run(self) -> None:
        """An output folder of a run without attempts, resumed with attempts: each prediction
        whose trajectory ended finished becomes attempt 0 (no seed was sent: ``seed`` null)."""
        for p in self.results.predictions:
            iid = p["instance_id"]
            traj = load_json(self.out / "trajectories" / f"{iid}.traj.json", None)
            if not isinstance(traj, dict) or traj.get("exit_reason") not in FINISHED_REASONS:
                continue
            patch = str(p.get("model_patch") or "")
            tokens = traj.get("tokens") or {}
            self.ledger[iid] = {0: {
                "attempt": 0, "seed": None, "exit_reason": traj["exit_reason"], "patch": patch,
                "patch_bytes": len(patch.encode("utf-8", "surrogateescape")),
                "steps": int(traj.get("n_steps") or 0),
                "prompt_tokens": int(tokens.get("prompt") or 0),
                "completion_tokens": int(tokens.get("completion") or 0),
                "trajectory": f"trajectories/{iid}.traj.json"}}

    def _write_ledger(self) -> None:
        write_json_atomic(self.out / ATTEMPTS_FILE, {
            "format": ATTEMPTS_FORMAT,
            "attempts": max(self.n_attempts, recorded_attempts(self.out)),
            "instances": {iid: [recs[k] for k in sorted(recs)] for iid, recs in self.ledger.items()}})

    def _label(self, key: str) -> str:
        """How a unit is named on the console: the instance id, with `` aK`` for attempts
        (control characters and Rich markup escaped: ``fak.terminal.markup_safe``)."""
        st = self.states[key]
        label = st.instance_id if self.n_attempts == 1 else f"{st.instance_id} a{st.attempt}"
        return markup_safe(label, newlines=False)

    # -- the driver's job ----------------------------------------------------------------------

    def units(self) -> list[Unit]:
        """Each (instance, attempt) still to run: ``run_instance`` on a thread with its live
        state, or ``ray_instance`` as a Ray task; either sees the row's public fields only."""
        if self.ray is not None:
            return [Unit(unit_key(r["instance_id"], k), ray_instance, (public_row(r), self.config))
                    for r, k in self.todo]
        return [Unit(key, run_instance, (public_row(r), self.config, k),
                     {"state": self.states[key], "ctx": self.ctx})
                for r, k in self.todo for key in (unit_key(r["instance_id"], k),)]

    def started(self, key: str) -> None:
        """A Ray task's row shows ``running`` until it returns (a thread's state is live)."""
        if self.ray is not None:
            st = self.states[key]
            st.started = time.time()
            st.stats.status = "running"

    def done(self, key: str, state: InstanceState) -> None:
        """Record a unit's final state (a Ray task's is a copy): the prediction when it
        finished, the traceback of an internal error in the log."""
        state.started = state.started or self.states[key].started
        self.states[key] = state
        if state.traceback:
            log.error("%s: %s", printable(key), printable(state.traceback.rstrip()))
        if state.patch is None:
            return
        if self.n_attempts == 1:
            self.results.record(state.instance_id, self.config.model, state.patch)
        else:
            self._record_attempt(state)

    def failed(self, key: str, exc: BaseException) -> None:
        st = self.states[key]
        if isinstance(exc, WorkerLost):
            st.exit_reason = "worker_lost"
            st.stats.status = "worker_lost"
            st.message = (f"{exc.kind} after {self.task_runs(st.instance_id)} attempt(s): "
                          f"{exc.detail}")
            st.ended = time.time()
            return
        st.fail(exc)
        log.error("%s: %s", printable(key), printable(st.traceback.rstrip()))

    def abort(self) -> None:
        self.ctx.abort()  # in-flight model requests end now

    def interrupted(self) -> None:
        for st in self.states.values():
            if st.exit_reason is None:
                st.exit_reason = "interrupted"

    def run(self) -> dict[str, Any]:
        """Run every instance not yet finished; returns the final summary.

        Raises ``KeyboardInterrupt`` after a clean stop (summary written) when interrupted: by
        Ctrl-C (SIGINT) or, from the main thread, by SIGTERM, which stops the same way.
        """
        if self.skipped:
            what = "attempt" if self.n_attempts > 1 else "instance"
            self.console.print(f"skipping {len(self.skipped)} finished {what}(s) in {self.out}")
        stopping = ("running Ray tasks are cancelled" if self.ray is not None
                    else "running agents finish their current step")
        return Driver(self, self.pool, workers=self.config.workers, console=self.console,
                      live=self.config.live, stopping=stopping).run()

    def task_runs(self, iid: str) -> int:
        """With ``ray``: how many times instance ``iid``'s task started."""
        path = self.out / "ray" / f"{iid}.attempts.jsonl"
        try:
            return sum(1 for _ in path.open())
        except FileNotFoundError:
            return 0

    # -- attempts ------------------------------------------------------------------------------

    def _record_attempt(self, state: InstanceState) -> None:
        """Attempts > 1: a finished attempt into ``ATTEMPTS_FILE``, and ``predictions.json``
        re-derived from every finished attempt (``select_attempt``)."""
        s = state.stats
        rec = {"attempt": state.attempt, "seed": state.seed, "exit_reason": state.exit_reason,
               "patch": state.patch, "patch_bytes": state.patch_bytes, "steps": s.step,
               "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
               "trajectory": f"trajectories/{unit_key(state.instance_id, state.attempt)}.traj.json"}
        with self.results.lock:
            self.ledger.setdefault(state.instance_id, {})[state.attempt] = rec
            self._write_ledger()
            self.results.replace(self._chosen_predictions())
            self.results.write_summary(final=False)

    def _chosen_predictions(self) -> list[dict[str, Any]]:
        """``predictions.json`` with attempts: per instance with a finished attempt, the chosen
        attempt's patch; the run's rows first in their order, then other instances of the
        ledger (sorted), then predictions of instances the ledger does not have (kept as read)."""
        order = [r["instance_id"] for r in self.rows if r["instance_id"] in self.ledger]
        order += sorted(set(self.ledger) - set(order))
        out = []
        for iid in order:
            choice = select_attempt(list(self.ledger[iid].values()))
            if choice is not None:
                out.append({"instance_id": iid, "model_name_or_path": self.config.model,
                            "model_patch": self.ledger[iid][choice[0]]["patch"]})
        return out + [p for p in self.results.predictions if p["instance_id"] not in self.ledger]

    def selection(self) -> list[dict[str, Any]]:
        """Attempts > 1, per instance of the run's rows: the chosen attempt and why
        (``select_attempt``), and every attempt: finished ones as recorded, the others as this
        run left them (``finished`` false; ``pending`` when not started)."""
        units = {(st.instance_id, st.attempt): st for st in self.states.values()}
        out = []
        for row in self.rows:
            iid = row["instance_id"]
            done = self.ledger.get(iid, {})
            attempts = []
            for k in range(max([self.n_attempts, *[a + 1 for a in done]])):
                if k in done:
                    attempts.append({**{f: v for f, v in done[k].items() if f != "patch"},
                                     "finished": True})
                    continue
                st = units.get((iid, k))
                s = st.stats if st else AgentStats()
                attempts.append({
                    "attempt": k, "seed": st.seed if st else attempt_seed(iid, k),
                    "exit_reason": (st.exit_reason or ("pending" if s.status == "waiting"
                                                       else s.status)) if st else "pending",
                    "patch_bytes": st.patch_bytes if st else 0, "steps": s.step,
                    "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                    "trajectory": f"trajectories/{unit_key(iid, k)}.traj.json",
                    "finished": False})
            choice = select_attempt(list(done.values()))
            out.append({"instance_id": iid,
                        "chosen_attempt": choice[0] if choice else None,
                        "reason": choice[1] if choice else None,
                        "chosen_exit_reason": done[choice[0]]["exit_reason"] if choice else None,
                        "patch_bytes": done[choice[0]]["patch_bytes"] if choice else 0,
                        "n_finished": len(done), "attempts": attempts})
        return out

    # -- reporting -----------------------------------------------------------------------------

    def summary(self, final: bool = True) -> dict[str, Any]:
        """Counts and totals so far (``final``: the run is over). With attempts > 1 every count,
        total and ``instances`` line is per (instance, attempt) run now, and ``attempts`` and
        ``selection`` (``Fleet.selection``) are added; with ``ray``, each instance line's
        ``attempts`` (its task's runs) and the ``ray`` section."""
        per: list[dict[str, Any]] = []
        totals = {"prompt_tokens": 0, "completion_tokens": 0, "steps": 0, "allowed": 0,
                  "denied": 0, "format_errors": 0, "model_s": 0.0,
                  "decode_s": 0.0, "decode_tokens": 0}
        by_reason: dict[str, int] = {}
        for st in self.states.values():
            s = st.stats
            reason = st.exit_reason or ("interrupted" if final else s.status)
            by_reason[reason] = by_reason.get(reason, 0) + 1
            totals["prompt_tokens"] += s.prompt_tokens
            totals["completion_tokens"] += s.completion_tokens
            totals["steps"] += s.step
            totals["allowed"] += s.allowed
            totals["denied"] += s.denied
            totals["format_errors"] += st.format_errors
            totals["model_s"] += s.model_s
            totals["decode_s"] += s.decode_s
            totals["decode_tokens"] += s.decode_tokens
            multi = {"attempt": st.attempt, "seed": st.seed} if self.n_attempts > 1 else {}
            per.append({"instance_id": st.instance_id, **multi, "exit_reason": reason, "steps": s.step,
                        "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                        "denied": s.denied, "allowed": s.allowed, "patch_bytes": st.patch_bytes,
                        "format_errors": st.format_errors, "repeated_calls": st.repeated,
                        "resampled_turns": st.resampled,
                        "model_s": round(s.model_s, 3), "tools_s": round(st.tools_s, 3),
                        "wall_s": round((st.ended or time.time()) - st.started, 3) if st.started else 0.0,
                        "difficulty": self.config.labels.get(st.instance_id),
                        "message": st.message[:500],
                        **({"traceback": st.traceback[-4000:]} if st.traceback else {})})
        wall = time.time() - self.started_at
        finished = sum(by_reason.get(r, 0) for r in FINISHED_REASONS)
        totals["model_s"] = round(totals["model_s"], 3)
        totals["decode_s"] = round(totals["decode_s"], 3)
        out = {
            "run_id": self.run_id, "model": self.config.model, "gateway": self.config.gateway,
            "protocol": self.config.protocol, "tool_choice": self.config.tool_choice,
            "server": self.config.server, "dataset": self.config.dataset,
            "max_steps": self.config.max_steps, "workers": self.config.workers,
            "allow_exec": self.config.allow_exec, "sandbox": self.sandbox, "final": final,
            "interrupted": self.stop.is_set(),
            "n_selected": len(self.rows), "n_skipped_finished": len(self.skipped),
            "n_run": len(self.todo), "n_finished": finished,
            "n_predictions": len(self.results.predictions),
            "exit_reasons": dict(sorted(by_reason.items())), "totals": totals,
            "wall_s": round(wall, 3),
            "instances_per_hour": round(finished * 3600 / wall, 3) if wall > 0 else 0.0,
            # decode speed of one sequence, as the server timed it (first to last token of each
            # reply; prefill and queueing excluded); 0 when the server reports no timings
            "completion_tok_s": (round(totals["decode_tokens"] / totals["decode_s"], 3)
                                 if totals["decode_s"] > 0 else 0.0),
            # the fleet's throughput: all agents' tokens over the run's wall time
            "completion_tok_per_wall_s": round(totals["completion_tokens"] / wall, 3) if wall > 0 else 0.0,
            "prompt_tok_per_wall_s": round(totals["prompt_tokens"] / wall, 3) if wall > 0 else 0.0,
            "instances": per,
        }
        if self.n_attempts > 1:
            out["attempts"] = self.n_attempts
            out["selection"] = self.selection()
        if self.ray is not None:  # the cluster, and how many times each instance's task started
            for inst in per:
                inst["attempts"] = self.task_runs(inst["instance_id"])
            out["ray"] = self.ray.to_json()
        return out

    def table(self) -> Table:
        """The live table: one row per instance that has started, then totals."""
        title = f"fak swebench run · {self.run_id} · {self.config.model}"
        if self.n_attempts > 1:
            title += f" · {self.n_attempts} attempts per instance"
        t = new_table(title, ("instance", "status", "step", "tokens", "tok/s", "last tool",
                              "verdicts"), right=("step", "tokens", "tok/s"))
        tot_tokens = tot_denied = tot_allowed = 0
        n_done = 0
        for iid, st in self.states.items():
            s = st.stats
            tot_tokens += s.tokens
            tot_denied += s.denied
            tot_allowed += s.allowed
            if st.exit_reason:
                n_done += 1
            if s.status == "waiting":
                continue
            status = status_markup(st.exit_reason or s.status, STATUS_STYLES, red=("error",))
            t.add_row(self._label(iid), status, str(s.step),
                      str(s.tokens), f"{s.tok_per_s:.1f}", markup_safe(s.last_tool, newlines=False),
                      f"{s.allowed}✓ {s.denied}✗")
        wall = time.time() - self.started_at
        t.add_section()
        unit = " attempts" if self.n_attempts > 1 else ""
        t.add_row(f"total {n_done}/{len(self.states)}{unit} done"
                  + (f" (+{len(self.skipped)} skipped)" if self.skipped else ""),
                  "stopping" if self.stop.is_set() else f"{wall:.0f} s", "",
                  str(tot_tokens), "", "", f"{tot_allowed}✓ {tot_denied}✗")
        return t

    def line(self, key: str) -> str:
        st = self.states[key]
        s = st.stats
        return (f"{self._label(key)}: {st.exit_reason} steps={s.step} tokens={s.tokens} "
                f"denied={s.denied} patch={st.patch_bytes}B"
                + (f" ({markup_safe(st.message[:200])})" if st.exit_reason not in FINISHED_REASONS
                   and st.message else ""))

