"""``fak swebench run``: the fleet — N agents at once over SWE-bench instances, against one gateway.

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

Without ``task_env``, bash still runs on a Python that can import the task's package when one
is here (a task env already built in the cache, the machine's ``python3``, or the spec's pyenv
version: ``fak.swebench.interpreter``), and the model is told which one it is.

Seed locations: ``FleetConfig.localizer`` (``(row, workspace root) -> [{path, line?, symbol?}]``,
e.g. the staged pipeline's localizer) gives each agent its first hints; it sees the row without
the fields that hold the answer (``HIDDEN_FIELDS``). Default: none.

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
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import signal
import logging
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fak.agent import (
    Agent,
    AgentConfig,
    AgentStats,
    OpenAIChatModel,
    ToolBox,
    Trajectory,
    get_protocol,
)
from fak.agent.trajectory import write_json_atomic
from fak.agent.workspace import WorkspaceError
from fak.gitsafe import git
from fak.sandbox import SandboxUnavailable, probe
from fak.swebench.attempts import (  # noqa: F401 (re-exported: the fleet's attempt rules)
    ATTEMPTS_FILE,
    ATTEMPTS_FORMAT,
    SELECT_REASONS,
    attempt_seed,
    check_attempts,
    read_ledger,
    recorded_attempts,
    select_attempt,
    unit_key,
)
from fak.swebench.envs import EnvBuilder, EnvError, make_overlay
from fak.swebench.interpreter import choose_python
from fak.swebench.repos import RepoError, ensure_mirror, make_workspace
from fak.terminal import markup_safe, printable

log = logging.getLogger(__name__)

FINISHED_REASONS = ("submitted", "max_steps", "context_limit", "error")
#: row fields that hold the answer or the grading: never shown to the agent or a localizer
HIDDEN_FIELDS = ("patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "hints_text")

#: ``(row without HIDDEN_FIELDS, workspace root) -> [{"path", "line"?, "symbol"?}]``
Localizer = Callable[[dict[str, Any], Path], list[dict[str, Any]]]


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    """SIGTERM handler of a fleet run: stop as Ctrl-C does (finished results kept, summary final)."""
    raise KeyboardInterrupt


@dataclass
class FleetConfig:
    """Settings of one fleet run (see ``fak swebench run --help`` for each)."""

    gateway: str
    model: str
    output: Path
    workers: int = 1
    max_steps: int = 30
    allow_exec: bool = False
    unsafe_no_sandbox: bool = False  # model-written commands on the host (--unsafe-no-sandbox)
    protocol: str = "tools"
    tool_choice: str | None = None  # tools protocol: "required" | "auto" (None: its default)
    repos_dir: Path | None = None
    run_id: str | None = None
    exec_timeout_s: float = 60.0
    keep_workspaces: bool = False
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 0.0, "max_tokens": 1024})
    observation_window: int = 0
    model_timeout_s: float = 600.0
    max_retries: int = 5
    live: bool | None = None  # None: when stdout is a terminal
    dataset: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    task_env: bool = False
    envs_dir: Path | None = None
    server: dict[str, Any] | None = None  # what the summary records about the gateway
    max_actions_per_step: int = 1
    on_repeat: str = "resample"  # AgentConfig.on_repeat: "resample" | "tell" | "run"
    repeat_resamples: int = 2
    resample_temperature: float = 0.7
    localizer: Localizer | None = None  # seed locations per instance (None: none)
    pick_python: bool = True  # without task_env: bash on a Python that imports the package
    attempts: int = 1  # independent agents per instance (module docstring; > 1 needs temperature > 0)


@dataclass
class InstanceState:
    instance_id: str
    stats: AgentStats = field(default_factory=AgentStats)
    started: float = 0.0
    ended: float = 0.0
    exit_reason: str | None = None
    patch_bytes: int = 0
    message: str = ""
    format_errors: int = 0
    repeated: int = 0
    resampled: int = 0
    tools_s: float = 0.0
    traceback: str = ""  # an internal error's, for the log and summary.json
    attempt: int = 0
    seed: int | None = None  # sent with every request of the attempt (attempts > 1 only)

    def __post_init__(self) -> None:
        self.stats.status = "waiting"


def root_listing(root: Path, limit: int = 60) -> str:
    """The entries of the workspace root for the task prompt: ``"a/, b/, setup.py"`` (folders
    first, ``.git`` left out; at most ``limit``, then how many more)."""
    entries = sorted((e for e in Path(root).iterdir() if e.name != ".git"),
                     key=lambda e: (not e.is_dir(), e.name))
    names = [e.name + ("/" if e.is_dir() else "") for e in entries]
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" (and {more} more)" if more > 0 else "")


def _load_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


class Fleet:
    """Runs ``rows`` with ``config``; ``run()`` returns the summary dict."""

    def __init__(self, config: FleetConfig, rows: list[dict[str, Any]], console: Console | None = None):
        self.config = config
        self.rows = rows
        self.console = console or Console(stderr=True)
        self.out = Path(config.output)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "trajectories").mkdir(exist_ok=True)
        self.run_id = config.run_id or self.out.resolve().name
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._repo_locks: dict[str, threading.Lock] = {}
        self._models: dict[str, OpenAIChatModel] = {}
        self.n_attempts = int(config.attempts)
        check_attempts(self.out, self.n_attempts, float(config.sampling.get("temperature") or 0.0))
        self.predictions: list[dict[str, Any]] = _load_json(self.out / "predictions.json", [])
        #: finished attempts (attempts > 1): instance id -> attempt -> record (``ATTEMPTS_FILE``)
        self.ledger: dict[str, dict[int, dict[str, Any]]] = {}
        if self.n_attempts == 1:
            done = {p["instance_id"] for p in self.predictions}
            self.skipped = [r["instance_id"] for r in rows if r["instance_id"] in done]
            self.todo = [r for r in rows if r["instance_id"] not in done]
            self.units = [(r, 0) for r in self.todo]
            self.states = {r["instance_id"]: InstanceState(r["instance_id"]) for r in self.todo}
        else:
            self._init_attempts(rows)
        self.started_at = time.time()
        self._env_builder = EnvBuilder(config.envs_dir)
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
        self.units = [(r, k) for k in range(self.n_attempts) for r in rows
                      if k not in self.ledger.get(r["instance_id"], {})]
        todo_ids = {r["instance_id"] for r, _ in self.units}
        self.todo = [r for r in rows if r["instance_id"] in todo_ids]
        self.states = {unit_key(r["instance_id"], k):
                       InstanceState(r["instance_id"], attempt=k,
                                     seed=attempt_seed(r["instance_id"], k))
                       for r, k in self.units}
        self._write_ledger()  # records the attempts now: a later run with fewer is refused
        if self.ledger:  # as the ledger says (it may hold attempts imported from a plain run)
            self.predictions = self._chosen_predictions()
            write_json_atomic(self.out / "predictions.json", self.predictions)

    def _import_single_run(self) -> None:
        """An output folder of a run without attempts, resumed with attempts: each prediction
        whose trajectory ended finished becomes attempt 0 (no seed was sent: ``seed`` null)."""
        for p in self.predictions:
            iid = p["instance_id"]
            traj = _load_json(self.out / "trajectories" / f"{iid}.traj.json", None)
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

    # -- one instance ------------------------------------------------------------------------

    def _run_instance(self, row: dict[str, Any], attempt: int = 0) -> None:
        iid = row["instance_id"]
        key = unit_key(iid, attempt)
        state = self.states[key]
        if self.stop.is_set():
            state.exit_reason = "interrupted"
            state.stats.status = "interrupted"
            return
        state.started = time.time()
        state.stats.status = "cloning"
        cfg = self.config
        ws_dir = self.out / "workspaces" / key
        traj_path = self.out / "trajectories" / f"{key}.traj.json"
        multi = {"attempt": attempt, "seed": state.seed} if self.n_attempts > 1 else {}
        traj = Trajectory(traj_path, instance_id=iid, **multi, run_id=self.run_id, model=cfg.model,
                          gateway=cfg.gateway, repo=row["repo"], base_commit=row["base_commit"])
        try:
            with self._repo_locks.setdefault(row["repo"], threading.Lock()):
                mirror = ensure_mirror(row["repo"], cfg.repos_dir, commit=row["base_commit"])
            ws = make_workspace(mirror, row["base_commit"], ws_dir)
            diff_base = row["base_commit"]
            bash_env: dict[str, str] = {}
            python_note = None
            if cfg.task_env:
                state.stats.status = "env"
                bash_env, diff_base = self._task_env(row, mirror, ws, traj, key)
                python_note = ("In the shell, `python` is the task's own environment (the "
                               "repository installed in it), so you can run scripts and tests.")
            elif cfg.allow_exec and cfg.pick_python:
                state.stats.status = "python"
                bash_env, python_note = self._pick_python(row, ws.root, traj, key)
            seeds = self._seeds(row, ws.root, traj)
        except (RepoError, EnvError, WorkspaceError) as e:
            state.exit_reason, state.message = "setup_error", str(e)
            state.stats.status = "setup_error"
            traj.data.update(exit_reason="setup_error", exit_message=str(e))
            traj.data["timings"]["ended_at"] = time.time()
            traj.save()
            state.ended = time.time()
            return
        protocol = get_protocol(cfg.protocol, allow_exec=cfg.allow_exec, tool_choice=cfg.tool_choice)
        headers = {"X-Fak-Conversation": f"{self.run_id}/{key}",
                   "X-Fak-Workspace": str(ws.root), **protocol.headers()}
        sampling = dict(cfg.sampling)
        if state.seed is not None:
            sampling["seed"] = state.seed
        model = OpenAIChatModel(cfg.gateway, cfg.model, headers=headers, sampling=sampling,
                                timeout_s=cfg.model_timeout_s, max_retries=cfg.max_retries,
                                cancel=self.stop)
        with self._lock:
            self._models[key] = model
        try:
            # the per-instance overlay (--task-env) is writable: pip may write there; a shared
            # task env that _pick_python chose stays read-only, since fak runs its interpreter on
            # the host later (make_overlay) and every instance shares it
            venv = bash_env.get("VIRTUAL_ENV") if cfg.task_env else None
            toolbox = ToolBox(ws, allow_exec=cfg.allow_exec, exec_timeout_s=cfg.exec_timeout_s,
                              unsafe_no_sandbox=cfg.unsafe_no_sandbox, env_overrides=bash_env,
                              sandbox_writable=(Path(venv),) if venv else ())
            agent = Agent(model, toolbox, protocol,
                          AgentConfig(max_steps=cfg.max_steps,
                                      observation_window=cfg.observation_window,
                                      max_actions_per_step=cfg.max_actions_per_step,
                                      on_repeat=cfg.on_repeat,
                                      repeat_resamples=cfg.repeat_resamples,
                                      resample_temperature=cfg.resample_temperature,
                                      seed=int(sampling.get("seed") or 0)),
                          traj, stop=self.stop)
            agent.stats = state.stats
            data = agent.run(problem_statement=row.get("problem_statement", ""),
                             repo=row["repo"], workspace=str(ws.root), listing=root_listing(ws.root),
                             python_note=python_note, seed_locations=seeds)
            patch = ws.diff(diff_base)
            data["patch"] = patch
            data["info"]["difficulty"] = cfg.labels.get(iid)
            traj.save()
        finally:
            with self._lock:
                self._models.pop(key, None)
            model.close()
        state.exit_reason = data["exit_reason"]
        state.message = data.get("exit_message") or ""
        state.format_errors = int(data.get("n_format_errors") or 0)
        state.repeated = int(data.get("n_repeated") or 0)
        state.resampled = int(data.get("n_resampled") or 0)
        state.tools_s = float(data["timings"].get("tools_s") or 0.0)
        state.patch_bytes = len(patch.encode("utf-8", "surrogateescape"))
        state.ended = time.time()
        if state.exit_reason in FINISHED_REASONS:
            if self.n_attempts == 1:
                self._record(iid, patch)
            else:
                self._record_attempt(state, patch, traj_path)
        if not cfg.keep_workspaces:
            shutil.rmtree(ws_dir, ignore_errors=True)
            shutil.rmtree(self.out / "envs" / key, ignore_errors=True)

    def _task_env(self, row: dict[str, Any], mirror: Path, ws: Any,
                  traj: Trajectory, unit: str) -> tuple[dict[str, str], str]:
        """Build (or reuse) the (repo, version) env, layer a per-instance venv over it with the
        repository installed, and commit what the setup changed, as the harness's instance image
        does; ``unit`` (``unit_key``: ID, or ID.aK for attempt K) names the venv's folder.
        Returns (bash environment overrides, the commit to diff against)."""
        key = EnvBuilder.key(row["repo"], str(row["version"]))
        with self._env_builder.lock(key):
            env = self._env_builder.ensure(row["repo"], str(row["version"]), mirror,
                                           row.get("environment_setup_commit") or row["base_commit"])
        overlay = make_overlay(env, self.out / "envs" / unit, ws.root,
                               self.out / "envs" / f"{unit}.install.log",
                               unsafe_no_sandbox=self.config.unsafe_no_sandbox)
        git(ws.root, "commit", "--quiet", "--allow-empty", "--no-verify", "-am", "fak: task setup")
        setup_commit = git(ws.root, "rev-parse", "HEAD").stdout.strip()
        traj.data["info"]["task_env"] = {"env": env.key, "overlay": str(overlay.path),
                                         "setup_commit": setup_commit,
                                         "unreproduced": overlay.unreproduced}
        environ = overlay.environ()
        return {"PATH": environ["PATH"], "VIRTUAL_ENV": environ["VIRTUAL_ENV"]}, setup_commit

    def _pick_python(self, row: dict[str, Any], root: Path, traj: Trajectory,
                     unit: str) -> tuple[dict[str, str], str | None]:
        """Without ``task_env``: the interpreter bash runs and the note for the prompt
        (``interpreter.choose_python``), recorded under ``info.python``; its shims go under
        ``envs/<unit>/bin``."""
        choice = choose_python(root, row["repo"], str(row.get("version") or ""),
                               self._env_builder, unsafe_no_sandbox=self.config.unsafe_no_sandbox,
                               shim_dir=self.out / "envs" / unit / "bin")
        traj.data["info"]["python"] = {"label": choice.label, "bin": str(choice.bin_dir or ""),
                                       "version": choice.version, "imports": choice.imports,
                                       "tried": choice.tried}
        return choice.env_overrides, choice.note or None

    def _seeds(self, row: dict[str, Any], root: Path, traj: Trajectory) -> list[dict[str, Any]]:
        """Seed locations from ``config.localizer`` (none without one); a failing localizer is
        recorded and the agent starts without seeds."""
        if self.config.localizer is None:
            return []
        public = {k: v for k, v in row.items() if k not in HIDDEN_FIELDS}
        try:
            return list(self.config.localizer(public, root) or [])
        except Exception as e:  # noqa: BLE001 - a hint source must not stop the instance
            traj.data["info"]["localizer_error"] = f"{type(e).__name__}: {e}"
            return []

    def _record(self, iid: str, patch: str) -> None:
        with self._lock:
            self.predictions = [p for p in self.predictions if p["instance_id"] != iid]
            self.predictions.append({"instance_id": iid, "model_name_or_path": self.config.model,
                                     "model_patch": patch})
            write_json_atomic(self.out / "predictions.json", self.predictions)
            self._write_summary(final=False)

    def _record_attempt(self, state: InstanceState, patch: str, traj_path: Path) -> None:
        """Attempts > 1: a finished attempt into ``ATTEMPTS_FILE``, and ``predictions.json``
        re-derived from every finished attempt (``select_attempt``)."""
        s = state.stats
        rec = {"attempt": state.attempt, "seed": state.seed, "exit_reason": state.exit_reason,
               "patch": patch, "patch_bytes": state.patch_bytes, "steps": s.step,
               "prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
               "trajectory": str(traj_path.relative_to(self.out))}
        with self._lock:
            self.ledger.setdefault(state.instance_id, {})[state.attempt] = rec
            self._write_ledger()
            self.predictions = self._chosen_predictions()
            write_json_atomic(self.out / "predictions.json", self.predictions)
            self._write_summary(final=False)

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
        return out + [p for p in self.predictions if p["instance_id"] not in self.ledger]

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
        ``selection`` (``Fleet.selection``) are added."""
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
            "n_run": len(self.units), "n_finished": finished,
            "n_predictions": len(self.predictions),
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
        return out

    def _write_summary(self, final: bool) -> dict[str, Any]:
        summary = self.summary(final=final)
        write_json_atomic(self.out / "summary.json", summary)
        return summary

    def table(self) -> Table:
        """The live table: one row per instance that has started, then totals."""
        title = f"fak swebench run · {self.run_id} · {self.config.model}"
        if self.n_attempts > 1:
            title += f" · {self.n_attempts} attempts per instance"
        t = Table(title=title, expand=False)
        for col in ("instance", "status", "step", "tokens", "tok/s", "last tool", "verdicts"):
            t.add_column(col, justify="right" if col in ("step", "tokens", "tok/s") else "left")
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
            status = st.exit_reason or s.status
            style = {"submitted": "green", "max_steps": "yellow", "interrupted": "magenta"}.get(
                status, "red" if status and "error" in status else "")
            t.add_row(self._label(iid), f"[{style}]{status}[/]" if style else status, str(s.step),
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

    # -- the fleet -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run every instance not yet finished; returns the final summary.

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

    def _skipping_note(self) -> None:
        if self.skipped:
            what = "attempt" if self.n_attempts > 1 else "instance"
            self.console.print(f"skipping {len(self.skipped)} finished {what}(s) in {self.out}")

    def _run(self) -> dict[str, Any]:
        live_on = self.config.live if self.config.live is not None else self.console.is_terminal
        self._skipping_note()
        interrupted = False
        executor = cf.ThreadPoolExecutor(max_workers=max(1, self.config.workers),
                                         thread_name_prefix="fak-agent")
        futures = {executor.submit(self._run_instance, row, k): unit_key(row["instance_id"], k)
                   for row, k in self.units}
        live = Live(self.table(), console=self.console, refresh_per_second=2) if live_on else None
        reported: set[str] = set()
        try:
            if live:
                live.start()
            pending = set(futures)
            while pending:
                done, pending = cf.wait(pending, timeout=0.5)
                for fut in done:
                    exc = fut.exception()
                    iid = futures[fut]
                    if exc is not None:
                        st = self.states[iid]
                        st.exit_reason, st.message = "error", f"{type(exc).__name__}: {exc}"
                        st.traceback = "".join(traceback.format_exception(exc))
                        log.error("%s: %s", printable(iid), printable(st.traceback.rstrip()))
                    if not live and iid not in reported:
                        reported.add(iid)
                        self._print_line(iid)
                if live:
                    live.update(self.table())
        except KeyboardInterrupt:
            interrupted = True
            self._interrupt(executor, futures, live)
        finally:
            executor.shutdown(wait=not interrupted, cancel_futures=True)
            if live:
                live.update(self.table())
                live.stop()
        summary = self._write_summary(final=True)
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _print_line(self, iid: str) -> None:
        st = self.states[iid]
        s = st.stats
        self.console.print(f"{self._label(iid)}: {st.exit_reason} steps={s.step} tokens={s.tokens} "
                           f"denied={s.denied} patch={st.patch_bytes}B"
                           + (f" ({markup_safe(st.message[:200])})" if st.exit_reason not in FINISHED_REASONS
                              and st.message else ""))

    def _interrupt(self, executor: cf.ThreadPoolExecutor, futures: dict, live: Live | None) -> None:
        """First Ctrl-C: stop cleanly. A second one during the wait exits at once."""
        self.stop.set()
        self.console.print("[magenta]stopping: running agents finish their current step "
                           "(Ctrl-C again to quit now)[/]")

        def hard_exit(*_: object) -> None:
            self._write_summary(final=True)
            os._exit(130)

        previous = signal.signal(signal.SIGINT, hard_exit)
        try:
            for fut in futures:
                fut.cancel()
            with self._lock:
                models = list(self._models.values())
            for m in models:  # abort in-flight model requests
                try:
                    m.close()
                except Exception:  # noqa: BLE001 - best effort
                    pass
            for fut in list(futures):
                if not fut.cancelled():
                    try:
                        fut.result()
                    except Exception:  # noqa: BLE001 - recorded in the state already
                        pass
                if live:
                    live.update(self.table())
        finally:
            signal.signal(signal.SIGINT, previous)
        for st in self.states.values():
            if st.exit_reason is None:
                st.exit_reason = "interrupted"
