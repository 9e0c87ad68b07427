"""``POST /v1/chat/completions`` through a real server with the official ``openai`` client.

The fake engine's reply is a pure function of the prompt (see ``gateway_fakes``), so each test
computes the exact expected text from the rendered prompt. To add a case: add a trigger to
``gateway_fakes.SCRIPT`` if the model must say something specific, then assert on what the client
receives.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from gateway_fakes import BASH_TOOL, WEATHER_TOOL, FakeEngine

MODEL = "fake-qwen"


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]


def expected_reply(engine: FakeEngine, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, int]:
    prompt = engine.apply_chat_template(messages, tools=tools)
    return engine.reply_for(prompt), len(engine.tokenize(prompt))


def collect_stream(stream: Any) -> dict[str, Any]:
    """Accumulate streamed chunks the way OpenAI's SDK helpers do."""
    out: dict[str, Any] = {"content": "", "tool_calls": {}, "finish_reason": None, "usage": None, "chunks": 0,
                           "roles": [], "fak": None}
    for chunk in stream:
        out["chunks"] += 1
        if (chunk.model_extra or {}).get("fak") is not None:  # fak's extension (a forced call's error)
            out["fak"] = chunk.model_extra["fak"]
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            if d.role:
                out["roles"].append(d.role)
            if d.content:
                out["content"] += d.content
            for tc in d.tool_calls or []:
                slot = out["tool_calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            if choice.finish_reason:
                out["finish_reason"] = choice.finish_reason
    return out


def test_chat_plain(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    messages = user("hello there")
    text, n_prompt = expected_reply(fake_engine, messages)
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == text
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        n_prompt, len(text), n_prompt + len(text))
    # the engine got exactly the rendered prompt's tokens and the requested sampling
    ids, sampling = fake_engine.requests[-1]
    assert ids == fake_engine.tokenize(fake_engine.apply_chat_template(messages))
    assert sampling["temperature"] == 0 and sampling["max_tokens"] == fake_engine.n_ctx - n_prompt


def test_stream_equals_non_stream_and_format(http: httpx.Client, gateway: Any, client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    messages = user("stream me")
    text, n_prompt = expected_reply(fake_engine, messages)
    got = collect_stream(client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}))
    assert got["content"] == text
    assert got["roles"] == ["assistant"]
    assert got["finish_reason"] == "stop"
    assert got["usage"].prompt_tokens == n_prompt and got["usage"].completion_tokens == len(text)

    # the raw wire format: data: lines, every chunk with usage null, a final usage chunk, [DONE]
    with http.stream("POST", gateway.base_url + "/chat/completions", json={
            "model": MODEL, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == n_prompt + len(text)
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == text


def test_stream_without_usage_has_no_usage_key(http: httpx.Client, gateway: Any, fake_engine: FakeEngine) -> None:
    with http.stream("POST", gateway.base_url + "/chat/completions",
                      json={"model": MODEL, "messages": user("x"), "stream": True}) as r:
        raw = b"".join(r.iter_raw()).decode()
    chunks = [json.loads(e[6:]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
    assert all("usage" not in c for c in chunks)


def test_tool_call_non_stream(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("what is the weather?"), tools=[WEATHER_TOOL])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_tool_call_streaming_any_delta_size(start_gateway: Any, chunk: int) -> None:
    from gateway_fakes import SCRIPT

    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT), chunk=chunk))
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    got = collect_stream(client.chat.completions.create(
        model=MODEL, messages=user("two calls please"), tools=[WEATHER_TOOL], stream=True))
    assert got["finish_reason"] == "tool_calls"
    assert got["content"].strip() == "Let me check both."
    calls = [got["tool_calls"][i] for i in sorted(got["tool_calls"])]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert "<tool_call>" not in got["content"]


def test_two_calls_and_text_non_stream(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("two calls please"), tools=[WEATHER_TOOL])
    msg = r.choices[0].message
    assert msg.content == "Let me check both."
    assert [json.loads(c.function.arguments)["city"] for c in msg.tool_calls] == ["Paris", "Rome"]


def test_parallel_tool_calls_false_keeps_first(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("two calls please"), tools=[WEATHER_TOOL],
                                       parallel_tool_calls=False)
    assert [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls] == ["Paris"]


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_tool_call_is_content(client: openai.OpenAI, stream: bool) -> None:
    raw = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    kwargs = dict(model=MODEL, messages=user("broken call"), tools=[WEATHER_TOOL])
    if stream:
        got = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        assert got["content"] == raw and not got["tool_calls"] and got["finish_reason"] == "stop"
    else:
        r = client.chat.completions.create(**kwargs)
        assert r.choices[0].message.content == raw
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].finish_reason == "stop"


def test_unterminated_call_with_whole_json_is_a_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("unterminated"), tools=[WEATHER_TOOL])
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Oslo"}


@pytest.mark.parametrize("stream", [False, True])
def test_bare_json_call_of_an_offered_tool(client: openai.OpenAI, stream: bool) -> None:
    """Small models sometimes drop the <tool_call> markers: a bare call object still counts."""
    kwargs = dict(model=MODEL, messages=user("no markers"), tools=[WEATHER_TOOL])
    if stream:
        got = collect_stream(client.chat.completions.create(stream=True, **kwargs))
        assert got["content"] == "" and got["finish_reason"] == "tool_calls"
        assert [(c["name"], json.loads(c["arguments"])) for c in got["tool_calls"].values()] == [
            ("get_weather", {"city": "Lima"})]
    else:
        r = client.chat.completions.create(**kwargs)
        assert r.choices[0].message.content is None and r.choices[0].finish_reason == "tool_calls"
        assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Lima"}
    # other JSON answers stay content; without tools nothing is parsed
    r = client.chat.completions.create(model=MODEL, messages=user("json answer"), tools=[WEATHER_TOOL])
    assert r.choices[0].message.content == '{"answer": 4}' and r.choices[0].message.tool_calls is None
    r = client.chat.completions.create(model=MODEL, messages=user("no markers"))
    assert r.choices[0].message.tool_calls is None


def test_tool_choice_none_hides_tools_and_parses_nothing(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("weather?"), tools=[WEATHER_TOOL],
                                       tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content.startswith("<tool_call>")
    prompt = fake_engine.detokenize(fake_engine.requests[-1][0])
    assert "<tools>" not in prompt


def test_tool_choice_required_prefills_a_call(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("say hi"), tools=[WEATHER_TOOL],
                                       tool_choice="required")
    prompt = fake_engine.detokenize(fake_engine.requests[-1][0])
    assert prompt.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "')
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "forced"}
    assert r.choices[0].finish_reason == "tool_calls"


def test_tool_choice_named_prefills_the_name(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=user("say hi"), tools=[WEATHER_TOOL, BASH_TOOL],
        tool_choice={"type": "function", "function": {"name": "bash"}}, stream=False)
    prompt = fake_engine.detokenize(fake_engine.requests[-1][0])
    assert prompt.endswith('<tool_call>\n{"name": "bash", "arguments":')
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "forced"}


def test_tool_result_round_trip(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    first = client.chat.completions.create(model=MODEL, messages=user("weather in Paris?"), tools=[WEATHER_TOOL])
    call = first.choices[0].message.tool_calls[0]
    messages = user("weather in Paris?") + [
        first.choices[0].message.model_dump(exclude_none=True),  # sent back as received (extra fields too)
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    assert r.choices[0].message.content == "It is sunny in Paris."
    prompt = fake_engine.detokenize(fake_engine.requests[-1][0])
    # the assistant's call is rendered with its arguments as an object, the result as a tool response
    assert '"arguments": {"city": "Paris"}' in prompt
    assert '<tool_response>\n{"sky": "clear"}\n</tool_response>' in prompt


def test_developer_role_and_content_parts(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    client.chat.completions.create(model=MODEL, messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}])
    prompt = fake_engine.detokenize(fake_engine.requests[-1][0])
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt
    assert "<|im_start|>user\npart one\npart two<|im_end|>" in prompt


def test_max_tokens_and_finish_length(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("long"), max_tokens=5)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = client.chat.completions.create(model=MODEL, messages=user("long"), max_completion_tokens=3, max_tokens=9)
    assert r.usage.completion_tokens == 3


def test_stop_and_sampling_reach_the_engine(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    messages = user("sampling")
    text, _ = expected_reply(fake_engine, messages)
    stop = text.split()[2]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, stop=[stop], temperature=0.7, top_p=0.9, seed=-1, presence_penalty=0.5,
        frequency_penalty=-0.5, extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1})
    assert r.choices[0].message.content == text[: text.find(stop)]
    sampling = {k: v for k, v in fake_engine.requests[-1][1].items() if k not in ("resident_prefix", "conversation")}  # the system turn, its conversation
    assert sampling == {"max_tokens": sampling["max_tokens"], "temperature": 0.7, "top_p": 0.9, "seed": 2**64 - 1,
                        "presence_penalty": 0.5, "frequency_penalty": -0.5, "top_k": 40, "min_p": 0.05,
                        "repeat_penalty": 1.1, "stop": [stop]}


def test_top_p_zero_is_greedy(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    client.chat.completions.create(model=MODEL, messages=user("x"), top_p=0)
    assert fake_engine.requests[-1][1]["temperature"] == 0.0 and "top_p" not in fake_engine.requests[-1][1]


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs(client: openai.OpenAI, fake_engine: FakeEngine, stream: bool) -> None:
    messages = user("logprobs please")
    text, _ = expected_reply(fake_engine, messages)
    kwargs = dict(model=MODEL, messages=messages, logprobs=True, top_logprobs=2)
    if stream:
        entries = []
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                if choice.logprobs and choice.logprobs.content:
                    entries += choice.logprobs.content
    else:
        entries = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    assert "".join(e.token for e in entries) == text
    assert all(e.logprob == -0.25 and len(e.top_logprobs) == 2 for e in entries)
    assert entries[0].top_logprobs[1].token == "x" and entries[0].bytes == list(entries[0].token.encode())
    assert fake_engine.requests[-1][1]["logprobs"] == 2


def test_user_and_metadata_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("x"), user="u-1", metadata={"k": "v"}, n=1,
                                       response_format={"type": "text"}, store=False)
    assert r.choices[0].message.content


def test_arguments_nested_past_the_parser_depth_are_text(http: httpx.Client, gateway: Any) -> None:
    """An assistant tool call in the history whose arguments nest deeper than Python's JSON parser
    can go (found by a new-user test: a RecursionError and a 500) is rendered as the text it is."""
    deep = "[" * 1500 + "]" * 1500  # past the parser's ~1,000 levels, inside the context
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": deep}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    for body in ({"model": "fake-qwen", "messages": history},
                 {"model": "fake-qwen", "messages": history, "tools": [BASH_TOOL]}):
        r = http.post(gateway.base_url + "/chat/completions", json=body)
        assert r.status_code == 200, r.text
