"""`fak report`: the page of a run folder, read from the committed fixtures in
tests/data/report_runs/ (cut from real runs by make_fixtures.py there: a fleet run with its
trajectories, audit log and grading report; a pipeline run with its stage artifacts), and checked
in headless Chromium (Debian's ``chromium`` driven by Playwright): it loads with no console error,
the table sorts, an instance page opens, a screenshot is not blank.

Add a case: a new kind of run file goes into a fixture folder (regenerate with make_fixtures.py or
add a file by hand), then assert on ``load_run`` / ``render_report`` here, or on the page in
``test_page_in_chromium``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fak.cli import main
from fak.report import RunFolderError, load_run, render_report, write_report

RUNS = Path(__file__).resolve().parents[1] / "data" / "report_runs"
FLEET, PIPELINE = RUNS / "fleet", RUNS / "pipeline"


def test_load_fleet_run() -> None:
    run = load_run(FLEET)
    assert run.kind == "fleet" and not run.problems
    by = {i.instance_id: i for i in run.instances}
    assert sorted(by) == ["psf__requests-2931", "pytest-dev__pytest-7236", "sympy__sympy-14711"]
    p = by["pytest-dev__pytest-7236"]
    assert (p.outcome, p.steps, p.resolved, p.grade_status) == ("submitted", 28, False, "unresolved")
    assert p.patch.startswith("diff --git") and p.patch_lines == 2 and p.trajectory is not None
    assert by["psf__requests-2931"].grade_status == "empty_patch"
    assert run.grading_path == FLEET / "eval" / "report.json"
    assert any(a.get("event") == "quarantine" for a in run.audit)


def test_load_pipeline_run() -> None:
    run = load_run(PIPELINE)
    assert run.kind == "pipeline"
    by = {i.instance_id: i for i in run.instances}
    s = by["sympy__sympy-14711"]
    assert s.resolved is True and set(s.pipeline) == {"locate", "choose", "repair", "reproduce",
                                                      "test", "rank"}
    assert "if other == 0: return self" in s.patch


def test_page_is_self_contained_and_escaped(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(FLEET, run_dir)
    traj = run_dir / "trajectories" / "sympy__sympy-14711.traj.json"
    t = json.loads(traj.read_text())
    t["steps"][0]["actions"][0]["output"] = '<script>alert("x")</script><img src="https://e.x/a.png">'
    traj.write_text(json.dumps(t))
    html = render_report(load_run(run_dir))
    assert "<script>alert" not in html and "&lt;script&gt;alert" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "no outside resource"
    assert "<link" not in html and "@import" not in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    for iid in ("psf__requests-2931", "pytest-dev__pytest-7236", "sympy__sympy-14711"):
        assert f'id="i-{iid}"' in html and f'href="#i-{iid}"' in html
    assert html.count("<svg") >= 4, "tokens, time, steps and throughput plots"


def test_pipeline_page_says_why(tmp_path: Path) -> None:
    html = render_report(load_run(PIPELINE))
    assert "Chosen patch: c27" in html
    assert "fixed 1 of 7 reproduction script(s)" in html
    assert "36 clusters of identical diffs" in html


def test_pipeline_page_lists_the_test_runs_cut(tmp_path: Path) -> None:
    """A test stage bounded by its budget (issue 31): the page says what was cut and why."""
    run_dir = tmp_path / "run"
    shutil.copytree(PIPELINE, run_dir)
    test = run_dir / "pipeline" / "sympy__sympy-14711" / "test.jsonl"
    cut = {"run": "regression", "candidate": "c27", "file": "sympy/physics/vector/tests/test_vector.py",
           "why": "budget", "detail": "the test budget (600 s) was spent before it started"}
    sched = {"kind": "schedule", "workers": 4, "budget_s": 600.0, "candidate_limit_s": 60.0,
             "runs": 31, "cut": [cut], "wall_s": 600.4, "timeline": []}
    test.write_text(test.read_text() + json.dumps(sched) + "\n")
    html = render_report(load_run(run_dir))
    assert "31 run(s) on 4 worker(s)" in html and "1 cut:" in html
    assert "regression c27 <code>sympy/physics/vector/tests/test_vector.py</code> — budget: the test budget (600 s) was spent" in html
    assert "nothing cut." not in html


def test_cli(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["report", str(PIPELINE), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out) and out.stat().st_size > 10_000
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(main, ["report", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "not a fak run folder" in r.output
    with pytest.raises(RunFolderError):
        load_run(tmp_path / "empty")


def test_unreadable_file_is_named_not_fatal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(FLEET, run_dir)
    (run_dir / "trajectories" / "psf__requests-2931.traj.json").write_text("{not json")
    run = load_run(run_dir)
    assert any("psf__requests-2931" in p for p in run.problems)
    assert "could not be read" in render_report(run)


def _chromium() -> str | None:
    for c in (os.environ.get("FAK_CHROMIUM"), "/usr/lib/chromium/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if c and Path(c).is_file():
            return c
    return None


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Playwright (Debian's chromium; .ci/run installs it). Missing:
    a failure under CI, a skip elsewhere."""
    exe = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if exe is None or sync_playwright is None:
        why = ("no chromium (apt-get install chromium)" if exe is None else
               "no playwright (pip install '.[test]')")
        if os.environ.get("CI"):
            pytest.fail(f"the report's browser test needs {why}")
        pytest.skip(why)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def _column(page, col: int) -> list[str]:
    return page.eval_on_selector_all(
        "#instances tbody tr", f"rows => rows.map(r => r.cells[{col}].dataset.v)")


@pytest.mark.parametrize("fixture", ["fleet", "pipeline"])
def test_page_in_chromium(browser, fixture: str, tmp_path: Path) -> None:
    out = write_report(RUNS / fixture, tmp_path / "report.html")
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: errors.append(f"request {r.url}") if not r.url.startswith(("file:", "data:")) else None)
    page.goto(out.as_uri())
    assert page.is_visible("#instances") and page.is_visible("#summary")

    prompt_col = 3
    page.click("#instances thead th:nth-child(4)")
    up = [int(v) for v in _column(page, prompt_col)]
    assert up == sorted(up)
    page.click("#instances thead th:nth-child(4)")
    down = [int(v) for v in _column(page, prompt_col)]
    assert down == sorted(up, reverse=True) and down != up
    page.click("#instances thead th:nth-child(1)")
    assert _column(page, 0) == sorted(_column(page, 0))

    shot = page.screenshot(full_page=True)
    from PIL import Image

    img = Image.open(io.BytesIO(shot)).convert("L")
    assert img.size[1] > 900 and len(img.getcolors(1 << 16) or []) > 20, "a blank page"
    assert img.getextrema()[0] < 100, "no dark pixels: nothing drawn"

    iid = "sympy__sympy-14711"
    page.click(f'#instances a[href="#i-{iid}"]')
    assert page.is_visible(f"section#i-{iid}") and not page.is_visible("#instances")
    assert page.is_visible(f"section#i-{iid} .diff")
    if fixture == "fleet":
        assert page.locator(f"section#i-{iid} li.step").count() >= 1
        assert page.is_visible(f"section#i-{iid} .tag:has-text('allowed')")
    else:
        assert page.is_visible(f"section#i-{iid} .why")
    page.click(f"section#i-{iid} a.back >> nth=0")
    assert page.is_visible("#instances")
    assert errors == []
    page.close()


def test_prefix_cache_plot_from_recorded_usage(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(FLEET, run_dir)
    (run_dir / "health.json").unlink()
    html = render_report(load_run(run_dir))
    assert "prefix-cache hits %" not in html and "prefix-cache hits</span>" not in html
    for traj in (run_dir / "trajectories").glob("*.traj.json"):
        t = json.loads(traj.read_text())
        for s in t["steps"]:
            s["usage"]["cached_tokens"] = s["usage"]["prompt_tokens"] // 2
        traj.write_text(json.dumps(t))
    html = render_report(load_run(run_dir))
    assert "prefix-cache hits %" in html  # the plot's second panel
    assert re.search(r"<b>(49\.\d|50\.0)%</b><span>prefix-cache hits", html)
