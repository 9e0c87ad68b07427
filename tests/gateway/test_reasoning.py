"""A thinking model's reasoning apart from its answer (``fak.gateway.reasoning``): chat
completions ``reasoning_content``, Anthropic ``thinking`` blocks, Responses ``reasoning`` items,
streamed and not, tool calls parsed from the answer only, reasoning sent back to the template,
and the switches that turn thinking off.

The fake engine here renders Qwen3's template (``gateway_fakes.thinking_engine``) and answers
``THINK_SCRIPT``; one test runs the real engine on the tiny synthetic qwen3 model. To add a case,
add a trigger and reply to ``THINK_SCRIPT`` and ask through one of the SDKs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fak.gateway import BackgroundServer, GatewayConfig, create_app
from fak.gateway.reasoning import ReasoningSplitter, prompt_opens_reasoning, template_thinks
from gateway_fakes import QWEN3_TEMPLATE, WEATHER_TOOL, FakeEngine, thinking_engine, xml_engine

MODEL = "fake-qwen"


def _split(parts: list[str], in_reasoning: bool = False) -> tuple[str, str]:
    sp = ReasoningSplitter(in_reasoning=in_reasoning)
    r = c = ""
    for p in parts:
        a, b = sp.feed(p)
        r, c = r + a, c + b
    a, b = sp.finish()
    return r + a, c + b


def _splits(text: str) -> list[list[str]]:
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


@pytest.mark.parametrize("text,in_reasoning,want", [
    ("<think>\nA\nB\n</think>\n\nThe answer.", False, ("A\nB", "The answer.")),
    ("  \n<think>x</think>y", False, ("x", "y")),
    ("\nNo thinking here.\n", False, ("", "\nNo thinking here.\n")),  # the text as it came
    ("<thinking> is not the tag", False, ("", "<thinking> is not the tag")),
    ("I think <think> mid-answer is text", False, ("", "I think <think> mid-answer is text")),
    ("Reasoning\n</think>\n\nAnswer", True, ("Reasoning", "Answer")),
    ("<think>\ncut off in the mid", False, ("cut off in the mid", "")),
    ("<think>\n\n</think>\n\n", False, ("", "")),
    ("<think>a</think>b</think>c", False, ("a", "b</think>c")),
])
def test_splitter_any_split(text: str, in_reasoning: bool, want: tuple[str, str]) -> None:
    for parts in _splits(text):
        assert _split(parts, in_reasoning) == want, parts


def test_which_templates_think() -> None:
    from gateway_fakes import XML_TEMPLATE

    assert template_thinks(QWEN3_TEMPLATE.read_text())
    assert not template_thinks(XML_TEMPLATE.read_text()) and not template_thinks(None)
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return thinking_engine()


@pytest.fixture(scope="module")
def server(engine: FakeEngine) -> Any:
    with BackgroundServer(create_app(GatewayConfig(), engine=engine)) as srv:
        yield srv


def _prompt(engine: FakeEngine) -> str:
    return engine.detokenize(engine.requests[-1][0])


# -- chat completions


def test_chat_reasoning_content(server: Any) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a haiku please"}])
    msg = r.choices[0].message
    assert msg.content == "Leaves fall.\nRed and gold.\nAutumn."
    assert msg.model_extra["reasoning_content"] == "A haiku has three lines."
    chunks = list(client.chat.completions.create(model=MODEL, stream=True,
                                                 messages=[{"role": "user", "content": "a haiku please"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Leaves fall.\nRed and gold.\nAutumn."


def test_chat_stream_reasoning_deltas_come_first(server: Any, http: httpx.Client) -> None:
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "a haiku please"}]}
    with http.stream("POST", server.base_url + "/chat/completions", json=body) as r:
        raw = b"".join(r.iter_raw()).decode()
    deltas = [json.loads(x[6:])["choices"][0]["delta"] for x in raw.split("\n\n") if x.startswith("data: {")]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning == "A haiku has three lines." and content == "Leaves fall.\nRed and gold.\nAutumn."
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all("reasoning_content" not in d for d in deltas[first_content:])
    assert "<think>" not in raw


def test_chat_tool_call_after_thinking_and_reasoning_sent_back(server: Any, engine: FakeEngine) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "weather in Paris?"}],
                                       tools=[WEATHER_TOOL])
    msg = r.choices[0].message
    assert [c.function.name for c in msg.tool_calls] == ["get_weather"] and not msg.content
    assert r.choices[0].finish_reason == "tool_calls"
    thought = msg.model_extra["reasoning_content"]
    assert thought == "The user wants the weather.\nI will call the tool."
    call = msg.tool_calls[0]
    client.chat.completions.create(model=MODEL, tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": thought,
         "tool_calls": [{"id": call.id, "type": "function", "function": call.function.model_dump()}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    # the template shows the turn's reasoning again (it is after the last user query)
    assert f"<think>\n{thought}\n</think>" in _prompt(engine)


def test_chat_enable_thinking_false(server: Any, engine: FakeEngine, http: httpx.Client) -> None:
    r = http.post(server.base_url + "/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hello"}],
        "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200
    assert _prompt(engine).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_no_split_without_a_thinking_template(start_gateway: Any) -> None:
    eng = xml_engine(script=[("x", "<think>\nhm\n</think>\n\nok")])
    srv = start_gateway(engine=eng)
    r = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert r.choices[0].message.content == "<think>\nhm\n</think>\n\nok"
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


# -- Anthropic messages


def test_messages_thinking_blocks(server: Any, engine: FakeEngine) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    r = client.messages.create(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "a haiku please"}])
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert r.content[0].thinking == "A haiku has three lines." and r.content[1].text.startswith("Leaves fall.")
    with client.messages.stream(model=MODEL, max_tokens=200, tools=[{
            "name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}],
            messages=[{"role": "user", "content": "weather in Paris?"}]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"] and final.stop_reason == "tool_use"
    assert final.content[0].thinking.startswith("The user wants the weather.")
    # the thinking block sent back is the turn's reasoning in the template
    client.messages.create(model=MODEL, max_tokens=50, messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": final.content[1].id, "content": "sunny"}]}],
        tools=[{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}])
    assert "<think>\nThe user wants the weather." in _prompt(engine)
    client.messages.create(model=MODEL, max_tokens=50, thinking={"type": "disabled"},
                           messages=[{"role": "user", "content": "hello"}])
    assert _prompt(engine).endswith("<think>\n\n</think>\n\n")


def test_messages_stream_events(server: Any, http: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": "a haiku"}]}
    with http.stream("POST", server.url + "/v1/messages", json=body) as r:
        raw = b"".join(r.iter_raw()).decode()
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    kinds = [e["delta"]["type"] for e in events if e["type"] == "content_block_delta"]
    assert kinds[0] == "thinking_delta" and kinds[-1] == "text_delta"


# -- Responses


def test_responses_reasoning_item(server: Any, engine: FakeEngine) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    r = client.responses.create(model=MODEL, input="a haiku please")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "A haiku has three lines."
    assert r.output_text.startswith("Leaves fall.") and r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(client.responses.create(model=MODEL, input="a haiku please", stream=True))
    types = [e.type for e in events]
    assert "response.reasoning_text.delta" in types and "response.reasoning_text.done" in types
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
    assert [o.type for o in events[-1].response.output] == ["reasoning", "message"]
    # a reasoning item sent back is the next assistant turn's reasoning
    weather = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}
    first = client.responses.create(model=MODEL, input="weather in Paris?", tools=[weather])
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    client.responses.create(model=MODEL, tools=[weather], input=[
        {"role": "user", "content": "weather in Paris?"}, *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "sunny"}])
    assert "<think>\nThe user wants the weather." in _prompt(engine)
    client.responses.create(model=MODEL, input="hello", reasoning={"effort": "none"})
    assert _prompt(engine).endswith("<think>\n\n</think>\n\n")


# -- the real engine


def test_real_engine_thinking_prefill(tmp_path: Path) -> None:
    """The tiny synthetic qwen3 model with a thinking-only template (the prompt opens
    ``<think>``): everything the model writes before ``</think>`` is reasoning."""
    synth = pytest.importorskip("fak.synth")
    from fak.engine import Engine

    path = tmp_path / "q3.gguf"
    synth.write_tiny_model(path, "qwen3")
    source = QWEN3_TEMPLATE.read_text()
    opening = "{{- '<|im_start|>assistant\\n' -}}"
    assert source.count(opening) == 1
    source = source.replace(opening, opening + "{{- '<think>\\n' -}}")
    with Engine(path, backend="cpu", n_ctx=512, chat_template=source) as eng, \
            BackgroundServer(create_app(GatewayConfig(model_name="tiny"), engine=eng)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=12, temperature=0)
        msg = r.choices[0].message
        text = eng.detokenize(eng.tokenize(msg.model_extra.get("reasoning_content") or "", add_special=False))
        if "</think>" not in text:
            assert msg.model_extra["reasoning_content"] and not msg.content
