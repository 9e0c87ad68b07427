"""The engine core ends a request itself (issue 13: "stop ids and max_tokens decided in the core"):
a sequence that samples one of its ``stop_ids``, its ``max_tokens``-th token, or fills its context
is finished in that step (``finish`` in the step's tuple) and removed, its KV blocks freed — on a
real (tiny, generated) model through ``fak._native.EngineCore`` and through ``fak.Engine``."""

from __future__ import annotations

import asyncio

import pytest

import fak
from fak import _native, synth


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(synth.write_tiny_model(tmp_path_factory.mktemp("finish") / "qwen2.gguf", "qwen2"))


def run(model: _native.EngineCore, steps: int) -> dict[int, list[tuple[int, str | None]]]:
    out: dict[int, list[tuple[int, str | None]]] = {}
    for _ in range(steps):
        for sid, tok, _lp, _top, fin in model.step():
            out.setdefault(sid, []).append((tok, fin))
    return out


PROMPT = [5, 9, 2, 7, 11, 3]


def test_max_tokens_finishes_and_frees(tiny: str) -> None:
    m = _native.EngineCore(tiny, n_ctx=128, threads=1)
    m.add_sequence(1, PROMPT, {"temperature": 0.0, "max_tokens": 5})
    m.add_sequence(2, PROMPT, {"temperature": 0.0})
    got = run(m, 8)
    assert [f for _, f in got[1]] == [None, None, None, None, "length"]
    assert len(got[2]) == 8 and all(f is None for _, f in got[2]), "the other sequence goes on"
    assert [t for t, _ in got[1]] == [t for t, _ in got[2]][:5], "the same greedy tokens"
    m.remove_sequence(2)
    assert m.kv_blocks_free == m.kv_blocks_total, "the finished sequence holds no block"


def test_stop_id_finishes_with_the_stop_token(tiny: str) -> None:
    m = _native.EngineCore(tiny, n_ctx=128, threads=1)
    m.add_sequence(1, PROMPT, {"temperature": 0.0})
    free = [t for t, _ in run(m, 6)[1]]
    m.remove_sequence(1)
    stop = free[3]
    first = free.index(stop)  # the first time the greedy run samples it
    m.add_sequence(2, PROMPT, {"temperature": 0.0, "stop_ids": [stop]})
    got = run(m, 8)[2]
    assert [t for t, _ in got] == free[: first + 1], "the stop token is returned, then nothing"
    assert got[-1][1] == "stop" and all(f is None for _, f in got[:-1])
    assert m.kv_blocks_free == m.kv_blocks_total


def test_full_context_finishes_with_length(tiny: str) -> None:
    m = _native.EngineCore(tiny, n_ctx=16, threads=1)
    m.add_sequence(1, list(range(1, 13)), {"temperature": 0.0})
    got = run(m, 10)[1]
    assert [f for _, f in got] == [None, None, None, "length"], "tokens 13..16 fill the window"


def test_stop_ids_outside_the_vocabulary_are_refused(tiny: str) -> None:
    m = _native.EngineCore(tiny, n_ctx=64, threads=1)
    with pytest.raises(ValueError, match="stop_ids"):
        m.add_sequence(1, PROMPT, {"stop_ids": [m.n_vocab]})
    with pytest.raises(ValueError, match="max_tokens"):
        m.add_sequence(1, PROMPT, {"max_tokens": 0})


def test_core_errors_are_typed(tiny: str) -> None:
    """The core checks the request once and says what was wrong in attributes (issue 28): the
    gateway reads ``.param`` and the numbers, never the message."""
    m = _native.EngineCore(tiny, n_ctx=16, threads=1)
    with pytest.raises(fak.ContextLengthError) as e:
        m.add_sequence(1, list(range(1, 17)), {})
    assert (e.value.param, e.value.n_prompt, e.value.max_tokens, e.value.n_tokens, e.value.n_ctx) == \
        ("prompt_ids", 16, None, 16, 16)
    with pytest.raises(fak.ContextLengthError) as e:
        m.add_sequence(1, PROMPT, {"max_tokens": 11})  # 6 + 11 > 16
    assert (e.value.param, e.value.n_prompt, e.value.max_tokens, e.value.n_tokens, e.value.n_ctx) == \
        ("max_tokens", 6, 11, 17, 16)
    m.add_sequence(1, PROMPT, {"max_tokens": 10})  # 6 + 10 fills the window exactly
    for sampling, prompt, param in [({"temperature": -1.0}, PROMPT, "temperature"), ({}, [m.n_vocab], "prompt_ids"),
                                    ({}, [], "prompt_ids"), ({"stop_ids": [m.n_vocab]}, PROMPT, "stop_ids")]:
        with pytest.raises(fak.InvalidArgumentError) as err:
            m.add_sequence(2, prompt, sampling)
        assert err.value.param == param and isinstance(err.value, ValueError) and isinstance(err.value, fak.FakError)
    with pytest.raises(fak.InvalidArgumentError) as err:
        m.add_sequence(1, PROMPT, {})
    assert err.value.param == "seq_id"


def test_engine_takes_the_core_decision(tiny: str) -> None:
    """``fak.Engine`` reports the core's finish: "length" at max_tokens (the sequence already gone
    from the native model), and frees nothing twice."""
    with fak.Engine(tiny, n_ctx=128, threads=1) as engine:
        c = engine.generate(PROMPT, max_tokens=4, temperature=0)
        assert c.finish_reason == "length" and c.usage.completion_tokens == 4
        c2 = engine.generate(PROMPT, max_tokens=4, temperature=0)
        assert c2.token_ids == c.token_ids
        stats = engine.stats()
        assert stats["running"] == 0 and stats["kv_blocks_used"] == 0


class _Spy:
    """The native model, recording the sampling dicts ``add_sequence`` receives."""

    def __init__(self, model: _native.EngineCore) -> None:
        self._m = model
        self.sent: list[dict] = []

    def add_sequence(self, seq_id: int, prompt: list[int], sampling: dict) -> None:
        self.sent.append(dict(sampling))
        self._m.add_sequence(seq_id, prompt, sampling)

    def __getattr__(self, name: str):  # everything else: the model itself
        return getattr(self._m, name)


def test_engine_passes_the_tokenizer_end_of_generation_ids(tiny: str) -> None:
    with fak.Engine(tiny, n_ctx=128, threads=1) as engine:
        spy = _Spy(engine._loop.model)
        engine._loop.model = spy  # type: ignore[assignment]
        engine.generate(PROMPT, max_tokens=3, temperature=0)
    assert engine.tokenizer.eog_ids, "the tiny model's tokenizer declares an end of generation"
    assert spy.sent and sorted(spy.sent[0]["stop_ids"]) == sorted(engine.tokenizer.eog_ids)
    assert spy.sent[0]["max_tokens"] == 3


def test_the_core_owns_the_queue(tiny: str) -> None:
    """Issue 13: "one queue ... in Rust". ``fak.Engine`` hands every request to the core at once;
    the core runs ``max_batch`` of them and queues the rest (its own ``n_waiting``), and the
    results are the ones an unbounded batch gives."""
    prompts = [PROMPT + [20 + i] for i in range(6)]
    with fak.Engine(tiny, n_ctx=256, threads=1, max_batch=64) as wide:
        want = [wide.generate(p, max_tokens=24, temperature=0).token_ids for p in prompts]
    with fak.Engine(tiny, n_ctx=256, threads=1, max_batch=2) as engine:
        spy = _Spy(engine._loop.model)
        engine._loop.model = spy  # type: ignore[assignment]
        seen: list[tuple[int, int, int]] = []

        async def main() -> list:
            tasks = [asyncio.create_task(engine.agenerate(p, max_tokens=24, temperature=0)) for p in prompts]
            while not all(t.done() for t in tasks):
                s = engine.stats()
                seen.append((s["running"], s["waiting"], len(spy.sent)))
                await asyncio.sleep(0.001)
            return [t.result() for t in tasks]

        got = asyncio.run(main())
    assert [c.token_ids for c in got] == want
    assert max(r for r, _, _ in seen) == 2, "the core runs max_batch sequences"
    queued = [w for r, w, sent in seen if sent == len(prompts)]
    assert queued and max(queued) >= 3, f"the other requests wait in the core's queue: {seen[:20]}"
