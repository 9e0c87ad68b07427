"""Prefix caching for agents' habits: the prompt tokens the prefix cache held, per request (each
protocol's usage field) and per conversation (``/health`` ``prefix_cache``); the system turn's
tokens sent to the engine as its resident prefix; and, on the real engine, a resident prefix that
outlives the dead tails of other conversations under memory pressure where plain LRU loses it.

The fake engine simulates a prefix cache of whole blocks (``FakeEngine._cached``). To add a case,
send requests through ``start_gateway`` and read ``usage`` or ``/health``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from gateway_fakes import FakeEngine

SYSTEM = "You are a careful coding agent. " * 20
MODEL = "fake-qwen"


def _chat(client: openai.OpenAI, system: str, user: str, conversation: str) -> Any:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": system},
                                                                 {"role": "user", "content": user}],
                                          extra_headers={"X-Fak-Conversation": conversation})


def test_cached_tokens_in_every_protocol_and_per_conversation(start_gateway: Any, http: httpx.Client) -> None:
    eng = FakeEngine()
    srv = start_gateway(engine=eng)
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    first = _chat(client, SYSTEM, "list the files", "main")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = _chat(client, SYSTEM, "read setup.py", "main")
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= len(SYSTEM) - 16 and cached % eng.kv_block_size == 0
    _chat(client, "You are a sub-agent that searches.", "find foo", "sub")
    # Anthropic: input_tokens + cache_read_input_tokens = the prompt
    a = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0).messages.create(
        model=MODEL, max_tokens=20, system=SYSTEM, messages=[{"role": "user", "content": "and now?"}],
        extra_headers={"X-Fak-Conversation": "main"})
    assert a.usage.cache_read_input_tokens >= len(SYSTEM) - 16 and a.usage.cache_creation_input_tokens == 0
    prompt_tokens = len(eng.requests[-1][0])
    assert a.usage.input_tokens + a.usage.cache_read_input_tokens == prompt_tokens
    r = client.responses.create(model=MODEL, instructions=SYSTEM, input="and then?",
                                extra_headers={"X-Fak-Conversation": "main"})
    assert r.usage.input_tokens_details.cached_tokens >= len(SYSTEM) - 16
    stats = http.get(srv.url + "/health").json()["prefix_cache"]
    by = {c["conversation"]: c for c in stats["conversations"]}
    assert by["main"]["requests"] == 4 and by["sub"]["requests"] == 1 and by["sub"]["cached_tokens"] <= 16
    assert 0.4 < by["main"]["hit_rate"] < 1 and stats["requests"] == 5
    assert stats["cached_tokens"] == sum(c["cached_tokens"] for c in by.values())


def test_the_system_turn_is_the_resident_prefix_once_shared(start_gateway: Any) -> None:
    """A system turn one conversation uses is left to the LRU; once a second conversation uses
    it (another session of the same agent), it is sent as the resident prefix."""
    eng = FakeEngine()
    srv = start_gateway(engine=eng)
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    _chat(client, SYSTEM, "hello", "c")
    _chat(client, SYSTEM, "and more", "c")
    assert "resident_prefix" not in eng.requests[-1][1]
    _chat(client, SYSTEM, "hello", "d")
    head = eng.apply_chat_template([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)
    assert eng.requests[-1][1]["resident_prefix"] == len(eng.tokenize(head)) - 1
    assert eng.detokenize(eng.requests[-1][0]).startswith(head)
    _chat(client, SYSTEM, "again", "c")
    assert eng.requests[-1][1]["resident_prefix"] == len(eng.tokenize(head)) - 1
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "no system"}])
    assert "resident_prefix" not in eng.requests[-1][1]


def _prompt(seed: int, n: int, n_vocab: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, n_vocab - 10) for _ in range(n)]


@pytest.mark.parametrize("resident", [False, True])
def test_a_resident_prefix_outlives_dead_tails(tmp_path_factory: pytest.TempPathFactory, resident: bool) -> None:
    """The real engine with a 20-block KV cache (32 tokens a block): a 4-block "system prompt"
    used once, then three 8-block conversations that never come back. Plain LRU evicts the system
    prompt's blocks (the oldest); marked resident, they get second chances and the next request
    with that system prompt finds them."""
    synth = pytest.importorskip("fak.synth")
    from fak import _native
    from fak.engine import Engine

    if "take_prefix_hits" not in dir(_native.EngineCore):
        pytest.skip("the native extension predates per-sequence prefix hits (scripts/dev-build)")
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    synth.write_tiny_model(path)
    with Engine(path, backend="cpu", n_ctx=512, kv_cache_tokens=20 * 32, max_batch=1) as eng:
        system = _prompt(1, 128, eng.n_vocab)
        extra = {"resident_prefix": 128} if resident else {}
        first = list(eng.stream(system + _prompt(2, 20, eng.n_vocab), max_tokens=1, temperature=0, **extra))
        assert first[0].cached_tokens == 0
        for seed in (3, 4, 5):
            list(eng.stream(_prompt(seed, 250, eng.n_vocab), max_tokens=1, temperature=0))
        again = list(eng.stream(system + _prompt(6, 20, eng.n_vocab), max_tokens=1, temperature=0, **extra))
        assert again[0].cached_tokens == (128 if resident else 0)
