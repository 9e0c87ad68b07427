"""Verify on edit (``fak.agent.verify``): after each edit the agent loop runs the model's own
reproduction script again, in the same sandbox, and shows its output with the edit's result."""

from __future__ import annotations

import pytest

from fak.agent import Agent, AgentConfig, OpenAIChatModel, ToolBox, Trajectory, get_protocol
from fak.agent.verify import EditVerifier, script_of

REPRO = "import calc\nprint('add(2, 3) =', calc.add(2, 3))\n"


@pytest.mark.parametrize(("command", "script"), [
    ("python repro.py", "repro.py"),
    ("python3 ./repro.py", "repro.py"),
    ("python3 -u repro.py --fast", "repro.py"),
    ("/usr/bin/python3 tests/t.py", "tests/t.py"),
    ("python -c 'print(1)'", None),
    ("python -m pytest repro.py", None),
    ("python repro.py | tail", None),
    ("python repro.py > out.txt", None),
    ("python repro.py; rm -rf x", None),
    ("python repro.py && echo ok", None),
    ("python $(cat f).py", None),
    ("python repro.py\nrm x", None),
    ("bash repro.py", None),
    ("python data.txt", None),
    ("python 'unclosed.py", None),
    ("", None),
])
def test_script_of(command, script):
    assert script_of(command) == script


def test_verifier_runs_only_a_written_script_after_an_edit_of_another_file():
    v = EditVerifier()
    v.observe("bash", {"command": "python repro.py"}, False)
    assert v.after_edit("edit", {"path": "calc.py"}, True) is None, "the script was not written by the model"
    v.observe("write", {"path": "./repro.py", "content": REPRO}, True)
    assert v.after_edit("edit", {"path": "calc.py"}, True) is None, "the script has not run yet"
    v.observe("bash", {"command": "python3 repro.py"}, False)  # fails while the bug is there: still the script
    assert v.after_edit("edit", {"path": "calc.py"}, True) == "python3 repro.py"
    assert v.after_edit("edit", {"path": "calc.py"}, False) is None, "a failed edit changed nothing"
    assert v.after_edit("edit", {"path": "./repro.py"}, True) is None, "an edit of the script itself"
    assert v.after_edit("write", {"path": "calc.py"}, True) is None
    v.observe("bash", {"command": "python3 repro.py | head"}, True)  # not a plain run: kept as it was
    assert v.after_edit("edit", {"path": "calc.py"}, True) == "python3 repro.py"


def _agent(server, ws, tmp_path, verify_on_edit=True):
    proto = get_protocol("tools", allow_exec=True)
    model = OpenAIChatModel(server.url, "scripted", backoff_s=0.01,
                            headers={"X-Fak-Conversation": "run1/inst1", "X-Fak-Workspace": str(ws.root),
                                     **proto.headers()})
    return Agent(model, ToolBox(ws, allow_exec=True), proto,
                 AgentConfig(max_steps=10, verify_on_edit=verify_on_edit),
                 Trajectory(tmp_path / "t.traj.json", instance_id="inst1"))


def _turns():
    return [
        {"tool_calls": [{"name": "write", "arguments": {"path": "repro.py", "content": REPRO}}]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "python3 repro.py"}}]},
        {"tool_calls": [{"name": "edit", "arguments": {"path": "calc.py", "old": "return a - b", "new": "return a + b"}}]},
        {"tool_calls": [{"name": "submit", "arguments": {}}]},
    ]


def _task(ws):
    return {"problem_statement": "add is wrong", "repo": "t/calc", "workspace": str(ws.root)}


def test_the_script_runs_again_after_an_edit(repo, scripted, tmp_path):
    ws, _ = repo
    data = _agent(scripted({"inst1": _turns()}), ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "submitted"
    assert "After each edit your script runs again" in data["messages"][1]["content"]
    tools = [m for m in data["messages"] if m["role"] == "tool"]
    assert "add(2, 3) = -1" in tools[1]["content"], "the model's own run, before the fix"
    edit = tools[2]["content"]
    assert "[After this edit `python3 repro.py` ran again, exit status 0:]" in edit, edit
    assert "add(2, 3) = 5" in edit, edit
    actions = [a for s in data["steps"] for a in s["actions"]]
    verify = actions[2]["verify"]
    assert verify["command"] == "python3 repro.py" and verify["returncode"] == 0 and "= 5" in verify["output"]
    assert data["n_verify_runs"] == 1
    assert all("verify" not in a for i, a in enumerate(actions) if i != 2)


def test_off_nothing_runs_again(repo, scripted, tmp_path):
    ws, _ = repo
    data = _agent(scripted({"inst1": _turns()}), ws, tmp_path, verify_on_edit=False).run(**_task(ws))
    assert data["exit_reason"] == "submitted"
    assert "Run your script again to check the fix" in data["messages"][1]["content"]
    tools = [m for m in data["messages"] if m["role"] == "tool"]
    assert "ran again" not in tools[2]["content"]
    assert not data.get("n_verify_runs")
