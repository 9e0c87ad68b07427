"""The real path end to end: ``fak swebench run --gguf`` starts ``fak serve`` with the real
Qwen2.5-Coder-0.5B on CPU, the fleet agent works a tiny SWE-bench-shaped instance through it, and
the server is stopped at the end.

The model's choices are its own, so the assertions are the mechanics that must hold whatever it
does: the predictions' exact shape, real model turns in the trajectory, one policy verdict per
proposed call (in the trajectory and in the gateway's audit log, with the same digests), a denied
call never executed, and no server left running. The policy of this test allows ``list``,
``read`` and ``submit`` and denies ``search``, ``edit`` and ``write``, so a denial is likely and
the patch must be empty whatever the model tries. Bounded: 3 steps of at most 96 tokens, n_ctx 4096.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from fak.toolcalls.wire import arguments_digest
from tiny import run_fak

POLICY = {
    "version": 1,
    "description": "test: look around and submit only",
    "default": {"verdict": "deny", "reason": "not a tool of this test"},
    "tools": {
        "list": {"paths": [{"argument": "path", "optional": True, "reason": "inside the workspace"}]},
        "read": {"paths": [{"argument": "path", "reason": "inside the workspace"}]},
        "search": {"allowed": False, "reason": "searching is denied by the test policy"},
        "edit": {"allowed": False, "reason": "editing is denied by the test policy"},
        "write": {"allowed": False, "reason": "writing is denied by the test policy"},
        "submit": {},
    },
}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_fleet_through_real_fak_serve(model_05b: Path, tiny: dict, tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    out = tmp_path / "run"
    iid = "fak-test__calc-1"
    proc = run_fak("swebench", "run", "--gguf", str(model_05b), "--backend", "cpu",
                   "--n-ctx", "4096", "--threads", "2", "--policy", str(policy),
                   "--dataset", str(tiny["dataset"]), "--filter", iid, "--repos", str(tiny["repos"]),
                   "--max-steps", "3", "--max-tokens", "96", "--output", str(out), "--no-live",
                   timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fak serve ready on 127.0.0.1:" in proc.stderr and "fak serve stopped" in proc.stderr

    # predictions.json: exactly the harness's shape
    preds = json.loads((out / "predictions.json").read_text())
    assert isinstance(preds, list) and len(preds) == 1
    assert set(preds[0]) == {"instance_id", "model_name_or_path", "model_patch"}
    assert preds[0]["instance_id"] == iid
    assert preds[0]["model_name_or_path"] == "qwen2.5-coder-0.5b-instruct-mixed"  # the served id
    assert preds[0]["model_patch"] == ""  # edit and write are denied, bash is not offered

    # the trajectory: real turns of the real model through the gateway
    traj = json.loads((out / "trajectories" / f"{iid}.traj.json").read_text())
    assert traj["exit_reason"] in ("submitted", "max_steps")
    assert 1 <= traj["n_steps"] <= 3 and len(traj["steps"]) == traj["n_steps"]
    assert traj["tokens"]["prompt"] > 500 and traj["tokens"]["completion"] > 0
    assistant = [m for m in traj["messages"] if m["role"] == "assistant"]
    assert len(assistant) == traj["n_steps"]  # a resampled reply is not in the history
    for step in traj["steps"]:
        assert step["usage"]["prompt_tokens"] > 0 and step["usage"]["completion_tokens"] > 0
        assert step["finish_reason"] in ("stop", "length", "tool_calls")
        assert step["response"]["content"] or step["response"]["tool_calls"]

    # one verdict per proposed call, recorded on both sides with the same digests (a reply
    # dropped as a repeated call and sampled again keeps its verdicts in its resample record)
    verdicts = [v for s in traj["steps"]
                for v in [*(x for r in s.get("resamples", []) for x in r["verdicts"]), *s["verdicts"]]]
    audit = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert len(audit) == len(verdicts)
    assert [(a["tool"], a["verdict"] == "allow", a["arguments_digest"]) for a in audit] == [
        (v["tool"], v["allowed"], v["arguments_digest"]) for v in verdicts]
    assert all(a["conversation"] == f"run/{iid}" for a in audit)
    assert traj["n_denied"] == sum(1 for s in traj["steps"] for v in s["verdicts"] if not v["allowed"])
    for step in traj["steps"]:
        for action in step["actions"]:
            if action["executed"]:
                assert action["name"] in ("list", "read", "submit")
                v = action["verdict"]
                assert v is not None and v["allowed"] is True
                assert v["arguments_digest"] == arguments_digest(action["arguments"])
        denied = [v for v in step["verdicts"] if not v["allowed"]]
        if denied:
            assert not any(a["executed"] and a["name"] in ("search", "edit", "write")
                           for a in step["actions"])
            assert "[fak policy]" in json.dumps(traj["messages"])

    # the server: recorded, stopped, gone
    summary = json.loads((out / "summary.json").read_text())
    server = summary["server"]
    assert server["managed"] is True and server["policy"] == str(policy)
    assert server["returncode"] is not None and not _pid_alive(server["pid"])
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{server['addr']}/health", timeout=2.0)
    assert summary["n_finished"] == 1 and summary["totals"]["steps"] == traj["n_steps"]
    assert (out / "serve.log").read_text().startswith("# ")
    # the workspace is gone and the repository at base is untouched
    assert not (out / "workspaces" / iid).exists()
    subprocess.run(["git", "-C", str(tiny["repos"] / "fak-test" / "calc"), "cat-file", "-e",
                    tiny["base_commit"]], check=True)
