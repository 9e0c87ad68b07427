"""One SWE-bench instance through fak's agent: ``run_instance``, the unit of work of
``fak swebench run`` (a fleet thread and a Ray task both call it).

``run_instance(row, config, attempt)`` clones the repository at ``base_commit`` (a mirror from
``config.repos_dir``, else GitHub), gives bash the task's own env (``task_env``) or a Python that
can import the task's package (``fak.swebench.interpreter``), asks ``config.localizer`` for seed
locations, runs the agent and takes the patch. It writes the attempt's trajectory
(``OUTPUT/trajectories/<unit>.traj.json``, every step) and works in ``OUTPUT/workspaces/<unit>``
(and ``OUTPUT/envs/<unit>``), removed at the end unless ``keep_workspaces``; ``<unit>`` is
``attempts.unit_key(ID, attempt)``. It returns the attempt's final ``InstanceState``, whose
``patch`` is set when the agent finished (``FINISHED_REASONS``); recording it
(``predictions.json``, ``attempts.json``, ``summary.json``) is the fleet's job
(``fak.swebench.fleet``).

Without ``task_env``, bash still runs on a Python that can import the task's package when one
is here (a task env already built in the cache, the machine's ``python3``, or the spec's pyenv
version: ``fak.swebench.interpreter``), and the model is told which one it is.

Seed locations: ``FleetConfig.localizer`` (``(row, workspace root) -> [{path, line?, symbol?}]``,
e.g. the staged pipeline's localizer) gives each agent its first hints; it sees the row without
the fields that hold the answer (``HIDDEN_FIELDS``). Default: none.

An instance ends ``setup_error`` when its repository, workspace or env cannot be made, and
``error`` (with the traceback) when fak itself failed; neither raises. It reads only the row's
public fields: the caller strips ``HIDDEN_FIELDS``, and the localizer never sees them.
"""

from __future__ import annotations

import shutil
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.agent import (
    Agent,
    AgentConfig,
    AgentStats,
    OpenAIChatModel,
    ToolBox,
    Trajectory,
    get_protocol,
)
from fak.agent.workspace import WorkspaceError
from fak.gitsafe import git
from fak.swebench.attempts import attempt_seed, unit_key
from fak.swebench.envs import EnvBuilder, EnvError, make_overlay
from fak.swebench.interpreter import choose_python
from fak.swebench.repos import RepoError, ensure_mirror, make_workspace

FINISHED_REASONS = ("submitted", "max_steps", "context_limit", "error")
#: row fields that hold the answer or the grading: never shown to the agent or a localizer
HIDDEN_FIELDS = ("patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "hints_text")

#: ``(row without HIDDEN_FIELDS, workspace root) -> [{"path", "line"?, "symbol"?}]``
Localizer = Callable[[dict[str, Any], Path], list[dict[str, Any]]]


def public_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without ``HIDDEN_FIELDS``: all that an instance's run may read."""
    return {k: v for k, v in row.items() if k not in HIDDEN_FIELDS}


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
    verify_on_edit: bool = True  # AgentConfig.verify_on_edit: the model's script runs after each edit
    localizer: Localizer | None = None  # seed locations per instance (None: none)
    pick_python: bool = True  # without task_env: bash on a Python that imports the package
    attempts: int = 1  # independent agents per instance (fleet.py's docstring; > 1 needs temperature > 0)

    @property
    def run_name(self) -> str:
        """The run id of conversation ids and the summary: ``run_id``, else the output folder's name."""
        return self.run_id or Path(self.output).resolve().name


@dataclass
class InstanceState:
    """One attempt of one instance: live while it runs (the table reads ``stats``), final when
    ``run_instance`` returns it."""

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
    patch: str | None = None  # the patch, once the attempt finished (FINISHED_REASONS)

    def __post_init__(self) -> None:
        self.stats.status = "waiting"

    @classmethod
    def of(cls, instance_id: str, attempt: int, config: FleetConfig) -> InstanceState:
        """The state of ``attempt`` before it starts: with ``config.attempts`` > 1 it carries the
        attempt's seed (``attempts.attempt_seed``)."""
        if config.attempts == 1:
            return cls(instance_id)
        return cls(instance_id, attempt=attempt, seed=attempt_seed(instance_id, attempt))

    def fail(self, exc: BaseException) -> None:
        """End ``error`` by fak's own exception ``exc`` (its traceback kept)."""
        self.exit_reason, self.message = "error", f"{type(exc).__name__}: {exc}"
        self.traceback = "".join(traceback.format_exception(exc))


@dataclass
class RunContext:
    """What the instances of a run share in one process: ``stop`` (set: no new instance starts,
    running agents stop after their step), one lock per repository (its mirror is fetched once),
    the task-env builder, and the model clients in flight (``abort`` closes them)."""

    stop: threading.Event
    env_builder: EnvBuilder
    repo_locks: dict[str, threading.Lock] = field(default_factory=dict)
    models: dict[str, OpenAIChatModel] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, config: FleetConfig) -> RunContext:
        return cls(threading.Event(), EnvBuilder(config.envs_dir))

    def abort(self) -> None:
        """Close every model client in flight: their requests end now (best effort)."""
        with self.lock:
            models = list(self.models.values())
        for m in models:
            try:
                m.close()
            except Exception:  # noqa: BLE001 - best effort
                pass


def root_listing(root: Path, limit: int = 60) -> str:
    """The entries of the workspace root for the task prompt: ``"a/, b/, setup.py"`` (folders
    first, ``.git`` left out; at most ``limit``, then how many more)."""
    entries = sorted((e for e in Path(root).iterdir() if e.name != ".git"),
                     key=lambda e: (not e.is_dir(), e.name))
    names = [e.name + ("/" if e.is_dir() else "") for e in entries]
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" (and {more} more)" if more > 0 else "")


def run_instance(row: dict[str, Any], config: FleetConfig, attempt: int = 0, *,
                 state: InstanceState | None = None,
                 ctx: RunContext | None = None) -> InstanceState:
    """Run ``attempt`` of instance ``row`` (its public fields: ``public_row``) with ``config``
    (the module docstring says what it does and writes).

    Args:
        row: the instance (``instance_id``, ``repo``, ``base_commit``, ``problem_statement``,
            ``version``, ``environment_setup_commit``).
        config: the run's settings.
        attempt: which attempt (0 without ``--attempts``).
        state: the state to update while it runs (a live table reads it); default a new one.
        ctx: what this run shares in this process (default: this instance's own).

    Returns:
        ``state``, final: ``exit_reason`` (``interrupted`` when ``ctx.stop`` was set before it
        started), counts and times, and ``patch`` when it finished.
    """
    state = state or InstanceState.of(row["instance_id"], attempt, config)
    ctx = ctx or RunContext.of(config)
    try:
        _run(row, config, attempt, state, ctx)
    except Exception as exc:  # noqa: BLE001 - fak's own failure: recorded, the run goes on
        state.fail(exc)
    return state


def _run(row: dict[str, Any], cfg: FleetConfig, attempt: int, state: InstanceState,
         ctx: RunContext) -> None:
    iid = row["instance_id"]
    key = unit_key(iid, attempt)
    if ctx.stop.is_set():
        state.exit_reason = "interrupted"
        state.stats.status = "interrupted"
        return
    state.started = time.time()
    state.stats.status = "cloning"
    out = Path(cfg.output)
    ws_dir = out / "workspaces" / key
    traj_path = out / "trajectories" / f"{key}.traj.json"
    multi = {"attempt": attempt, "seed": state.seed} if cfg.attempts > 1 else {}
    traj = Trajectory(traj_path, instance_id=iid, **multi, run_id=cfg.run_name, model=cfg.model,
                      gateway=cfg.gateway, repo=row["repo"], base_commit=row["base_commit"])
    try:
        with ctx.lock:
            repo_lock = ctx.repo_locks.setdefault(row["repo"], threading.Lock())
        with repo_lock:
            mirror = ensure_mirror(row["repo"], cfg.repos_dir, commit=row["base_commit"])
        ws = make_workspace(mirror, row["base_commit"], ws_dir)
        diff_base = row["base_commit"]
        bash_env: dict[str, str] = {}
        python_note = None
        if cfg.task_env:
            state.stats.status = "env"
            bash_env, diff_base = _task_env(row, cfg, ctx.env_builder, mirror, ws, traj, key)
            python_note = ("In the shell, `python` is the task's own environment (the "
                           "repository installed in it), so you can run scripts and tests.")
        elif cfg.allow_exec and cfg.pick_python:
            state.stats.status = "python"
            bash_env, python_note = _pick_python(row, cfg, ctx.env_builder, ws.root, traj, key)
        seeds = _seeds(row, cfg, ws.root, traj)
    except (RepoError, EnvError, WorkspaceError) as e:
        state.exit_reason, state.message = "setup_error", str(e)
        state.stats.status = "setup_error"
        traj.data.update(exit_reason="setup_error", exit_message=str(e))
        traj.data["timings"]["ended_at"] = time.time()
        traj.save()
        state.ended = time.time()
        return
    protocol = get_protocol(cfg.protocol, allow_exec=cfg.allow_exec, tool_choice=cfg.tool_choice)
    headers = {"X-Fak-Conversation": f"{cfg.run_name}/{key}",
               "X-Fak-Workspace": str(ws.root), **protocol.headers()}
    sampling = dict(cfg.sampling)
    if state.seed is not None:
        sampling["seed"] = state.seed
    model = OpenAIChatModel(cfg.gateway, cfg.model, headers=headers, sampling=sampling,
                            timeout_s=cfg.model_timeout_s, max_retries=cfg.max_retries,
                            cancel=ctx.stop)
    with ctx.lock:
        ctx.models[key] = model
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
                                  seed=int(sampling.get("seed") or 0),
                                  verify_on_edit=cfg.verify_on_edit),
                      traj, stop=ctx.stop)
        agent.stats = state.stats
        data = agent.run(problem_statement=row.get("problem_statement", ""),
                         repo=row["repo"], workspace=str(ws.root), listing=root_listing(ws.root),
                         python_note=python_note, seed_locations=seeds)
        patch = ws.diff(diff_base)
        data["patch"] = patch
        data["info"]["difficulty"] = cfg.labels.get(iid)
        traj.save()
    finally:
        with ctx.lock:
            ctx.models.pop(key, None)
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
        state.patch = patch
    if not cfg.keep_workspaces:
        shutil.rmtree(ws_dir, ignore_errors=True)
        shutil.rmtree(out / "envs" / key, ignore_errors=True)


def _task_env(row: dict[str, Any], cfg: FleetConfig, builder: EnvBuilder, mirror: Path, ws: Any,
              traj: Trajectory, unit: str) -> tuple[dict[str, str], str]:
    """Build (or reuse) the (repo, version) env, layer a per-instance venv over it with the
    repository installed, and commit what the setup changed, as the harness's instance image
    does; ``unit`` (``unit_key``: ID, or ID.aK for attempt K) names the venv's folder.
    Returns (bash environment overrides, the commit to diff against)."""
    key = EnvBuilder.key(row["repo"], str(row["version"]))
    with builder.lock(key):
        env = builder.ensure(row["repo"], str(row["version"]), mirror,
                             row.get("environment_setup_commit") or row["base_commit"])
    envs = Path(cfg.output) / "envs"
    overlay = make_overlay(env, envs / unit, ws.root, envs / f"{unit}.install.log",
                           unsafe_no_sandbox=cfg.unsafe_no_sandbox)
    git(ws.root, "commit", "--quiet", "--allow-empty", "--no-verify", "-am", "fak: task setup")
    setup_commit = git(ws.root, "rev-parse", "HEAD").stdout.strip()
    traj.data["info"]["task_env"] = {"env": env.key, "overlay": str(overlay.path),
                                     "setup_commit": setup_commit,
                                     "unreproduced": overlay.unreproduced}
    environ = overlay.environ()
    return {"PATH": environ["PATH"], "VIRTUAL_ENV": environ["VIRTUAL_ENV"]}, setup_commit


def _pick_python(row: dict[str, Any], cfg: FleetConfig, builder: EnvBuilder, root: Path,
                 traj: Trajectory, unit: str) -> tuple[dict[str, str], str | None]:
    """Without ``task_env``: the interpreter bash runs and the note for the prompt
    (``interpreter.choose_python``), recorded under ``info.python``; its shims go under
    ``envs/<unit>/bin``."""
    choice = choose_python(root, row["repo"], str(row.get("version") or ""), builder,
                           unsafe_no_sandbox=cfg.unsafe_no_sandbox,
                           shim_dir=Path(cfg.output) / "envs" / unit / "bin")
    traj.data["info"]["python"] = {"label": choice.label, "bin": str(choice.bin_dir or ""),
                                   "version": choice.version, "imports": choice.imports,
                                   "tried": choice.tried}
    return choice.env_overrides, choice.note or None


def _seeds(row: dict[str, Any], cfg: FleetConfig, root: Path,
           traj: Trajectory) -> list[dict[str, Any]]:
    """Seed locations from ``cfg.localizer`` (none without one); a failing localizer is
    recorded and the agent starts without seeds."""
    if cfg.localizer is None:
        return []
    try:
        return list(cfg.localizer(public_row(row), root) or [])
    except Exception as e:  # noqa: BLE001 - a hint source must not stop the instance
        traj.data["info"]["localizer_error"] = f"{type(e).__name__}: {e}"
        return []
