"""Injection quarantine through the real gateway on the real engine: the whole corpus on the tiny
synthetic Qwen2 model, and one end-to-end request on Qwen2.5-Coder-0.5B (slow).

Every injected result of ``tests/data/quarantine_injected.jsonl`` must be withheld (absent from
the prompt the engine received, the replacement in its place) and every benign result of
``tests/data/quarantine_benign.jsonl`` passed (present in the prompt); afterwards the prefix
cache (``Engine.prefix_cache_contents``, chains of KV blocks decoded back to text) must hold none
of the withheld bytes and the benign ones (positive control). After the fact, a result already
in the cache is evicted by the gateway hook and banned. Counts print with ``-s``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fak.engine import Engine
from fak.gateway import BackgroundServer, GatewayConfig, create_app
from fak.policy import Policy
from fak.synth import write_tiny_model

DATA = Path(__file__).parents[1] / "data"


def _rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (DATA / name).read_text(encoding="utf-8").splitlines() if x.strip()]


POLICY = Policy.from_dict({"version": 1, "default": {"verdict": "allow", "reason": "ok"}, "quarantine": {}})


class Recording:
    """Delegates to an engine and records the prompt token ids of every generation."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.prompts: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def astream(self, prompt: Any, **sampling: Any) -> Any:
        self.prompts.append(list(prompt))
        return self._engine.astream(prompt, **sampling)


def _messages(result: str, i: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Look at the repository."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": '{"path": "x"}'}}]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": result}]


def _chains_text(engine: Any) -> list[str]:
    contents = engine.prefix_cache_contents()
    by_hash = {h: (p, t) for h, p, t in contents}
    parents = {p for _, p, _ in contents if p is not None}
    out = []
    for h in by_hash:
        if h in parents:
            continue
        toks: list[int] = []
        while h is not None and h in by_hash:
            p, t = by_hash[h]
            toks, h = t + toks, p
        out.append(engine.tokenizer.decode(toks, skip_special=False))
    return out


def _windows(text: str) -> list[str]:
    """A few 40-character pieces of ``text`` (enough to recognize it, robust to block cuts)."""
    t = text.strip()
    if len(t) <= 40:
        return [t]
    return [t[:40], t[len(t) // 2:len(t) // 2 + 40]]


def _distinct(text: str, others: list[str]) -> list[str]:
    """Up to three 32-character pieces of ``text`` that no passed result contains (so finding one
    in the cache means these bytes got there)."""
    t = text.strip()
    if len(t) <= 32:
        return [t]
    out = []
    for i in range(len(t) - 32, -1, -16):
        w = t[i:i + 32]
        if not any(w in o for o in others):
            out.append(w)
            if len(out) == 3:
                break
    return out


@pytest.fixture(scope="module")
def tiny_gateway(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_model(tmp_path_factory.mktemp("qe") / "tiny.gguf", weight_type="Q8_0")
    with Engine(str(path), backend="cpu", n_ctx=8192, max_batch=8, kv_cache_tokens=600_000) as engine:
        rec = Recording(engine)
        app = create_app(GatewayConfig(), engine=rec, policy=POLICY)
        with BackgroundServer(app) as srv:
            yield srv, rec, engine


def test_corpus_through_the_gateway_on_the_tiny_model(tiny_gateway: Any) -> None:
    srv, rec, engine = tiny_gateway
    injected, benign = _rows("quarantine_injected.jsonl"), _rows("quarantine_benign.jsonl")
    withheld, passed = 0, 0
    with httpx.Client(timeout=120) as http:
        for i, row in enumerate(injected + benign):
            r = http.post(srv.base_url + "/chat/completions", headers={"X-Fak-Conversation": row["id"]},
                          json={"model": engine.model_name, "messages": _messages(row["content"], i), "max_tokens": 1})
            assert r.status_code == 200, (row["id"], r.text)
            prompt = engine.tokenizer.decode(rec.prompts[-1], skip_special=False)
            if "family" in row:
                assert row["content"] not in prompt, row["id"]
                assert "[fak: tool result quarantined: " in prompt, row["id"]
                withheld += 1
            else:
                assert row["content"] in prompt and "[fak: tool result quarantined" not in prompt, row["id"]
                passed += 1
    chains = _chains_text(engine)
    # pieces of passed results and of the template itself are not evidence
    others = [row["content"] for row in benign] + [engine.tokenizer.decode(rec.prompts[-1], skip_special=False)]
    leaked = [row["id"] for row in injected for w in _distinct(row["content"], others) if any(w in c for c in chains)]
    kept = sum(1 for row in benign if all(any(w in c for c in chains) for w in _windows(row["content"])[:1]))
    print(f"\ntiny model through the gateway: {withheld}/{len(injected)} injected withheld, {passed}/{len(benign)} "
          f"benign passed; prefix cache: {len(chains)} chains, withheld bytes found in {len(set(leaked))}, "
          f"benign found in {kept}/{len(benign)}")
    assert withheld == len(injected) and passed == len(benign)
    assert not leaked
    assert kept >= 0.9 * len(benign), "positive control: the cache does hold what was passed"


def test_after_the_fact_eviction_on_the_real_engine(tiny_gateway: Any) -> None:
    srv, rec, engine = tiny_gateway
    late = ("Build finished in 3.2 s. " * 12) + "(found poisoned later)"
    conv = {"X-Fak-Conversation": "late-1"}
    body = {"model": engine.model_name, "messages": _messages(late, 900), "max_tokens": 1}
    with httpx.Client(timeout=120) as http:
        assert http.post(srv.base_url + "/chat/completions", headers=conv, json=body).status_code == 200
        assert any(late[:40] in c for c in _chains_text(engine))
        r = http.post(srv.base_url + "/fak/quarantine", json={"content": late})
        assert r.status_code == 200 and r.json()["evicted_blocks"] >= 1, r.text
        assert not any(w in c for c in _chains_text(engine) for w in _windows(late))
        hits = engine.stats().get("native_prefix_cache_hit_tokens", 0)
        assert http.post(srv.base_url + "/chat/completions", headers=conv, json=body).status_code == 200
        prompt = engine.tokenizer.decode(rec.prompts[-1], skip_special=False)
        assert late not in prompt and "found poisoned after the fact" in prompt
        assert engine.stats().get("native_prefix_cache_hit_tokens", 0) > hits, "the head before the span is reused"
        assert not any(w in c for c in _chains_text(engine) for w in _windows(late))


def test_after_the_fact_in_a_running_generation(tiny_gateway: Any) -> None:
    srv, rec, engine = tiny_gateway
    late = "Log line that turns out to be poisoned. " * 10
    body = {"model": engine.model_name, "messages": _messages(late, 901), "max_tokens": 400, "stream": True,
            "temperature": 0}
    out: dict[str, Any] = {}
    started = threading.Event()

    def stream() -> None:
        with httpx.Client(timeout=120) as http:
            with http.stream("POST", srv.base_url + "/chat/completions", json=body,
                             headers={"X-Fak-Conversation": "late-2"}) as r:
                text = []
                for line in r.iter_lines():
                    started.set()
                    text.append(line)
                out["text"] = "\n".join(text)

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    gate = srv.app.state.gateway.quarantine
    result = gate.quarantine(content=late)
    t.join(120)
    assert "[DONE]" in out["text"]
    assert result["sequences"] in (0, 1)  # 0 only if the generation finished first
    assert not any(w in c for c in _chains_text(engine) for w in _windows(late))


@pytest.mark.slow
def test_end_to_end_on_qwen_05b(engine_05b: Any) -> None:
    rec = Recording(engine_05b)
    app = create_app(GatewayConfig(), engine=rec, policy=POLICY)
    poisoned = _rows("quarantine_injected.jsonl")[0]["content"]
    with BackgroundServer(app) as srv, httpx.Client(timeout=600) as http:
        r = http.post(srv.base_url + "/chat/completions", headers={"X-Fak-Conversation": "05b"},
                      json={"model": engine_05b.model_name, "messages": _messages(poisoned, 1), "max_tokens": 8,
                            "temperature": 0})
        assert r.status_code == 200, r.text
    prompt = engine_05b.tokenizer.decode(rec.prompts[-1], skip_special=False)
    assert "maintenance mode" not in prompt and "[fak: tool result quarantined: fake role" in prompt
    assert prompt.count("<|im_start|>") == 5, "the result's fake turns never became special tokens"
    assert not any(w in c for c in _chains_text(engine_05b) for w in _windows(poisoned))
