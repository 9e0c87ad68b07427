"""What `fak report` reads from a run folder (``fak swebench run --output RUN_DIR``).

- ``summary.json``: the run (fleet: ``instances`` with exit reason, steps, tokens, times; pipeline:
  ``agent: "pipeline"``, ``instances`` with candidates, tests, the chosen patch, ``stage_totals``);
- ``predictions.json``: one patch per instance (the official harness's format);
- ``trajectories/ID.traj.json``: a fleet instance's conversation and steps (``fak-trajectory/1``,
  ``fak.agent.trajectory``);
- ``pipeline/ID/STAGE.jsonl``: a pipeline instance's artifacts (``fak.swebench.pipeline.artifacts``);
- ``audit.jsonl`` (here or one folder up): the policy's decisions and quarantine events;
- a grading report (``fak swebench eval --output DIR``: ``DIR/report.json`` with ``resolved_ids``):
  ``RUN_DIR/eval/report.json``, ``RUN_DIR/report.json`` or any ``RUN_DIR/*/report.json``, or given.

Every file is optional but one of ``summary.json``, ``trajectories/`` and ``pipeline/``; a file
that is not valid JSON is named in ``RunData.problems`` and left out, never fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RunFolderError(ValueError):
    """The folder is not a fak run (no summary.json, trajectories/ or pipeline/)."""


@dataclass
class Instance:
    """One row of the report's table and its page. Times in seconds; ``resolved`` None when
    there is no grading report (or it does not grade this instance)."""

    instance_id: str
    outcome: str  # fleet: exit reason; pipeline: result
    steps: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float | None = None
    model_s: float | None = None
    tools_s: float | None = None
    patch: str = ""
    resolved: bool | None = None
    grade_status: str | None = None
    message: str = ""
    denied: int = 0
    format_errors: int = 0
    summary: dict[str, Any] = field(default_factory=dict)
    trajectory: dict[str, Any] | None = None
    pipeline: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> {header, records}
    grade: dict[str, Any] = field(default_factory=dict)

    @property
    def patch_lines(self) -> int:
        """Added plus removed lines of the patch."""
        return sum(1 for ln in self.patch.splitlines()
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---")))


@dataclass
class RunData:
    """A run folder read whole: ``kind`` ``"fleet"`` or ``"pipeline"``."""

    path: Path
    kind: str
    summary: dict[str, Any]
    instances: list[Instance]
    grading: dict[str, Any] | None = None
    grading_path: Path | None = None
    audit: list[dict[str, Any]] = field(default_factory=list)
    health: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


def _json(path: Path, problems: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        problems.append(f"{path.name}: {exc}")
        return None


def _jsonl(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        problems.append(f"{path}: {exc}")
        return out
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            problems.append(f"{path.name} line {i}: not JSON")
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def find_grading(run_dir: Path) -> Path | None:
    """The grading report of ``run_dir``, where `fak swebench eval --output` is usually pointed."""
    for p in [run_dir / "eval" / "report.json", run_dir / "report.json",
              *sorted(run_dir.glob("*/report.json"))]:
        if p.is_file():
            try:
                data = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and "resolved_ids" in data:
                return p
    return None


def load_run(run_dir: str | Path, grading: str | Path | None = None) -> RunData:
    """Read the run folder ``run_dir`` (and the grading report ``grading``, else the one found
    beside it).

    Raises:
        RunFolderError: ``run_dir`` holds none of summary.json, trajectories/, pipeline/."""
    root = Path(run_dir)
    problems: list[str] = []
    has = [(root / n).exists() for n in ("summary.json", "trajectories", "pipeline")]
    if not root.is_dir() or not any(has):
        raise RunFolderError(f"{root} is not a fak run folder (no summary.json, trajectories/ or "
                             "pipeline/: the --output of fak swebench run)")
    summary = _json(root / "summary.json", problems) if has[0] else None
    summary = summary if isinstance(summary, dict) else {}
    kind = "pipeline" if summary.get("agent") == "pipeline" or (has[2] and not has[1]) else "fleet"
    preds_raw = _json(root / "predictions.json", problems) if (root / "predictions.json").exists() else None
    preds: dict[str, str] = {}
    if isinstance(preds_raw, list):
        preds = {p["instance_id"]: p.get("model_patch") or "" for p in preds_raw
                 if isinstance(p, dict) and "instance_id" in p}
    elif isinstance(preds_raw, dict):
        preds = {k: (v.get("model_patch") or "") for k, v in preds_raw.items() if isinstance(v, dict)}

    rows: dict[str, Instance] = {}
    for s in summary.get("instances") or []:
        if not isinstance(s, dict) or "instance_id" not in s:
            continue
        iid = str(s["instance_id"])
        rows[iid] = Instance(
            instance_id=iid, outcome=str(s.get("exit_reason") or s.get("result") or "?"),
            steps=s.get("steps"), prompt_tokens=int(s.get("prompt_tokens") or 0),
            completion_tokens=int(s.get("completion_tokens") or 0), wall_s=s.get("wall_s"),
            model_s=s.get("model_s"), tools_s=s.get("tools_s"), message=str(s.get("message") or ""),
            denied=int(s.get("denied") or 0), format_errors=int(s.get("format_errors") or 0),
            summary=s)
    tdir = root / "trajectories"
    if tdir.is_dir():
        for p in sorted(tdir.glob("*.traj.json")):
            t = _json(p, problems)
            if not isinstance(t, dict):
                continue
            iid = str(t.get("instance_id") or p.name[:-len(".traj.json")])
            key = p.name[:-len(".traj.json")]
            row = rows.get(key) or rows.get(iid)
            if row is None:
                tok = t.get("tokens") or {}
                tim = t.get("timings") or {}
                row = rows[key] = Instance(
                    instance_id=key, outcome=str(t.get("exit_reason") or "?"), steps=t.get("n_steps"),
                    prompt_tokens=int(tok.get("prompt") or 0),
                    completion_tokens=int(tok.get("completion") or 0), wall_s=tim.get("wall_s"),
                    model_s=tim.get("model_s"), tools_s=tim.get("tools_s"),
                    message=str(t.get("exit_message") or ""), denied=int(t.get("n_denied") or 0),
                    format_errors=int(t.get("n_format_errors") or 0))
            row.trajectory = t
            if not row.patch:
                row.patch = str(t.get("patch") or "")
    pdir = root / "pipeline"
    if pdir.is_dir():
        for d in sorted(x for x in pdir.iterdir() if x.is_dir() and x.name != "workspaces"):
            stages: dict[str, dict[str, Any]] = {}
            for f in sorted(d.glob("*.jsonl")):
                recs = _jsonl(f, problems)
                if recs and recs[0].get("kind") == "header":
                    stages[f.stem] = {"header": recs[0], "records": recs[1:]}
            if not stages:
                continue
            row = rows.get(d.name)
            if row is None:
                row = rows[d.name] = Instance(instance_id=d.name, outcome="?")
            row.pipeline = stages
            for st in stages.values():
                u = st["header"].get("usage") or {}
                if not row.summary.get("prompt_tokens"):
                    row.prompt_tokens += int(u.get("prompt_tokens") or 0)
                    row.completion_tokens += int(u.get("completion_tokens") or 0)
            chosen = [r for r in stages.get("rank", {}).get("records", []) if r.get("kind") == "chosen"]
            if chosen and not row.patch:
                row.patch = str(chosen[0].get("diff") or "")
    for iid, patch in preds.items():
        row = rows.get(iid)
        if row is None:
            row = rows[iid] = Instance(instance_id=iid, outcome="?")
        if patch:
            row.patch = patch

    gpath = Path(grading) if grading is not None else find_grading(root)
    gdata = _json(gpath, problems) if gpath is not None else None
    gdata = gdata if isinstance(gdata, dict) else None
    if gdata is not None:
        resolved = set(gdata.get("resolved_ids") or [])
        graded = (set(gdata.get("completed_ids") or []) | set(gdata.get("empty_patch_ids") or [])
                  | set(gdata.get("error_ids") or []) | resolved)
        per = gdata.get("instances") or {}
        for iid, row in rows.items():
            if iid in graded or iid in per:
                row.resolved = iid in resolved
                g = per.get(iid) if isinstance(per, dict) else None
                row.grade = g if isinstance(g, dict) else {}
                row.grade_status = str(row.grade.get("status") or ("resolved" if row.resolved else
                                                                   "unresolved"))
    audit: list[dict[str, Any]] = []
    for a in (root / "audit.jsonl", root.parent / "audit.jsonl"):
        if a.is_file():
            audit = _jsonl(a, problems)
            break
    health = None
    for h in (root / "health.json", root.parent / "health.json"):
        if h.is_file():
            hd = _json(h, problems)
            health = hd if isinstance(hd, dict) else None
            break
    return RunData(path=root, kind=kind, summary=summary,
                   instances=sorted(rows.values(), key=lambda r: r.instance_id),
                   grading=gdata, grading_path=gpath if gdata is not None else None,
                   audit=audit, health=health, problems=problems)
