"""The pipeline over many instances: ``workers`` at once, a live table, ``predictions.json`` and
``summary.json`` in ``--output`` (the fleet's formats: ``fak swebench eval`` grades the
predictions as it grades the fleet's). ``PipelineRun`` is a job of ``fak.swebench.driver``
(threads, live table, Ctrl-C, the two files); each instance is ``instance.process_instance``.

``predictions.json`` gets one entry per instance whose ``rank`` stage ran (or was reused) in
this run: the chosen patch (``""`` when there was no candidate); entries of other instances
already in the file are kept; the list is in dataset order (the same bytes for the same
results, whatever order the workers finish in). ``summary.json``: the run's settings, per instance its result,
per-stage seconds/requests/tokens (``reused`` when the artifact was current), candidate and
script counts, the test stage's runs, cuts (``test_cut``, ``test_cut_why``: count per reason),
runs that could not start (``test_env_errors``: no evidence) and wall seconds, the chosen
candidate; and totals per stage.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fak.swebench.driver import Driver, Job, Results, ThreadPool, Unit, new_table, status_markup
from fak.swebench.pipeline.artifacts import Store
from fak.swebench.pipeline.config import MODEL_STAGES, STAGES, PipelineConfig
from fak.swebench.pipeline.instance import InstanceState, process_instance
from fak.swebench.pipeline.sampler import Sampler
from fak.swebench.pipeline.task import task_view
from fak.terminal import markup_safe


#: colours of the live table's status column (other statuses with "error" or "missing" in red)
STATUS_STYLES = {"done": "green", "interrupted": "magenta"}


class PipelineRun(Job):
    """Runs ``rows`` (dataset rows; only ``task_view`` of each is used) with ``config``."""

    def __init__(self, config: PipelineConfig, rows: list[dict[str, Any]],
                 console: Console | None = None):
        self.config = config
        self.tasks = [task_view(r, hints=config.hints) for r in rows]
        self.console = console or Console(stderr=True)
        self.out = Path(config.output)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = Store(self.out / "pipeline")
        self.run_id = config.run_id or self.out.resolve().name
        self.states = {t["instance_id"]: InstanceState(t["instance_id"]) for t in self.tasks}
        self.stop = threading.Event()
        # predictions in dataset order: the same bytes for the same results
        self.results = Results(self.out, self.summary, order=[t["instance_id"] for t in self.tasks])
        self.started_at = time.time()
        self._env_builder = None
        if "test" in config.stages and config.task_env:
            from fak.swebench.envs import EnvBuilder

            self._env_builder = EnvBuilder(config.envs_dir)

    def _sampler(self, iid: str) -> Sampler | None:
        cfg = self.config
        if cfg.gateway is None or not (set(cfg.stages) & MODEL_STAGES):
            return None
        return Sampler(cfg.gateway, cfg.model or "default", template=cfg.template,
                       headers={"X-Fak-Conversation": f"{self.run_id}/{iid}"},
                       concurrency=cfg.concurrency, cancel=self.stop)

    def _one(self, task: dict[str, Any]) -> InstanceState:
        iid = task["instance_id"]
        state = self.states[iid]
        if self.stop.is_set():
            state.result = state.status = "interrupted"
            return state
        sampler = self._sampler(iid)
        try:
            process_instance(task, self.config, self.store, sampler, state, self._env_builder)
        finally:
            if sampler is not None:
                sampler.close()
        if self.stop.is_set() and state.result != "done":
            state.result = state.status = "interrupted"
        return state

    # -- the driver's job ----------------------------------------------------------------------

    def units(self) -> list[Unit]:
        return [Unit(t["instance_id"], self._one, (t,)) for t in self.tasks]

    def done(self, key: str, state: InstanceState) -> None:
        if state.patch is not None:
            self.results.record(key, state.model or self.config.model or "fak-pipeline", state.patch)

    def failed(self, key: str, exc: BaseException) -> None:
        st = self.states[key]
        st.result, st.message = "error", f"{type(exc).__name__}: {exc}"

    # -- reporting -----------------------------------------------------------------------------

    def summary(self, final: bool = True) -> dict[str, Any]:
        per = []
        by_result: dict[str, int] = {}
        totals: dict[str, dict[str, float]] = {s: {"seconds": 0.0, "requests": 0, "prompt_tokens": 0,
                                                   "completion_tokens": 0, "ran": 0, "reused": 0}
                                               for s in STAGES}
        for iid, st in self.states.items():
            result = st.result or ("interrupted" if final else st.status)
            by_result[result] = by_result.get(result, 0) + 1
            for s, d in st.stages.items():
                t = totals[s]
                t["reused" if d.get("reused") else "ran"] += 1
                for k in ("seconds", "requests", "prompt_tokens", "completion_tokens"):
                    t[k] += d.get(k, 0) or 0
            per.append({"instance_id": iid, "result": result, "message": st.message[:2000],
                        "stages": st.stages, **st.counts,
                        "patch_bytes": len(st.patch.encode("utf-8", "surrogateescape"))
                        if st.patch is not None else None,
                        "wall_s": round((st.ended or time.time()) - st.started, 3) if st.started else 0.0})
        for t in totals.values():
            t["seconds"] = round(t["seconds"], 3)
        wall = time.time() - self.started_at
        return {"agent": "pipeline", "run_id": self.run_id, "final": final,
                "interrupted": self.stop.is_set(), "config": self.config.to_json(),
                "n_selected": len(self.tasks), "n_predictions": len(self.results.predictions),
                "results": dict(sorted(by_result.items())), "stage_totals": totals,
                "wall_s": round(wall, 3), "instances": per}

    def table(self) -> Table:
        t = new_table(f"fak swebench run --agent pipeline · {self.run_id} · "
                      f"{self.config.model or '-'} · stages {','.join(self.config.stages)}",
                      ("instance", "status", "requests", "tokens", "candidates", "scripts kept",
                       "chosen"), right=("requests", "tokens", "candidates", "scripts kept"))
        for iid, st in self.states.items():
            if st.status == "waiting":
                continue
            c = st.counts
            status = status_markup(st.status, STATUS_STYLES, red=("error", "missing"))
            t.add_row(markup_safe(iid, newlines=False), status, str(st.usage.requests),
                      str(st.usage.prompt_tokens + st.usage.completion_tokens),
                      str(c.get("candidates", "")), str(c.get("scripts_kept", "")),
                      str(c.get("chosen") or ""))
        n_done = sum(1 for s in self.states.values() if s.result)
        t.add_section()
        t.add_row(f"total {n_done}/{len(self.states)} done", f"{time.time() - self.started_at:.0f} s",
                  str(sum(s.usage.requests for s in self.states.values())),
                  str(sum(s.usage.prompt_tokens + s.usage.completion_tokens
                          for s in self.states.values())), "", "", "")
        return t

    def run(self) -> dict[str, Any]:
        """Run every instance; returns the final summary. Raises ``KeyboardInterrupt`` after a
        clean stop (finished artifacts kept, summary written)."""
        return Driver(self, ThreadPool("fak-pipeline"), workers=self.config.workers,
                      console=self.console, live=self.config.live,
                      stopping="running instances stop at their next model request").run()

    def line(self, key: str) -> str:
        st = self.states[key]
        c = st.counts
        stages = " ".join(s + ("(reused)" if d.get("reused") else f"={d.get('seconds', 0):.1f}s")
                          for s, d in st.stages.items())
        cut = ""
        if "test_cut" in c:  # the test stage's runs, and those its bounds cut (and why)
            why = ", ".join(f"{k} {n}" for k, n in sorted(c["test_cut_why"].items()))
            cut = f" test-runs={c['test_runs']} cut={c['test_cut']}" + (f" ({why})" if why else "")
            if c.get("test_env_errors"):  # runs that could not start: no evidence (issue 31)
                cut += f" env-errors={c['test_env_errors']}"
        return (f"{markup_safe(key)}: {st.result} {stages} candidates={c.get('candidates', '-')} "
                f"kept-scripts={c.get('scripts_kept', '-')}{cut} chosen={c.get('chosen', '-')}"
                + (f" ({markup_safe(st.message.splitlines()[0][:300])})" if st.result != "done"
                   and st.message else ""))
