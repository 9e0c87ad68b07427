"""``GET /health``."""

from __future__ import annotations

from typing import Any

import httpx


def test_health(gateway: Any, http: httpx.Client) -> None:
    r = http.get(gateway.url + "/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["mode"] == "engine" and body["model"] == "fake-qwen"
    assert set(body["engine"]) >= {"running", "waiting", "kv_blocks_used", "kv_blocks_total"}


def test_openapi_schema_is_served(gateway: Any, http: httpx.Client) -> None:
    doc = http.get(gateway.url + "/schema/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    post = doc["paths"]["/v1/chat/completions"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletionRequest")
    req = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert "messages" in req["required"]  # unknown fields are ignored (logged), not refused
    assert req["properties"]["messages"]["minItems"] == 1
    assert set(doc["paths"]) >= {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                 "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"}
