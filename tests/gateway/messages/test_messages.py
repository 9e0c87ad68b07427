"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic Messages) through the official
``anthropic`` SDK against a real HTTP server over the fake engine (``gateway_fakes.FakeEngine``).

Covered: text answers, system as string / blocks / turns inside ``messages`` (Claude Code's
billing block left out), a tool round trip (``tool_use`` → ``tool_result``), ``tool_choice``
any / tool / none, stop sequences and stop reasons, the exact stream event sequence, errors in
Anthropic's shape with their status codes, ``x-api-key``, betas and unknown fields, policy
verdicts and notes, count_tokens, and a stream that answers before its first token. To add a
case: ask for ``anthropic_client`` (the SDK over the module's server) or start a gateway with
``start_gateway`` and point ``anthropic.Anthropic(base_url=srv.url)`` at it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from fak.gateway import BackgroundServer, GatewayConfig, create_app
from gateway_fakes import SCRIPT, FakeAudit, FakeEngine, FakePolicy, audit_lines

WEATHER = {"name": "get_weather", "description": "Current weather of a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
BASH = {"name": "bash", "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
MODEL = "fake-qwen"


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(script=list(SCRIPT))


@pytest.fixture(scope="module")
def server(engine: FakeEngine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(GatewayConfig(), engine=engine)) as srv:
        yield srv


@pytest.fixture(scope="module")
def anthropic_client(server: BackgroundServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def last_prompt(engine: FakeEngine) -> str:
    return engine.detokenize(engine.requests[-1][0])


def test_text_answer(anthropic_client: anthropic.Anthropic, engine: FakeEngine) -> None:
    r = anthropic_client.messages.create(model=MODEL, max_tokens=200,
                                         messages=[{"role": "user", "content": "Say something."}])
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason == "end_turn" and r.stop_sequence is None
    assert r.usage.input_tokens == len(engine.requests[-1][0])
    assert r.usage.output_tokens == len(r.content[0].text)


def test_system_forms_and_the_billing_block(anthropic_client: anthropic.Anthropic, engine: FakeEngine) -> None:
    """System text as a string, as blocks and as turns inside ``messages`` all reach the template's
    system turn; Claude Code's per-request billing block does not (it would change the prefix of
    every request)."""
    anthropic_client.messages.create(model=MODEL, max_tokens=50, system="Be brief.",
                                     messages=[{"role": "user", "content": "hi"}])
    assert last_prompt(engine).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    blocks = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.337; cch=9f1c2;"},
              {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}]
    anthropic_client.messages.create(model=MODEL, max_tokens=50, system=blocks,
                                     messages=[{"role": "user", "content": "hi"}])
    prompt = last_prompt(engine)
    assert prompt.startswith("<|im_start|>system\nYou are a coding agent.<|im_end|>") and "cch=" not in prompt
    # system turns inside messages (vLLM #44000, Ollama #16372 answer 400): leading ones join the
    # system text, later ones stay where they are
    anthropic_client.messages.create(model=MODEL, max_tokens=50, system="A.", messages=[
        {"role": "system", "content": "B."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "system", "content": "C."},
        {"role": "user", "content": "again"}])  # type: ignore[list-item]
    prompt = last_prompt(engine)
    assert prompt.startswith("<|im_start|>system\nA.\n\nB.<|im_end|>")
    assert "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>system\nC.<|im_end|>" in prompt


def test_tool_round_trip(anthropic_client: anthropic.Anthropic, engine: FakeEngine) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = anthropic_client.messages.create(model=MODEL, max_tokens=200, tools=[WEATHER], messages=messages)
    assert r.stop_reason == "tool_use"
    (call,) = [b for b in r.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id
    assert '"name": "get_weather"' in last_prompt(engine)  # the tool reached the template
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                               "content": [{"type": "text", "text": "18 C, clear"}]},
                                              {"type": "text", "text": "Thanks."}]}]
    r2 = anthropic_client.messages.create(model=MODEL, max_tokens=200, tools=[WEATHER], messages=messages)
    assert r2.stop_reason == "end_turn" and r2.content[0].text == "It is sunny in Paris."
    prompt = last_prompt(engine)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 C, clear\n</tool_response>" in prompt
    assert prompt.index("</tool_response>") < prompt.index("Thanks.")


def test_tool_choice(anthropic_client: anthropic.Anthropic, engine: FakeEngine) -> None:
    haiku = [{"role": "user", "content": "Write a poem."}]
    r = anthropic_client.messages.create(model=MODEL, max_tokens=200, tools=[WEATHER, BASH], messages=haiku,
                                         tool_choice={"type": "any"})
    assert r.stop_reason == "tool_use" and r.content[-1].type == "tool_use"
    assert engine.requests[-1][1].get("prefix_choices")
    r = anthropic_client.messages.create(model=MODEL, max_tokens=200, tools=[WEATHER, BASH], messages=haiku,
                                         tool_choice={"type": "tool", "name": "bash"})
    assert [(b.type, b.name, b.input) for b in r.content] == [("tool_use", "bash", {"command": "forced"})]
    r = anthropic_client.messages.create(model=MODEL, max_tokens=200, tools=[WEATHER], tool_choice={"type": "none"},
                                         messages=[{"role": "user", "content": "weather?"}])
    assert "<tools>" not in last_prompt(engine) and r.content[0].type == "text"
    r = anthropic_client.messages.create(model=MODEL, max_tokens=200, tools=[WEATHER], messages=[
        {"role": "user", "content": "two calls"}], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.type for b in r.content] == ["text", "tool_use"]


def test_stop_reasons(start_gateway: Any) -> None:
    engine = FakeEngine(script=list(SCRIPT), n_ctx=400)
    client = anthropic.Anthropic(base_url=start_gateway(engine=engine).url, api_key="x", max_retries=0)
    turns = [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                                "input": {"city": "Paris"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]
    first = [{"role": "user", "content": "weather"}]
    r = client.messages.create(model=MODEL, max_tokens=100, messages=first + turns, stop_sequences=["sunny"])
    assert (r.stop_reason, r.stop_sequence, r.content[0].text) == ("stop_sequence", "sunny", "It is ")
    r = client.messages.create(model=MODEL, max_tokens=5, messages=first + turns)
    assert (r.stop_reason, r.usage.output_tokens, r.content[0].text) == ("max_tokens", 5, "It is")
    # a budget larger than the window is a ceiling: the window ends the answer
    long = [{"role": "user", "content": "x " * 170 + "Tell me more."}]
    r = client.messages.create(model=MODEL, max_tokens=20_000, messages=long)
    assert r.stop_reason == "model_context_window_exceeded"
    assert r.usage.input_tokens + r.usage.output_tokens == 400


def events_of(raw: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.split("\n") if not line.startswith(":"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_stream_event_sequence(server: BackgroundServer, http: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 300, "stream": True, "tools": [WEATHER],
            "messages": [{"role": "user", "content": "two calls"}]}
    r = http.post(server.url + "/v1/messages?beta=true", json=body,
                  headers={"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = events_of(r.text)
    names = [e for e, _ in events]
    assert all(e == data["type"] for e, data in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    text_deltas = names.index("content_block_stop") - 3
    assert names[3:3 + text_deltas] == ["content_block_delta"] * text_deltas
    assert names[3 + text_deltas:] == ["content_block_stop"] + [
        "content_block_start", "content_block_delta", "content_block_stop"] * 2 + ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for e, d in events if d.get("delta", {}).get("type") == "text_delta")
    assert text == "Let me check both."
    starts = [d for e, d in events if e == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use", "tool_use"]
    inputs = [json.loads(d["delta"]["partial_json"]) for e, d in events
              if d.get("delta", {}).get("type") == "input_json_delta"]
    assert inputs == [{"city": "Paris"}, {"city": "Rome"}]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0


def test_stream_through_the_sdk(anthropic_client: anthropic.Anthropic) -> None:
    with anthropic_client.messages.stream(model=MODEL, max_tokens=300, tools=[WEATHER],
                                          messages=[{"role": "user", "content": "two calls"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Let me check both."
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert [b.input for b in final.content[1:]] == [{"city": "Paris"}, {"city": "Rome"}]
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0
    # the beta surface (Claude Code's ?beta=true) answers the same
    r = anthropic_client.beta.messages.create(model=MODEL, max_tokens=50, betas=["context-management-2025-06-27"],
                                              messages=[{"role": "user", "content": "hi"}])
    assert r.content[0].type == "text"


def test_count_tokens(anthropic_client: anthropic.Anthropic, engine: FakeEngine) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    n = anthropic_client.messages.count_tokens(model=MODEL, messages=messages, tools=[WEATHER]).input_tokens
    anthropic_client.messages.create(model=MODEL, max_tokens=20, messages=messages, tools=[WEATHER])
    assert n == len(engine.requests[-1][0])
    bare = anthropic_client.messages.count_tokens(model=MODEL, messages=messages).input_tokens
    assert 0 < bare < n


def anthropic_error(exc: anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) >= {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    return body["error"]


def test_errors_have_anthropic_shape(anthropic_client: anthropic.Anthropic, server: BackgroundServer,
                                     http: httpx.Client) -> None:
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError) as nf:
        anthropic_client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=hi)
    assert anthropic_error(nf.value)["type"] == "not_found_error"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": MODEL, "messages": hi}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 10, "messages": []}, "messages"),
        ({"model": MODEL, "max_tokens": 10, "temperature": 1.5, "messages": hi}, "temperature"),
        ({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
         "messages[0].content[0].type"),
        ({"model": MODEL, "max_tokens": 10, "messages": hi,
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
        ({"model": MODEL, "max_tokens": 10, "messages": hi, "tools": [WEATHER],
          "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ({"model": MODEL, "max_tokens": 10, "messages": hi, "stop_sequences": [""]}, "stop_sequences[0]"),
        ({"model": MODEL, "max_tokens": 10, "messages": hi,
          "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {"a": {"$ref": "http://x/s"}}}}]},
         "tools[0].input_schema"),
    ]
    for body, where in cases:
        r = http.post(server.url + "/v1/messages", json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert r.json()["type"] == "error" and err["type"] == "invalid_request_error" and where in err["message"]
    r = http.post(server.url + "/v1/messages", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = http.get(server.url + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = http.post(server.url + "/v1/messages/nope", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # with the SDK: a 400 raises BadRequestError carrying the body
    with pytest.raises(anthropic.BadRequestError) as bad:
        anthropic_client.messages.create(model=MODEL, max_tokens=10, messages=hi, extra_body={"temperature": 3.0})
    assert anthropic_error(bad.value)["type"] == "invalid_request_error"


def test_api_key_and_unknown_fields(start_gateway: Any, engine: FakeEngine) -> None:
    srv = start_gateway(engine=engine, api_key="sekrit", model_aliases=("claude-sonnet-4-5",))
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as auth:
        anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=10, messages=hi)
    assert anthropic_error(auth.value)["type"] == "authentication_error"
    ok = anthropic.Anthropic(base_url=srv.url, api_key="sekrit", max_retries=0)  # sent as x-api-key
    r = ok.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=hi, metadata={"user_id": "u1"},
                           thinking={"type": "enabled", "budget_tokens": 1024}, output_config={"effort": "low"},
                           extra_body={"context_management": {"edits": []}, "temperature": 1.0, "top_k": 40,
                                       "top_p": 0.9})  # sampling fields: older SDKs and Claude Code send them
    assert r.content[0].type == "text"
    bearer = anthropic.Anthropic(base_url=srv.url, auth_token="sekrit", max_retries=0)  # Authorization: Bearer
    assert bearer.messages.create(model=MODEL, max_tokens=10, messages=hi).content


def test_policy_on_messages(start_gateway: Any, tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT)), policy=FakePolicy(), audit=FakeAudit(audit))
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "clean up please"}]
    r = client.messages.create(model=MODEL, max_tokens=400, tools=[BASH], messages=messages)
    assert [b.type for b in r.content] == ["text", "tool_use"]
    assert r.content[1].input == {"command": "ls -la"}
    assert "[fak policy] Tool call `bash` was denied" in r.content[0].text and "rm -rf" not in json.dumps(
        r.content[1].input)
    verdicts = r.model_extra["fak_policy"]["verdicts"]  # type: ignore[index]
    assert [v["allowed"] for v in verdicts] == [False, True]
    assert verdicts[1]["call_ref"] == r.content[1].id
    assert [line["tool"] for line in audit_lines(audit)] == ["bash", "bash"]
    with client.messages.stream(model=MODEL, max_tokens=400, tools=[BASH], messages=messages) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"command": "ls -la"}
    assert "was denied" in final.content[0].text


def test_stream_answers_before_the_first_token(start_gateway: Any, http: httpx.Client) -> None:
    """A slow prefill (here a fake engine that waits 1 s) still gets the status line, headers,
    message_start and pings at once; clients with short idle timeouts keep the stream."""
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT), delay=1.0), stream_keepalive_s=0.2)
    body = {"model": MODEL, "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    t0 = time.perf_counter()
    with http.stream("POST", srv.url + "/v1/messages", json=body) as r:
        assert r.status_code == 200
        seen: list[tuple[float, str]] = []
        for line in r.iter_lines():
            if line.startswith("event: "):
                seen.append((time.perf_counter() - t0, line[7:]))
    first_text = next(t for t, e in seen if e == "content_block_start")
    assert seen[0][1] == "message_start" and seen[0][0] < 0.8 < first_text
    assert sum(1 for t, e in seen if e == "ping" and t < first_text) >= 3
    assert seen[-1][1] == "message_stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_that_fails_is_never_a_fragment(start_gateway: Any, http: httpx.Client, stream: bool) -> None:
    """tool_choice any, and a model that names a tool that was not offered (an engine that
    ignores prefix_choices): no tool_use, no text fragment of the call, end_turn, and
    fak.tool_call_error saying why."""
    srv = start_gateway(engine=FakeEngine(honor_choices=False), tool_call_retries=0)
    body = {"model": MODEL, "max_tokens": 100, "tools": [WEATHER], "tool_choice": {"type": "any"},
            "messages": [{"role": "user", "content": "Write a haiku about autumn."}]}
    if not stream:
        r = http.post(srv.url + "/v1/messages", json=body)
        data = r.json()
        assert r.status_code == 200 and data["content"] == [] and data["stop_reason"] == "end_turn"
        assert data["fak"]["tool_call_error"]["kind"] == "unknown_tool"
        return
    with http.stream("POST", srv.url + "/v1/messages", json={**body, "stream": True}) as r:
        raw = b"".join(r.iter_raw()).decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["message_start", "ping", "message_delta", "message_stop"]
    assert events[2]["delta"]["stop_reason"] == "end_turn" and "autumn" not in raw.split("message_delta")[0]
    assert events[2]["fak"]["tool_call_error"]["kind"] == "unknown_tool"
