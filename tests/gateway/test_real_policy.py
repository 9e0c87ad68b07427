"""The gateway with the real ``fak.policy`` (the SWE-bench coding-agent example policy).

The same promises as ``test_policy_filter.py``, now with the real decision path and audit log:
a denied call is removed (engine and proxy mode, streamed or not), the client sees the policy's
own reason and rule, and every decision is one JSONL line in the audit log. Paths are checked
against the workspace given in ``X-Fak-Workspace``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from fak.gateway import BackgroundServer, Upstream
from fak.policy import AuditLog, Policy
from fak.toolcalls.wire import arguments_digest
from gateway_fakes import (
    BASH_TOOL,
    FakeEngine,
    FakeUpstream,
    UpstreamReply,
    audit_lines,
)

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "examples" / "swebench-coding-agent-policy.json"
READ_TOOL = {"type": "function", "function": {"name": "read", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}}}}


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SCRIPT = [
    ("push it", "Pushing.\n" + call("bash", command="git push origin main") + "\n" + call("bash", command="git status")),
    ("escalate", call("bash", command="sudo rm -rf /")),
    ("read secrets", call("read", path="../../etc/shadow") + "\n" + call("read", path="src/app.py")),
    ("launch", call("rocket", target="moon")),
]


@pytest.fixture
def real(start_gateway: Any, tmp_path: Path) -> tuple[Any, Path, Path]:
    audit_path = tmp_path / "audit.jsonl"
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "app.py").write_text("print('hi')\n")
    audit = AuditLog(audit_path)
    srv = start_gateway(engine=FakeEngine(script=SCRIPT), policy=Policy.load(POLICY), audit=audit)
    return srv, audit_path, workspace


def without_notes(content: str) -> str:
    """The content minus the policy's notes (a reason may quote the offending command)."""
    return "\n".join(line for line in content.split("\n") if not line.startswith("[fak policy]"))


def ask(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[str, list[str]]:
    """One chat completion, streamed or not: ``(content, [function.arguments of each tool call])``."""
    if stream:
        content, calls = "", []
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for ch in chunk.choices:
                content += ch.delta.content or ""
                calls += [tc.function.arguments for tc in ch.delta.tool_calls or []]
        return content, calls
    msg = client.chat.completions.create(**kwargs).choices[0].message
    return msg.content or "", [tc.function.arguments for tc in msg.tool_calls or []]


def headers(workspace: Path, conversation: str = "real-1") -> dict[str, str]:
    return {"X-Fak-Workspace": str(workspace), "X-Fak-Conversation": conversation}


@pytest.mark.parametrize("stream", [False, True])
def test_git_push_denied_git_status_kept(real: Any, stream: bool) -> None:
    srv, audit_path, ws = real
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    kwargs = dict(model="fake-qwen", messages=[{"role": "user", "content": "push it"}], tools=[BASH_TOOL],
                  extra_headers=headers(ws))
    content, calls = ask(client, stream, **kwargs)
    assert [json.loads(a)["command"] for a in calls] == ["git status"]
    assert "git push origin" not in without_notes(content)
    assert "[fak policy] Tool call `bash` was denied: pushing is not allowed" in content
    assert "(rule: tools.bash.deny[" in content
    lines = audit_lines(audit_path)
    assert [(x["tool"], x["verdict"], x["conversation"]) for x in lines] == [
        ("bash", "deny", "real-1"), ("bash", "allow", "real-1")]
    assert all(len(x["arguments_digest"]) >= 16 and "git" not in x["arguments_digest"] for x in lines)


def test_path_scope_uses_workspace_header(real: Any) -> None:
    srv, audit_path, ws = real
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    r = client.chat.completions.create(model="fake-qwen", messages=[{"role": "user", "content": "read secrets"}],
                                       tools=[READ_TOOL], extra_headers=headers(ws))
    kept = r.choices[0].message.tool_calls
    assert [json.loads(tc.function.arguments)["path"] for tc in kept] == ["src/app.py"]
    assert "inside its workspace only" in r.choices[0].message.content
    verdicts = r.model_extra["fak_policy"]["verdicts"]
    assert [v["allowed"] for v in verdicts] == [False, True]
    # the verdict's digest is the audit log's, and the one the agent computes from the kept call
    assert verdicts[1]["arguments_digest"] == arguments_digest(
        json.loads(kept[0].function.arguments))
    assert [v["arguments_digest"] for v in verdicts] == [
        x["arguments_digest"] for x in audit_lines(audit_path)]


def test_unknown_tool_denied_by_default(real: Any) -> None:
    srv, _, ws = real
    r = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0).chat.completions.create(
        model="fake-qwen", messages=[{"role": "user", "content": "launch"}], extra_headers=headers(ws),
        tools=[{"type": "function", "function": {"name": "rocket", "parameters": {"type": "object"}}}])
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert r.model_extra["fak_policy"]["verdicts"][0]["rule"] == "default"


def test_text_tools_with_real_policy(start_gateway: Any, tmp_path: Path) -> None:
    eng = FakeEngine(script=[("go", "THOUGHT: escalate.\n```bash\nsudo apt-get install evil\n```")])
    srv = start_gateway(engine=eng, policy=Policy.load(POLICY), audit=AuditLog(tmp_path / "a.jsonl"))
    r = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0).chat.completions.create(
        model="fake-qwen", messages=[{"role": "user", "content": "go"}],
        extra_headers={"X-Fak-Text-Tools": "bash", "X-Fak-Workspace": str(tmp_path)})
    content = r.choices[0].message.content
    assert "apt-get install evil" not in without_notes(content) and "```" not in content
    assert content.startswith("THOUGHT: escalate.\n[fak policy] Tool call `bash` was denied: privilege escalation")


@pytest.mark.parametrize("stream", [False, True])
def test_proxy_with_real_policy(start_gateway: Any, tmp_path: Path, stream: bool) -> None:
    fake = FakeUpstream(script={"escalate": UpstreamReply(tool_calls=[("bash", {"command": "sudo su"}),
                                                                      ("bash", {"command": "pytest -x"})])})
    audit_path = tmp_path / "audit.jsonl"
    with BackgroundServer(fake.app()) as up:
        srv = start_gateway(upstream=Upstream(up.base_url), policy=Policy.load(POLICY), audit=AuditLog(audit_path))
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        kwargs = dict(model="up-model", messages=[{"role": "user", "content": "escalate"}], tools=[BASH_TOOL],
                      extra_headers=headers(tmp_path, "proxy-1"))
        content, calls = ask(client, stream, **kwargs)
    assert [json.loads(a)["command"] for a in calls] == ["pytest -x"]
    assert "sudo su" not in without_notes(content) and "privilege escalation is not allowed" in content
    assert [(x["verdict"], x["conversation"]) for x in audit_lines(audit_path)] == [
        ("deny", "proxy-1"), ("allow", "proxy-1")]


@pytest.mark.parametrize("reply", [
    "```sh\nsudo su\n```",
    "```Shell\nsudo su\n```",
    "```python\nx = '```bash\nsudo su\n```'\n```",
    "Try this ```bash sudo su```",
    "```bash\nsudo su",
])
def test_text_tools_fence_evasions(start_gateway: Any, tmp_path: Path, reply: str) -> None:
    """Every fence an agent would run is adjudicated, whatever its spelling or nesting."""
    srv = start_gateway(engine=FakeEngine(script=[("go", reply)], chunk=3), policy=Policy.load(POLICY))
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    for stream in (False, True):
        kwargs = dict(model="fake-qwen", messages=[{"role": "user", "content": "go"}],
                      extra_headers={"X-Fak-Text-Tools": "bash", "X-Fak-Workspace": str(tmp_path)})
        if stream:
            content = "".join(ch.delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                              for ch in c.choices)
        else:
            content = client.chat.completions.create(**kwargs).choices[0].message.content
        assert "sudo su" not in without_notes(content), (reply, stream, content)
        assert "privilege escalation is not allowed" in content
