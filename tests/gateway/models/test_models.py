"""``GET /v1/models``."""

from __future__ import annotations

import openai


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["fake-qwen"]
    assert models[0].object == "model" and models[0].owned_by == "fak"
    assert models[0].model_extra["max_model_len"] == 4096


def test_model_name_override(start_gateway, fake_engine) -> None:  # type: ignore[no-untyped-def]
    srv = start_gateway(engine=fake_engine, model_name="qwen-coder")
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["qwen-coder"]
    assert client.chat.completions.create(model="qwen-coder", messages=[{"role": "user", "content": "x"}]).model == "qwen-coder"
