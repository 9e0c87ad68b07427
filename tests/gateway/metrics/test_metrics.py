"""``GET /metrics``: Prometheus exposition of requests, tokens, latencies, KV cache, verdicts."""

from __future__ import annotations

from typing import Any

import httpx
import openai
from gateway_fakes import FakeEngine, FakePolicy, scrape


def test_metrics_count_requests_tokens_and_latency(start_gateway: Any, http: httpx.Client) -> None:
    eng = FakeEngine()
    srv = start_gateway(engine=eng, policy=FakePolicy())
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    r1 = client.chat.completions.create(model="fake-qwen", messages=[{"role": "user", "content": "a"}])
    r2 = client.completions.create(model="fake-qwen", prompt="b", max_tokens=5)
    for _ in client.chat.completions.create(model="fake-qwen", messages=[{"role": "user", "content": "c"}],
                                            stream=True, max_tokens=4):
        pass
    http.post(srv.base_url + "/chat/completions", json={"model": "nope", "messages": []})
    http.get(srv.url + "/no/such/path")
    m = scrape(http, srv.url)
    assert m[("fak_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "200")))] == 2
    assert m[("fak_requests_total", (("endpoint", "/v1/completions"), ("status", "200")))] == 1
    assert m[("fak_requests_total", (("endpoint", "/v1/chat/completions"), ("status", "400")))] == 1
    assert m[("fak_requests_total", (("endpoint", "other"), ("status", "404")))] == 1
    n_prompt = r1.usage.prompt_tokens + r2.usage.prompt_tokens + len(eng.requests[2][0])
    assert m[("fak_prompt_tokens_total", ())] == n_prompt
    assert m[("fak_completion_tokens_total", ())] == r1.usage.completion_tokens + 5 + 4
    assert m[("fak_time_to_first_token_seconds_count", ())] == 3
    assert m[("fak_time_per_output_token_seconds_count", ())] == 3
    assert m[("fak_request_latency_seconds_count", ())] == 3
    assert m[("fak_requests_cancelled_total", ())] == 0
    assert m[("fak_kv_cache_blocks_used", ())] == 0 and m[("fak_kv_cache_blocks_total", ())] == eng.kv_blocks_total
    assert m[("fak_engine_batch_size", ())] == 0 and m[("fak_requests_running", ())] == 0


def test_metrics_policy_verdicts(start_gateway: Any, http: httpx.Client) -> None:
    from gateway_fakes import BASH_TOOL, SCRIPT

    srv = start_gateway(engine=FakeEngine(script=list(SCRIPT)), policy=FakePolicy())
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(model="fake-qwen", messages=[{"role": "user", "content": "clean up"}],
                                   tools=[BASH_TOOL])
    m = scrape(http, srv.url)
    assert m[("fak_policy_verdicts_total", (("tool", "bash"), ("verdict", "deny")))] == 1
    assert m[("fak_policy_verdicts_total", (("tool", "bash"), ("verdict", "allow")))] == 1


def test_rejected_requests_are_not_cancellations(start_gateway: Any, http: httpx.Client) -> None:
    """A request the engine refuses before its first token (here: a prompt the KV cache can never
    hold) counts in fak_requests_rejected_total{reason}, never in fak_requests_cancelled_total."""
    srv = start_gateway(engine=FakeEngine(kv_blocks_total=1, kv_block_size=4))
    for stream in (False, True):
        r = http.post(srv.base_url + "/chat/completions", json={
            "model": "fake-qwen", "stream": stream, "messages": [{"role": "user", "content": "a long question"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "kv_cache_full"
    r = http.post(srv.base_url + "/completions", json={"model": "fake-qwen", "prompt": "x", "max_tokens": 4})
    assert r.status_code == 200
    m = scrape(http, srv.url)
    assert m[("fak_requests_rejected_total", (("reason", "kv_cache_full"),))] == 2
    assert m[("fak_requests_cancelled_total", ())] == 0


def test_every_protocol_has_its_endpoint_label(start_gateway: Any, http: httpx.Client) -> None:
    """Anthropic messages, count_tokens and responses are counted under their own paths, not
    ``other`` (bench_clients reads the requests per endpoint)."""
    srv = start_gateway(engine=FakeEngine(), model_aliases=("*",))
    http.post(srv.url + "/v1/messages", json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    http.post(srv.url + "/v1/messages/count_tokens", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    http.post(srv.url + "/v1/responses", json={"model": "m", "input": "hi"})
    m = scrape(http, srv.url)
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses"):
        assert m[("fak_requests_total", (("endpoint", path), ("status", "200")))] == 1, path
