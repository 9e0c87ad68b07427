"""A model that speaks Qwen3-Coder's XML tool-call form, through ``fak serve``.

The fake engine (``gateway_fakes.xml_engine``) carries a chat template in Qwen3-Coder's layout, so
the gateway reads the form from the template as it does for a real GGUF; it answers
``XML_SCRIPT`` and completes the XML pre-fills of ``tool_choice`` the way a model held to
``prefix_choices`` does. Each test checks that the client sees exactly what the Hermes JSON form
gives it: OpenAI ``tool_calls`` with JSON ``arguments``, content without markup or pre-fill, the
policy's verdicts referring to the calls. To add a case, script a reply in ``XML_SCRIPT`` (or
pass ``script=``) and assert on what the client receives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fak.gateway import GatewayConfig, create_app
from fak.gateway.engine_client import engine_tool_call_format
from fak.toolcalls import ToolCallFormat
from gateway_fakes import (
    BASH_TOOL,
    FORECAST_TOOL,
    WEATHER_TOOL,
    FakeAudit,
    FakeEngine,
    FakePolicy,
    audit_lines,
    scrape,
    xml_call,
    xml_engine,
)
from test_chat_completions import collect_stream

MODEL = "fake-qwen"
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
HAIKU = [{"role": "user", "content": "Write a haiku about autumn."}]
NOTE_RM = "[fak policy] Tool call `bash` was denied: command matches deny pattern 'rm -rf' (rule: bash.command.deny)."


def _client(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def _ask(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[str | None, list[tuple[str, Any]], str]:
    """(content, [(name, arguments decoded)], finish_reason), streamed or not."""
    if stream:
        got = collect_stream(client.chat.completions.create(model=MODEL, stream=True, **kwargs))
        calls = [(c["name"], json.loads(c["arguments"])) for c in got["tool_calls"].values()]
        return got["content"], calls, got["finish_reason"]
    r = client.chat.completions.create(model=MODEL, **kwargs)
    msg = r.choices[0].message
    return msg.content, [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []], \
        r.choices[0].finish_reason


def test_the_chat_template_decides_the_form() -> None:
    assert create_app(GatewayConfig(), engine=xml_engine()).state.gateway.tool_call_format is ToolCallFormat.QWEN3_XML
    assert create_app(GatewayConfig(), engine=FakeEngine()).state.gateway.tool_call_format is ToolCallFormat.HERMES
    forced = create_app(GatewayConfig(tool_call_format="hermes"), engine=xml_engine())
    assert forced.state.gateway.tool_call_format is ToolCallFormat.HERMES
    assert engine_tool_call_format(FakeEngine(), "qwen3_xml") is ToolCallFormat.QWEN3_XML
    assert engine_tool_call_format(FakeEngine(), "auto") is ToolCallFormat.HERMES
    with pytest.raises(ValueError, match="unknown tool-call format"):
        create_app(GatewayConfig(tool_call_format="xml"), engine=FakeEngine())


@pytest.mark.parametrize("stream", [False, True])
def test_text_then_two_calls(start_gateway: Any, stream: bool) -> None:
    """Text before the calls streams as content; the calls come back as tool_calls, and no
    piece of their markup is ever content (the engine sends one character per delta)."""
    srv = start_gateway(engine=xml_engine(chunk=1))
    content, calls, finish = _ask(_client(srv), stream, messages=[{"role": "user", "content": "two calls please"}],
                                  tools=[WEATHER_TOOL])
    assert calls == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert content in ("Let me check both.", "Let me check both.\n") and finish == "tool_calls"


def test_streamed_content_chunks_hold_no_markup(start_gateway: Any, http: httpx.Client) -> None:
    srv = start_gateway(engine=xml_engine(chunk=1))
    chunks = _sse(http, srv, {"model": MODEL, "messages": [{"role": "user", "content": "two calls please"}],
                              "tools": [WEATHER_TOOL]})
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(p or "" for p in pieces).startswith("Let me check both.")
    assert not any(p and "<" in p for p in pieces)
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [(tc["index"], tc["function"]["arguments"]) for tc in calls] == [
        (0, '{"city": "Paris"}'), (1, '{"city": "Rome"}')]


@pytest.mark.parametrize("stream", [False, True])
def test_values_are_typed_by_the_tools_schema(start_gateway: Any, stream: bool) -> None:
    srv = start_gateway(engine=xml_engine())
    content, calls, _ = _ask(_client(srv), stream, messages=[{"role": "user", "content": "forecast for Brazil"}],
                             tools=[FORECAST_TOOL])
    assert calls == [("get_forecast", {"city": "São Paulo", "days": 3, "hourly": True, "fields": ["temp", "rain"]})]
    assert content in ("A typed call.", "A typed call.\n")


def test_values_holding_markup_and_lines(start_gateway: Any) -> None:
    srv = start_gateway(engine=xml_engine())
    _, calls, _ = _ask(_client(srv), False, messages=[{"role": "user", "content": "write html"}], tools=[BASH_TOOL])
    assert calls == [("bash", {"command": "echo '<b>a < b</b>' > out.html\ncat out.html"})]


@pytest.mark.parametrize("stream", [False, True])
def test_a_cut_off_call_is_content(start_gateway: Any, http: httpx.Client, stream: bool) -> None:
    """A call the generation ended inside is never a call (its value may be cut: `rm -rf /tmp/bu`)."""
    srv = start_gateway(engine=xml_engine())
    content, calls, finish = _ask(_client(srv), stream, messages=[{"role": "user", "content": "cut off"}],
                                  tools=[BASH_TOOL])
    assert not calls and finish == "stop"
    assert content == "Running.\n<tool_call>\n<function=bash>\n<parameter=command>\nrm -rf /tmp/bu"
    assert scrape(http, srv.url)[("fak_tool_calls_rejected_total", (("reason", "malformed"),))] == 1


def test_history_is_rendered_in_the_xml_form(start_gateway: Any) -> None:
    eng = xml_engine()
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    content, calls, finish = _ask(_client(start_gateway(engine=eng)), False, messages=messages, tools=[WEATHER_TOOL])
    assert (content, calls, finish) == ("It is sunny in Paris.", [], "stop")
    prompt = eng.detokenize(eng.requests[-1][0])
    assert xml_call("get_weather", city="Paris") in prompt
    assert "<name>get_weather</name>" in prompt


@pytest.mark.parametrize("stream", [False, True])
def test_required_chooses_among_the_offered_tools(start_gateway: Any, stream: bool) -> None:
    """tool_choice required: pre-filled with `<tool_call>\\n`, held to `<function=NAME>\\n` and an
    opening for each offered NAME. The model would name `autumn`; it can only call an offered tool."""
    eng = xml_engine()
    content, calls, finish = _ask(_client(start_gateway(engine=eng)), stream, messages=HAIKU,
                                  tools=[TIME_TOOL, WEATHER_TOOL], tool_choice="required")
    assert calls == [("get_time", {})] and finish == "tool_calls" and not content
    ids, sampling = eng.requests[-1]
    assert eng.detokenize(ids).endswith("<|im_start|>assistant\n<tool_call>\n")
    assert {eng.detokenize(c) for c in sampling["prefix_choices"]} == {
        f"<function={n}>\n{o}" for n in ("get_time", "get_weather") for o in ("<parameter=", "</function>")}


@pytest.mark.parametrize("stream", [False, True])
def test_required_fills_the_required_parameters(start_gateway: Any, stream: bool) -> None:
    srv = start_gateway(engine=xml_engine())
    _, calls, _ = _ask(_client(srv), stream, messages=[{"role": "user", "content": "anything"}],
                       tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="required")
    assert calls == [("get_weather", {"city": "forced"})]


def test_required_unoffered_name_is_never_a_fragment(start_gateway: Any) -> None:
    """An engine that ignores prefix_choices: the call of an unknown tool is not a call, and
    nothing of it comes back (empty content, finish "stop")."""
    srv = start_gateway(engine=xml_engine(honor_choices=False), tool_call_retries=0)
    content, calls, finish = _ask(_client(srv), False, messages=HAIKU, tools=[WEATHER_TOOL], tool_choice="required")
    assert not calls and finish == "stop" and not content


@pytest.mark.parametrize("stream", [False, True])
def test_named_choice(start_gateway: Any, stream: bool) -> None:
    eng = xml_engine()
    content, calls, finish = _ask(_client(start_gateway(engine=eng)), stream,
                                  messages=[{"role": "user", "content": "what time is it"}],
                                  tools=[TIME_TOOL, WEATHER_TOOL], tool_choice=_named("get_time"))
    assert calls == [("get_time", {})] and finish == "tool_calls" and not content
    ids, sampling = eng.requests[-1]
    assert eng.detokenize(ids).endswith("<|im_start|>assistant\n<tool_call>\n<function=get_time>\n")
    assert {eng.detokenize(c) for c in sampling["prefix_choices"]} == {"<parameter=", "</function>"}
    _, calls, _ = _ask(_client(start_gateway(engine=eng)), stream, messages=[{"role": "user", "content": "weather"}],
                       tools=[TIME_TOOL, WEATHER_TOOL], tool_choice=_named("get_weather"))
    assert calls == [("get_weather", {"city": "forced"})]


def test_named_choice_that_misses_the_schema_is_retried_then_empty(start_gateway: Any, http: httpx.Client) -> None:
    eng = xml_engine()
    srv = start_gateway(engine=eng, tool_call_retries=2)
    content, calls, finish = _ask(_client(srv), False, messages=[{"role": "user", "content": "no city"}],
                                  tools=[WEATHER_TOOL], tool_choice=_named("get_weather"))
    assert not calls and finish == "stop" and len(eng.requests) == 3
    assert not content  # nothing of the broken call
    m = scrape(http, srv.url)
    assert m[("fak_tool_call_retries_total", ())] == 2
    assert m[("fak_tool_calls_rejected_total", (("reason", "schema"),))] == 3


def _sse(http: httpx.Client, srv: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", srv.base_url + "/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        raw = b"".join(r.iter_raw()).decode()
    assert "rm -rf /" not in raw  # a denied command is nowhere in the bytes sent
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[6:]) for e in events[:-1]]


@pytest.mark.parametrize("stream", [False, True])
def test_policy_denies_an_xml_call_and_its_verdict_refers_to_it(start_gateway: Any, http: httpx.Client,
                                                                 tmp_path: Path, stream: bool) -> None:
    audit = tmp_path / "audit.jsonl"
    srv = start_gateway(engine=xml_engine(chunk=3), policy=FakePolicy(), audit=FakeAudit(audit))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "please clean up"}], "tools": [BASH_TOOL]}
    if stream:
        chunks = _sse(http, srv, body)
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        kept = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
        verdicts = [v for c in chunks for v in c.get("fak_policy", {}).get("verdicts", [])]
        finish = chunks[-1]["choices"][0]["finish_reason"]
    else:
        r = http.post(srv.base_url + "/chat/completions", json=body)
        assert r.status_code == 200 and "rm -rf /" not in r.text
        msg = r.json()["choices"][0]["message"]
        content, kept = msg["content"], msg["tool_calls"]
        verdicts, finish = r.json()["fak_policy"]["verdicts"], r.json()["choices"][0]["finish_reason"]
    assert content.strip() == "Cleaning.\n" + NOTE_RM and finish == "tool_calls"
    assert [json.loads(tc["function"]["arguments"]) for tc in kept] == [{"command": "ls -la"}]
    assert [(v["tool"], v["allowed"], v["rule"]) for v in verdicts] == [
        ("bash", False, "bash.command.deny"), ("bash", True, None)]
    assert verdicts[1]["call_ref"] == kept[0]["id"] == verdicts[1]["tool_call_id"]
    assert verdicts[0]["call_ref"].startswith("call_") and verdicts[0]["call_ref"] != kept[0]["id"]
    assert verdicts[0]["tool_call_id"] is None
    assert [(x["tool"], x["allowed"]) for x in audit_lines(audit)] == [("bash", False), ("bash", True)]


def test_a_denied_forced_call_is_a_note(start_gateway: Any) -> None:
    """tool_choice named with a call the policy denies: the note, never the call."""
    eng = xml_engine(forced_xml_arguments=[("wipe", "<parameter=command>\nsudo rm -rf /\n</parameter>\n"
                                                    "</function>\n</tool_call>")])
    srv = start_gateway(engine=eng, policy=FakePolicy())
    r = _client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "wipe it"}],
                                             tools=[BASH_TOOL], tool_choice=_named("bash"))
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content.startswith("[fak policy] Tool call `bash` was denied")
    assert [v["allowed"] for v in r.model_extra["fak_policy"]["verdicts"]] == [False]


def test_inline_reads_with_the_xml_form(start_gateway: Any, http: httpx.Client) -> None:
    """A repeated read written in the XML form is served inline; the next round is parsed in the
    same form."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "command": {"type": "string"}}}}} for n in ("read", "list", "bash")]
    history = [
        {"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix the bug in a.py"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "read", "arguments": '{"path": "a.py"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "CONTENT-A: def f(): return 1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c2", "type": "function", "function": {
            "name": "list", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "FILES-LIST: a.py b.py"}]
    eng = xml_engine(script=[("FILES-LIST", xml_call("read", path="a.py")),
                             ("CONTENT-A", xml_call("bash", command="python -m pytest -q"))])
    srv = start_gateway(engine=eng, serve_inline_reads=True)
    r = http.post(srv.base_url + "/chat/completions", headers={"X-Fak-Conversation": "conv-x"},
                  json={"model": MODEL, "messages": history, "tools": tools})
    assert r.status_code == 200, r.text
    body = r.json()
    calls = body["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("bash", {"command": "python -m pytest -q"})]
    pairs = body["fak"]["inline_reads"]
    assert len(pairs) == 1 and pairs[0]["served_from"] == "c1"
    second = eng.detokenize(eng.requests[-1][0])
    assert second.count("<function=read>\n<parameter=path>\na.py\n</parameter>") == 2
