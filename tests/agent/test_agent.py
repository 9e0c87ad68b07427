"""The agent loop against the scripted OpenAI-compatible server: both protocols, retries, limits,
format errors, and policy denials (a denied call never executes).

To add a case: write the turns the model should give (see ``fak.agent.scripted``), run
``_agent(...).run(...)`` and check the trajectory and the workspace.
"""

from __future__ import annotations

import json

import pytest

from fak.agent import Agent, AgentConfig, OpenAIChatModel, ToolBox, Trajectory, get_protocol
from fak.agent.exceptions import FormatError
from fak.agent.protocols.text import TextProtocol
from fak.agent.protocols.tools import ToolCallProtocol
from fak.toolcalls.wire import arguments_digest


def _agent(server, ws, tmp_path, protocol="tools", allow_exec=False, max_steps=10, **model_kw):
    proto = get_protocol(protocol, allow_exec=allow_exec)
    model = OpenAIChatModel(server.url, "scripted", backoff_s=0.01,
                            headers={"X-Fak-Conversation": "run1/inst1",
                                     "X-Fak-Workspace": str(ws.root), **proto.headers()},
                            **model_kw)
    traj = Trajectory(tmp_path / "t.traj.json", instance_id="inst1")
    return Agent(model, ToolBox(ws, allow_exec=allow_exec), proto,
                 AgentConfig(max_steps=max_steps), traj)


def _task(ws):
    return {"problem_statement": "add is wrong", "repo": "t/calc", "workspace": str(ws.root)}


def _call(name, call_id=None, **arguments):
    call = {"name": name, "arguments": arguments}
    if call_id:
        call["id"] = call_id
    return call


def test_tool_protocol_fixes_bug_and_submits(repo, scripted, tmp_path):
    ws, base = repo
    server = scripted({"inst1": [
        {"tool_calls": [_call("search", pattern="def add")]},
        {"tool_calls": [_call("edit", path="calc.py", old="return a - b", new="return a + b")]},
        {"tool_calls": [_call("submit")]},
    ]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "submitted" and data["n_steps"] == 3
    assert "return a + b" in (ws.root / "calc.py").read_text()
    # the history is valid OpenAI chat: assistant tool_calls answered by tool messages
    roles = [m["role"] for m in data["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert data["messages"][3]["content"] == "calc.py:1:def add(a, b):"
    assert data["messages"][3]["tool_call_id"] == data["messages"][2]["tool_calls"][0]["id"]
    # the trajectory on disk equals the returned one, with tokens and timings
    on_disk = json.loads((tmp_path / "t.traj.json").read_text())
    assert on_disk["exit_reason"] == "submitted" and on_disk["tokens"]["completion"] > 0
    assert [a["name"] for s in on_disk["steps"] for a in s["actions"]] == ["search", "edit", "submit"]
    # headers and tools went to the server
    req = server.requests[0]
    assert req["headers"]["x-fak-conversation"] == "run1/inst1"
    assert req["headers"]["x-fak-workspace"] == str(ws.root)
    assert [t["function"]["name"] for t in req["body"]["tools"]] == [
        "read", "list", "search", "edit", "write", "submit"]


def test_text_protocol(repo, scripted, tmp_path):
    ws, _ = repo
    server = scripted({"inst1": [
        {"content": "Look.\n```bash\ngrep -n 'a - b' calc.py\n```"},
        {"content": "no block here"},
        {"content": "```bash\nsed -i 's/a - b/a + b/' calc.py\n```"},
        {"content": "```bash\npython3 -c 'import calc; print(calc.add(2, 3))'\n```"},
        {"content": "```bash\nsubmit\n```"},
    ]})
    data = _agent(server, ws, tmp_path, protocol="text", allow_exec=True).run(**_task(ws))
    assert data["exit_reason"] == "submitted"
    assert data["n_format_errors"] == 1
    outputs = [a["output"] for s in data["steps"] for a in s["actions"]]
    assert outputs[0] == "2:    return a - b\n" and outputs[2] == "5\n"
    assert "<returncode>0</returncode>" in data["messages"][3]["content"]
    assert "Format error: no ```bash block" in data["messages"][5]["content"]
    assert server.requests[0]["headers"]["x-fak-text-tools"] == "bash"
    assert "tools" not in server.requests[0]["body"]


def test_retries_429_and_5xx(repo, scripted, tmp_path):
    ws, _ = repo
    server = scripted({"inst1": [{"fail": [429, 500, 503], "tool_calls": [_call("submit")]}]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "submitted"
    assert data["steps"][0]["attempts"] == 4
    assert [r["status"] for r in server.requests] == [429, 500, 503, 200]


def test_retries_are_bounded(repo, scripted, tmp_path):
    ws, _ = repo
    server = scripted({"inst1": [{"fail": [500] * 10, "tool_calls": [_call("submit")]}]})
    data = _agent(server, ws, tmp_path, max_retries=2).run(**_task(ws))
    assert data["exit_reason"] == "model_error" and "failed 3 times" in data["exit_message"]
    assert len(server.requests) == 3


def test_client_error_is_not_retried(repo, scripted, tmp_path):
    ws, _ = repo
    server = scripted({"inst1": [{"fail": [400], "tool_calls": [_call("submit")]}]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "model_error" and "HTTP 400" in data["exit_message"]
    assert len(server.requests) == 1


def test_step_limit_and_tool_errors(repo, scripted, tmp_path):
    ws, _ = repo
    server = scripted({"*": [{"tool_calls": [_call("read", path="missing.py")]}] * 5})
    data = _agent(server, ws, tmp_path, max_steps=3).run(**_task(ws))
    assert data["exit_reason"] == "max_steps" and data["n_steps"] == 3
    assert data["messages"][3]["content"].startswith("Error: no such file: missing.py")
    assert all(a["ok"] is False for s in data["steps"] for a in s["actions"])


def test_denied_call_removed_by_gateway_is_reported(repo, scripted, tmp_path):
    """The gateway removed the denied call and said so: nothing runs, the verdict is recorded,
    the model is told, and the loop goes on to submit."""
    ws, base = repo
    verdict = {"tool": "write", "allowed": False, "reason": "writes outside src/ are denied",
               "rule": "deny-write-root", "call_ref": "call_removed",
               "arguments_digest": arguments_digest({"path": "evil.py", "content": "x = 1\n"})}
    server = scripted({"inst1": [
        {"content": "[fak policy] denied write: writes outside src/ are denied",
         "fak_policy": {"verdicts": [verdict]}},
        {"tool_calls": [_call("submit")]},
    ]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "submitted" and data["n_denied"] == 1
    assert data["steps"][0]["verdicts"] == [verdict] and data["steps"][0]["format_error"] is None
    assert "[fak policy] denied write: writes outside src/ are denied" in data["messages"][3]["content"]
    assert not (ws.root / "evil.py").exists()
    assert ws.diff(base) == ""


@pytest.mark.parametrize("max_actions", [0, 1])
def test_denied_call_left_in_reply_never_executes(repo, scripted, tmp_path, max_actions):
    """Defence in depth: even if the denied call is still in tool_calls, it is not executed.
    With every call of a reply carried out (0), the allowed call of the same turn is; with one
    call per reply (1, the default), the denied first call is reported and the rest dropped."""
    ws, _ = repo
    evil = {"path": "evil.py", "content": "x = 1\n"}
    server = scripted({"inst1": [
        {"tool_calls": [_call("write", "call_w", **evil), _call("list", "call_l")],
         "fak_policy": {"verdicts": [
             {"tool": "write", "allowed": False, "reason": "denied by test", "rule": "r1",
              "call_ref": "call_w", "arguments_digest": arguments_digest(evil)},
             {"tool": "list", "allowed": True, "reason": "", "rule": "r0", "call_ref": "call_l",
              "arguments_digest": arguments_digest({})}]}},
        {"tool_calls": [_call("submit")]},
    ]})
    agent = _agent(server, ws, tmp_path)
    agent.config.max_actions_per_step = max_actions
    data = agent.run(**_task(ws))
    assert not (ws.root / "evil.py").exists()
    actions = data["steps"][0]["actions"]
    assert actions[0]["name"] == "write" and actions[0]["denied"] and not actions[0]["executed"]
    assert actions[0]["verdict"]["rule"] == "r1"
    if max_actions == 1:
        assert len(actions) == 1 and data["steps"][0]["dropped"] == [{"name": "list", "arguments": {}}]
        assert [c["function"]["name"] for c in data["messages"][2]["tool_calls"]] == ["write"]
        assert data["exit_reason"] == "submitted"
        return
    assert actions[1]["name"] == "list" and actions[1]["executed"] and "calc.py" in actions[1]["output"]
    assert actions[1]["verdict"]["allowed"] is True and actions[1]["verdict"]["rule"] == "r0"
    assert data["exit_reason"] == "submitted"
    tool_msgs = [m for m in data["messages"] if m["role"] == "tool"]
    assert tool_msgs[0]["content"].startswith("[fak policy] denied write")


def test_text_protocol_denial(repo, scripted, tmp_path):
    ws, _ = repo
    server = scripted({"inst1": [
        {"content": "```bash\ntouch pwned\n```",
         "fak_policy": {"verdicts": [{"tool": "bash", "allowed": False, "reason": "no touching",
                                      "rule": "r", "arguments_digest": "opaque-digest"}]}},
        {"content": "```bash\nsubmit\n```"},
    ]})
    data = _agent(server, ws, tmp_path, protocol="text", allow_exec=True).run(**_task(ws))
    assert not (ws.root / "pwned").exists()
    assert data["steps"][0]["actions"][0]["denied"] is True
    assert data["exit_reason"] == "submitted"


def test_observation_window_cuts_old_outputs(repo, scripted, tmp_path):
    ws, _ = repo
    (ws.root / "big.txt").write_text("a line of text in a big file\n" * 3000)
    server = scripted({"inst1": [{"tool_calls": [_call("read", path="big.txt", start_line=n)]}
                                 for n in (1, 101, 201)] + [{"tool_calls": [_call("submit")]}]})
    agent = _agent(server, ws, tmp_path)
    agent.config.observation_window = 1
    agent.config.old_observation_chars = 100
    agent.run(**_task(ws))
    last = server.requests[-1]["body"]["messages"]
    tool_lens = [len(m["content"]) for m in last if m["role"] == "tool"]
    assert tool_lens[0] < 200 and tool_lens[-1] > 2000  # old cut, newest whole
    assert all(len(m["content"]) > 2000 for m in agent.messages if m["role"] == "tool")


def test_protocol_parsing():
    tools = ToolCallProtocol(allow_exec=False)
    with pytest.raises(FormatError):
        tools.parse({"content": "I think the bug is in add"})
    with pytest.raises(FormatError, match="not valid JSON"):
        tools.parse({"tool_calls": [{"id": "1", "function": {"name": "read", "arguments": "{bad"}}]})
    acts = tools.parse({"content": 'ok <tool_call>\n{"name": "read", "arguments": '
                                   '{"path": "a.py"}}\n</tool_call>'})
    assert [(a.name, a.arguments) for a in acts] == [("read", {"path": "a.py"})]
    assert tools.observation(acts[0], "x", None, 10)["role"] == "user"  # no id to answer
    # Qwen2.5's call written in the content: closed, cut at the stop string, or bare JSON
    acts = tools.parse({"content": '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}'})
    assert [(a.name, a.arguments) for a in acts] == [("read", {"path": "a.py"})]
    acts = tools.parse({"content": '{"name": "list", "arguments": {}}\n{"name": "submit", "argu'})
    assert [a.name for a in acts] == ["list"]
    with pytest.raises(FormatError, match="not valid JSON"):
        tools.parse({"content": '<tool_call>\n{"name": "read", "arguments": {"path": '})
    with pytest.raises(FormatError, match="empty"):
        tools.parse({"content": ""})
    with pytest.raises(FormatError):  # JSON that names no tool of ours is prose, not a call
        tools.parse({"content": '{"name": "Alice"}'})
    assert tools.request_options() == {"tool_choice": "required", "stop": ["</tool_call>"]}
    assert ToolCallProtocol(allow_exec=False, tool_choice="auto").request_options()["tool_choice"] == "auto"
    with pytest.raises(ValueError):
        ToolCallProtocol(allow_exec=False, tool_choice="any")
    text = TextProtocol(allow_exec=True)
    two = {"content": "First.\n```bash\nls\n```\nThen:\n```bash\npwd\n```"}
    acts = text.parse(two)
    assert [a.arguments["command"] for a in acts] == ["ls", "pwd"]
    assert text.trim_history(text.history_message(two), acts[:1])["content"] == "First.\n```bash\nls\n```"
    assert text.parse({"content": "```bash\n  submit \n```"})[0].name == "submit"
    assert text.parse({"content": "```sh\nls -la\n```"})[0].arguments == {"command": "ls -la"}
    structured = {"content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "bash", "arguments": json.dumps({"command": "submit"})}}]}
    assert text.parse(structured)[0].name == "submit"  # a gateway that parsed the block
    assert "tool_calls" not in text.history_message(structured)
    with pytest.raises(ValueError, match="--allow-exec"):
        TextProtocol(allow_exec=False)


def test_one_call_per_reply_rest_dropped(repo, scripted, tmp_path):
    """A reply with several calls runs the first only; the history keeps only that call and its
    observation says the others were ignored (small models plan a whole fix in one reply)."""
    ws, _ = repo
    server = scripted({"inst1": [
        {"tool_calls": [_call("read", path="calc.py"),
                        _call("edit", path="calc.py", old="return a - b", new="return a + b"),
                        _call("submit")]},
        {"tool_calls": [_call("submit")]},
    ]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "submitted" and data["n_steps"] == 2
    assert "return a - b" in (ws.root / "calc.py").read_text()  # the edit was not run
    step = data["steps"][0]
    assert [a["name"] for a in step["actions"]] == ["read"]
    assert [d["name"] for d in step["dropped"]] == ["edit", "submit"]
    assert len(step["response"]["tool_calls"]) == 3  # the raw reply is kept in the record
    sent = server.requests[1]["body"]["messages"]
    assert [c["function"]["name"] for c in sent[2]["tool_calls"]] == ["read"]
    assert sent[3]["role"] == "tool" and sent[3]["content"].startswith("[Only your first call was run")
    # tool_choice and the stop string went with every request
    assert server.requests[0]["body"]["tool_choice"] == "required"
    assert server.requests[0]["body"]["stop"] == ["</tool_call>"]


def test_repeated_call_is_pointed_out(repo, scripted, tmp_path):
    """``on_repeat="run"`` (the old behaviour): the repeat runs and the model is told."""
    ws, _ = repo
    server = scripted({"inst1": [{"tool_calls": [_call("list")]}] * 3})
    agent = _agent(server, ws, tmp_path, max_steps=3)
    agent.config.on_repeat = "run"
    data = agent.run(**_task(ws))
    tool_msgs = [m["content"] for m in data["messages"] if m["role"] == "tool"]
    assert "same call before" not in tool_msgs[0]
    assert all("same call before" in t for t in tool_msgs[1:])
    assert data["n_repeated"] == 2
    assert all(a["executed"] for s in data["steps"] for a in s["actions"])


def test_repeated_call_is_not_run_with_tell(repo, scripted, tmp_path):
    """``on_repeat="tell"``: an identical call (normalized: ``./calc.py`` is ``calc.py``, line 1 is
    the default start) is not executed again; the model is told the step it repeats."""
    ws, _ = repo
    server = scripted({"inst1": [
        {"tool_calls": [_call("read", path="calc.py")]},
        {"tool_calls": [_call("read", path="./calc.py", start_line=1)]},
        {"tool_calls": [_call("read", path="calc.py", start_line="1")]},
    ]})
    agent = _agent(server, ws, tmp_path, max_steps=3)
    agent.config.on_repeat = "tell"
    data = agent.run(**_task(ws))
    actions = [a for s in data["steps"] for a in s["actions"]]
    assert actions[0]["executed"] and "def add" in actions[0]["output"]
    for a in actions[1:]:
        assert not a["executed"] and a["repeated"] and a["repeat_of"] == 1
        assert a["output"].startswith("[not run] You already made this exact call at step 1")
    assert data["n_repeated"] == 2 and data["n_resampled"] == 0
    tool_msgs = [m["content"] for m in data["messages"] if m["role"] == "tool"]
    assert tool_msgs[1].startswith("[not run]")
    assert len(server.requests) == 3  # no resampling


def test_repeated_call_is_resampled(repo, scripted, tmp_path):
    """The default: a reply whose call repeats an earlier one is dropped and the turn sampled
    again with a temperature and a new seed; the repeat never enters the history."""
    ws, _ = repo
    search = _call("search", pattern="def add")
    server = scripted({"inst1": [
        {"tool_calls": [search]},
        {"tool_calls": [search], "resampled": [{"tool_calls": [search]},
                                               {"tool_calls": [_call("read", path="calc.py")]}]},
        {"tool_calls": [_call("submit")]},
    ]})
    agent = _agent(server, ws, tmp_path)
    assert agent.config.on_repeat == "resample" and agent.config.repeat_resamples == 2
    data = agent.run(**_task(ws))
    assert data["exit_reason"] == "submitted" and data["n_steps"] == 3
    step2 = data["steps"][1]
    assert [a["name"] for a in step2["actions"]] == ["read"] and step2["actions"][0]["executed"]
    res = step2["resamples"]
    assert [r["attempt"] for r in res] == [1, 2] and data["n_resampled"] == 2
    assert all(r["repeated_call"] == {"name": "search", "arguments": {"pattern": "def add"}}
               and r["repeat_of_step"] == 1 for r in res)
    assert res[0]["response"]["tool_calls"][0]["function"]["name"] == "search"
    # the resamples asked for a temperature and distinct seeds; the first try of a turn did not
    bodies = [r["body"] for r in server.requests]
    assert [b.get("seed") for b in bodies] == [None, None, 2001, 2002, None]  # 1000*step + n
    assert [b.get("temperature") for b in bodies][2:4] == [0.7, 0.7]
    assert bodies[2]["tool_choice"] == "required"  # the protocol's options stay
    # the history holds one assistant turn per step: the repeats were dropped
    names = [m["tool_calls"][0]["function"]["name"] for m in data["messages"]
             if m["role"] == "assistant"]
    assert names == ["search", "read", "submit"]
    assert data["n_repeated"] == 0


def test_resamples_are_bounded_then_told(repo, scripted, tmp_path):
    ws, _ = repo
    lst = _call("list")
    server = scripted({"inst1": [{"tool_calls": [lst]},
                                 {"tool_calls": [lst], "resampled": [{"tool_calls": [lst]}]}]})
    agent = _agent(server, ws, tmp_path, max_steps=2)
    agent.config.repeat_resamples = 3
    data = agent.run(**_task(ws))
    step2 = data["steps"][1]
    assert len(step2["resamples"]) == 3 and len(server.requests) == 1 + 1 + 3
    action = step2["actions"][0]
    assert action["repeated"] and not action["executed"] and data["n_repeated"] == 1
    assert "read or search one of the files it listed" in action["output"]


def test_same_call_after_a_change_runs_again(repo, scripted, tmp_path):
    """A call identical to an earlier one runs again when a file changed in between (its result
    may differ): read, edit, read; a failed edit changes nothing, so its repeat is a repeat."""
    ws, _ = repo
    bad = _call("edit", path="calc.py", old="return a -- b", new="return a + b")
    server = scripted({"inst1": [
        {"tool_calls": [_call("read", path="calc.py")]},
        {"tool_calls": [bad]},
        {"tool_calls": [bad]},
        {"tool_calls": [_call("edit", path="calc.py", old="return a - b", new="return a + b")]},
        {"tool_calls": [_call("read", path="calc.py")]},
    ]})
    agent = _agent(server, ws, tmp_path, max_steps=5)
    agent.config.on_repeat = "tell"
    data = agent.run(**_task(ws))
    acts = [s["actions"][0] for s in data["steps"]]
    assert [a["executed"] for a in acts] == [True, True, False, True, True]
    assert acts[2]["repeat_of"] == 2 and "(it failed)" in acts[2]["output"]
    assert "copy `old` exactly" in acts[2]["output"]
    assert "return a + b" in acts[4]["output"]


def test_same_denied_call_is_resampled(repo, scripted, tmp_path):
    """The gateway removed a call it denied (an unknown tool, say); the same denial again at the
    next step is a repeat: that turn is resampled."""
    ws, _ = repo
    verdict = {"tool": "PolyElement.as_expr()", "allowed": False, "reason": "unknown tool",
               "rule": "default", "arguments_digest": arguments_digest({"x": 1})}
    denied = {"content": "[fak policy] Tool call `PolyElement.as_expr()` was denied",
              "fak_policy": {"verdicts": [verdict]}}
    server = scripted({"inst1": [
        denied,
        {**denied, "resampled": [{"tool_calls": [_call("search", pattern="as_expr")]}]},
        {"tool_calls": [_call("submit")]},
    ]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "submitted"
    res = data["steps"][1]["resamples"]
    assert len(res) == 1 and res[0]["repeated_call"] == {"name": "PolyElement.as_expr()",
                                                         "denied": True}
    assert res[0]["repeat_of_step"] == 1 and res[0]["verdicts"] == [verdict]
    assert data["steps"][1]["actions"][0]["name"] == "search"
    assert data["n_denied"] == 1  # the dropped reply's verdict is in its resample record


def test_config_checks_on_repeat():
    with pytest.raises(ValueError, match="on_repeat"):
        AgentConfig(on_repeat="ignore")
    with pytest.raises(ValueError, match="repeat_resamples"):
        AgentConfig(repeat_resamples=-1)


def test_seed_locations_in_first_message(repo, scripted, tmp_path):
    """Seed locations from a localizer are shown in the first user message (files not in the
    workspace dropped) and recorded; the prompts' examples are real paths of the workspace."""
    ws, _ = repo
    server = scripted({"inst1": [{"tool_calls": [_call("submit")]}]})
    agent = _agent(server, ws, tmp_path)
    seeds = [{"path": "calc.py", "line": 1, "symbol": "add"}, {"path": "nope.py", "line": 3},
             {"path": "pkg/util.py"}, "calc.py"]
    data = agent.run(**_task(ws), seed_locations=seeds)
    first = data["messages"][1]["content"]
    assert "Likely relevant" in first
    assert "- calc.py line 1 (add)\n- pkg/util.py" in first and "nope.py" not in first
    assert data["info"]["seed_locations"] == [{"path": "calc.py", "line": 1, "symbol": "add"},
                                              {"path": "pkg/util.py"}, {"path": "calc.py"}]
    system = data["messages"][0]["content"]
    assert "for example `calc.py`" in system and "src/package" not in system
    assert data["info"]["prompt_examples"]["example_path"] == "calc.py"
    # without seeds: no such section
    server2 = scripted({"inst1": [{"tool_calls": [_call("submit")]}]})
    data2 = _agent(server2, ws, tmp_path).run(**_task(ws))
    assert "Likely relevant" not in data2["messages"][1]["content"]
    assert data2["info"]["seed_locations"] == []


def test_python_note_is_shown_with_exec(repo, scripted, tmp_path):
    ws, _ = repo
    server = scripted({"inst1": [{"content": "```bash\nsubmit\n```"}]})
    note = "`python` here is Python 3.9.18 (the task's environment)."
    data = _agent(server, ws, tmp_path, protocol="text", allow_exec=True).run(
        **_task(ws), python_note=note)
    assert note in data["messages"][1]["content"]
    server2 = scripted({"inst1": [{"tool_calls": [_call("submit")]}]})
    data2 = _agent(server2, ws, tmp_path).run(**_task(ws), python_note=note)
    assert note not in data2["messages"][1]["content"]  # no bash: nothing runs python


def test_thought_before_the_call_is_kept(repo, scripted, tmp_path):
    """A short thought before the call: in the tools protocol, content beside the tool call; in
    the text protocol, prose before the block. The call runs; the thought stays in the history."""
    ws, _ = repo
    server = scripted({"inst1": [
        {"content": "The bug is in add; look at it.", "tool_calls": [_call("read", path="calc.py")]},
        {"tool_calls": [_call("submit")]},
    ]})
    agent = Agent(OpenAIChatModel(server.url, "scripted", backoff_s=0.01,
                                  headers={"X-Fak-Conversation": "run1/inst1"}),
                  ToolBox(ws), get_protocol("tools", allow_exec=False, tool_choice="auto"),
                  AgentConfig(max_steps=3), Trajectory(tmp_path / "t.traj.json"))
    data = agent.run(**_task(ws))
    assert data["steps"][0]["actions"][0]["executed"]
    assert data["messages"][2]["content"] == "The bug is in add; look at it."
    assert "you may write one short sentence" in data["messages"][0]["content"]
    assert server.requests[0]["body"]["tool_choice"] == "auto"
    # with tool_choice "required" the gateway pre-fills the call: the prompt does not offer it
    assert "short sentence" not in get_protocol("tools", allow_exec=False).system_prompt()


def test_failed_reply_is_shortened_in_history(repo, scripted, tmp_path):
    ws, _ = repo
    rambling = "I will now think about the problem. " * 100
    server = scripted({"inst1": [{"content": rambling}, {"tool_calls": [_call("submit")]}]})
    agent = _agent(server, ws, tmp_path)
    data = agent.run(**_task(ws))
    assert data["n_format_errors"] == 1 and data["exit_reason"] == "submitted"
    assert len(server.requests[1]["body"]["messages"][2]["content"]) < 500
    assert data["steps"][0]["response"]["content"] == rambling  # the record keeps it whole


def test_context_limit_ends_the_run_as_finished(repo, scripted, tmp_path):
    """``context_length_exceeded`` ends the run (exit ``context_limit``), the changes so far kept."""
    ws, _ = repo
    server = scripted({"inst1": [
        {"tool_calls": [_call("edit", path="calc.py", old="return a - b", new="return a + b")]},
        {"fail": [400], "error_code": "context_length_exceeded", "tool_calls": [_call("submit")]},
    ]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert data["exit_reason"] == "context_limit"
    assert "return a + b" in (ws.root / "calc.py").read_text()


def test_with_a_policy_only_adjudicated_calls_run(repo, scripted, tmp_path):
    """When the gateway runs a policy (``fak_policy`` present), a call it did not adjudicate (a
    bare call object the agent reads at the start of the content, which the gateway left as text)
    is never run; a call whose ``call_ref`` an allowing verdict names is."""
    ws, _ = repo
    edit = {"path": "calc.py", "old": "return a - b", "new": "return a + b"}
    ok = {"tool": "read", "allowed": True, "reason": "", "rule": "r", "call_ref": "call_r",
          "arguments_digest": arguments_digest({"path": "calc.py"})}
    server = scripted({"inst1": [
        {"content": '{"name": "edit", "arguments": ' + json.dumps(edit) + "} junk",
         "fak_policy": {"verdicts": []}},
        {"tool_calls": [_call("read", "call_r", path="calc.py")], "fak_policy": {"verdicts": [ok]}},
        {"tool_calls": [_call("submit", "call_s")], "fak_policy": {"verdicts": [
            {"tool": "submit", "allowed": True, "reason": "", "rule": "s", "call_ref": "call_s",
             "arguments_digest": arguments_digest({})}]}},
    ]})
    data = _agent(server, ws, tmp_path).run(**_task(ws))
    assert "return a - b" in (ws.root / "calc.py").read_text()  # the unchecked edit did not run
    first = data["steps"][0]["actions"][0]
    assert first["name"] == "edit" and not first["executed"] and first["not_adjudicated"]
    assert data["steps"][1]["actions"][0]["executed"] and data["exit_reason"] == "submitted"


def test_text_protocol_submit_matches_its_bash_verdict(repo, scripted, tmp_path):
    ws, _ = repo
    allow = {"tool": "bash", "allowed": True, "reason": "", "rule": "b", "call_ref": "block:0",
             "span": [6, len("Done.\n```bash\nsubmit\n```")],
             "arguments_digest": arguments_digest({"command": "submit"})}
    server = scripted({"inst1": [{"content": "Done.\n```bash\nsubmit\n```",
                                  "fak_policy": {"verdicts": [allow]}}]})
    data = _agent(server, ws, tmp_path, protocol="text", allow_exec=True).run(**_task(ws))
    assert data["exit_reason"] == "submitted"
    assert data["steps"][0]["actions"][0]["verdict"] == allow


def test_text_blocks_matched_by_call_ref_span(repo, scripted, tmp_path):
    """Each shell block finds its verdict by the span of the gateway's ``block:N`` verdict (the
    same parser finds the blocks on both sides); a block no verdict's span covers is not run."""
    ws, _ = repo
    content = "First:\n```bash\ntouch one\n```\nthen\n```bash\ntouch two\n```\nand ```bash\ntouch three\n```"
    from fak.toolcalls import shell_blocks

    spans = [[b.start, b.end] for b in shell_blocks(content)]
    verdicts = [{"tool": "bash", "allowed": True, "reason": "", "rule": f"r{i}", "call_ref": f"block:{i}",
                 "span": spans[i]} for i in range(2)]  # the third block has no verdict
    server = scripted({"inst1": [{"content": content, "fak_policy": {"verdicts": verdicts}},
                                 {"content": "```bash\nsubmit\n```", "fak_policy": {"verdicts": [
                                     {"tool": "bash", "allowed": True, "reason": "", "rule": "s",
                                      "call_ref": "block:0", "span": [0, 20]}]}}]})
    agent = _agent(server, ws, tmp_path, protocol="text", allow_exec=True)
    agent.config.max_actions_per_step = 0
    data = agent.run(**_task(ws))
    actions = data["steps"][0]["actions"]
    assert [a["verdict"] and a["verdict"]["rule"] for a in actions] == ["r0", "r1", None]
    assert [a["executed"] for a in actions] == [True, True, False] and actions[2]["not_adjudicated"]
    assert (ws.root / "one").exists() and (ws.root / "two").exists() and not (ws.root / "three").exists()
    assert data["exit_reason"] == "submitted"


def test_calls_in_text_are_checked_as_the_gateway_checks_them():
    """The tool protocol reads calls written in the content with the gateway's parser and the
    offered tools' schemas (``fak.toolcalls``): a call that does not fit says why."""
    tools = ToolCallProtocol(allow_exec=False)
    with pytest.raises(FormatError, match="not one of the offered tools"):
        tools.parse({"content": '<tool_call>\n{"name": "autumn", "arguments": {}}\n</tool_call>'})
    with pytest.raises(FormatError, match="bash"):  # bash is not offered without allow_exec
        tools.parse({"content": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'})
    with pytest.raises(FormatError, match=r"schema: .*start_line"):
        tools.parse({"content": '<tool_call>\n{"name": "read", "arguments": {"path": "a.py", "start_line": "x"}}'})
    with pytest.raises(FormatError, match="required"):
        tools.parse({"content": '{"name": "edit", "arguments": {"path": "a.py"}} and then'})
    acts = tools.parse({"content": '<tool_call>\n{"name": "read", "arguments": {"path": "a.py", "start_line": 3}}'})
    assert [(a.name, a.arguments, a.call_ref) for a in acts] == [("read", {"path": "a.py", "start_line": 3}, None)]
    acts = tools.parse({"tool_calls": [{"id": "call_1", "function": {"name": "list", "arguments": "{}"}}]})
    assert acts[0].call_ref == "call_1"


def test_inline_reads_are_recorded_in_the_history(tmp_path):
    """A response with ``fak.inline_reads`` (``fak serve --serve-inline-reads``): the pairs the
    gateway answered go into the history before the returned assistant message, and into the
    step record, so the next request is the prompt the model saw."""
    from fak.agent.model import ModelResponse

    pair = {"assistant": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_i", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}]},
            "tool": {"role": "tool", "tool_call_id": "call_i", "content": "1: x = 1"}, "served_from": "call_0"}
    returned = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_n", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}

    class Stub:
        def query(self, messages, tools=None, options=None):
            return ModelResponse(message=returned, usage={}, policy=None, latency_s=0.0,
                                 raw={"fak": {"inline_reads": [pair]}})

    agent = Agent(Stub(), None, get_protocol("tools", allow_exec=False), AgentConfig(), Trajectory(tmp_path / "t.json"))
    record: dict = {}
    agent.query(record)
    assert agent.messages[-3:] == [pair["assistant"], pair["tool"], agent.protocol.history_message(returned)]
    assert record["inline_reads"] == [pair] and agent.trajectory.data["n_inline_reads"] == 1
