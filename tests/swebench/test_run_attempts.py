"""``fak swebench run --attempts N``: N independent agents per instance, one patch per instance.

Against the scripted model on the tiny instances: each attempt has its own trajectory, workspace,
conversation and seed (every request of an attempt carries it); ``--workers`` is shared by all
attempts; the selection rule (lowest submitted non-empty patch, else lowest non-empty, else
attempt 0's) reads only the attempts' outcomes, never the dataset's grading fields (the same run
on poisoned rows gives the same predictions and requests); a re-run skips finished attempts,
runs only new ones when ``--attempts`` grows and refuses fewer; ``--temperature 0`` is refused.

To add a case: script turns per attempt under the key ``ID`` (attempt 0) or ``ID.aK`` (the
scripted server falls back to ``ID`` for an attempt without its own key), run the CLI with
``_run_args`` and check ``attempts.json``, ``predictions.json`` and ``summary.json``'s
``selection``.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from fak.swebench.attempts import attempt_seed, select_attempt, unit_key
from fak.swebench.dataset import load_rows
from fak.swebench.fleet import Fleet
from fak.swebench.instance import FleetConfig
from tiny import run_fak, tools_script_fix_add, tools_script_fix_shout

C1, C2 = "fak-test__calc-1", "fak-test__calc-2"
SUBMIT = [{"tool_calls": [{"name": "submit", "arguments": {}}]}]


def _run_args(tiny, server, out, *extra, dataset=None):
    return ("swebench", "run", "--agent", "fleet", "--gateway", server.url.removeprefix("http://"),
            "--model", "scripted-1", "--dataset", str(dataset or tiny["dataset"]), "--repos",
            str(tiny["repos"]), "--output", str(out), "--no-live", "--run-id", "r", *extra)


def _preds(out: Path) -> dict[str, str]:
    return {p["instance_id"]: p["model_patch"]
            for p in json.loads((out / "predictions.json").read_text())}


def _convs(requests) -> list[str]:
    return [r["headers"]["x-fak-conversation"].split("/", 1)[1] for r in requests]


# -- the selection rule, as a function -----------------------------------------------------------

def _rec(k, reason, patch):
    return {"attempt": k, "exit_reason": reason, "patch": patch}


@pytest.mark.parametrize("records, expected", [
    # attempt 0 empty, attempt 2 submitted: 2
    ([_rec(0, "submitted", ""), _rec(1, "max_steps", ""), _rec(2, "submitted", "P2")],
     (2, "submitted_patch")),
    # a submitted patch beats a lower attempt's unsubmitted one
    ([_rec(0, "max_steps", "P0"), _rec(1, "error", "P1"), _rec(2, "submitted", "P2")],
     (2, "submitted_patch")),
    # two submitted patches: the lowest attempt, whatever the order given
    ([_rec(3, "submitted", "P3"), _rec(1, "submitted", "P1"), _rec(0, "submitted", "")],
     (1, "submitted_patch")),
    # no submitted patch: the lowest non-empty one (white space is empty)
    ([_rec(0, "submitted", " \n"), _rec(1, "context_limit", ""), _rec(2, "max_steps", "P2"),
      _rec(3, "error", "P3")], (2, "unsubmitted_patch")),
    # nothing: attempt 0's empty patch
    ([_rec(2, "max_steps", ""), _rec(0, "submitted", ""), _rec(1, "error", "")], (0, "no_patch")),
    # attempt 0 not finished (yet): the lowest finished one
    ([_rec(2, "max_steps", ""), _rec(1, "submitted", "")], (1, "no_patch")),
    ([], None),
], ids=["empty0-submitted2", "submitted-beats-lower", "lowest-submitted", "lowest-patch",
        "all-empty", "no-attempt0", "none"])
def test_select_attempt(records, expected):
    assert select_attempt(records) == expected


def test_attempt_seeds_and_names():
    seeds = {attempt_seed(iid, k) for iid in (C1, C2) for k in range(8)}
    assert len(seeds) == 16 and all(0 <= s < 2**31 for s in seeds)
    assert attempt_seed(C1, 3) == attempt_seed(C1, 3)  # deterministic across calls and runs
    assert [unit_key(C1, k) for k in range(3)] == [C1, f"{C1}.a1", f"{C1}.a2"]


# -- end to end ----------------------------------------------------------------------------------

def test_attempts_have_their_own_trajectory_workspace_conversation_and_seed(tiny, scripted,
                                                                           tmp_path):
    # every turn takes 1 s at the server: with 6 attempts and 4 workers, 4 are in flight at once
    slow = {"delay_s": 1.0}
    fix_add = [{**t, **slow} for t in tools_script_fix_add()[2:]]  # edit, submit
    server = scripted({C1: fix_add, f"{C1}.a1": [{**SUBMIT[0], **slow}],
                       f"{C1}.a2": fix_add, C2: [{**t, **slow} for t in tools_script_fix_shout()]})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--attempts", "3", "--temperature", "0.7",
                              "--workers", "4", "--keep-workspaces"), timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "6/6 attempts finished" in proc.stdout
    assert "2 instance(s) with a prediction" in proc.stdout
    keys = [unit_key(i, k) for i in (C1, C2) for k in range(3)]
    # one trajectory per attempt, naming its attempt and seed
    names = sorted(p.name for p in (out / "trajectories").iterdir())
    assert names == sorted(f"{k}.traj.json" for k in keys)
    for iid in (C1, C2):
        for k in range(3):
            traj = json.loads((out / "trajectories" / f"{unit_key(iid, k)}.traj.json").read_text())
            assert (traj["instance_id"], traj["attempt"]) == (iid, k)
            assert traj["seed"] == attempt_seed(iid, k) and traj["exit_reason"] == "submitted"
    # the server: one conversation per attempt, each request with its attempt's seed
    by_conv: dict[str, set] = {}
    for r in server.requests:
        conv = r["headers"]["x-fak-conversation"].split("/", 1)[1]
        by_conv.setdefault(conv, set()).add(r["body"].get("seed"))
        assert r["body"]["temperature"] == 0.7
    assert sorted(by_conv) == sorted(keys)
    for key, seeds in by_conv.items():
        iid, _, a = key.partition(".a")
        assert seeds == {attempt_seed(iid, int(a or 0))}, key
    assert len({s for seeds in by_conv.values() for s in seeds}) == 6
    # workers shared by all attempts: 4 requests in flight at once (the 2 instances alone: 2)
    spans = [(r["time"], r["time"] + 1.0) for r in server.requests]
    in_flight = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert in_flight == 4
    # one workspace per attempt, each with its own edits
    ws = {p.name: p for p in (out / "workspaces").iterdir()}
    assert sorted(ws) == sorted(keys)
    assert "return a + b" in (ws[C1] / "calc.py").read_text()
    assert "return a - b" in (ws[f"{C1}.a1"] / "calc.py").read_text()
    assert len({r["headers"]["x-fak-workspace"] for r in server.requests}) == 6
    # one prediction per instance; the summary counts attempts
    preds = json.loads((out / "predictions.json").read_text())
    assert [p["instance_id"] for p in preds] == [C1, C2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attempts"] == 3 and summary["n_run"] == 6 and summary["n_finished"] == 6
    assert summary["exit_reasons"] == {"submitted": 6} and summary["n_predictions"] == 2
    assert summary["totals"]["steps"] == 2 + 1 + 2 + 4 * 3
    assert sorted((i["instance_id"], i["attempt"]) for i in summary["instances"]) == \
        [(i, k) for i in (C1, C2) for k in range(3)]
    ledger = json.loads((out / "attempts.json").read_text())
    assert ledger["attempts"] == 3
    assert [r["attempt"] for r in ledger["instances"][C1]] == [0, 1, 2]


def _selection_script():
    """calc-1: attempt 0 submits nothing, 1 edits but runs out of steps, 2 fixes and submits
    → 2 (submitted_patch). calc-2: 0 submits nothing, 1 edits but runs out of steps, 2 submits
    nothing → 1 (unsubmitted_patch)."""
    look = {"tool_calls": [{"name": "list", "arguments": {}}]}
    edit1 = {"tool_calls": [{"name": "edit", "arguments": {"path": "calc.py",
                                                           "old": "def mul", "new": "def mul2"}}]}
    edit2 = {"tool_calls": [{"name": "edit", "arguments": {"path": "text.py", "old": "s.lower()",
                                                           "new": "s.upper()"}}]}
    return {C1: SUBMIT, f"{C1}.a1": [edit1, look, look, look], f"{C1}.a2": tools_script_fix_add(),
            C2: SUBMIT, f"{C2}.a1": [look, edit2, look, look], f"{C2}.a2": SUBMIT}


def _stable(summary_selection: list[dict]) -> list[dict]:
    return [{**s, "attempts": [{k: v for k, v in a.items() if k not in ("prompt_tokens",)}
                               for a in s["attempts"]]} for s in summary_selection]


def test_selection_uses_outcomes_only_never_the_grading_fields(tiny, scripted, tmp_path):
    """The rule on real outcomes, and honesty: rows whose gold patch is attempt 0's (empty) diff,
    whose test lists and test patch are garbage, give the same predictions, selection and
    requests (tests/swebench/test_pipeline_honest.py's pattern)."""
    rows = [json.loads(ln) for ln in Path(tiny["dataset"]).read_text().splitlines()]
    for r in rows:  # a run that read these would choose differently (or crash)
        r["patch"] = ""
        r["test_patch"] = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+garbage\n"
        r["FAIL_TO_PASS"] = json.dumps(["x::garbage"])
        r["PASS_TO_PASS"] = json.dumps(["tests/test_calc.py::test_mul", "x::y"])
    poisoned = tmp_path / "poisoned.jsonl"
    poisoned.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = {}
    for name, dataset in (("clean", tiny["dataset"]), ("poisoned", poisoned)):
        server = scripted(_selection_script())
        out = tmp_path / name
        proc = run_fak(*_run_args(tiny, server, out, "--attempts", "3", "--temperature", "0.5",
                                  "--max-steps", "4", "--workers", "6", dataset=dataset),
                       timeout=180)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads((out / "summary.json").read_text())
        requests = sorted(  # the scripted server's tool call ids are random
            re.sub(r"call_[0-9a-f]{10}", "call_ID", json.dumps({"conv": c, "body": r["body"]},
                                                               sort_keys=True))
            .replace(str(out.resolve()), "OUT")
            for c, r in zip(_convs(server.requests), server.requests))
        results[name] = ((out / "predictions.json").read_bytes(), _stable(summary["selection"]),
                         requests)
        sel = {s["instance_id"]: s for s in summary["selection"]}
        assert (sel[C1]["chosen_attempt"], sel[C1]["reason"]) == (2, "submitted_patch")
        assert (sel[C2]["chosen_attempt"], sel[C2]["reason"]) == (1, "unsubmitted_patch")
        assert sel[C2]["chosen_exit_reason"] == "max_steps"
        assert [a["exit_reason"] for a in sel[C1]["attempts"]] == ["submitted", "max_steps",
                                                                    "submitted"]
        assert [a["patch_bytes"] > 0 for a in sel[C2]["attempts"]] == [False, True, False]
        assert all(a["finished"] and a["completion_tokens"] > 0 and a["seed"] ==
                   attempt_seed(s["instance_id"], a["attempt"])
                   for s in summary["selection"] for a in s["attempts"])
        assert sel[C1]["n_finished"] == 3
        preds = _preds(out)
        trajs = {k: json.loads((out / "trajectories" / f"{k}.traj.json").read_text())["patch"]
                 for k in (f"{C1}.a2", f"{C2}.a1", C1)}
        assert preds[C1] == trajs[f"{C1}.a2"] and "+    return a + b" in preds[C1]
        assert preds[C2] == trajs[f"{C2}.a1"] and "s.upper()" in preds[C2]
        assert trajs[C1] == ""
        assert sel[C2]["patch_bytes"] == len(preds[C2].encode())
    assert results["clean"] == results["poisoned"]


def test_resume_skips_finished_attempts_grows_and_refuses_fewer(tiny, scripted, tmp_path):
    server = scripted({C1: tools_script_fix_add(), C2: tools_script_fix_shout()})
    out = tmp_path / "out"
    # a run without attempts first: attempt 0 of calc-1
    assert run_fak(*_run_args(tiny, server, out, "--filter", C1), timeout=120).returncode == 0
    first = _preds(out)
    n = len(server.requests)
    # --attempts 2: calc-1's finished run is its attempt 0; the rest runs
    proc = run_fak(*_run_args(tiny, server, out, "--attempts", "2", "--temperature", "0.7"),
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "skipping 1 finished attempt(s)" in proc.stderr
    assert sorted(set(_convs(server.requests[n:]))) == [f"{C1}.a1", C2, f"{C2}.a1"]
    ledger = json.loads((out / "attempts.json").read_text())
    assert ledger["instances"][C1][0]["seed"] is None  # run without a seed
    assert ledger["instances"][C1][0]["exit_reason"] == "submitted"
    assert _preds(out)[C1] == first[C1]  # attempt 0 submitted a patch: still the choice
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_skipped_finished"] == 1 and summary["n_run"] == 3
    # the same again: nothing to run
    n = len(server.requests)
    proc = run_fak(*_run_args(tiny, server, out, "--attempts", "2", "--temperature", "0.7"),
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "skipping 4 finished attempt(s)" in proc.stderr and len(server.requests) == n
    # more attempts: only the new ones
    proc = run_fak(*_run_args(tiny, server, out, "--attempts", "3", "--temperature", "0.7"),
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(set(_convs(server.requests[n:]))) == [f"{C1}.a2", f"{C2}.a2"]
    assert json.loads((out / "attempts.json").read_text())["attempts"] == 3
    assert len(list((out / "trajectories").iterdir())) == 6
    # fewer (and the default 1) are refused before anything runs
    n = len(server.requests)
    for extra in (("--attempts", "2", "--temperature", "0.7"), ()):
        proc = run_fak(*_run_args(tiny, server, out, *extra), timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "holds a run with --attempts 3" in proc.stderr
        assert "--attempts 3 or more" in proc.stderr
    assert len(server.requests) == n


def test_an_attempt_that_failed_runs_again_and_the_choice_follows(tiny, scripted, tmp_path):
    """A model_error attempt is not recorded: the prediction is chosen from the finished ones,
    and the next run runs it (and only it) again; a lower attempt's patch then wins."""
    script = {C1: [{"tool_calls": [{"name": "list", "arguments": {}}], "fail": [500]},
                   *tools_script_fix_add()],
              f"{C1}.a1": [{"tool_calls": [{"name": "edit", "arguments": {
                  "path": "calc.py", "old": "return a - b", "new": "return b + a"}}]}, *SUBMIT]}
    server = scripted(script)
    cfg = FleetConfig(gateway=server.url, model="m", output=tmp_path / "out", workers=2,
                      repos_dir=tiny["repos"], live=False, attempts=2, max_retries=0,
                      sampling={"temperature": 0.7, "max_tokens": 64})
    rows = [r for r in load_rows(tiny["dataset"]) if r["instance_id"] == C1]
    quiet = Fleet(cfg, rows, console=_console()[0]).run()
    assert quiet["exit_reasons"] == {"model_error": 1, "submitted": 1}
    sel = quiet["selection"][0]
    assert (sel["chosen_attempt"], sel["reason"], sel["n_finished"]) == (1, "submitted_patch", 1)
    assert sel["attempts"][0]["finished"] is False
    assert sel["attempts"][0]["exit_reason"] == "model_error"
    assert "return b + a" in _preds(cfg.output)[C1]
    n = len(server.requests)
    again = Fleet(cfg, rows, console=_console()[0]).run()
    assert set(_convs(server.requests[n:])) == {C1}
    assert again["exit_reasons"] == {"submitted": 1} and again["n_skipped_finished"] == 1
    sel = again["selection"][0]
    assert (sel["chosen_attempt"], sel["n_finished"]) == (0, 2)
    assert "return a + b" in _preds(cfg.output)[C1]


def _console():
    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=160, color_system=None), buf


def test_live_table_shows_each_attempt(tiny, scripted, tmp_path):
    server = scripted({C1: tools_script_fix_add(), C2: tools_script_fix_shout()})
    console, buf = _console()
    cfg = FleetConfig(gateway=server.url, model="m", output=tmp_path / "out", workers=4,
                      repos_dir=tiny["repos"], live=True, attempts=2,
                      sampling={"temperature": 0.7, "max_tokens": 64})
    summary = Fleet(cfg, load_rows(tiny["dataset"]), console=console).run()
    assert summary["exit_reasons"] == {"submitted": 4}
    screen = buf.getvalue()
    for text in (f"{C1} a0", f"{C1} a1", f"{C2} a0", f"{C2} a1", "2 attempts per instance",
                 "total 4/4 attempts done"):
        assert text in screen, text


def test_attempts_at_temperature_0_and_other_misuse_are_refused(tiny, scripted, tmp_path):
    server = scripted({})
    out = tmp_path / "out"
    for extra, needle in ((("--attempts", "3"), "--temperature above 0"),
                          (("--attempts", "3", "--temperature", "0"), "near-identical"),
                          (("--attempts", "0"), "--attempts"),
                          (("--attempts", "2", "--temperature", "0.7", "--ray"), "--ray runs one"),
                          (("--attempts", "2", "--temperature", "0.7", "--agent", "pipeline"),
                           "--attempts applies to --agent fleet"),
                          # a temperature no request can carry is refused before anything runs
                          (("--attempts", "2", "--temperature", "nan"), "finite number >= 0"),
                          (("--temperature", "inf"), "finite number >= 0"),
                          (("--attempts", "2", "--temperature", "-1"), "finite number >= 0")):
        proc = run_fak(*_run_args(tiny, server, out, *extra), timeout=60)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert "Traceback" not in proc.stderr and needle in proc.stderr, (extra, proc.stderr)
    assert server.requests == [] and not (out / "attempts.json").exists()
    # the API refuses the same
    cfg = FleetConfig(gateway=server.url, model="m", output=tmp_path / "api", attempts=2)
    with pytest.raises(ValueError, match="temperature 0"):
        Fleet(cfg, load_rows(tiny["dataset"]))
    cfg.sampling = {"temperature": 0.7}
    clash = [dict(r) for r in load_rows(tiny["dataset"])]
    clash[1]["instance_id"] = f"{C1}.a1"
    with pytest.raises(ValueError, match="clash"):
        Fleet(cfg, clash)


def test_one_attempt_is_the_plain_fleet(tiny, scripted, tmp_path):
    """--attempts 1 (the default) writes nothing new: no attempts.json, no seed in requests,
    no attempt fields in trajectories or the summary, the plain conversation ids."""
    server = scripted({C1: tools_script_fix_add(), C2: tools_script_fix_shout()})
    out = tmp_path / "out"
    proc = run_fak(*_run_args(tiny, server, out, "--attempts", "1", "--temperature", "0.7",
                              "--workers", "2"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2/2 finished" in proc.stdout
    assert not (out / "attempts.json").exists()
    assert all("seed" not in r["body"] for r in server.requests)
    assert set(_convs(server.requests)) == {C1, C2}
    assert sorted(p.name for p in (out / "trajectories").iterdir()) == \
        [f"{C1}.traj.json", f"{C2}.traj.json"]
    traj = json.loads((out / "trajectories" / f"{C1}.traj.json").read_text())
    assert "attempt" not in traj and "seed" not in traj
    summary = json.loads((out / "summary.json").read_text())
    assert "attempts" not in summary and "selection" not in summary
    assert all("attempt" not in i and "seed" not in i for i in summary["instances"])
    preds = json.loads((out / "predictions.json").read_text())
    assert sorted(p["instance_id"] for p in preds) == [C1, C2]


def test_a_damaged_attempts_record_is_refused_before_anything_runs(tiny, scripted, tmp_path):
    """A cut-short or edited attempts.json is named and refused (found by a new-user test: it was
    ignored, so finished attempts ran again and the fewer-attempts check was skipped)."""
    server = scripted({})
    for text in ('{"format": "fak-attempts/1", "attempts": 3, "instan',
                 json.dumps({"format": "fak-attempts/1", "attempts": 2,
                             "instances": {C1: [{"attempt": "zero", "exit_reason": "submitted", "patch": ""}]}}),
                 json.dumps({"attempts": 0})):
        out = tmp_path / f"out{len(text)}"
        out.mkdir()
        (out / "attempts.json").write_text(text)
        proc = run_fak(*_run_args(tiny, server, out, "--attempts", "3", "--temperature", "0.7"), timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "attempts.json" in proc.stderr, proc.stderr
        assert (out / "attempts.json").read_text() == text, "left as it was"
    assert server.requests == []
