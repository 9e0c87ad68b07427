"""Bad input gets an OpenAI error object with the right 4xx, never a traceback.

Raw HTTP (httpx) for malformed bodies, the ``openai`` client for its typed exceptions. To add a
case, append ``(body, status, param, code)`` to ``BAD_CHAT``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from fak.errors import ContextLengthError, KVCacheFullError, invalid_argument
from gateway_fakes import WEATHER_TOOL, FakeEngine

MODEL = "fake-qwen"
MSG = [{"role": "user", "content": "hi"}]


def assert_error(resp: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"] and "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def chat(**fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": MSG}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not ...}


BAD_CHAT = [
    (chat(model=...), 400, "model", None),
    (chat(messages=...), 400, "messages", None),
    (chat(messages=[]), 400, "messages", None),
    (chat(model=5), 400, "model", None),
    (chat(max_tokens="5"), 400, "max_tokens", None),
    (chat(max_tokens=0), 400, "max_tokens", None),
    (chat(max_tokens=1.5), 400, "max_tokens", None),
    (chat(temperature=2.5), 400, "temperature", None),
    (chat(temperature=-0.1), 400, "temperature", None),
    (chat(top_p=1.5), 400, "top_p", None),
    (chat(presence_penalty=3), 400, "presence_penalty", None),
    (chat(frequency_penalty=-3), 400, "frequency_penalty", None),
    (chat(top_logprobs=21, logprobs=True), 400, "top_logprobs", None),
    (chat(top_logprobs=2), 400, "top_logprobs", None),
    (chat(n=2), 400, "n", "unsupported_value"),
    (chat(stop=["a", "b", "c", "d", "e"]), 400, "stop", None),
    (chat(stream="yes"), 400, "stream", None),
    (chat(stream_options={"include_usage": True}), 400, "stream_options", None),
    (chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role", None),
    (chat(messages=[{"content": "x"}]), 400, "messages[0].role", None),
    (chat(messages=[{"role": "user"}]), 400, "messages[0].content", None),
    (chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content", None),
    (chat(messages=[{"role": "tool", "content": "x"}]), 400, "messages[0].tool_call_id", None),
    (chat(messages=[{"role": "assistant"}]), 400, "messages[0].content", None),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "messages[0].content[0].type", "unsupported_content"),
    (chat(tool_choice="required"), 400, "tool_choice", None),
    (chat(tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), 400,
     "tool_choice", None),
    (chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]), 400, "tools[0].function.name", None),
    (chat(tools=[{"type": "retrieval"}]), 400, "tools[0].type", None),
    (chat(logit_bias={"1": 5}), 400, "logit_bias", "unsupported_parameter"),
    (chat(response_format={"type": "json_object"}), 400, "response_format", "unsupported_value"),
    (chat(seed="x"), 400, "seed", None),
    (chat(stop=[""]), 400, "stop[0]", None),
    (chat(stop=["END", ""]), 400, "stop[1]", None),
    (chat(stop=""), 400, "stop", None),
]


@pytest.mark.parametrize("body,status,param,code", BAD_CHAT)
def test_bad_chat_requests(http: httpx.Client, gateway: Any, body: dict, status: int, param: str, code: str | None) -> None:
    assert_error(http.post(gateway.base_url + "/chat/completions", json=body), status, param, code)


@pytest.mark.parametrize("raw", [b"", b"{", b"not json", b"[1, 2]", b"null", b'"s"', b"\xff\xfe", b'{"model": "a",}'])
def test_malformed_bodies(http: httpx.Client, gateway: Any, raw: bytes) -> None:
    for path in ("/chat/completions", "/completions"):
        resp = http.post(gateway.base_url + path, content=raw, headers={"content-type": "application/json"})
        assert_error(resp, 400)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-9", messages=MSG)
    assert exc.value.status_code == 404
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"


def test_context_length_exceeded(start_gateway: Any) -> None:
    srv = start_gateway(engine=FakeEngine(n_ctx=64))
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 100}])
    assert exc.value.body["code"] == "context_length_exceeded" and "64 tokens" in exc.value.body["message"]
    with pytest.raises(openai.BadRequestError) as exc:  # prompt fits, prompt + max_tokens does not
        client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=60)
    assert exc.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="y" * 70)
    assert exc.value.body["code"] == "context_length_exceeded" and exc.value.body["param"] == "prompt"


def test_context_length_errors_name_the_field(start_gateway: Any) -> None:
    """The prompt alone too long names the prompt's field; a prompt that fits with a completion
    budget that does not names the budget's field (the one the client set)."""
    srv = start_gateway(engine=FakeEngine(n_ctx=64))
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    cases = [
        (lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 100}]),
         "messages"),
        (lambda: client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=60), "max_tokens"),
        (lambda: client.chat.completions.create(model=MODEL, messages=MSG, max_completion_tokens=60),
         "max_completion_tokens"),
        (lambda: client.completions.create(model=MODEL, prompt="y" * 70, max_tokens=4), "prompt"),
        (lambda: client.completions.create(model=MODEL, prompt="y" * 30, max_tokens=60), "max_tokens"),
        (lambda: client.completions.create(model=MODEL, prompt="y" * 60), "prompt"),  # + the default 16
        (lambda: client.completions.create(model=MODEL, prompt=[121] * 60), "prompt"),
    ]
    for call, param in cases:
        with pytest.raises(openai.BadRequestError) as exc:
            call()
        assert (exc.value.body["code"], exc.value.body["param"]) == ("context_length_exceeded", param)


def test_engine_side_errors_name_the_field(http: httpx.Client, start_gateway: Any) -> None:
    """Errors the engine raises (its own limits) name the request's field, the prompt's per endpoint."""
    eng = _FailingEngine()
    srv = start_gateway(engine=eng)
    eng.error = ContextLengthError("the prompt has 9 tokens but the context holds 8 tokens")
    err = assert_error(http.post(srv.base_url + "/chat/completions", json=chat()), 400, code="context_length_exceeded")
    assert err["param"] == "messages"
    body = {"model": MODEL, "prompt": "hello"}
    err = assert_error(http.post(srv.base_url + "/completions", json=body), 400, code="context_length_exceeded")
    assert err["param"] == "prompt"
    eng.error = invalid_argument("prompt_ids", "prompt token ids outside the vocabulary [0, 8): [9]")
    assert assert_error(http.post(srv.base_url + "/completions", json=body), 400)["param"] == "prompt"
    eng.error = invalid_argument("repeat_penalty", "repeat_penalty must be in (0, 10] (1 disables it), got 11")
    assert assert_error(http.post(srv.base_url + "/chat/completions", json=chat()), 400)["param"] == "repetition_penalty"


def test_404_and_405_are_openai_shaped(http: httpx.Client, gateway: Any) -> None:
    assert_error(http.get(gateway.url + "/v1/nothing"), 404, code="not_found")
    assert_error(http.post(gateway.url + "/nothing/at/all", json={}), 404)
    assert_error(http.get(gateway.base_url + "/chat/completions"), 405, code="method_not_allowed")
    assert_error(http.delete(gateway.base_url + "/models"), 405)


def test_body_too_large_is_413(http: httpx.Client, gateway: Any) -> None:
    big = b'{"model": "' + b"x" * (11 * 1024 * 1024) + b'"}'
    assert_error(http.post(gateway.base_url + "/chat/completions", content=big, timeout=60), 413)


def test_api_key(http: httpx.Client, start_gateway: Any, fake_engine: FakeEngine) -> None:
    srv = start_gateway(engine=fake_engine, api_key="s3cret")
    err = assert_error(http.get(srv.base_url + "/models"), 401, code="invalid_api_key")
    assert err["type"] == "authentication_error"
    assert_error(http.get(srv.base_url + "/models", headers={"Authorization": "Bearer wrong"}), 401)
    assert_error(http.get(srv.base_url + "/models", headers={"Authorization": "Basic s3cret"}), 401)
    assert_error(http.post(srv.base_url + "/chat/completions", json=chat()), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=srv.base_url, api_key="wrong", max_retries=0).models.list()
    ok = openai.OpenAI(base_url=srv.base_url, api_key="s3cret", max_retries=0)
    assert ok.models.list().data[0].id == MODEL
    assert ok.chat.completions.create(model=MODEL, messages=MSG).choices[0].message.content
    # health, metrics and the schema stay open for probes
    assert http.get(srv.url + "/health").status_code == 200
    assert http.get(srv.url + "/metrics").status_code == 200
    assert http.get(srv.url + "/schema/openapi.json").status_code == 200


class _FailingEngine(FakeEngine):
    """Raises ``error`` when a stream starts (before the first token) or after ``after`` deltas."""

    error: BaseException | None = None
    after: int | None = None

    async def astream(self, prompt: Any, **sampling: Any):  # type: ignore[override]
        if self.after is None and self.error is not None:
            raise self.error
        n = 0
        inner = super().astream(prompt, **sampling)
        try:
            async for delta in inner:
                if self.after is not None and n == self.after:
                    raise self.error  # type: ignore[misc]
                n += 1
                yield delta
        finally:
            await inner.aclose()


@pytest.mark.parametrize("error,status,code", [
    (KVCacheFullError("no free blocks"), 503, "kv_cache_full"),
    (ValueError("top_k out of range"), 400, "invalid_value"),
    (RuntimeError("kernel exploded"), 500, "engine_error"),
])
def test_engine_errors_before_first_token(http: httpx.Client, start_gateway: Any, error: BaseException, status: int, code: str) -> None:
    eng = _FailingEngine()
    eng.error = error
    srv = start_gateway(engine=eng)
    for stream in (False, True):
        err = assert_error(http.post(srv.base_url + "/chat/completions", json=chat(stream=stream)), status, code=code)
        assert "Traceback" not in err["message"]
    assert srv.app.state.gateway.admission.in_flight == 0


def test_engine_error_mid_stream_is_an_error_event(http: httpx.Client, start_gateway: Any) -> None:
    eng = _FailingEngine()
    eng.error, eng.after = RuntimeError("device lost"), 3
    srv = start_gateway(engine=eng)
    with http.stream("POST", srv.base_url + "/chat/completions", json=chat(stream=True)) as r:
        assert r.status_code == 200
        events = [e for e in b"".join(r.iter_raw()).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    err = json.loads(events[-2][6:])["error"]
    assert err["code"] == "engine_error" and err["type"] == "server_error"
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model=MODEL, messages=MSG, stream=True):
            pass
    assert eng.running == 0 and eng.kv_blocks_used == 0
    err = assert_error(http.post(srv.base_url + "/chat/completions", json=chat()), 500, code="engine_error")
    assert "RuntimeError" in err["message"]  # non-fak errors are named, not echoed


def test_litestar_validation_errors_become_openai_errors() -> None:
    """Litestar's own ValidationException (parameters it validates) gets the OpenAI shape too."""
    from litestar.exceptions import ValidationException
    from litestar.testing import RequestFactory

    from fak.gateway.errors import exception_handlers

    handler = exception_handlers()[ValidationException]
    exc = ValidationException(detail="Validation failed for GET /x",
                              extra=[{"message": "Expected `int`, got `str`", "key": "limit", "source": "query"}])
    resp = handler(RequestFactory().get("/x"), exc)
    assert resp.status_code == 400
    body = json.loads(resp.render(resp.content, "application/json"))
    assert body == {"error": {"message": "Invalid request: Expected `int`, got `str` (at 'limit')",
                              "type": "invalid_request_error", "param": "limit", "code": None}}


def test_unknown_fields_are_ignored(http: httpx.Client, gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Vendor fields clients send (``reasoning_effort``, ``logit_scale``) are ignored and listed
    in the debug log, not refused (issue 29: a 400 stopped the agent); ``chat_template_kwargs``
    (vLLM's) is read."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="fak.gateway"):
        r = http.post(gateway.base_url + "/chat/completions",
                      json=chat(reasoning_effort="high", logit_scale=2, chat_template_kwargs={"enable_thinking": False}))
    assert r.status_code == 200, r.text
    assert any("reasoning_effort" in rec.getMessage() and "logit_scale" in rec.getMessage()
               and "chat_template_kwargs" not in rec.getMessage() for rec in caplog.records)
