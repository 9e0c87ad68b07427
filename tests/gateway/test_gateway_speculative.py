"""Speculative decoding behind the gateway (docs/speculative.md): an engine that gives a sequence
several tokens in one step streams the same chat completion, chunk text joined, as one without
speculation; a request's ``speculative`` field (``extra_body``) overrides the server's; the
acceptance counters reach ``/metrics``.

To add a case: another request through both gateways, compared whole.
"""

from __future__ import annotations

from typing import Any

from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner

import fak
from fak import synth
from fak.cli import main
from fak_subprocess import fak_process

MESSAGES = [{"role": "user", "content": "repeat after me: alpha beta gamma delta, alpha beta gamma delta, alpha beta"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(synth.write_tiny_model(tmp_path_factory.mktemp("gwspec") / "qwen2.gguf", "qwen2", seed=3))


def _stream(client: openai.OpenAI, **extra: Any) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=48,
                                                temperature=0, **extra):
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


def test_streamed_chat_is_unchanged(start_gateway: Any, http: httpx.Client, tiny: str) -> None:
    with fak.Engine(tiny, n_ctx=512, threads=1) as plain, \
            fak.Engine(tiny, n_ctx=512, threads=1, speculative="suffix:8") as fast:
        a = start_gateway(engine=plain, model_name="tiny")
        b = start_gateway(engine=fast, model_name="tiny")
        ca = openai.OpenAI(base_url=a.base_url, api_key="x", max_retries=0)
        cb = openai.OpenAI(base_url=b.base_url, api_key="x", max_retries=0)
        want = _stream(ca)
        assert want[0] and _stream(cb) == want
        full_a = ca.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48, temperature=0)
        full_b = cb.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=48, temperature=0)
        assert full_b.choices[0].message.content == full_a.choices[0].message.content == want[0]
        assert full_b.usage.completion_tokens == full_a.usage.completion_tokens
        accepted = fast.stats()["native_spec_accepted_tokens"]
        assert accepted > 0
        # a request that asks for none is not speculated
        assert _stream(cb, extra_body={"speculative": "none"}) == want
        assert fast.stats()["native_spec_accepted_tokens"] == accepted
        # and one that asks on a server without a default is
        assert _stream(ca, extra_body={"speculative": "ngram:6"}) == want
        assert plain.stats()["native_spec_accepted_tokens"] > 0
        metrics = http.get(b.url + "/metrics").text
        line = next(x for x in metrics.splitlines() if x.startswith("fak_spec_decode_accepted_tokens_total"))
        assert float(line.split()[-1]) >= accepted
        bad = cb.with_options(max_retries=0)
        with pytest.raises(openai.BadRequestError, match="speculative"):
            bad.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                        extra_body={"speculative": "eagle"})


def test_serve_with_a_draft_model(start_gateway: Any, http: httpx.Client, tiny: str) -> None:
    """``fak serve --draft-model FILE`` (the target itself as its draft: every draft token is
    accepted) streams what a server without speculation gives; its draft model's forwards and
    the accepted tokens reach ``/metrics``."""
    with fak.Engine(tiny, n_ctx=512, threads=1) as plain, \
            fak_process("serve", "--gguf", tiny, "--backend", "cpu", "--n-ctx", "512", "--threads", "1",
                        "--model-name", "tiny", "--draft-model", tiny) as url:
        a = start_gateway(engine=plain, model_name="tiny")
        want = _stream(openai.OpenAI(base_url=a.base_url, api_key="x", max_retries=0))
        assert want[0]
        assert _stream(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)) == want
        metrics = http.get(url + "/metrics").text
        values = {x.split()[0]: float(x.split()[-1]) for x in metrics.splitlines()
                  if x.startswith("fak_spec_decode_")}
        assert values["fak_spec_decode_draft_model_forwards_total"] > 0, values
        assert values["fak_spec_decode_accepted_tokens_total"] == values["fak_spec_decode_draft_tokens_total"] > 0


@pytest.mark.parametrize("extra,message,code", [
    (["--base-url", "http://x/v1"], "it needs --gguf", 2),
    (["--tensor-parallel", "2"], "does not run with --tensor-parallel", 2),
    (["--wide"], "vocabulary has 768 tokens", 1),
])
def test_serve_refuses_a_bad_draft_model(tiny: str, tmp_path: Path, extra: list[str], message: str,
                                         code: int) -> None:
    draft = tiny
    args = ["serve", "--backend", "cpu", "--n-ctx", "256", "--addr", "127.0.0.1:0"]
    if extra == ["--wide"]:
        draft = str(synth.write_tiny_model(tmp_path / "wide.gguf", "qwen2", n_vocab=768, seed=3))
        extra = []
    if "--base-url" not in extra:
        args += ["--gguf", tiny]
    result = CliRunner().invoke(main, [*args, *extra, "--draft-model", draft])
    assert result.exit_code == code, result.output
    assert message in result.output
