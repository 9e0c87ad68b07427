"""The API fuzzed from its own OpenAPI schema with schemathesis: zero 5xx, every 4xx OpenAI-shaped.

The schema is the one the server serves (``/schema/openapi.json``, the same object), loaded once
at import; schemathesis generates valid and invalid bodies per operation (positive and negative
modes) and each case is sent to the live server over HTTP. Most generated bodies get the served
model's name so the cases reach past the model check into sampling, tools and the engine.
Half of the generated bodies are also repaired (``repair``: content where a role needs it, a
tool_call_id on tool messages, ``n`` = 1, ...) so that many reach the engine and the streaming path,
not only the validators; the test checks that some did. Examples per operation are bounded
(``MAX_EXAMPLES``) to keep the suite fast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fak.gateway import BackgroundServer, GatewayConfig, create_app
from gateway_fakes import SCRIPT, FakeEngine, FakePolicy
from hypothesis import HealthCheck, settings

MAX_EXAMPLES = 60
MODEL = "fake-qwen"

ENGINE = FakeEngine(script=list(SCRIPT), n_ctx=2048)
APP = create_app(GatewayConfig(model_name=MODEL, max_queue=1024), engine=ENGINE, policy=FakePolicy())
schema = schemathesis.openapi.from_dict(APP.openapi_schema.to_schema())


REACHED: dict[str, int] = {}


def repair(path: str, body: dict[str, Any]) -> None:
    """Make a generated body semantically valid where the schema alone cannot say so."""
    body["model"] = MODEL
    for key in ("n", "best_of", "suffix", "logit_bias", "response_format", "tool_choice", "echo"):
        body.pop(key, None)
    if not body.get("stream"):
        body.pop("stream_options", None)
    if not body.get("logprobs"):
        body.pop("top_logprobs", None)
    if isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = min(body["max_tokens"], 64)
    body.pop("max_completion_tokens", None)
    if path.endswith("/chat/completions") and isinstance(body.get("messages"), list):
        for msg in body["messages"]:
            if isinstance(msg, dict):
                if msg.get("content") is None or isinstance(msg.get("content"), list):
                    msg["content"] = "hello"
                if msg.get("role") == "tool":
                    msg["tool_call_id"] = "call_1"
    if path.endswith("/v1/completions"):
        if not body.get("prompt") or isinstance(body.get("prompt"), list):
            body["prompt"] = "Once upon a time"


@pytest.fixture(scope="module")
def live() -> Iterator[BackgroundServer]:
    with BackgroundServer(APP) as srv:
        yield srv


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: Any, live: BackgroundServer) -> None:
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).digest()
        if digest[0] % 4 == 3:
            body["model"] = MODEL
        elif digest[0] % 4 != 0:
            repair(case.path, body)
    response = case.call(base_url=live.url, timeout=60)
    if case.method == "POST" and response.status_code == 200:
        REACHED[case.path] = REACHED.get(case.path, 0) + 1
    assert response.status_code < 500, (case.method, case.path, body, response.text[:500])
    if 400 <= response.status_code < 500:
        data = response.json()
        error = data["error"]
        if case.path.startswith("/v1/messages"):  # Anthropic's shape
            assert data["type"] == "error" and set(error) == {"type", "message"} and error["message"]
        else:
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert ENGINE.running >= 0


def test_fuzzing_reached_the_engine() -> None:
    """Runs after the fuzz cases (file order): the repaired bodies did get generated answers."""
    assert REACHED.get("/v1/chat/completions", 0) >= 5, REACHED
    assert REACHED.get("/v1/completions", 0) >= 5, REACHED
    assert ENGINE.running == 0 and ENGINE.kv_blocks_used == 0
