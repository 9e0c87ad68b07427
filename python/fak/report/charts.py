"""The report's plots, drawn by matplotlib as inline SVG (text kept as text, no external file).

Each function takes the run's instances and returns one ``<svg>`` element as a string, or None
when the run did not record what the plot needs. matplotlib's object API (``Figure``) is used,
not pyplot: no global state, no GUI backend.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from fak.report.load import Instance

OUTCOME_COLORS = {"submitted": "#2e7d32", "done": "#2e7d32", "resolved": "#1b5e20",
                  "max_steps": "#f9a825", "context_limit": "#ef6c00", "error": "#c62828",
                  "setup_error": "#8e24aa", "format_error": "#c62828"}
BLUE, ORANGE, GREY, PURPLE = "#1565c0", "#ef6c00", "#9e9e9e", "#6a1b9a"


def _figure(n_rows: int, width: float = 7.5, per_row: float = 0.24, min_h: float = 2.2) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, max(min_h, 0.9 + per_row * n_rows)), layout="constrained")
    return fig


def _svg(fig: Any, salt: str) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _style(ax: Any) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=8)


def _names(instances: Sequence[Instance]) -> list[str]:
    return [i.instance_id for i in instances]


def tokens_per_instance(instances: Sequence[Instance]) -> str | None:
    """Prompt and completion tokens per instance (two panels: their scales differ ~100×)."""
    if not instances or not any(i.prompt_tokens or i.completion_tokens for i in instances):
        return None
    fig = _figure(len(instances), width=8.5)
    a, b = fig.subplots(1, 2, sharey=True)
    y = range(len(instances))
    a.barh(y, [i.prompt_tokens for i in instances], color=BLUE)
    b.barh(y, [i.completion_tokens for i in instances], color=ORANGE)
    a.set_yticks(list(y), _names(instances))
    a.invert_yaxis()
    a.set_title("prompt tokens", fontsize=9)
    b.set_title("completion tokens", fontsize=9)
    for ax in (a, b):
        _style(ax)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
    return _svg(fig, "tokens")


def time_per_instance(instances: Sequence[Instance]) -> str | None:
    """Wall time per instance, split into the model's time, the tools' time and the rest."""
    rows = [i for i in instances if i.wall_s is not None]
    if not rows:
        return None
    fig = _figure(len(rows))
    ax = fig.subplots()
    y = list(range(len(rows)))
    model = [float(i.model_s or 0) for i in rows]
    tools = [float(i.tools_s or 0) for i in rows]
    rest = [max(0.0, float(i.wall_s or 0) - m - t) for i, m, t in zip(rows, model, tools)]
    if any(model) or any(tools):
        ax.barh(y, model, color=BLUE, label="model")
        ax.barh(y, tools, left=model, color=ORANGE, label="tools")
        ax.barh(y, rest, left=[m + t for m, t in zip(model, tools)], color=GREY, label="other")
        ax.legend(fontsize=8, frameon=False, loc="lower right")
    else:
        ax.barh(y, [float(i.wall_s or 0) for i in rows], color=BLUE)
    ax.set_yticks(y, _names(rows))
    ax.invert_yaxis()
    ax.set_xlabel("seconds", fontsize=8)
    _style(ax)
    return _svg(fig, "time")


def steps_per_instance(instances: Sequence[Instance]) -> str | None:
    """Steps each instance took, coloured by how it ended (steps to submit, when it submitted)."""
    rows = [i for i in instances if i.steps is not None]
    if not rows:
        return None
    fig = _figure(len(rows))
    ax = fig.subplots()
    y = list(range(len(rows)))
    colors = [OUTCOME_COLORS.get(i.outcome, PURPLE) for i in rows]
    ax.barh(y, [int(i.steps or 0) for i in rows], color=colors)
    ax.set_yticks(y, _names(rows))
    ax.invert_yaxis()
    ax.set_xlabel("steps", fontsize=8)
    from matplotlib.patches import Patch

    seen = sorted({i.outcome for i in rows})
    ax.legend(handles=[Patch(color=OUTCOME_COLORS.get(o, PURPLE), label=o) for o in seen],
              fontsize=8, frameon=False, loc="lower right")
    _style(ax)
    return _svg(fig, "steps")


def step_events(instances: Sequence[Instance]) -> list[tuple[float, float, int, int, int | None]]:
    """Every model turn of the run's trajectories as ``(start, end, prompt_tokens,
    completion_tokens, cached_tokens | None)``, times in unix seconds, sorted by end."""
    out = []
    for inst in instances:
        for s in (inst.trajectory or {}).get("steps") or []:
            start = s.get("started_at")
            lat = s.get("model_latency_s")
            u = s.get("usage") or {}
            if not isinstance(start, (int, float)) or not isinstance(lat, (int, float)):
                continue
            cached = u.get("cached_tokens")
            out.append((float(start), float(start) + float(lat), int(u.get("prompt_tokens") or 0),
                        int(u.get("completion_tokens") or 0),
                        int(cached) if isinstance(cached, int) else None))
    return sorted(out, key=lambda e: e[1])


def throughput_over_run(instances: Sequence[Instance], bins: int = 30) -> str | None:
    """The engine's throughput over the run as its clients saw it: completion and prompt tokens
    per second, summed over all agents per time bin (a turn's tokens counted when it ended); with
    a second panel of the prefix-cache hit rate (cached / prompt tokens) when the run recorded
    ``cached_tokens``."""
    ev = step_events(instances)
    if len(ev) < 2:
        return None
    t0 = min(e[0] for e in ev)
    t1 = max(e[1] for e in ev)
    span = max(t1 - t0, 1e-6)
    width = span / bins
    comp = [0.0] * bins
    prompt = [0.0] * bins
    hit, query = [0] * bins, [0] * bins
    have_cached = any(e[4] is not None for e in ev)
    for _s, end, p, c, cached in ev:
        k = min(bins - 1, int((end - t0) / width))
        comp[k] += c
        prompt[k] += p
        if cached is not None:
            hit[k] += cached
            query[k] += p
    x = [(k + 0.5) * width for k in range(bins)]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 4.2 if have_cached else 2.8), layout="constrained")
    axes = fig.subplots(2 if have_cached else 1, 1, sharex=True, squeeze=False)[:, 0]
    ax = axes[0]
    ax.plot(x, [c / width for c in comp], color=ORANGE, marker=".", label="completion tok/s")
    ax.set_ylabel("completion tok/s", fontsize=8, color=ORANGE)
    ax2 = ax.twinx()
    ax2.plot(x, [p / width for p in prompt], color=BLUE, marker=".", label="prompt tok/s")
    ax2.set_ylabel("prompt tok/s", fontsize=8, color=BLUE)
    ax2.tick_params(labelsize=8)
    ax2.spines[["top"]].set_visible(False)
    _style(ax)
    ax.grid(axis="y", color="#e0e0e0", linewidth=0.6)
    if have_cached:
        hx = [xx for xx, q in zip(x, query) if q]
        hy = [100.0 * h / q for h, q in zip(hit, query) if q]
        axes[1].plot(hx, hy, color=PURPLE, marker=".")
        axes[1].set_ylim(0, 100)
        axes[1].set_ylabel("prefix-cache hits %", fontsize=8)
        _style(axes[1])
        axes[1].grid(axis="y", color="#e0e0e0", linewidth=0.6)
    axes[-1].set_xlabel("seconds since the run's first request", fontsize=8)
    return _svg(fig, "throughput")


def pipeline_candidates(instances: Sequence[Instance]) -> str | None:
    """Per pipeline instance: candidate patches (clusters of identical diffs), those tested, and
    the reproduction scripts kept."""
    rows = [i for i in instances if i.pipeline]
    if not rows:
        return None
    fig = _figure(len(rows), per_row=0.36)
    ax = fig.subplots()
    y = list(range(len(rows)))
    h = 0.27
    cand = [sum(1 for r in i.pipeline.get("repair", {}).get("records", []) if r.get("kind") == "candidate")
            for i in rows]
    tested = [sum(1 for r in i.pipeline.get("test", {}).get("records", [])
                  if r.get("kind") == "candidate_test") for i in rows]
    kept = [sum(1 for r in i.pipeline.get("test", {}).get("records", [])
                if r.get("kind") == "script_base" and r.get("kept")) for i in rows]
    ax.barh([v - h for v in y], cand, height=h, color=BLUE, label="candidates")
    ax.barh(y, tested, height=h, color=ORANGE, label="tested")
    ax.barh([v + h for v in y], kept, height=h, color=PURPLE, label="repro scripts kept")
    ax.set_yticks(y, _names(rows))
    ax.invert_yaxis()
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    _style(ax)
    return _svg(fig, "candidates")


def pipeline_stage_seconds(instances: Sequence[Instance]) -> str | None:
    """Seconds per pipeline stage per instance, stacked (from each stage artifact's header)."""
    rows = [i for i in instances if i.pipeline]
    if not rows:
        return None
    stages = ["locate", "choose", "repair", "reproduce", "test", "rank"]
    colors = ["#90caf9", "#42a5f5", BLUE, "#ffb74d", ORANGE, GREY]
    fig = _figure(len(rows))
    ax = fig.subplots()
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for st, col in zip(stages, colors):
        vals = [float(i.pipeline.get(st, {}).get("header", {}).get("seconds") or 0) for i in rows]
        if any(vals):
            ax.barh(y, vals, left=left, color=col, label=st)
            left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(y, _names(rows))
    ax.invert_yaxis()
    ax.set_xlabel("seconds", fontsize=8)
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    _style(ax)
    return _svg(fig, "stages")
