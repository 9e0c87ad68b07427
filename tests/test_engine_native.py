"""fak.Engine over the real native model (``fak._native.EngineCore``): tiny synthetic models of both
architectures and the real Qwen2.5-Coder-0.5B.

Checked: generation end to end, stream == generate, same seed same output, stop strings not
emitted, EOS ends a chat reply, ContextLengthError numbers, 16 concurrent async streams each equal
to its solo run under greedy decoding, logits shape, cancellation freeing KV blocks, the CLI.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from click.testing import CliRunner

import fak
from fak import _native
from fak.engine import Engine

pytestmark = pytest.mark.skipif(not hasattr(_native, "EngineCore"),
                                reason="fak._native.EngineCore is not built in this checkout")

PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "import numpy as np\n\n# compute the mean of",
    "日本の首都は",
    "SELECT name FROM users WHERE",
    "# Sort a list in Python\n",
    "class Stack:\n    def __init__(self):",
    "Once upon a time",
    "for i in range(10):",
    "The quick brown fox",
    "fn main() {",
    "<html>\n<head>",
    "1, 2, 3, 5, 8,",
    "Q: What is 2+2?\nA:",
    "#include <stdio.h>",
    "git commit -m \"",
]


@pytest.fixture(scope="module")
def engine(model_05b):  # type: ignore[no-untyped-def]
    with Engine(model_05b, backend="cpu", n_ctx=512, threads=2, max_batch=16) as e:
        yield e


def test_generate_greedy(engine: Engine) -> None:
    c = engine.generate("def add(a, b):\n    return", temperature=0, max_tokens=4)
    assert c.usage.completion_tokens == len(c.token_ids) <= 4
    assert c.text == engine.detokenize(c.token_ids) or c.finish_reason == "stop"
    assert c.text.strip() and c.timings.decode_tok_s > 0 and c.timings.prefill_tok_s > 0
    assert engine.backend == "cpu" and engine.n_ctx == 512 and engine.model_name == "qwen2.5-coder-0.5b-instruct-mixed"


def test_stream_equals_generate(engine: Engine) -> None:
    c = engine.generate("The quick brown fox", temperature=0, max_tokens=4)
    deltas = list(engine.stream("The quick brown fox", temperature=0, max_tokens=4))
    assert "".join(d.text for d in deltas) == c.text
    assert [t for d in deltas for t in d.token_ids] == c.token_ids


def test_same_seed_same_output(engine: Engine) -> None:
    a = engine.generate("Once upon a time", temperature=1.0, top_k=40, seed=1234, max_tokens=4)
    b = engine.generate("Once upon a time", temperature=1.0, top_k=40, seed=1234, max_tokens=4)
    assert a.token_ids == b.token_ids


def test_stop_string_not_emitted(engine: Engine) -> None:
    full = engine.generate("1, 2, 3, 4, 5,", temperature=0, max_tokens=8).text
    k = len(full) // 2
    stop = full[k:k + 2]
    c = engine.generate("1, 2, 3, 4, 5,", temperature=0, max_tokens=8, stop=[stop])
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == full[:full.index(stop)]
    streamed = "".join(d.text for d in engine.stream("1, 2, 3, 4, 5,", temperature=0, max_tokens=8, stop=[stop]))
    assert streamed == c.text


def test_chat_reply_ends_with_eos(engine: Engine) -> None:
    c = engine.chat([{"role": "user", "content": "Reply with the single word: yes"}], temperature=0, max_tokens=8)
    assert c.finish_reason == "stop" and c.stop_reason in engine.tokenizer.eog_ids
    assert "yes" in c.text.lower() and "<|im_end|>" not in c.text


def test_context_length_error_numbers(engine: Engine) -> None:
    ids = engine.tokenize("word " * 600)
    with pytest.raises(fak.ContextLengthError) as e:
        engine.generate(ids)
    assert str(len(ids)) in str(e.value) and "512" in str(e.value)


def test_logits(engine: Engine) -> None:
    ids = engine.tokenize("Hello world")
    out = engine.logits(ids)
    assert out.dtype == np.float32 and out.shape == (len(ids), engine.tokenizer.n_vocab)
    assert np.isfinite(out).all()
    greedy = engine.generate(ids, temperature=0, max_tokens=1).token_ids[0]
    assert int(np.argmax(out[-1])) == greedy


def test_cancel_frees_kv(engine: Engine) -> None:
    before = engine.stats()["kv_blocks_used"]
    with engine.stream("Once upon a time", temperature=0, max_tokens=50) as s:
        next(s)
        assert engine.stats()["kv_blocks_used"] > before
    end = time.monotonic() + 30
    while engine.stats()["running"] or engine.stats()["kv_blocks_used"] != before:
        assert time.monotonic() < end
        time.sleep(0.05)


@pytest.mark.slow
def test_16_concurrent_async_streams_equal_solo_runs(engine: Engine) -> None:
    """Greedy continuations of 16 concurrent streams equal their solo runs, except where the
    batched forward pass (different batch shapes, different accumulation order) flips a near-tie:
    there the two tokens must be the solo run's top two, within 1% of each other (the criterion
    issue 3 uses for parity with llama.cpp), and such flips must stay rare."""
    # 3 tokens: the first comes from the (batched) prefill, the next two from batched decode steps.
    solo = {p: engine.generate(p, temperature=0, max_tokens=3).token_ids for p in PROMPTS}

    async def one(p: str) -> list[int]:
        ids: list[int] = []
        async for d in engine.astream(p, temperature=0, max_tokens=3):
            ids.extend(d.token_ids)
        return ids

    async def main() -> list[list[int]]:
        return await asyncio.gather(*[one(p) for p in PROMPTS])

    together = dict(zip(PROMPTS, asyncio.run(main())))
    flips = []
    for p in PROMPTS:
        a, b = solo[p], together[p]
        if a == b:
            continue
        i = next(k for k in range(min(len(a), len(b))) if a[k] != b[k])
        logits = engine.logits(engine.tokenize(p) + a[:i])[-1]
        top1, top2 = np.sort(logits)[::-1][:2]
        assert {a[i], b[i]} == set(np.argsort(logits)[::-1][:2].tolist()), (p, a, b)
        margin = float((top1 - top2) / abs(top1))
        assert margin < 0.01, (p, a, b, margin)
        flips.append((p, i, margin))
    assert len(flips) <= 2, flips


def test_cli_generate(model_05b) -> None:  # type: ignore[no-untyped-def]
    from fak.cli import main

    result = CliRunner().invoke(main, ["generate", str(model_05b), "def add(a, b):", "--temperature", "0",
                                       "--max-tokens", "3", "--backend", "cpu", "--n-ctx", "256"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() and "decode" in result.stderr


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_synthetic_models(tmp_path, arch: str) -> None:  # type: ignore[no-untyped-def]
    synth = pytest.importorskip("fak.synth")
    path = tmp_path / f"tiny-{arch}.gguf"
    synth.write_tiny_model(path, arch=arch)
    with Engine(path, backend="cpu", n_ctx=128) as e:
        c = e.generate("hello world", temperature=0, max_tokens=8)
        assert 1 <= c.usage.completion_tokens <= 8
        assert "".join(d.text for d in e.stream("hello world", temperature=0, max_tokens=8)) == c.text
        assert e.tokenize("hello world") == e.tokenizer.encode("hello world")
        assert e.generate("hello", temperature=0.9, seed=3, max_tokens=8).token_ids == \
            e.generate("hello", temperature=0.9, seed=3, max_tokens=8).token_ids
        if e.chat_template is not None:
            e.chat([{"role": "user", "content": "hi"}], temperature=0, max_tokens=4)


def test_prefix_choices_hold_the_output(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``prefix_choices``: whatever the (random) weights prefer, the output begins with one of the
    token sequences, token by token, greedy or sampled; then generation is free."""
    synth = pytest.importorskip("fak.synth")
    from fak import _native

    path = tmp_path / "tiny.gguf"
    synth.write_tiny_model(path)
    with Engine(path, backend="cpu", n_ctx=256) as e:
        choices = [e.tokenize(t, add_special=False) for t in ('get_weather", "arguments": {', 'bash", "arguments": {')]
        free = e.generate("hello world", temperature=0, max_tokens=12).token_ids
        assert not any(free[:len(c)] == c for c in choices)  # the model alone writes something else
        firsts = set()
        for seed in range(8):
            out = e.generate("hello world", temperature=1.5, seed=seed, max_tokens=20, prefix_choices=choices).token_ids
            assert any(out[:len(c)] == c for c in choices), out
            firsts.add(out[0])
        assert len(firsts) == 2  # sampling visits both choices
        greedy = e.generate("hello world", temperature=0, max_tokens=20, prefix_choices=choices).token_ids
        assert any(greedy[:len(c)] == c for c in choices)
        with pytest.raises(ValueError, match="prefix_choices"):
            e.generate("hello", max_tokens=2, prefix_choices=[[e.n_vocab]])
    model = _native.EngineCore(str(path), backend="cpu", n_ctx=64)
    with pytest.raises(ValueError, match="prefix_choices"):
        model.add_sequence(1, [1, 2], {"prefix_choices": [[10**6]]})
    with pytest.raises(ValueError, match="prefix_choices"):
        model.add_sequence(2, [1, 2], {"prefix_choices": [[]]})
