"""Policy integration in engine mode: denied calls never leave the gateway.

A fake policy (``gateway_fakes.FakePolicy``: deny ``delete_file``, deny bash commands with
``rm -rf``/``sudo``) stands in for ``fak.policy.Policy``; ``test_real_policy.py`` repeats the key
cases with the real one. Each test checks the three promises: the denied call is gone from what the
client receives (raw bytes, streamed or not), a note says which call was denied and why, and the
decision is in the audit log and in ``fak_policy``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_fakes import (
    BASH_TOOL,
    SCRIPT,
    FakeAudit,
    FakeEngine,
    FakePolicy,
    WEATHER_TOOL,
    audit_lines,
)

from fak.toolcalls.wire import arguments_digest

MODEL = "fake-qwen"
DENIED_ARGS = {"command": "rm -rf /"}
DELETE_TOOL = {"type": "function", "function": {"name": "delete_file", "parameters": {"type": "object"}}}
NOTE_RM = "[fak policy] Tool call `bash` was denied: command matches deny pattern 'rm -rf' (rule: bash.command.deny)."


@pytest.fixture
def policed(start_gateway: Any, tmp_path: Path) -> tuple[Any, FakePolicy, Path]:
    policy = FakePolicy()
    audit = tmp_path / "audit.jsonl"
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT) + [
        ("delete it", '<tool_call>\n{"name": "delete_file", "arguments": {"path": "/etc/passwd"}}\n</tool_call>')]),
        policy=policy, audit=FakeAudit(audit))
    return srv, policy, audit


def sse_chunks(http: httpx.Client, url: str, body: dict, headers: dict | None = None) -> tuple[str, list[dict]]:
    with http.stream("POST", url, json={**body, "stream": True}, headers=headers or {}) as r:
        assert r.status_code == 200, r.read()
        raw = b"".join(r.iter_raw()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return raw, [json.loads(e[6:]) for e in events[:-1]]


def test_denied_call_removed_non_stream(policed: Any, http: httpx.Client) -> None:
    srv, policy, audit = policed
    r = http.post(srv.base_url + "/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "please clean up"}], "tools": [BASH_TOOL]},
        headers={"X-Fak-Conversation": "conv-1", "X-Fak-Workspace": "/work/repo"})
    assert r.status_code == 200
    assert "rm -rf /" not in r.text  # the denied command is nowhere in the response bytes
    body = r.json()
    msg = body["choices"][0]["message"]
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [{"command": "ls -la"}]
    assert msg["content"] == "Cleaning.\n" + NOTE_RM
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    verdicts = body["fak_policy"]["verdicts"]
    assert [(v["tool"], v["allowed"], v["rule"]) for v in verdicts] == [
        ("bash", False, "bash.command.deny"), ("bash", True, None)]
    assert verdicts[0]["tool_call_id"] is None and verdicts[1]["tool_call_id"] == msg["tool_calls"][0]["id"]
    # the agent's side of the contract: "sha256:" + SHA-256 of the canonical JSON of the arguments
    kept_args = json.loads(msg["tool_calls"][0]["function"]["arguments"])
    assert verdicts[1]["arguments_digest"] == arguments_digest(kept_args)
    assert verdicts[0]["arguments_digest"] == arguments_digest(DENIED_ARGS)
    assert [c[2:] for c in policy.calls] == [("conv-1", "/work/repo")] * 2
    lines = audit_lines(audit)
    assert [(x["conversation"], x["tool"], x["allowed"]) for x in lines] == [
        ("conv-1", "bash", False), ("conv-1", "bash", True)]


@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_denied_call_removed_stream(start_gateway: Any, http: httpx.Client, tmp_path: Path, chunk: int) -> None:
    audit = tmp_path / "a.jsonl"
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT), chunk=chunk), policy=FakePolicy(),
                        audit=FakeAudit(audit))
    raw, chunks = sse_chunks(http, srv.base_url + "/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "clean up"}], "tools": [BASH_TOOL]})
    assert "rm -rf /" not in raw
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content.startswith("Cleaning.") and NOTE_RM in content
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["index"] == 0 and json.loads(calls[0]["function"]["arguments"]) == {
        "command": "ls -la"}
    verdicts = [v for c in chunks for v in c.get("fak_policy", {}).get("verdicts", [])]
    assert [v["allowed"] for v in verdicts] == [False, True]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [x["allowed"] for x in audit_lines(audit)] == [False, True]


@pytest.mark.parametrize("stream", [False, True])
def test_all_calls_denied_finishes_with_stop(policed: Any, stream: bool) -> None:
    srv, _, audit = policed
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "delete it"}], tools=[DELETE_TOOL])
    note = "[fak policy] Tool call `delete_file` was denied: tool delete_file is not allowed (rule: tools.delete_file)."
    if stream:
        content, finish, calls = "", None, []
        for c in client.chat.completions.create(stream=True, **kwargs):
            for ch in c.choices:
                content += ch.delta.content or ""
                calls += ch.delta.tool_calls or []
                finish = ch.finish_reason or finish
        assert (content, finish, calls) == (note, "stop", [])
    else:
        r = client.chat.completions.create(**kwargs)
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].message.content == note
        assert r.choices[0].finish_reason == "stop"
        assert r.model_extra["fak_policy"]["verdicts"][0]["allowed"] is False
    assert "/etc/passwd" not in json.dumps(audit_lines(audit))  # the audit keeps a digest, not arguments


def test_conversation_key_sources(policed: Any, http: httpx.Client) -> None:
    srv, policy, _ = policed
    url = srv.base_url + "/chat/completions"
    first = [{"role": "system", "content": "S"}, {"role": "user", "content": "please clean up"}]
    http.post(url, json={"model": MODEL, "messages": first, "tools": [BASH_TOOL], "user": "alice"})
    assert policy.calls[-1][2] == "alice"
    http.post(url, json={"model": MODEL, "messages": first, "tools": [BASH_TOOL]})
    key = policy.calls[-1][2]
    assert key.startswith("h-") and len(key) == 18
    later = first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "clean up again"}]
    http.post(url, json={"model": MODEL, "messages": later, "tools": [BASH_TOOL]})
    assert policy.calls[-1][2] == key  # same first messages: same conversation
    other = [{"role": "system", "content": "S2"}, {"role": "user", "content": "please clean up"}]
    http.post(url, json={"model": MODEL, "messages": other, "tools": [BASH_TOOL]})
    assert policy.calls[-1][2] != key
    assert policy.calls[-1][3] is None  # no workspace header: the policy's own root
    r = http.post(url, json={"model": MODEL, "messages": first}, headers={"X-Fak-Workspace": "relative/dir"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Fak-Workspace"


def test_call_budget_per_conversation(start_gateway: Any, http: httpx.Client) -> None:
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT)), policy=FakePolicy(budget=1))
    url = srv.base_url + "/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "what weather"}], "tools": [WEATHER_TOOL, BASH_TOOL]}
    assert http.post(url, json=body, headers={"X-Fak-Conversation": "c"}).json()["choices"][0]["message"]["tool_calls"]
    second = http.post(url, json=body, headers={"X-Fak-Conversation": "c"}).json()
    assert "tool_calls" not in second["choices"][0]["message"]
    assert "budget" in second["choices"][0]["message"]["content"]
    assert http.post(url, json=body, headers={"X-Fak-Conversation": "d"}).json()["choices"][0]["message"]["tool_calls"]


class _BrokenPolicy:
    def decide(self, tool: str, arguments: Any, **_: Any) -> Any:
        raise RuntimeError("policy file vanished")


def test_failing_policy_denies(start_gateway: Any, http: httpx.Client) -> None:
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT)), policy=_BrokenPolicy())
    body = http.post(srv.base_url + "/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "weather"}], "tools": [WEATHER_TOOL, BASH_TOOL]}).json()
    assert "tool_calls" not in body["choices"][0]["message"]
    assert body["fak_policy"]["verdicts"][0]["rule"] == "policy-error"
    assert "policy file vanished" in body["choices"][0]["message"]["content"]


def test_no_policy_means_no_extension(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "clean up"}],
                                       tools=[BASH_TOOL])
    assert "fak_policy" not in (r.model_extra or {})
    assert len(r.choices[0].message.tool_calls) == 2


# ----------------------------------------------------------------------------- text tools (bash)

TEXT = {"X-Fak-Text-Tools": "bash"}


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_text_tools_bash_blocks(start_gateway: Any, http: httpx.Client, tmp_path: Path, chunk: int) -> None:
    audit = tmp_path / "t.jsonl"
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT), chunk=chunk), policy=FakePolicy(),
                        audit=FakeAudit(audit))
    url = srv.base_url + "/chat/completions"
    note = "[fak policy] Tool call `bash` was denied: command matches deny pattern 'sudo' (rule: bash.command.deny)."

    def ask(text: str, stream: bool, headers: dict = TEXT) -> tuple[str, list[dict]]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
        if stream:
            raw, chunks = sse_chunks(http, url, body, headers)
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            return content, [v for c in chunks for v in c.get("fak_policy", {}).get("verdicts", [])]
        r = http.post(url, json=body, headers=headers).json()
        return r["choices"][0]["message"]["content"], r.get("fak_policy", {}).get("verdicts", [])

    def at(content: str, verdict: dict) -> str:  # the text a verdict's call_ref span points at
        start, end = verdict["span"]
        return content[start:end]

    for stream in (False, True):
        content, verdicts = ask("list files", stream)
        assert content == "I will list the files.\n```bash\nls -la\n```"
        assert [(v["tool"], v["allowed"], v["call_ref"]) for v in verdicts] == [("bash", True, "block:0")]
        assert at(content, verdicts[0]) == "```bash\nls -la\n```"
        content, verdicts = ask("wipe disk", stream)
        assert content == "Wiping now.\n" + note + "\nDone."
        assert "sudo" not in content.replace(note, "")
        assert [v["allowed"] for v in verdicts] == [False]
        assert verdicts[0]["call_ref"] == "block:0" and at(content, verdicts[0]) == note  # the note's place
        content, verdicts = ask("never close", stream)  # an unclosed fence is adjudicated too
        assert content == "Here:\n" + note and [v["allowed"] for v in verdicts] == [False]
        assert at(content, verdicts[0]) == note
        content, verdicts = ask("wipe disk", stream, headers={})  # header absent: plain text
        assert "sudo shutdown -h now" in content and verdicts == []
    assert [x["allowed"] for x in audit_lines(audit)] == [True, False, False] * 2


def test_text_tools_on_completions(start_gateway: Any, http: httpx.Client) -> None:
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT)), policy=FakePolicy())
    r = http.post(srv.base_url + "/completions", json={"model": MODEL, "prompt": "wipe disk", "max_tokens": 100},
                  headers=TEXT).json()
    assert "sudo" not in r["choices"][0]["text"].split("denied")[0]
    assert r["fak_policy"]["verdicts"][0]["allowed"] is False
    # with echo, a block's span counts the echoed prompt too: it points into choices[0].text
    r = http.post(srv.base_url + "/completions", json={"model": MODEL, "prompt": "list files", "max_tokens": 100,
                                                       "echo": True}, headers=TEXT).json()
    text, verdict = r["choices"][0]["text"], r["fak_policy"]["verdicts"][0]
    assert text.startswith("list files") and verdict["call_ref"] == "block:0"
    assert text[verdict["span"][0]:verdict["span"][1]] == "```bash\nls -la\n```"


def test_text_tools_header_validation(gateway: Any, http: httpx.Client) -> None:
    r = http.post(gateway.base_url + "/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "x"}]}, headers={"X-Fak-Text-Tools": "python"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Fak-Text-Tools"


def test_merge_content_keeps_notes_and_calls_apart() -> None:
    from fak.toolcalls.wire import PolicyVerdictInfo
    from fak.gateway.policy_filter import ContentOut, ToolCallOut, merge_content
    from fak.toolcalls import ParsedToolCall

    v = PolicyVerdictInfo(tool="bash", allowed=False, reason="r")
    call = ToolCallOut(ParsedToolCall("f", "{}", ""), 0)
    events = [ContentOut("a"), ContentOut("b"), ContentOut("note", v), ContentOut("c"), call, ContentOut("d"),
              ContentOut("e")]
    merged = merge_content(events)
    assert [(e.text, e.verdict) if isinstance(e, ContentOut) else "call" for e in merged] == [
        ("ab", None), ("note", v), ("c", None), "call", ("de", None)]
