"""One table of fleet runs (``fak swebench run --agent fleet`` output folders), for
``benches/results/`` and the issues' fleet measurements.

Per run, from its ``summary.json`` (written by ``fak.swebench.fleet``) and its trajectories:
agents (workers) and attempts, wall time, instances per hour, completion tokens per wall second
(all agents together) and per sequence (the server's decode timings), model turns, tool calls
the model made, repeated read-only calls the gateway served inline (``--serve-inline-reads``:
the pairs a response's fak metadata lists, recorded per step in the trajectory as
``inline_reads``), prompt and completion tokens, and how the agents ended.

Usage: ``python benches/fleet_report.py RUN_DIR [RUN_DIR ...] [--json OUT.json]``; a run folder
may carry a ``label`` file (one line) naming it in the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def trajectory_counts(run: Path) -> dict[str, int]:
    """Model turns, tool calls and inline-served reads over every trajectory of ``run``."""
    turns = calls = inline = files = 0
    for f in sorted((run / "trajectories").glob("*.traj.json")):
        t = json.loads(f.read_text())
        files += 1
        steps = t.get("steps") or []
        turns += len(steps)
        calls += sum(len(s.get("actions") or []) for s in steps)
        inline += int(t.get("n_inline_reads") or 0) or sum(len(s.get("inline_reads") or []) for s in steps)
    return {"trajectories": files, "turns": turns, "tool_calls": calls, "inline_reads": inline}


def report(run: Path) -> dict[str, Any]:
    """One row of the table for the run folder ``run``: its ``summary.json`` fields (seconds,
    instances per hour, tokens per second) and :func:`trajectory_counts`. Raises ``OSError`` /
    ``ValueError`` when the folder has no readable ``summary.json``."""
    s = json.loads((run / "summary.json").read_text())
    label_file = run / "label"
    tot = s.get("totals") or {}
    return {
        "run": label_file.read_text().strip() if label_file.exists() else run.name,
        "workers": s.get("workers"),
        "attempts": s.get("attempts", 1),
        "units": s.get("n_run"),
        "finished": s.get("n_finished"),
        "wall_s": s.get("wall_s"),
        "instances_per_hour": s.get("instances_per_hour"),
        "completion_tok_per_wall_s": s.get("completion_tok_per_wall_s"),
        "completion_tok_s_per_seq": s.get("completion_tok_s"),
        "prompt_tokens": tot.get("prompt_tokens"),
        "completion_tokens": tot.get("completion_tokens"),
        "exit_reasons": s.get("exit_reasons"),
        **trajectory_counts(run),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`report` as a Markdown table."""
    cols = [("run", "run"), ("workers", "agents at once"), ("attempts", "attempts"), ("finished", "finished"),
            ("wall_s", "wall s"), ("instances_per_hour", "inst/h"), ("completion_tok_per_wall_s", "completion tok/s"),
            ("completion_tok_s_per_seq", "tok/s per seq"), ("turns", "turns"), ("tool_calls", "tool calls"),
            ("inline_reads", "served inline"), ("prompt_tokens", "prompt tok"), ("completion_tokens", "completion tok")]
    out = ["| " + " | ".join(h for _, h in cols) + " | exit reasons |", "|" + "---|" * (len(cols) + 1)]
    for r in rows:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            cells.append(f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
        reasons = ", ".join(f"{k} {v}" for k, v in (r.get("exit_reasons") or {}).items())
        out.append("| " + " | ".join(cells) + f" | {reasons} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows = [report(r) for r in a.runs]
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
