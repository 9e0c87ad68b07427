"""One instance through the requested stages (the pipeline's ``process_instance``).

For each stage in order: the artifacts it reads must be *current* (each artifact's header names
the ``content_digest`` of the artifacts it was made from; one made from an older upstream is
stale and is not used); a finished stage whose ``input_digest`` (configuration + inputs) is
unchanged is reused, a requested one that is missing or stale is run, and a stage that is not
requested is only read. See ``artifacts.py`` for the files.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fak.swebench.pipeline import testing
from fak.swebench.pipeline.artifacts import Artifact, Store, digest
from fak.swebench.pipeline.choose import choose
from fak.swebench.pipeline.config import INPUTS, MODEL_STAGES, STAGES, PipelineConfig
from fak.swebench.pipeline.locate import locate
from fak.swebench.pipeline.rank import rank
from fak.swebench.pipeline.repair import repair
from fak.swebench.pipeline.reproduce import reproduce
from fak.swebench.pipeline.sampler import Sampler, SamplerError, Usage
from fak.swebench.pipeline.source import Repo
from fak.swebench.pipeline.task import issue_text


class StageInputError(RuntimeError):
    """A stage's input artifact is missing or stale; the message says which stage to run."""


@dataclass
class InstanceState:
    """Live state of one instance (read by the table; one writer: the instance's thread)."""

    instance_id: str
    status: str = "waiting"
    stage: str = ""
    usage: Usage = field(default_factory=Usage)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    result: str | None = None
    message: str = ""
    started: float = 0.0
    ended: float = 0.0
    counts: dict[str, Any] = field(default_factory=dict)
    patch: str | None = None
    model: str | None = None


def _current(store: Store, iid: str) -> dict[str, Artifact]:
    """The artifacts of ``iid`` that are consistent with their upstream artifacts."""
    current: dict[str, Artifact] = {}
    for stage in STAGES:
        art = store.load(iid, stage)
        if art is None:
            continue
        made_from = art.header.get("inputs") or {}
        ok = True
        for up, _ in INPUTS[stage]:
            want = made_from.get(up)
            have = current[up].content_digest if up in current else None
            if want != have:
                ok = False
                break
        if ok:
            current[stage] = art
    return current


def _counts(current: dict[str, Artifact]) -> dict[str, Any]:
    c: dict[str, Any] = {}
    if "choose" in current:
        c["locations"] = len(current["choose"].of_kind("location"))
    if "repair" in current:
        c["samples"] = len(current["repair"].of_kind("sample"))
        c["candidates"] = len(current["repair"].of_kind("candidate"))
    if "reproduce" in current:
        c["scripts"] = len(current["reproduce"].of_kind("script"))
    if "test" in current:
        c["scripts_kept"] = sum(1 for r in current["test"].of_kind("script_base") if r["kept"])
        c["tested"] = len(current["test"].of_kind("candidate_test"))
        for sched in current["test"].of_kind("schedule")[:1]:  # the bounds (issue 31)
            why: dict[str, int] = {}
            for cut in sched.get("cut", []):
                why[cut["why"]] = why.get(cut["why"], 0) + 1
            c.update(test_runs=sched.get("runs", 0), test_cut=len(sched.get("cut", [])),
                     test_cut_why=why, test_wall_s=sched.get("wall_s"),
                     test_env_errors=len(sched.get("env_errors", [])))
    if "rank" in current:
        chosen = current["rank"].of_kind("chosen")[0]
        ranked = {r["id"]: r for r in current["rank"].of_kind("ranked")}
        c["chosen"] = chosen["id"]
        if chosen["id"] in ranked:
            r = ranked[chosen["id"]]
            c.update(chosen_votes=r["votes"], chosen_repro_fixed=r["repro_fixed"],
                     chosen_regression_failures=r["regression_failures"])
        for sel in current["rank"].of_kind("selection")[:1]:  # selection by behaviour (issue 31)
            c.update(clusters=sel["clusters"], cluster_sizes=sel["cluster_sizes"],
                     script_weights={s["script"]: s["weight"] for s in sel["scripts"]},
                     chosen_cluster=sel["chosen_cluster"], chosen_reason=sel["reason"],
                     runner_up=sel["runner_up"])
    return c


def process_instance(task: dict[str, Any], cfg: PipelineConfig, store: Store,
                     sampler: Sampler | None, state: InstanceState, env_builder: Any = None) -> None:
    """Run the requested stages of one instance (``task``: ``task.task_view`` of its row);
    results go to ``store`` and ``state`` (``result``: ``done`` | ``setup_error`` |
    ``model_error`` | ``missing_input`` | ``error``; ``patch``: the chosen patch when ``rank``
    ran or was reused)."""
    from fak.swebench.repos import RepoError, ensure_mirror

    iid = task["instance_id"]
    state.started = time.time()
    state.status = "starting"
    issue = issue_text(task, cfg.issue_chars)
    current = _current(store, iid)
    mirror: Path | None = None
    try:
        for stage in STAGES:
            if stage not in cfg.stages:
                continue
            state.stage = stage
            inputs: dict[str, str | None] = {}
            for up, required in INPUTS[stage]:
                if up in current:
                    inputs[up] = current[up].content_digest
                elif required:
                    raise StageInputError(f"stage {stage} needs a current {up} artifact in "
                                          f"{store.path(iid, up)}; run --stages {up}")
                else:
                    inputs[up] = None
            input_digest = digest({"stage": stage, "config": cfg.stage_config(stage),
                                   "inputs": inputs})
            old = current.get(stage)
            if old is not None and old.header.get("input_digest") == input_digest:
                state.stages[stage] = {"reused": True, "seconds": 0.0}
                continue
            if stage in MODEL_STAGES and sampler is None:
                raise StageInputError(f"stage {stage} asks the model: give --gguf or --gateway")
            if mirror is None and stage in ("locate", "choose", "repair", "reproduce", "test"):
                state.status = "mirror"
                mirror = ensure_mirror(task["repo"], cfg.repos_dir, commit=task["base_commit"])
            state.status = stage
            usage = Usage()
            t0 = time.perf_counter()
            records = _run_stage(stage, task, issue, cfg, current, mirror, sampler, usage,
                                 env_builder, store)
            seconds = round(time.perf_counter() - t0, 3)
            header = {"input_digest": input_digest, "inputs": inputs,
                      "config": cfg.stage_config(stage), "usage": usage.to_json(),
                      "seconds": seconds,
                      "model": cfg.model if stage in MODEL_STAGES else None}
            current[stage] = store.write(iid, stage, header, records)
            state.stages[stage] = {"reused": False, "seconds": seconds, **usage.to_json()}
            for k in ("requests", "prompt_tokens", "completion_tokens"):
                setattr(state.usage, k, getattr(state.usage, k) + getattr(usage, k))
            state.counts = _counts(current)
            # a later stage reads this one: drop artifacts made from the old version
            current = {s: a for s, a in _current(store, iid).items()}
        state.result = "done"
    except RepoError as e:
        state.result, state.message = "setup_error", str(e)
    except SamplerError as e:
        state.result, state.message = "model_error", str(e)
    except StageInputError as e:
        state.result, state.message = "missing_input", str(e)
    except Exception as e:  # noqa: BLE001 - recorded; the other instances go on
        state.result = "error"
        state.message = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
    finally:
        state.counts = _counts(current)
        if "rank" in cfg.stages and "rank" in current and state.result == "done":
            state.patch = current["rank"].of_kind("chosen")[0]["diff"]
            repair_art = current.get("repair")
            state.model = (repair_art.header.get("model") if repair_art else None) or cfg.model
        state.status = state.result or "error"
        state.ended = time.time()


def _run_stage(stage: str, task: dict[str, Any], issue: str, cfg: PipelineConfig,
               current: dict[str, Artifact], mirror: Path | None, sampler: Sampler | None,
               usage: Usage, env_builder: Any, store: Store) -> list[dict[str, Any]]:
    iid = task["instance_id"]
    repo = Repo(mirror, task["base_commit"]) if mirror is not None else None
    if stage == "locate":
        found = locate(repo, issue, cfg.locate)
        return ([{"kind": "clues", **found["clues"], "n_source_files": found["n_source_files"]}]
                + [{"kind": "file", "rank": i, **f} for i, f in enumerate(found["files"])])
    if stage == "choose":
        located = {"files": [{k: v for k, v in r.items() if k not in ("kind", "rank")}
                             for r in current["locate"].of_kind("file")]}
        return choose(repo, issue, task, located, sampler, cfg.choose, usage, iid)
    locations = current["choose"].of_kind("location") if "choose" in current else []
    if stage == "repair":
        return repair(repo, issue, task, locations, sampler, cfg.repair, usage, iid)
    if stage == "reproduce":
        return reproduce(repo, issue, task, locations, sampler, cfg.reproduce, usage, iid)
    candidates = current["repair"].of_kind("candidate")
    if stage == "test":
        if not candidates:
            return [{"kind": "env", "mode": "skipped", "why": "no candidate to test"}]
        scripts = current["reproduce"].of_kind("script") if "reproduce" in current else []
        work = Path(cfg.output) / "workspaces" / iid
        tenv = testing.prepare(task, mirror, work, task_env=cfg.task_env,
                               env_builder=env_builder, unsafe_no_sandbox=cfg.unsafe_no_sandbox)
        try:
            return testing.test_stage(repo, task, candidates, scripts, tenv, cfg.test)
        finally:
            if not cfg.keep_workspaces:
                testing.cleanup(work)
    if stage == "rank":
        tests = current["test"].records if "test" in current else None
        return rank(candidates, tests, cfg.rank.method)
    raise ValueError(f"unknown stage {stage}")
