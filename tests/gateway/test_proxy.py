"""Proxy mode against a local fake upstream (``gateway_fakes.FakeUpstream``) on its own port.

The upstream streams tool calls the way vLLM does (header delta, then argument pieces), so the
gateway must buffer each call until it is complete before adjudicating it. To add a case, add a
trigger to ``UP_SCRIPT`` and assert on what the official client receives through the gateway.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fak.gateway import BackgroundServer, Upstream
from gateway_fakes import (
    BASH_TOOL,
    FakeAudit,
    FakePolicy,
    FakeUpstream,
    UpstreamReply,
    audit_lines,
)

UP_SCRIPT = {
    "weather": UpstreamReply(tool_calls=[("get_weather", {"city": "Paris"})]),
    "clean up": UpstreamReply(content="Cleaning.", tool_calls=[("bash", {"command": "rm -rf /"}),
                                                                ("bash", {"command": "ls -la"}),
                                                                ("bash", {"command": "pwd"})]),
    "delete": UpstreamReply(tool_calls=[("delete_file", {"path": "/etc/passwd"})]),
    "wipe": UpstreamReply(content="Wiping.\n```bash\nsudo shutdown now\n```\nDone."),
    "listing": UpstreamReply(content="```bash\nls\n```"),
}
NOTE_RM = "[fak policy] Tool call `bash` was denied: command matches deny pattern 'rm -rf' (rule: bash.command.deny)."


@pytest.fixture
def upstream() -> Any:
    fake = FakeUpstream(script=dict(UP_SCRIPT))
    with BackgroundServer(fake.app()) as srv:
        fake.url = srv.base_url  # type: ignore[attr-defined]
        yield fake


def proxy(start_gateway: Any, upstream: Any, **kw: Any) -> Any:
    return start_gateway(upstream=Upstream(upstream.url, "up-key"), **kw)


def oai(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="client-key", max_retries=0)


def collect(stream: Any) -> tuple[str, list[dict[str, Any]], str | None]:
    content, calls, finish = "", {}, None
    for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            finish = ch.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_passthrough_without_policy(start_gateway: Any, upstream: Any, http: httpx.Client) -> None:
    srv = proxy(start_gateway, upstream)
    client = oai(srv)
    body = {"model": "up-model", "messages": [{"role": "user", "content": "clean up"}], "tools": [BASH_TOOL]}
    r = client.chat.completions.create(**body)
    assert [json.loads(c.function.arguments)["command"] for c in r.choices[0].message.tool_calls] == [
        "rm -rf /", "ls -la", "pwd"]
    path, headers, raw = upstream.seen[-1]
    assert headers["authorization"] == "Bearer up-key"  # the upstream key, never the client's
    assert json.loads(raw) == body
    # streaming with no policy: the upstream's events byte for byte
    with http.stream("POST", srv.base_url + "/chat/completions", json={**body, "stream": True}) as resp:
        through = b"".join(resp.iter_raw())
    with http.stream("POST", upstream.url + "/chat/completions", json={**body, "stream": True}) as resp:
        direct = b"".join(resp.iter_raw())
    assert through == direct


def test_models_and_completions_proxied(start_gateway: Any, upstream: Any) -> None:
    client = oai(proxy(start_gateway, upstream))
    assert [m.id for m in client.models.list().data] == ["up-model"]
    assert client.completions.create(model="up-model", prompt="hello").choices[0].text == "Upstream says hi."


def test_policy_non_stream(start_gateway: Any, upstream: Any, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    srv = proxy(start_gateway, upstream, policy=FakePolicy(), audit=FakeAudit(audit))
    r = oai(srv).chat.completions.create(model="up-model", messages=[{"role": "user", "content": "clean up"}],
                                         tools=[BASH_TOOL], extra_headers={"X-Fak-Conversation": "p1"})
    msg = r.choices[0].message
    assert [json.loads(c.function.arguments)["command"] for c in msg.tool_calls] == ["ls -la", "pwd"]
    assert [c.id for c in msg.tool_calls] == ["call_up1", "call_up2"]
    assert msg.content == "Cleaning.\n" + NOTE_RM
    assert r.choices[0].finish_reason == "tool_calls"
    assert [v["allowed"] for v in r.model_extra["fak_policy"]["verdicts"]] == [False, True, True]
    assert [(x["conversation"], x["allowed"]) for x in audit_lines(audit)] == [("p1", False), ("p1", True), ("p1", True)]
    r = oai(srv).chat.completions.create(model="up-model", messages=[{"role": "user", "content": "delete"}])
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content.startswith("[fak policy] Tool call `delete_file` was denied")


@pytest.mark.parametrize("omit_index", [False, True])
def test_policy_stream_buffers_until_complete(start_gateway: Any, upstream: Any, http: httpx.Client,
                                              tmp_path: Path, omit_index: bool) -> None:
    upstream.omit_index = omit_index
    audit = tmp_path / "audit.jsonl"
    srv = proxy(start_gateway, upstream, policy=FakePolicy(), audit=FakeAudit(audit))
    body = {"model": "up-model", "messages": [{"role": "user", "content": "clean up"}], "tools": [BASH_TOOL],
            "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", srv.base_url + "/chat/completions", json=body) as resp:
        raw = b"".join(resp.iter_raw()).decode()
    assert "rm -rf /" not in raw and '"rm -' not in raw  # not even a piece of the denied arguments
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 16
    deltas = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
    # each allowed call arrives whole, in one delta, renumbered from 0
    assert [(d["index"], d["id"], json.loads(d["function"]["arguments"])["command"]) for d in deltas] == [
        (0, "call_up1", "ls -la"), (1, "call_up2", "pwd")]
    content, calls, finish = collect(oai(srv).chat.completions.create(**{k: v for k, v in body.items()
                                                                          if k != "stream"}, stream=True))
    assert content == "Cleaning.\n" + NOTE_RM
    assert [json.loads(c["arguments"])["command"] for c in calls] == ["ls -la", "pwd"] and finish == "tool_calls"
    assert [x["allowed"] for x in audit_lines(audit)] == [False, True, True] * 2


def test_policy_stream_all_denied_finishes_with_stop(start_gateway: Any, upstream: Any) -> None:
    srv = proxy(start_gateway, upstream, policy=FakePolicy())
    content, calls, finish = collect(oai(srv).chat.completions.create(
        model="up-model", messages=[{"role": "user", "content": "delete"}], stream=True))
    assert calls == [] and finish == "stop" and "`delete_file` was denied" in content


@pytest.mark.parametrize("stream", [False, True])
def test_text_tools_through_proxy(start_gateway: Any, upstream: Any, stream: bool) -> None:
    srv = proxy(start_gateway, upstream, policy=FakePolicy())
    client = oai(srv)
    kwargs = dict(model="up-model", messages=[{"role": "user", "content": "wipe"}],
                  extra_headers={"X-Fak-Text-Tools": "bash"})
    if stream:
        content, _, _ = collect(client.chat.completions.create(stream=True, **kwargs))
    else:
        content = client.chat.completions.create(**kwargs).choices[0].message.content
    assert "sudo shutdown" not in content
    assert content == ("Wiping.\n[fak policy] Tool call `bash` was denied: command matches deny pattern 'sudo' "
                       "(rule: bash.command.deny).\nDone.")
    kwargs["messages"] = [{"role": "user", "content": "listing"}]
    if stream:
        content, _, _ = collect(client.chat.completions.create(stream=True, **kwargs))
    else:
        content = client.chat.completions.create(**kwargs).choices[0].message.content
    assert content == "```bash\nls\n```"


def test_upstream_errors(start_gateway: Any, upstream: Any, http: httpx.Client) -> None:
    srv = proxy(start_gateway, upstream)
    with pytest.raises(openai.NotFoundError) as exc:  # the upstream's own OpenAI error, passed through
        oai(srv).chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["message"] == "no such model"
    n_seen = len(upstream.seen)
    r = http.post(srv.base_url + "/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": "x"}], "n": 3})
    assert r.status_code == 400 and len(upstream.seen) == n_seen  # refused before the upstream
    dead = start_gateway(upstream=Upstream("http://127.0.0.1:9/v1"))
    for stream in (False, True):
        r = http.post(dead.base_url + "/chat/completions", json={"model": "m", "stream": stream, "messages": [
            {"role": "user", "content": "x"}]})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unavailable"
    assert dead.app.state.gateway.admission.in_flight == 0


def test_client_disconnect_closes_upstream(start_gateway: Any, upstream: Any) -> None:
    upstream.delay = 0.05
    upstream.script["long"] = UpstreamReply(content="x" * 600)
    srv = proxy(start_gateway, upstream, policy=FakePolicy())
    with httpx.Client(timeout=30) as c, c.stream("POST", srv.base_url + "/chat/completions", json={
            "model": "up-model", "stream": True, "messages": [{"role": "user", "content": "long"}]}) as resp:
        it = resp.iter_raw()
        next(it)
        next(it)
    deadline = time.monotonic() + 10
    while (upstream.disconnects == 0 or srv.app.state.gateway.admission.in_flight) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.disconnects == 1 and srv.app.state.gateway.admission.in_flight == 0


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_upstream_never_crashes_or_leaks(start_gateway: Any, upstream: Any, http: httpx.Client,
                                                 stream: bool) -> None:
    srv = proxy(start_gateway, upstream, policy=FakePolicy())
    r = http.post(srv.base_url + "/chat/completions", json={
        "model": "garbage", "stream": stream, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code in (200, 502), r.text
    if stream:
        assert r.text.endswith("data: [DONE]\n\n")
        for event in r.text.split("\n\n"):
            if event.startswith("data: {") and '"tool_calls"' in event:
                # whatever reached the client was adjudicated (the policy saw it) and is whole
                assert '"arguments":"{\\"command\\": \\"ls\\"}"' in event
    else:
        assert r.json().get("error", {}).get("code", "upstream_error") == "upstream_error"
    assert srv.app.state.gateway.admission.in_flight == 0
    assert http.get(srv.url + "/health").status_code == 200


def test_models_retrieve_proxied(start_gateway: Any, upstream: Any) -> None:
    client = oai(proxy(start_gateway, upstream))
    assert client.models.retrieve("up-model").id == "up-model"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("nope")
    assert err.value.code == "model_not_found"


def test_proxy_verdicts_carry_the_upstream_call_ids(start_gateway: Any, upstream: Any) -> None:
    srv = proxy(start_gateway, upstream, policy=FakePolicy())
    r = oai(srv).chat.completions.create(model="up-model", messages=[{"role": "user", "content": "clean up"}],
                                         tools=[BASH_TOOL])
    verdicts = r.model_extra["fak_policy"]["verdicts"]
    kept = {c.id for c in r.choices[0].message.tool_calls}
    assert all(v["call_ref"].startswith("call_up") for v in verdicts)
    assert {v["call_ref"] for v in verdicts if v["allowed"]} == kept
