"""``POST /v1/completions`` through a real server with the official ``openai`` client."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from gateway_fakes import FakeEngine

MODEL = "fake-qwen"


def test_completion_text(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=100, temperature=0)
    text = fake_engine.reply_for("Once upon a time")
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == text and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len("Once upon a time") and r.usage.completion_tokens == len(text)
    assert fake_engine.requests[-1][1] == {"max_tokens": 100, "temperature": 0}


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time")
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_token_id_prompt_and_echo(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    ids = fake_engine.tokenize("Hello")
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=200, echo=True)
    assert fake_engine.requests[-1][0] == ids
    assert r.choices[0].text == "Hello" + fake_engine.reply_for("Hello")


def test_one_element_list_prompt(client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    r = client.completions.create(model=MODEL, prompt=["abc"], max_tokens=200)
    assert r.choices[0].text == fake_engine.reply_for("abc")


def test_stream(gateway: Any, http: httpx.Client, client: openai.OpenAI, fake_engine: FakeEngine) -> None:
    text = fake_engine.reply_for("stream it")
    chunks = list(client.completions.create(model=MODEL, prompt="stream it", max_tokens=200, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(text)
    with http.stream("POST", gateway.base_url + "/completions",
                     json={"model": MODEL, "prompt": "stream it", "stream": True}) as r:
        raw = b"".join(r.iter_raw()).decode()
    assert raw.endswith("data: [DONE]\n\n")
    first = json.loads(raw.split("\n\n")[0][6:])
    assert first["object"] == "text_completion" and first["choices"][0]["index"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_legacy_format(client: openai.OpenAI, fake_engine: FakeEngine, stream: bool) -> None:
    kwargs = dict(model=MODEL, prompt="lp", max_tokens=6, logprobs=2)
    if stream:
        tokens, lps, offsets = [], [], []
        for c in client.completions.create(stream=True, **kwargs):
            if c.choices and c.choices[0].logprobs:
                tokens += c.choices[0].logprobs.tokens
                lps += c.choices[0].logprobs.token_logprobs
                offsets += c.choices[0].logprobs.text_offset
    else:
        lp = client.completions.create(**kwargs).choices[0].logprobs
        tokens, lps, offsets = lp.tokens, lp.token_logprobs, lp.text_offset
        assert lp.top_logprobs[0] == {tokens[0]: -0.25, "x": -2.0}
    assert "".join(tokens) == fake_engine.reply_for("lp")[:6]
    assert lps == [-0.25] * 6 and offsets == list(range(6))


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
    ({"model": MODEL, "prompt": []}, "prompt"),
    ({"model": MODEL, "prompt": ["a", 1]}, "prompt"),
    ({"model": MODEL, "prompt": [-1]}, "prompt"),
    ({"model": MODEL, "prompt": [0x7FFFFFFF]}, "prompt"),
    ({"model": MODEL, "prompt": "x", "n": 3}, "n"),
    ({"model": MODEL, "prompt": "x", "best_of": 2}, "best_of"),
    ({"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix"),
    ({"model": MODEL, "prompt": "x", "logprobs": 9}, "logprobs"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "echo": "yes"}, "echo"),
    ({"model": MODEL, "prompt": "x", "messages": []}, "messages"),
    ({"model": MODEL}, "prompt"),
    ({"model": MODEL, "prompt": "x", "stop": [""]}, "stop[0]"),
    ({"model": MODEL, "prompt": "x", "stop": ""}, "stop"),
    ({"model": MODEL, "prompt": [0x110004]}, "prompt"),  # the fake's vocabulary ends below it
])
def test_bad_completion_requests(gateway: Any, http: httpx.Client, body: dict, param: str) -> None:
    r = http.post(gateway.base_url + "/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_model(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")


def test_text_offset_same_streamed_or_not(start_gateway: Any, http: httpx.Client) -> None:
    """text_offset counts the tokens' own texts from the end of the echo, in a stream as in one
    response, even where the text sent differs from the tokens (a denied shell block replaced by
    the policy's note)."""
    from gateway_fakes import SCRIPT, FakePolicy

    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT), chunk=3), policy=FakePolicy())
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    kwargs: dict[str, Any] = dict(model=MODEL, prompt="wipe disk", max_tokens=200, logprobs=1, echo=True,
                                  extra_headers={"X-Fak-Text-Tools": "bash"})
    whole = client.completions.create(**kwargs).choices[0].logprobs
    tokens, offsets = [], []
    for c in client.completions.create(stream=True, **kwargs):
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens
            offsets += c.choices[0].logprobs.text_offset
    assert tokens == whole.tokens and offsets == whole.text_offset
    assert whole.text_offset[0] == len("wipe disk")
    assert whole.text_offset == [len("wipe disk") + sum(len(t) for t in whole.tokens[:i]) for i in range(len(tokens))]
