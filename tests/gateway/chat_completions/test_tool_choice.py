"""Tool calls a small model cannot break: offered names only, arguments that fit each tool's JSON
Schema, no server pre-fill in the content, only the client's tool fields in the prompt.

Found by replaying public llama.cpp/vLLM bug reports against ``fak serve`` (issue 12). The fake
engine plays a model that writes what ``gateway_fakes.FakeEngine.forced_names`` /
``forced_arguments`` script after the gateway's pre-fill, held to the engine's ``prefix_choices``
unless ``honor_choices=False``. To add a case: script what the model writes, then assert that what
the client receives is a call of an offered tool with fitting arguments, or content.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from gateway_fakes import (
    BASH_TOOL,
    SCRIPT,
    WEATHER_TOOL,
    Delta,
    FakeEngine,
    FakePolicy,
    scrape,
)
from test_chat_completions import collect_stream

MODEL = "fake-qwen"
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
HAIKU = [{"role": "user", "content": "Write a haiku about autumn."}]


def _client(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_required_never_calls_a_tool_that_was_not_offered(start_gateway: Any, stream: bool) -> None:
    """"Write a haiku about autumn." with tool_choice required: the model would name `autumn`;
    the engine's prefix_choices let it write only an offered name, so the call is get_time."""
    eng = FakeEngine()
    client = _client(start_gateway(engine=eng))
    kwargs = dict(model=MODEL, messages=HAIKU, tools=[TIME_TOOL, WEATHER_TOOL], tool_choice="required")
    if stream:
        got = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        calls = [(c["name"], json.loads(c["arguments"])) for c in got["tool_calls"].values()]
        assert got["content"] == "" and got["finish_reason"] == "tool_calls"
    else:
        r = client.chat.completions.create(**kwargs)
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
        assert r.choices[0].finish_reason == "tool_calls"
    assert calls == [("get_time", {})]
    # every choice the engine was given spells an offered name, then the arguments' opening
    choices = {eng.detokenize(c) for c in eng.requests[-1][1]["prefix_choices"]}
    assert choices == {f'{n}", "arguments":{o}' for n in ("get_weather", "get_time") for o in (' {"', " {}", " {\n")}


def _forced(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[str | None, Any, str, Any]:
    """(content, tool calls, finish reason, fak extension) of one request, streamed or not."""
    if stream:
        got = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        return got["content"], got["tool_calls"], got["finish_reason"], got["fak"]
    r = client.chat.completions.create(**kwargs)
    c = r.choices[0]
    return c.message.content, c.message.tool_calls, c.finish_reason, (r.model_extra or {}).get("fak")


@pytest.mark.parametrize("stream", [False, True])
def test_unoffered_name_is_never_a_call_nor_a_fragment(start_gateway: Any, stream: bool) -> None:
    """An engine that does not hold the model to the choices (or a model writing a second block):
    a call of an unknown tool is never returned as a call, and nothing of the broken call reaches
    the client (no `autumn", "arguments": ...` fragment): empty content, finish "stop", and
    fak.tool_call_error saying why."""
    srv = start_gateway(engine=FakeEngine(honor_choices=False))
    content, calls, finish, fak = _forced(_client(srv), stream, model=MODEL, messages=HAIKU, tools=[WEATHER_TOOL],
                                          tool_choice="required")
    assert not calls and finish == "stop" and not content
    assert fak["tool_call_error"]["kind"] == "unknown_tool" and "autumn" in fak["tool_call_error"]["message"]


class _CallThenJunk(FakeEngine):
    """Completes a forced call whole, then writes junk (extra braces, prose) for a long time."""

    async def astream(self, prompt: Any, **sampling: Any) -> AsyncIterator[Any]:
        self.requests.append((list(prompt), dict(sampling)))
        text = 'get_weather", "arguments": {"city": "Rome"}}}}' + " and so on" * 200
        for i, ch in enumerate(text):
            await asyncio.sleep(0)
            yield Delta(ch, [ord(ch)], "length" if i == len(text) - 1 else None)
        self.finished += 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_whole_forced_call_followed_by_junk_is_the_call(start_gateway: Any, http: httpx.Client,
                                                          stream: bool) -> None:
    """The issue's case: the text held a complete valid call followed by junk. The call comes
    back (no retry), and the sequence stops at the first junk character."""
    eng = _CallThenJunk()
    srv = start_gateway(engine=eng, tool_call_retries=2)
    content, calls, finish, fak = _forced(_client(srv), stream, model=MODEL, messages=HAIKU, tools=[WEATHER_TOOL],
                                          tool_choice="required")
    if stream:
        calls = [(c["name"], json.loads(c["arguments"])) for c in calls.values()]
    else:
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert calls == [("get_weather", {"city": "Rome"})] and finish == "tool_calls" and not content and fak is None
    assert len(eng.requests) == 1 and eng.finished == 0  # stopped early: the fake never reached its end
    assert ("fak_tool_call_retries_total", ()) not in scrape(http, srv.url) or \
        scrape(http, srv.url)[("fak_tool_call_retries_total", ())] == 0


def test_unoffered_name_in_auto_mode_is_content(start_gateway: Any, http: httpx.Client) -> None:
    block = '<tool_call>\n{"name": "autumn", "arguments": {}}\n</tool_call>'
    srv = start_gateway(engine=FakeEngine(script=[("haiku", block)]))
    r = _client(srv).chat.completions.create(model=MODEL, messages=HAIKU, tools=[WEATHER_TOOL])
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == block
    assert scrape(http, srv.url)[("fak_tool_calls_rejected_total", (("reason", "unknown_tool"),))] == 1


@pytest.mark.parametrize("stream", [False, True])
def test_arguments_that_fail_the_schema_are_content_in_auto_mode(start_gateway: Any, http: httpx.Client,
                                                                  stream: bool) -> None:
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Oslo"}}\n</tool_call>'
    srv = start_gateway(engine=FakeEngine(script=[("weather in Oslo", block)]), policy=FakePolicy())
    client = _client(srv)
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "weather in Oslo?"}], tools=[WEATHER_TOOL])
    if stream:
        got = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        assert got["content"] == block and not got["tool_calls"] and got["finish_reason"] == "stop"
    else:
        r = client.chat.completions.create(**kwargs)
        assert r.choices[0].message.content == block and r.choices[0].message.tool_calls is None
        assert r.model_extra["fak_policy"]["verdicts"] == []  # never reached the policy
    assert scrape(http, srv.url)[("fak_tool_calls_rejected_total", (("reason", "schema"),))] == 1


@pytest.mark.parametrize("stream", [False, True])
def test_named_choice_never_leaks_the_prefill(start_gateway: Any, stream: bool) -> None:
    """The model answers the pre-filled `"arguments":` with `1}` (not an object): the client gets
    neither `<tool_call>\\n{"name": "get_weather", "arguments": 1}` nor the fragment ` 1}`."""
    srv = start_gateway(engine=FakeEngine(honor_choices=False), tool_call_retries=1)
    client = _client(srv)
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "a number please"}], tools=[WEATHER_TOOL],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    content, calls, finish, fak = _forced(client, stream, **kwargs)
    assert not calls and not content and finish == "stop"
    assert fak["tool_call_error"]["kind"] == "invalid_json"


def test_named_choice_opens_an_object(start_gateway: Any) -> None:
    """Held to the opening brace, the same model writes an object: a call comes back."""
    eng = FakeEngine()
    r = _client(start_gateway(engine=eng)).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a number please"}], tools=[TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] == [("get_time", "{}")]
    assert {eng.detokenize(c) for c in eng.requests[-1][1]["prefix_choices"]} == {' {"', " {}", " {\n"}


class _SecondTimeLucky(FakeEngine):
    """Writes arguments that miss the schema's required `city` on the first attempt, a fitting
    call on the next ones."""

    async def astream(self, prompt: Any, **sampling: Any) -> AsyncIterator[Any]:
        self.forced_arguments = [("weather", ' {"town": "Oslo"}}\n</tool_call>')] if not self.requests else []
        async for delta in super().astream(prompt, **sampling):
            yield delta


@pytest.mark.parametrize("stream", [False, True])
def test_forced_call_that_misses_the_schema_is_sampled_again(start_gateway: Any, http: httpx.Client,
                                                              stream: bool) -> None:
    eng = _SecondTimeLucky()
    srv = start_gateway(engine=eng)
    client = _client(srv)
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "weather please"}], tools=[WEATHER_TOOL],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0, seed=7,
                  stream_options={"include_usage": True} if stream else None)
    if stream:
        got = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        calls = [(c["name"], json.loads(c["arguments"])) for c in got["tool_calls"].values()]
        content, usage = got["content"], got["usage"]
    else:
        r = client.chat.completions.create(**kwargs)
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls]
        content, usage = r.choices[0].message.content or "", r.usage
    assert calls == [("get_weather", {"city": "forced"})] and "Oslo" not in content
    first, second = eng.requests[0][1], eng.requests[1][1]
    assert (first["temperature"], first["seed"]) == (0, 7)
    assert (second["temperature"], second["seed"]) == (0.7, 8)  # a greedy retry would repeat itself
    n_first = len(' {"town": "Oslo"}}\n</tool_call>')
    assert usage.completion_tokens == n_first + len(' {"city": "forced"}}\n</tool_call>')
    m = scrape(http, srv.url)
    assert m[("fak_tool_call_retries_total", ())] == 1
    assert m[("fak_requests_cancelled_total", ())] == 0  # the set-aside attempt is no cancellation


def test_an_unseeded_greedy_retry_is_reproducible(start_gateway: Any) -> None:
    """Without a client seed, the retry of a greedy request draws from a seed of the prompt and
    the attempt: the same request gives the same retry (runs repeat), another prompt another."""
    class GreedyMisses(FakeEngine):  # every greedy first attempt misses the schema; retries fit
        async def astream(self, prompt: Any, **sampling: Any) -> AsyncIterator[Any]:
            self.forced_arguments = [("weather", ' {"town": "Oslo"}}\n</tool_call>')] \
                if sampling.get("temperature") == 0 else []
            async for delta in super().astream(prompt, **sampling):
                yield delta

    eng = GreedyMisses()
    srv = start_gateway(engine=eng)
    client = _client(srv)
    seeds = []
    for text in ("weather please", "weather please", "weather now"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], tools=[WEATHER_TOOL],
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                       temperature=0)
        first, second = eng.requests[-2][1], eng.requests[-1][1]
        assert "seed" not in first and second["temperature"] == 0.7
        seeds.append(second["seed"])
    assert seeds[0] == seeds[1] != seeds[2]


def test_retries_exhausted_answer_cleanly(start_gateway: Any) -> None:
    eng = FakeEngine()
    srv = start_gateway(engine=eng, tool_call_retries=2)
    r = _client(srv).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "no city"}], tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == ""
    assert r.model_extra["fak"]["tool_call_error"]["kind"] == "schema"
    assert len(eng.requests) == 3


def test_only_the_clients_tool_fields_reach_the_template(start_gateway: Any) -> None:
    eng = FakeEngine()
    bare = {"type": "function", "function": {"name": "get_time"}}  # no description, parameters, strict
    _client(start_gateway(engine=eng)).chat.completions.create(model=MODEL, messages=HAIKU, tools=[bare])
    prompt = eng.detokenize(eng.requests[-1][0])
    tools_block = prompt[prompt.index("<tools>\n") + 8: prompt.index("\n</tools>")]
    assert json.loads(tools_block) == bare
    assert "null" not in tools_block and "strict" not in tools_block


def test_invalid_parameters_schema_is_a_400(start_gateway: Any, http: httpx.Client) -> None:
    srv = start_gateway(engine=FakeEngine())
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}
    for tools, param in (([bad], "tools[0].function.parameters"),
                         ([WEATHER_TOOL, {"type": "function", "function": {
                             "name": "g", "parameters": {"$ref": "http://127.0.0.1:9/schema.json"}}}],
                          "tools[1].function.parameters")):
        r = http.post(srv.base_url + "/chat/completions",
                      json={"model": MODEL, "messages": HAIKU, "tools": tools})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param and "JSON Schema" in r.json()["error"]["message"]


def test_bash_tool_schema_and_policy_together(start_gateway: Any) -> None:
    """A fitting call still goes to the policy; its verdict carries the call's id as call_ref."""
    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT)), policy=FakePolicy())
    r = _client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "clean up"}],
                                             tools=[BASH_TOOL])
    verdicts = r.model_extra["fak_policy"]["verdicts"]
    kept = r.choices[0].message.tool_calls
    assert [v["allowed"] for v in verdicts] == [False, True]
    assert verdicts[1]["call_ref"] == kept[0].id == verdicts[1]["tool_call_id"]
    assert verdicts[0]["call_ref"].startswith("call_") and verdicts[0]["call_ref"] != kept[0].id
    assert verdicts[0]["tool_call_id"] is None and verdicts[0]["span"] is None
