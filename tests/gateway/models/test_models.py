"""``GET /v1/models``."""

from __future__ import annotations

import openai
import pytest


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


def test_models_retrieve(client: openai.OpenAI) -> None:
    """``GET /v1/models/{id}``: the SDK's ``models.retrieve`` gets the served model's card."""
    card = client.models.retrieve("fake-qwen")
    assert (card.id, card.object, card.owned_by) == ("fake-qwen", "model", "fak")
    assert card.model_extra["max_model_len"] == 4096


def test_models_retrieve_unknown_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    body = err.value.body
    assert err.value.code == "model_not_found" and body["param"] == "model" and "gpt-4o" in body["message"]


def test_models_retrieve_id_with_slashes(start_gateway, fake_engine) -> None:  # type: ignore[no-untyped-def]
    srv = start_gateway(engine=fake_engine, model_name="Qwen/Qwen2.5-Coder-0.5B")
    client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    assert client.models.retrieve("Qwen/Qwen2.5-Coder-0.5B").id == "Qwen/Qwen2.5-Coder-0.5B"
