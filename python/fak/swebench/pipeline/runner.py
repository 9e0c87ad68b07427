"""The pipeline over many instances: ``workers`` at once, a live table, ``predictions.json`` and
``summary.json`` in ``--output`` (the fleet's formats: ``fak swebench eval`` grades the
predictions as it grades the fleet's).

``predictions.json`` gets one entry per instance whose ``rank`` stage ran (or was reused) in
this run: the chosen patch (``""`` when there was no candidate); entries of other instances
already in the file are kept; the list is in dataset order (the same bytes for the same
results, whatever order the workers finish in). ``summary.json``: the run's settings, per instance its result,
per-stage seconds/requests/tokens (``reused`` when the artifact was current), candidate and
script counts, the chosen candidate; and totals per stage.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from fak.agent.trajectory import write_json_atomic
from fak.swebench.pipeline.artifacts import Store
from fak.swebench.pipeline.config import MODEL_STAGES, STAGES, PipelineConfig
from fak.swebench.pipeline.instance import InstanceState, process_instance
from fak.swebench.pipeline.sampler import Sampler
from fak.swebench.pipeline.task import task_view
from fak.terminal import markup_safe


def _load_json(path: Path, default: Any) -> Any:
    import json

    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return default


class PipelineRun:
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
        self._lock = threading.Lock()
        self.predictions: list[dict[str, Any]] = _load_json(self.out / "predictions.json", [])
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

    def _one(self, task: dict[str, Any]) -> None:
        iid = task["instance_id"]
        state = self.states[iid]
        if self.stop.is_set():
            state.result = state.status = "interrupted"
            return
        sampler = self._sampler(iid)
        try:
            process_instance(task, self.config, self.store, sampler, state, self._env_builder)
        finally:
            if sampler is not None:
                sampler.close()
        if self.stop.is_set() and state.result != "done":
            state.result = state.status = "interrupted"
        if state.patch is not None:
            self._record(iid, state.patch, state.model or self.config.model or "fak-pipeline")

    def _record(self, iid: str, patch: str, model: str) -> None:
        with self._lock:
            self.predictions = [p for p in self.predictions if p["instance_id"] != iid]
            self.predictions.append({"instance_id": iid, "model_name_or_path": model,
                                     "model_patch": patch})
            order = {t["instance_id"]: i for i, t in enumerate(self.tasks)}
            self.predictions.sort(key=lambda p: (order.get(p["instance_id"], len(order)),
                                                 p["instance_id"]))
            write_json_atomic(self.out / "predictions.json", self.predictions)
            self._write_summary(final=False)

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
                "n_selected": len(self.tasks), "n_predictions": len(self.predictions),
                "results": dict(sorted(by_result.items())), "stage_totals": totals,
                "wall_s": round(wall, 3), "instances": per}

    def _write_summary(self, final: bool) -> dict[str, Any]:
        summary = self.summary(final=final)
        write_json_atomic(self.out / "summary.json", summary)
        return summary

    def table(self) -> Table:
        t = Table(title=f"fak swebench run --agent pipeline · {self.run_id} · "
                        f"{self.config.model or '-'} · stages {','.join(self.config.stages)}")
        for col in ("instance", "status", "requests", "tokens", "candidates", "scripts kept",
                    "chosen"):
            t.add_column(col, justify="right" if col not in ("instance", "status", "chosen") else "left")
        for iid, st in self.states.items():
            if st.status == "waiting":
                continue
            c = st.counts
            style = {"done": "green", "interrupted": "magenta"}.get(st.status,
                                                                   "red" if "error" in st.status
                                                                   or "missing" in st.status else "")
            status = f"[{style}]{st.status}[/]" if style else st.status
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
        live_on = self.config.live if self.config.live is not None else self.console.is_terminal
        ex = cf.ThreadPoolExecutor(max_workers=max(1, self.config.workers),
                                   thread_name_prefix="fak-pipeline")
        futs = {ex.submit(self._one, t): t["instance_id"] for t in self.tasks}
        live = Live(self.table(), console=self.console, refresh_per_second=2) if live_on else None
        interrupted = False
        reported: set[str] = set()
        try:
            if live:
                live.start()
            pending = set(futs)
            while pending:
                done, pending = cf.wait(pending, timeout=0.5)
                for fut in done:
                    iid = futs[fut]
                    exc = fut.exception()
                    if exc is not None:
                        st = self.states[iid]
                        st.result, st.message = "error", f"{type(exc).__name__}: {exc}"
                    if not live and iid not in reported:
                        reported.add(iid)
                        self._print_line(iid)
                if live:
                    live.update(self.table())
        except KeyboardInterrupt:
            interrupted = True
            self.stop.set()
            for f in futs:
                f.cancel()
        finally:
            ex.shutdown(wait=True, cancel_futures=True)
            if live:
                live.update(self.table())
                live.stop()
        summary = self._write_summary(final=True)
        if interrupted:
            raise KeyboardInterrupt
        return summary

    def _print_line(self, iid: str) -> None:
        st = self.states[iid]
        c = st.counts
        stages = " ".join(s + ("(reused)" if d.get("reused") else f"={d.get('seconds', 0):.1f}s")
                          for s, d in st.stages.items())
        self.console.print(f"{markup_safe(iid)}: {st.result} {stages} candidates={c.get('candidates', '-')} "
                           f"kept-scripts={c.get('scripts_kept', '-')} chosen={c.get('chosen', '-')}"
                           + (f" ({markup_safe(st.message.splitlines()[0][:300])})" if st.result != "done"
                              and st.message else ""))
