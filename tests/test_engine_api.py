"""fak.Engine over a deterministic fake native model: the loop, streaming, batching, cancellation,
error isolation, sync/asyncio/anyio(trio) use. The same API over the real native model is tested in
``test_engine_native.py``.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import anyio
import numpy as np
import pytest

import fak
from fak.chat import ChatTemplate, NoChatTemplateError
from fak.engine import Completion, Delta, Engine

from fake_native import TEXT, FakeModel, tiny_tokenizer

TOK = tiny_tokenizer()
EOS = TOK.eos_id
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make(**kw) -> tuple[Engine, FakeModel]:  # type: ignore[no-untyped-def]
    max_batch = kw.pop("max_batch", 64)
    template = kw.pop("template", ChatTemplate(CHATML))
    kw.setdefault("n_ctx", 2048)
    model = FakeModel(TOK, max_batch=max_batch, **kw)
    return Engine.from_model(model, TOK, chat_template=template, model_name="fake", max_batch=max_batch), model


def wait_until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


def expected_bytes(prompt_ids: list[int], n: int) -> bytes:
    text = TEXT.encode()
    off = sum(prompt_ids) % len(text)
    return bytes(text[(off + i) % len(text)] for i in range(n))


# --- basic generation --------------------------------------------------------------------------


def test_generate_length_usage_and_timings() -> None:
    engine, _ = make()
    with engine:
        prompt = TOK.encode("Hi")
        c = engine.generate("Hi", temperature=0, max_tokens=12)
        assert isinstance(c, Completion)
        assert c.finish_reason == "length" and c.stop_reason is None
        assert len(c.token_ids) == 12 and c.usage.completion_tokens == 12 and c.usage.prompt_tokens == len(prompt)
        assert c.usage.total_tokens == 12 + len(prompt)
        assert c.text == expected_bytes(prompt, 12).decode("utf-8", "replace")
        assert c.timings.ttft_s >= 0 and c.timings.prefill_tok_s > 0 and c.timings.decode_tok_s > 0
        assert c.text == engine.detokenize(c.token_ids)


def test_stream_equals_generate() -> None:
    engine, _ = make()
    with engine:
        c = engine.generate("abc", temperature=0, max_tokens=40)
        deltas = list(engine.stream("abc", temperature=0, max_tokens=40))
        assert all(isinstance(d, Delta) for d in deltas)
        assert "".join(d.text for d in deltas) == c.text
        assert [t for d in deltas for t in d.token_ids] == c.token_ids
        assert [d.finish_reason for d in deltas][-1] == "length"
        assert all(d.finish_reason is None for d in deltas[:-1])
        assert deltas[-1].usage == c.usage


def test_deltas_never_split_characters() -> None:
    engine, _ = make()
    with engine:
        for d in engine.stream("x", temperature=0, max_tokens=len(TEXT.encode()) * 2):
            d.text.encode("utf-8")
            assert "\ufffd" not in d.text


def test_eos_stops_and_is_counted_but_not_shown() -> None:
    engine, _ = make(eos_after=5)
    with engine:
        c = engine.generate("Hi", temperature=0, max_tokens=50)
        assert c.finish_reason == "stop" and c.stop_reason == EOS
        assert c.token_ids[-1] == EOS and len(c.token_ids) == 6
        assert c.text == engine.detokenize(c.token_ids)


def test_stop_string_across_tokens_is_not_emitted() -> None:
    engine, _ = make()
    with engine:
        prompt = TOK.encode("Q")
        full = expected_bytes(prompt, 60).decode("utf-8", "replace")
        for stop in ["日本", "😀", "wör", "\n"]:
            if stop not in full:
                continue
            c = engine.generate("Q", temperature=0, max_tokens=60, stop=[stop, "never-there"])
            assert c.finish_reason == "stop" and c.stop_reason == stop
            assert c.text == full[: full.index(stop)]
            streamed = "".join(d.text for d in engine.stream("Q", temperature=0, max_tokens=60, stop=stop))
            assert streamed == c.text


def test_stop_string_ends_the_core_sequence_after_the_consumer() -> None:
    """Stop strings are matched where the tokens are consumed: the core sequence is removed a step
    or more later, the tokens it sampled meanwhile are in neither ``token_ids`` nor ``usage``, and
    the request counts once as finished."""
    engine, model = make(step_delay=0.002)
    with engine:
        prompt = TOK.encode("Q")
        full = expected_bytes(prompt, 60).decode("utf-8", "replace")
        stop = "wör"
        through_stop = full[: full.index(stop) + len(stop)].encode()  # one byte token each
        finished = engine.stats()["requests_finished"]
        c = engine.generate("Q", temperature=0, max_tokens=60, stop=stop)
        assert c.text == full[: full.index(stop)] and c.stop_reason == stop
        assert c.token_ids == list(through_stop) and c.usage.completion_tokens == len(through_stop)
        seq = model.added[-1]
        wait_until(lambda: seq in model.removed and engine.stats()["running"] == 0)
        assert engine.stats()["requests_finished"] == finished + 1
        assert model.kv_blocks_free == model.kv_blocks_total


def test_held_stop_prefix_released_at_the_end() -> None:
    engine, _ = make(eos_after=3)
    with engine:
        prompt = TOK.encode("Q")
        first3 = expected_bytes(prompt, 3).decode("utf-8", "replace")
        c = engine.generate("Q", temperature=0, max_tokens=10, stop=first3[-1] + "zzz")
        assert c.text == first3 and c.finish_reason == "stop"


def test_default_max_tokens_fills_the_context() -> None:
    engine, _ = make(n_ctx=32)
    with engine:
        prompt = TOK.encode("Hi")
        c = engine.generate(prompt, temperature=0)
        assert c.finish_reason == "length" and len(c.token_ids) == 32 - len(prompt)


def test_same_seed_same_output_and_seed_reaches_native() -> None:
    engine, model = make()
    with engine:
        a = engine.generate("Hi", temperature=0.8, seed=7, max_tokens=10)
        b = engine.generate("Hi", temperature=0.8, seed=7, max_tokens=10)
        assert a.token_ids == b.token_ids
        assert {s["seed"] for s in model.sampling.values()} == {7}


def test_logprobs() -> None:
    engine, _ = make()
    with engine:
        c = engine.generate("Hi", temperature=0, max_tokens=4, logprobs=2)
        assert c.logprobs is not None and len(c.logprobs) == 4
        for tok_id, lp in zip(c.token_ids, c.logprobs):
            assert lp.token_id == tok_id and lp.logprob == -0.25 and len(lp.top_logprobs) == 2
            assert lp.top_logprobs[0].token_id == tok_id
        assert engine.generate("Hi", temperature=0, max_tokens=4).logprobs is None


# --- errors at submission -----------------------------------------------------------------------


def test_context_length_error_has_both_numbers() -> None:
    engine, _ = make(n_ctx=16)
    with engine:
        with pytest.raises(fak.ContextLengthError) as e:
            engine.stream(list(range(20)))  # raised at the call, before iterating
        assert "20" in str(e.value) and "16" in str(e.value)
        assert e.value.n_tokens == 20 and e.value.n_ctx == 16
        with pytest.raises(fak.ContextLengthError, match="16"):
            engine.generate(list(range(16)))
        with pytest.raises(fak.ContextLengthError) as e2:
            engine.generate(list(range(10)), max_tokens=10)
        assert e2.value.n_tokens == 20 and e2.value.n_ctx == 16
        assert engine.generate(list(range(10)), max_tokens=6, temperature=0).usage.completion_tokens == 6


def test_bad_sampling_and_prompts() -> None:
    engine, _ = make()
    with engine:
        with pytest.raises(ValueError, match="top_p"):
            engine.stream("x", top_p=-0.5)
        with pytest.raises(TypeError, match="bogus"):
            engine.generate("x", bogus=1)
        with pytest.raises(ValueError, match="empty"):
            engine.generate("")
        with pytest.raises(ValueError, match="vocabulary"):
            engine.generate([TOK.n_vocab])
        assert engine.stats()["running"] == 0


# --- continuous batching, max_batch, KV pressure -----------------------------------------------


def test_new_requests_join_a_running_batch() -> None:
    engine, model = make(step_delay=0.003)
    with engine:
        solo = {p: engine.generate(p, temperature=0, max_tokens=20).token_ids for p in ("A", "BB", "CCC")}
        model.joined_running_batch = 0
        results: dict[str, list[int]] = {}

        def run(p: str) -> None:
            results[p] = engine.generate(p, temperature=0, max_tokens=20).token_ids

        first = threading.Thread(target=run, args=("A",))
        first.start()
        wait_until(lambda: engine.stats()["running"] == 1 and model.batch_sizes[-1:] == [1])
        others = [threading.Thread(target=run, args=(p,)) for p in ("BB", "CCC")]
        for t in others:
            t.start()
        for t in [first, *others]:
            t.join()
        assert results == solo
        assert model.joined_running_batch >= 1 and max(model.batch_sizes) >= 2


def test_max_batch_bounds_the_running_set() -> None:
    engine, model = make(step_delay=0.001, max_batch=2)
    with engine:
        async def main() -> list[Completion]:
            return await asyncio.gather(*[engine.agenerate(f"p{i}", temperature=0, max_tokens=8) for i in range(6)])

        out = asyncio.run(main())
        assert all(c.usage.completion_tokens == 8 for c in out)
        assert max(model.batch_sizes) == 2


def test_prompt_that_can_never_fit_fails_alone() -> None:
    engine, model = make(kv_blocks=3, block_size=16, step_delay=0.001)
    with engine:
        async def main() -> list:
            return await asyncio.gather(
                engine.agenerate([1] * 10, temperature=0, max_tokens=10),
                engine.agenerate([2] * 100, temperature=0, max_tokens=10),  # 7 blocks > 3
                engine.agenerate([3] * 10, temperature=0, max_tokens=10),
                return_exceptions=True)

        ok1, full, ok2 = asyncio.run(main())
        assert isinstance(full, fak.KVCacheFullError)
        assert ok1.usage.completion_tokens == 10 and ok2.usage.completion_tokens == 10
        assert model.kv_blocks_free == model.kv_blocks_total


# --- cancellation --------------------------------------------------------------------------------


def test_closing_a_stream_cancels_and_frees_kv() -> None:
    engine, model = make(step_delay=0.002)
    with engine:
        stream = engine.stream("Hi", temperature=0, max_tokens=200)
        next(stream)
        next(stream)
        seq = model.added[-1]
        assert model.kv_blocks_free < model.kv_blocks_total
        stream.close()
        wait_until(lambda: seq in model.removed)
        assert model.kv_blocks_free == model.kv_blocks_total
        with pytest.raises(StopIteration):
            next(stream)


def test_dropping_a_stream_cancels() -> None:
    engine, model = make(step_delay=0.002)
    with engine:
        stream = engine.stream("Hi", temperature=0, max_tokens=200)
        next(stream)
        seq = model.added[-1]
        del stream
        gc.collect()
        wait_until(lambda: seq in model.removed)


def test_with_block_cancels() -> None:
    engine, model = make(step_delay=0.002)
    with engine:
        with engine.stream("Hi", temperature=0, max_tokens=200) as s:
            next(s)
            seq = model.added[-1]
        wait_until(lambda: seq in model.removed and engine.stats()["running"] == 0)


def test_async_break_and_task_cancellation_free_the_sequence() -> None:
    engine, model = make(step_delay=0.002)

    async def main() -> None:
        stream = engine.astream("Hi", temperature=0, max_tokens=500)
        async with stream:
            async for _ in stream:
                break
        seq = model.added[-1]
        await asyncio.sleep(0.05)
        assert seq in model.removed

        async def consume() -> None:
            async for _ in engine.astream("Yo", temperature=0, max_tokens=500):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.03)
        seq2 = model.added[-1]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if seq2 in model.removed:
                break
            await asyncio.sleep(0.005)
        assert seq2 in model.removed

    with engine:
        asyncio.run(main())
        wait_until(lambda: engine.stats()["running"] == 0)
        assert model.kv_blocks_free == model.kv_blocks_total


def test_anyio_timeout_cancels_the_sequence() -> None:
    engine, model = make(step_delay=0.002)

    async def main() -> None:
        with anyio.move_on_after(0.03):
            async for _ in engine.astream("Hi", temperature=0, max_tokens=500):
                pass
        seq = model.added[-1]
        for _ in range(200):
            if seq in model.removed:
                return
            await anyio.sleep(0.005)
        raise AssertionError("sequence not removed")

    with engine:
        anyio.run(main)


# --- error isolation -----------------------------------------------------------------------------


def test_failing_add_sequence_fails_only_that_request() -> None:
    engine, _ = make(fail_prompt_token=ord("!"), step_delay=0.001)
    with engine:
        async def main() -> list:
            return await asyncio.gather(
                engine.agenerate("ok", temperature=0, max_tokens=10),
                engine.agenerate("bad!", temperature=0, max_tokens=10),
                engine.agenerate("fine", temperature=0, max_tokens=10),
                return_exceptions=True)

        good1, bad, good2 = asyncio.run(main())
        assert isinstance(bad, ValueError) and "injected" in str(bad)
        assert good1.usage.completion_tokens == 10 and good2.usage.completion_tokens == 10
        assert engine.generate("again", temperature=0, max_tokens=3).usage.completion_tokens == 3


def test_failing_step_fails_the_batch_and_the_engine_goes_on() -> None:
    engine, model = make(step_delay=0.001)
    with engine:
        engine.generate("warm", temperature=0, max_tokens=2)
        model.fail_step_when = model.added[-1] + 1  # the next sequence
        with pytest.raises(RuntimeError, match="injected step failure"):
            engine.generate("x", temperature=0, max_tokens=5)
        assert model.kv_blocks_free == model.kv_blocks_total
        assert engine.generate("y", temperature=0, max_tokens=5).usage.completion_tokens == 5


def test_bad_token_from_the_model_fails_only_that_request() -> None:
    engine, _ = make(bad_token_prompt_token=ord("#"), step_delay=0.001)
    with engine:
        async def main() -> list:
            return await asyncio.gather(
                engine.agenerate("a", temperature=0, max_tokens=10),
                engine.agenerate("#", temperature=0, max_tokens=10),
                return_exceptions=True)

        ok, bad = asyncio.run(main())
        assert isinstance(bad, IndexError)
        assert ok.usage.completion_tokens == 10


def test_close_fails_running_streams_and_later_calls() -> None:
    engine, model = make(step_delay=0.002)
    stream = engine.stream("Hi", temperature=0, max_tokens=1000)
    next(stream)
    engine.close()
    with pytest.raises(fak.FakError, match="closed"):
        for _ in stream:
            pass
    with pytest.raises(fak.FakError, match="closed"):
        engine.generate("x")
    assert not engine._loop.thread.is_alive()
    assert model.seqs == {}
    engine.close()  # idempotent


# --- async from several libraries ----------------------------------------------------------------


def _solo(engine: Engine, prompts: list[str]) -> dict[str, list[int]]:
    return {p: engine.generate(p, temperature=0, max_tokens=16).token_ids for p in prompts}


def test_concurrent_asyncio_streams_equal_solo_runs() -> None:
    engine, model = make(step_delay=0.001)
    prompts = [f"prompt {i} " * (i % 4 + 1) for i in range(16)]
    with engine:
        solo = _solo(engine, prompts)

        async def one(p: str) -> list[int]:
            ids: list[int] = []
            async for d in engine.astream(p, temperature=0, max_tokens=16):
                ids.extend(d.token_ids)
            return ids

        async def main() -> list[list[int]]:
            return await asyncio.gather(*[one(p) for p in prompts])

        out = asyncio.run(main())
        assert dict(zip(prompts, out)) == solo
        assert max(model.batch_sizes) > 1


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_anyio_backends(backend: str) -> None:
    engine, _ = make(step_delay=0.001)
    prompts = [f"q{i}" for i in range(8)]
    with engine:
        solo = _solo(engine, prompts)
        results: dict[str, list[int]] = {}

        async def one(p: str) -> None:
            c = await engine.agenerate(p, temperature=0, max_tokens=16)
            results[p] = c.token_ids

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                for p in prompts:
                    tg.start_soon(one, p)

        anyio.run(main, backend=backend)
        assert results == solo


# --- chat, logits, stats, threads ---------------------------------------------------------------


def test_chat_uses_the_template_without_bos() -> None:
    engine, model = make()
    with engine:
        messages = [{"role": "user", "content": "hi"}]
        text = engine.apply_chat_template(messages)
        assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        c = engine.chat(messages, temperature=0, max_tokens=4)
        assert c.usage.prompt_tokens == len(engine.tokenize(text, add_special=False))
        seq = model.added[-1]
        assert seq not in model.seqs  # finished and removed
        assert engine.chat_stream(messages, temperature=0, max_tokens=4) is not None

        async def achat() -> Completion:
            return await engine.achat(messages, temperature=0, max_tokens=4)

        assert asyncio.run(achat()).token_ids == c.token_ids


def test_chat_without_template() -> None:
    engine, _ = make(template=None)
    with engine, pytest.raises(NoChatTemplateError):
        engine.chat([{"role": "user", "content": "hi"}])


def test_logits_and_single_owner_thread() -> None:
    engine, model = make()
    with engine:
        engine.generate("Hi", temperature=0, max_tokens=3)
        out = engine.logits([1, 2, 3])
        assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (3, TOK.n_vocab)
        assert out[0, 2] == 1.0
        with pytest.raises(ValueError):
            engine.logits([])
        assert model.thread_ids == {engine._loop.thread.ident}


def test_stats() -> None:
    engine, model = make(step_delay=0.002)
    with engine:
        s = engine.stats()
        assert s["running"] == 0 and s["kv_blocks_total"] == model.kv_blocks_total and s["kv_blocks_used"] == 0
        stream = engine.stream("Hi", temperature=0, max_tokens=200)
        next(stream)
        wait_until(lambda: engine.stats()["running"] == 1 and engine.stats()["kv_blocks_used"] > 0)
        stream.close()
        wait_until(lambda: engine.stats()["running"] == 0 and engine.stats()["kv_blocks_used"] == 0)
        assert engine.stats()["requests_finished"] >= 0 and engine.stats()["steps"] > 0


def test_idle_engine_sleeps() -> None:
    engine, model = make()
    with engine:
        engine.generate("Hi", temperature=0, max_tokens=2)
        steps = engine.stats()["steps"]
        time.sleep(0.05)
        assert engine.stats()["steps"] == steps
