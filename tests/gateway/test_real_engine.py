"""The gateway over the real ``fak.Engine``: a tiny synthetic Qwen2 model (fast, random weights,
real tokenizer and chat template) and, bounded, the real Qwen2.5-Coder-0.5B-Instruct.

Random weights give arbitrary text, so the tiny-model tests compare the gateway with the engine
called directly (same tokens, same greedy output) rather than with expected words; the 0.5B
tests check answers where the model cooperates (arithmetic, a weather tool call).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fak.gateway import BackgroundServer, GatewayConfig, create_app
from gateway_fakes import BASH_TOOL, WEATHER_TOOL


@pytest.fixture(scope="module")
def tiny_server(tiny_engine: Any) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(GatewayConfig(model_name="tiny"), engine=tiny_engine)) as srv:
        yield srv


@pytest.fixture(scope="module")
def tiny_client(tiny_server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.base_url, api_key="x", max_retries=0)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}]


def direct_chat(engine: Any, messages: list[dict[str, Any]], **sampling: Any) -> Any:
    ids = engine.tokenize(engine.apply_chat_template(messages), add_special=False, parse_special=True)

    async def run() -> tuple[str, list[int], str | None]:
        text, tokens, finish = "", [], None
        async with engine.astream(ids, **sampling) as it:
            async for d in it:
                text += d.text
                tokens += d.token_ids
                finish = d.finish_reason or finish
        return text, tokens, finish

    return ids, asyncio.run(run())


def test_chat_matches_the_engine(tiny_engine: Any, tiny_client: openai.OpenAI) -> None:
    ids, (text, tokens, finish) = direct_chat(tiny_engine, MESSAGES, max_tokens=24, temperature=0)
    r = tiny_client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == finish
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(tokens))
    streamed, finish_s = "", None
    for chunk in tiny_client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24,
                                                     temperature=0, stream=True):
        for ch in chunk.choices:
            streamed += ch.delta.content or ""
            finish_s = ch.finish_reason or finish_s
    assert (streamed, finish_s) == (text, finish)


def test_chat_reports_its_decode_time(tiny_server: BackgroundServer) -> None:
    """``timings`` (llama.cpp's names): the completion tokens, decode time from the first to the
    last token, and queue + prefill before it; what the fleet's decode tok/s is computed from."""
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "temperature": 0}
    data = httpx.post(tiny_server.base_url + "/chat/completions", json=body, timeout=60).json()
    t = data["timings"]
    assert t["predicted_n"] == data["usage"]["completion_tokens"] > 1
    assert t["prompt_n"] == data["usage"]["prompt_tokens"]
    assert t["predicted_ms"] > 0 and t["prompt_ms"] > 0
    assert t["predicted_per_second"] == pytest.approx((t["predicted_n"] - 1) / (t["predicted_ms"] / 1e3),
                                                      rel=1e-2)


def test_seeded_sampling_is_reproducible(tiny_client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    a = tiny_client.chat.completions.create(**kwargs).choices[0].message.content
    b = tiny_client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def test_stop_string(tiny_engine: Any, tiny_client: openai.OpenAI) -> None:
    _, (text, _, _) = direct_chat(tiny_engine, MESSAGES, max_tokens=24, temperature=0)
    stop = next(text[i:i + 2] for i in range(len(text) // 3, len(text) - 2)
                if text[i:i + 2].isprintable() and not text[i:i + 2].isspace() and "\ufffd" not in text[i:i + 2])
    r = tiny_client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].message.content == text[: text.find(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_completions_token_ids_and_echo(tiny_engine: Any, tiny_client: openai.OpenAI) -> None:
    ids = tiny_engine.tokenize("def add(a, b):", add_special=False)
    r = tiny_client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0, echo=True)
    comp = tiny_engine.generate(ids, max_tokens=8, temperature=0)
    assert r.choices[0].text == tiny_engine.detokenize(ids) + comp.text


def test_logprobs(tiny_client: openai.OpenAI) -> None:
    r = tiny_client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.top_logprobs[-1].logprob
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-4)  # greedy: the top token


def test_engine_side_errors(tiny_server: BackgroundServer, tiny_engine: Any) -> None:
    with httpx.Client(base_url=tiny_server.base_url, timeout=60) as http:
        long = [{"role": "user", "content": "word " * 600}]
        r = http.post("/chat/completions", json={"model": "tiny", "messages": long})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = http.post("/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 500})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = http.post("/completions", json={"model": "tiny", "prompt": [10**6], "max_tokens": 2})
        assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "prompt"  # the gateway's check (Engine.n_vocab), not a sampling error
        r = http.post("/completions", json={"model": "tiny", "prompt": [tiny_engine.n_vocab], "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = http.get(tiny_server.url + "/health").json()
        assert r["engine"]["running"] == 0


def test_logprob_bytes_of_byte_fallback_tokens(tiny_server: BackgroundServer, tiny_engine: Any) -> None:
    """🚀 is split across byte-level tokens whose text alone is U+FFFD: each entry's ``bytes`` are
    the token's own, so they join to the character's UTF-8 (not to U+FFFD's [239, 191, 189])."""
    from fak.gateway.engine_client import TokenLogprobs

    ids = tiny_engine.tokenize("🚀", add_special=False)
    assert len(ids) > 1  # the tiny vocabulary has no token for it
    chat = tiny_server.app.state.gateway.chat
    pieces = [tiny_engine.token_bytes(t).decode("utf-8", errors="replace") for t in ids]
    entries = chat._chat_logprobs([TokenLogprobs(t, -0.5, [(t, -0.5, None)], p) for t, p in zip(ids, pieces)])
    assert b"".join(bytes(e.bytes) for e in entries) == "🚀".encode() == bytes([240, 159, 154, 128])
    assert all(e.top_logprobs[0].bytes == e.bytes for e in entries)
    assert any(e.token == "\ufffd" for e in entries)


@pytest.mark.slow
def test_05b_answers_and_calls_a_tool(engine_05b: Any) -> None:
    with BackgroundServer(create_app(GatewayConfig(model_name="qwen-0.5b"), engine=engine_05b)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=1200)
        r = client.chat.completions.create(model="qwen-0.5b", messages=[{"role": "user", "content": "What is 2+2?"}],
                                           max_tokens=12, temperature=0)
        assert "4" in r.choices[0].message.content
        r = client.chat.completions.create(
            model="qwen-0.5b", temperature=0, max_tokens=40, tools=[WEATHER_TOOL],
            messages=[{"role": "system", "content": "Call tools when useful."},
                      {"role": "user", "content": "What is the weather in Paris?"}])
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather"
        assert json.loads(calls[0].function.arguments)["city"].lower() == "paris"


@pytest.mark.slow
def test_05b_tool_choice_required_names_only_offered_tools(engine_05b: Any) -> None:
    """The replayed bug report: "Write a haiku about autumn." with tool_choice required. Unconstrained,
    Qwen2.5-Coder-0.5B names a tool of its own (`Autumn's Song`, measured); held to the offered
    names it calls one of them, with arguments that fit the tool's schema. A named choice gives
    a call too, and no pre-fill ever reaches the content."""
    from fak.toolcalls import ToolSet

    tools = [WEATHER_TOOL, BASH_TOOL]
    toolset = ToolSet.from_openai(tools)
    haiku = [{"role": "user", "content": "Write a haiku about autumn."}]
    with BackgroundServer(create_app(GatewayConfig(model_name="qwen-0.5b"), engine=engine_05b)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=1200)
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            for stream in (False, True):
                kwargs: dict[str, Any] = dict(model="qwen-0.5b", messages=haiku, tools=tools, tool_choice=choice,
                                              temperature=0, max_tokens=40)
                if stream:
                    calls: dict[int, list[str]] = {}
                    content = ""
                    for chunk in client.chat.completions.create(stream=True, **kwargs):
                        for ch in chunk.choices:
                            content += ch.delta.content or ""
                            for tc in ch.delta.tool_calls or []:
                                calls[tc.index] = [tc.function.name, tc.function.arguments]
                    got = [tuple(c) for c in calls.values()]
                else:
                    msg = client.chat.completions.create(**kwargs).choices[0].message
                    content = msg.content or ""
                    got = [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
                assert got, (choice, stream, content)
                for name, arguments in got:
                    assert name in {"get_weather", "bash"} and toolset.check(name, arguments) is None
                if not isinstance(choice, str):
                    assert got[0][0] == "get_weather"
                assert "<tool_call>" not in content
        r = client.chat.completions.create(model="qwen-0.5b", tools=tools, tool_choice="required", temperature=0,
                                           max_tokens=40,
                                           messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
        assert client.models.retrieve("qwen-0.5b").id == "qwen-0.5b"
