"""`fak report RUN_DIR` → one self-contained ``report.html``: no server, no network (a
Content-Security-Policy that allows nothing from outside), works from a ``file://`` URL.

The page: the run's summary (resolved / submitted / errors, the grading report when there is
one), plots (matplotlib SVG, ``fak.report.charts``), a sortable table of instances, and one page
per instance (a ``#i-ID`` fragment: the trajectory with the policy's verdicts, observations and
quarantine decisions, or the pipeline's stages, and the patch as a coloured diff). HTML comes from
the jinja2 templates in ``fak/report/templates/`` with autoescaping on: everything a model or a
workspace wrote is escaped.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from fak.report import charts
from fak.report.load import Instance, RunData, load_run

TEMPLATES = Path(__file__).with_name("templates")
MAX_OUTPUT_CHARS = 6000  # per observation shown; the rest is cut with a note


def _env() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.ChainableUndefined)  # run files vary: a missing field renders empty
    env.filters["slug"] = slug
    env.filters["num"] = _num
    env.filters["secs"] = _secs
    env.filters["diff"] = diff_html
    env.filters["cut"] = _cut
    env.filters["pretty"] = _pretty
    return env


def slug(text: str) -> str:
    """``text`` as a fragment id: letters, digits, ``-``, ``_`` and ``.`` kept, others ``-``."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", str(text))


def _num(n: Any) -> str:
    return f"{n:,}" if isinstance(n, int) else ("" if n is None else str(n))


def _secs(s: Any) -> str:
    if not isinstance(s, (int, float)):
        return ""
    return f"{s:,.1f} s" if s < 120 else f"{s / 60:,.1f} min"


def _cut(text: Any, n: int = MAX_OUTPUT_CHARS) -> str:
    t = "" if text is None else str(text)
    return t if len(t) <= n else t[:n] + f"\n… [{len(t) - n:,} more characters not shown]"


def _pretty(obj: Any) -> str:
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except ValueError:
            return obj
    return json.dumps(obj, indent=1, ensure_ascii=False)


def diff_html(patch: str) -> Any:
    """The unified diff ``patch`` as HTML coloured by pygments' diff lexer (escaped, classes
    styled by the page's stylesheet)."""
    import markupsafe
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import DiffLexer

    if not patch:
        return markupsafe.Markup('<p class="muted">no patch</p>')
    return markupsafe.Markup(highlight(patch, DiffLexer(), HtmlFormatter(cssclass="diff")))


def _diff_css() -> str:
    from pygments.formatters import HtmlFormatter

    return str(HtmlFormatter(style="default").get_style_defs(".diff"))


def _quarantine(run: RunData) -> dict[str, dict[str, Any]]:
    """Quarantine events of the audit log by tool_call_id."""
    out = {}
    for ev in run.audit:
        if ev.get("event") == "quarantine" and ev.get("tool_call_id"):
            out[str(ev["tool_call_id"])] = ev
    return out


def _steps(inst: Instance, quarantine: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The trajectory's steps as the template shows them."""
    out = []
    for s in (inst.trajectory or {}).get("steps") or []:
        resp = s.get("response") or {}
        actions = []
        for a in s.get("actions") or []:
            v = a.get("verdict") or {}
            q = quarantine.get(str(a.get("id") or ""))
            actions.append({
                "name": a.get("name") or "?", "arguments": a.get("arguments"),
                "denied": bool(a.get("denied")), "verdict_reason": v.get("reason") or "",
                "rule": v.get("rule") or "", "executed": a.get("executed"), "ok": a.get("ok"),
                "repeated": bool(a.get("repeated")), "output": a.get("output"),
                "returncode": a.get("returncode"), "duration_s": a.get("duration_s"),
                "quarantine": q})
        out.append({"n": s.get("step"), "latency": s.get("model_latency_s"),
                    "usage": s.get("usage") or {}, "finish": s.get("finish_reason"),
                    "format_error": s.get("format_error"), "text": resp.get("content") or "",
                    "reasoning": resp.get("reasoning_content") or "",
                    "actions": actions, "repeat_of": s.get("repeat_of_step")})
    return out


def _pipeline(inst: Instance) -> dict[str, Any]:
    """The pipeline's stages of one instance, reduced to what a person looks at."""
    st = inst.pipeline
    recs = {k: v.get("records", []) for k, v in st.items()}
    cands = [r for r in recs.get("repair", []) if r.get("kind") == "candidate"]
    tests = {r.get("id"): r for r in recs.get("test", []) if r.get("kind") == "candidate_test"}
    ranked = [r for r in recs.get("rank", []) if r.get("kind") == "ranked"]
    chosen = next((r for r in recs.get("rank", []) if r.get("kind") == "chosen"), None)
    chosen_rank = next((r for r in ranked if chosen and r.get("id") == chosen.get("id")), None)
    return {
        "stages": [{"name": k, "seconds": v["header"].get("seconds"),
                    "usage": v["header"].get("usage") or {}, "n": len(v.get("records", []))}
                   for k, v in st.items()],
        "files": [r for r in recs.get("locate", []) if r.get("kind") == "file"][:8],
        "locations": [r for r in recs.get("choose", []) if r.get("kind") == "location"],
        "candidates": sorted(cands, key=lambda r: -int(r.get("votes") or 0)),
        "tests": tests,
        "scripts": [r for r in recs.get("test", []) if r.get("kind") == "script_base"],
        "regression": [r for r in recs.get("test", []) if r.get("kind") == "regression_base"],
        "env": next((r for r in recs.get("test", []) if r.get("kind") == "env"), None),
        "schedule": next((r for r in recs.get("test", []) if r.get("kind") == "schedule"), None),
        "ranked": ranked,
        "chosen": chosen,
        "chosen_rank": chosen_rank,
    }


def _headline(run: RunData) -> dict[str, Any]:
    s = run.summary
    insts = run.instances
    submitted = sum(1 for i in insts if i.patch.strip())
    errors = sum(1 for i in insts if "error" in i.outcome)
    g = run.grading
    resolved = len(g.get("resolved_ids") or []) if g else None
    graded = (len(set(g.get("completed_ids") or []) | set(g.get("resolved_ids") or []))
              if g else None)
    tot_p = sum(i.prompt_tokens for i in insts)
    tot_c = sum(i.completion_tokens for i in insts)
    cache = None
    h = (run.health or {}).get("engine") or {}
    if h.get("native_prefix_cache_query_tokens"):
        cache = h.get("native_prefix_cache_hit_tokens", 0) / h["native_prefix_cache_query_tokens"]
    ev = charts.step_events(insts)
    hit_tokens = [e[4] for e in ev if e[4] is not None]
    if cache is None and hit_tokens:
        q = sum(e[2] for e in ev if e[4] is not None)
        cache = sum(hit_tokens) / q if q else None
    outcomes: dict[str, int] = {}
    for i in insts:
        outcomes[i.outcome] = outcomes.get(i.outcome, 0) + 1
    return {"n": len(insts), "submitted": submitted, "errors": errors, "resolved": resolved,
            "graded": graded, "prompt_tokens": tot_p, "completion_tokens": tot_c,
            "wall_s": s.get("wall_s"), "model": s.get("model"), "run_id": s.get("run_id"),
            "agent": s.get("agent") or run.kind, "outcomes": outcomes, "cache_hit": cache,
            "sandbox": (s.get("sandbox") or {}).get("method"),
            "interrupted": s.get("interrupted"), "final": s.get("final")}


def render_report(run: RunData) -> str:
    """The report of ``run`` as one HTML document (a string)."""
    from fak import __version__

    quarantine = _quarantine(run)
    plots = []
    for title, fn in [("Tokens per instance", charts.tokens_per_instance),
                      ("Time per instance", charts.time_per_instance),
                      ("Steps per instance (to submit, when submitted)", charts.steps_per_instance),
                      ("Engine throughput and prefix-cache hits over the run", charts.throughput_over_run),
                      ("Pipeline: candidates, tests and reproduction scripts per instance",
                       charts.pipeline_candidates),
                      ("Pipeline: seconds per stage", charts.pipeline_stage_seconds)]:
        svg = fn(run.instances)
        if svg is not None:
            import markupsafe

            plots.append({"title": title, "svg": markupsafe.Markup(svg)})
    pages = []
    for inst in run.instances:
        pages.append({"inst": inst, "steps": _steps(inst, quarantine),
                      "pipeline": _pipeline(inst) if inst.pipeline else None,
                      "messages": ((inst.trajectory or {}).get("messages") or [])[:2]})
    return str(_env().get_template("report.html.j2").render(
        run=run, head=_headline(run), plots=plots, pages=pages, diff_css=_diff_css(),
        version=__version__, generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        grading_path=str(run.grading_path) if run.grading_path else None))


def write_report(run_dir: str | Path, output: str | Path | None = None,
                 grading: str | Path | None = None) -> Path:
    """Read the run folder ``run_dir`` and write its report (default ``RUN_DIR/report.html``);
    returns the path written.

    Raises:
        fak.report.load.RunFolderError: ``run_dir`` is not a run folder.
        OSError: the report cannot be written."""
    run = load_run(run_dir, grading)
    out = Path(output) if output is not None else Path(run_dir) / "report.html"
    html = render_report(run)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out
