"""One owner of a request's rules (issue 28): ``EngineCore.check_request`` / ``RequestLimits.check``
raise exactly what ``add_sequence`` raises, from the same Rust function, without the engine's lock;
``fak.Engine`` raises them at the call of ``stream`` (before anything is answered)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fak
from fak import _native, synth

PROMPT = [5, 9, 2, 7, 11, 3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(synth.write_tiny_model(tmp_path_factory.mktemp("limits") / "qwen2.gguf", "qwen2"))


def _raised(fn: Any) -> tuple[type, str, tuple] | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared below
        fields = tuple(getattr(e, k, None) for k in ("param", "n_prompt", "max_tokens", "n_tokens", "n_ctx", "needed", "free"))
        return type(e), str(e), fields
    return None


def _cases(n_vocab: int) -> list[tuple[list[Any], dict[str, Any]]]:
    return [
        (PROMPT, {}),
        (list(range(1, 17)), {}),  # the prompt fills the window
        (PROMPT, {"max_tokens": 11}),  # 6 + 11 > 16
        (PROMPT, {"max_tokens": 10}),  # fills it exactly: fine
        ([], {}),
        ([n_vocab], {}),
        ([3, -1], {}),
        ([2**40], {}),
        (PROMPT, {"temperature": -1.0}),
        (PROMPT, {"top_p": 2.0}),
        (PROMPT, {"bogus": 1}),
        (PROMPT, {"stop_ids": [n_vocab]}),
        (PROMPT, {"stop_ids": []}),
        (PROMPT, {"prefix_choices": [[n_vocab]]}),
        (PROMPT, {"prefix_choices": [[]]}),
        ([n_vocab], {"temperature": -1.0}),  # the sampling value first, as add_sequence
    ]


def test_check_request_raises_what_add_sequence_raises(tiny: str) -> None:
    m = _native.EngineCore(tiny, n_ctx=16, threads=1)
    seq = iter(range(1, 1000))
    for prompt, sampling in _cases(m.n_vocab):
        want = _raised(lambda: m.add_sequence(next(seq), prompt, sampling))
        got = _raised(lambda: m.check_request(prompt, sampling))
        assert got == want, (prompt, sampling)
        assert _raised(lambda: m.request_limits.check(prompt, sampling)) == want
    assert _raised(lambda: m.check_request(PROMPT, {"max_tokens": 11}))[0] is fak.ContextLengthError  # type: ignore[index]


def test_a_prompt_the_whole_cache_cannot_hold() -> None:
    """Unreachable in a native engine (its cache holds one whole window), so checked on limits
    built for a smaller cache (the test fake of the core uses them so)."""
    lim = _native.RequestLimits(512, 100, 3, block_size=16)
    lim.check([1] * 47, {})  # 48 tokens with the one to generate: 3 blocks
    with pytest.raises(fak.KVCacheFullError) as e:
        lim.check([1] * 48, {})
    assert (e.value.needed, e.value.free) == (4, 3)


def test_the_limits_are_the_engines(tiny: str) -> None:
    m = _native.EngineCore(tiny, n_ctx=64, threads=1)
    lim = m.request_limits
    assert (lim.n_ctx, lim.n_vocab, lim.kv_blocks, lim.block_size) == (64, m.n_vocab, m.kv_blocks_total, 32)
    with pytest.raises(TypeError):
        lim.check(["a"], {})
    with pytest.raises(fak.InvalidArgumentError) as e:
        _native.RequestLimits(0, 10, 1)
    assert e.value.param == "n_ctx"
    assert "RequestLimits(n_ctx=64" in repr(lim)


def test_logits_checks_are_the_cores(tiny: str) -> None:
    m = _native.EngineCore(tiny, n_ctx=16, threads=1)
    for ids in ([], [m.n_vocab], list(range(1, 18)), [1, 2, 3]):
        want = _raised(lambda: m.logits(ids))
        assert _raised(lambda: m.request_limits.check_logits(ids)) == want, ids
    with pytest.raises(fak.ContextLengthError) as e:
        m.request_limits.check_logits(list(range(1, 18)))
    assert (e.value.param, e.value.n_ctx) == ("token_ids", 16)


def test_check_request_does_not_wait_for_the_engine(tiny: str) -> None:
    """The check reads the snapshot: it answers while another thread holds the engine in one long
    call (a stateless ``logits`` over a 4096-token window: about 0.35 s on a 2-core VM, against
    about 50 µs for a check of as many ids), and ``add_sequence`` waits for that call."""
    m = _native.EngineCore(tiny, n_ctx=4096, threads=1, kv_cache_tokens=4096)
    entered = threading.Event()
    done = threading.Event()

    def hold() -> None:
        entered.set()
        m.logits([7] * 4096)
        done.set()

    t = threading.Thread(target=hold)
    t.start()
    try:
        entered.wait()
        time.sleep(0.02)  # inside the call (it releases the GIL and holds the engine's lock)
        assert not done.is_set()
        for _ in range(20):
            with pytest.raises(fak.ContextLengthError):
                m.check_request([1] * 4096, {})
            m.check_request([1] * 8, {"max_tokens": 8})
        checked_during_the_call = not done.is_set()
        m.add_sequence(1, [1] * 8, {"max_tokens": 8})  # takes the lock: after the call
        assert done.is_set()
    finally:
        t.join()
    assert checked_during_the_call


def test_engine_stream_raises_the_cores_errors_at_the_call(tiny: str) -> None:
    with fak.Engine(tiny, n_ctx=16, threads=1) as engine:
        with pytest.raises(fak.ContextLengthError) as e:
            engine.stream(PROMPT, max_tokens=11)  # no next(): raised at the call
        assert (e.value.param, e.value.n_tokens, e.value.n_ctx) == ("max_tokens", 17, 16)
        with pytest.raises(fak.InvalidArgumentError) as err:
            engine.astream([-3])
        assert err.value.param == "prompt_ids" and "-3" in str(err.value)
        with pytest.raises(fak.InvalidArgumentError) as err:
            engine.stream(PROMPT, prefix_choices=[[engine._loop.model.n_vocab]])
        assert err.value.param == "prefix_choices"
        with pytest.raises(fak.InvalidArgumentError) as err:
            engine.logits([])
        assert err.value.param == "token_ids"
        assert engine.generate(PROMPT, max_tokens=10, temperature=0).usage.completion_tokens == 10
        assert engine.stats()["running"] == 0
