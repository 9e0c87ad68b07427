"""KV quarantine (rust/src/engine: ``Model.quarantine_span``, ``Model.evict_prefix``): a sequence
whose span was removed goes on *exactly* as a sequence that never saw it.

Each test runs a sequence whose prompt holds a poisoned span, removes the span mid-generation,
and compares every following step against a fresh sequence whose prompt is the clean
conversation (the prompt without the span, plus the tokens generated before the removal): the
logits of every step (``Model.last_logits``, the full ``[n_vocab]`` row) must be equal to the bit
(max |Δ| = 0 on CPU), and so the tokens. Logits after several decode steps depend on every K/V
row of every layer, so equal logits over the steps that follow also say the recomputed KV cache
equals the fresh one. Also: after a prefix-cache hit, in a batch with other sequences (which must
not change), and the prefix cache holding none of the span afterwards. To add a case, build the
token lists and call ``_compare``.
"""

from __future__ import annotations

import numpy as np
import pytest
from fak import _native
from fak.synth import write_tiny_model

BLOCK = 32
#: n_logprobs > 0 makes every step copy its logits to the host (``last_logits``); greedy.
SAMPLING = {"temperature": 0.0, "n_logprobs": 2}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("kvq") / "tiny.gguf", "qwen2", n_layer=2, n_embd=256, n_head=8,
                            n_head_kv=2, n_ff=512, weight_type="Q8_0", seed=11)
    return path


def _model(path, **kw):
    return _native.EngineCore(str(path), threads=1, n_ctx=1024, kv_cache_tokens=8192, **kw)


def _tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 600, size=n)]


def _steps(model, seq_id: int, n: int) -> list[tuple[int, np.ndarray]]:
    """``n`` steps that give ``seq_id`` a token: ``(token, logits)`` each."""
    out = []
    while len(out) < n:
        for sid, tok, _lp, _top, _fin in model.step():
            if sid == seq_id:
                out.append((tok, np.array(model.last_logits(sid))))
    return out


def _chains(contents: list[tuple[int, int | None, list[int]]]) -> list[list[int]]:
    """The token lists of the prefix cache's chains (root to each leaf)."""
    by_hash = {h: (p, t) for h, p, t in contents}
    parents = {p for _, p, _ in contents if p is not None}
    out = []
    for h in by_hash:
        if h in parents:
            continue
        toks: list[int] = []
        while h is not None and h in by_hash:
            p, t = by_hash[h]
            toks = t + toks
            h = p
        out.append(toks)
    return out


def _contains(seq: list[int], sub: list[int]) -> bool:
    n = len(sub)
    return any(seq[i:i + n] == sub for i in range(len(seq) - n + 1))


def _clean_run(path, clean: list[int], n: int) -> list[tuple[int, np.ndarray]]:
    m = _model(path)
    m.add_sequence(1, clean, dict(SAMPLING))
    return _steps(m, 1, n)


def _compare(got: list[tuple[int, np.ndarray]], want: list[tuple[int, np.ndarray]]) -> None:
    assert [t for t, _ in got] == [t for t, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert a.shape == b.shape
        assert float(np.max(np.abs(a - b))) == 0.0
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("start,end", [(70, 130), (64, 96), (5, 9), (100, 101), (33, 180)])
def test_quarantine_equals_never_saw(tiny, start: int, end: int) -> None:
    prompt = _tokens(200, seed=start)
    m = _model(tiny)
    m.add_sequence(1, prompt, dict(SAMPLING))
    before = _steps(m, 1, 3)  # prefill + 2 decodes
    dropped = m.quarantine_span(1, start, end)
    assert dropped >= 1 or start // BLOCK == 200 // BLOCK
    after = _steps(m, 1, 4)
    clean = prompt[:start] + prompt[end:] + [t for t, _ in before]
    _compare(after, _clean_run(tiny, clean, 4))
    # nothing of the span is cached any more, and the clean head is
    chains = _chains(m.prefix_cache_contents())
    assert not any(_contains(c, prompt[max(0, start - 4):end]) for c in chains)
    assert start < BLOCK or any(c[:start // BLOCK * BLOCK] == prompt[:start // BLOCK * BLOCK] for c in chains)


def test_after_a_prefix_cache_hit(tiny) -> None:
    prompt = _tokens(230, seed=5)
    start, end = 100, 160
    m = _model(tiny)
    m.add_sequence(1, prompt, dict(SAMPLING))
    _steps(m, 1, 1)
    m.remove_sequence(1)
    hits0 = m.stats()["prefix_cache_hit_tokens"]
    m.add_sequence(2, prompt + [7, 8], dict(SAMPLING))  # the conversation grows: 7 cached blocks hit
    before = _steps(m, 2, 2)
    assert m.stats()["prefix_cache_hit_tokens"] - hits0 == 7 * BLOCK
    m.quarantine_span(2, start, end)
    after = _steps(m, 2, 3)
    clean = prompt[:start] + prompt[end:] + [7, 8] + [t for t, _ in before]
    _compare(after, _clean_run(tiny, clean, 3))
    # a third request with the poisoned prompt finds only the blocks before the span
    hits1 = m.stats()["prefix_cache_hit_tokens"]
    m.add_sequence(3, prompt, dict(SAMPLING))
    _steps(m, 3, 1)
    assert m.stats()["prefix_cache_hit_tokens"] - hits1 == (start // BLOCK) * BLOCK


def test_in_a_batch_with_other_sequences(tiny) -> None:
    prompts = {1: _tokens(150, seed=1), 2: _tokens(90, seed=2), 3: _tokens(170, seed=3)}
    alone = {sid: _clean_run(tiny, p, 6) for sid, p in prompts.items() if sid != 1}
    m = _model(tiny)
    for sid, p in prompts.items():
        m.add_sequence(sid, p, dict(SAMPLING))
    got: dict[int, list[tuple[int, np.ndarray]]] = {1: [], 2: [], 3: []}
    removed = False
    before_n = 0
    while min(len(v) for v in got.values()) < 6:
        for sid, tok, _lp, _top, _fin in m.step():
            got[sid].append((tok, np.array(m.last_logits(sid))))
        if not removed and len(got[1]) == 2:
            before_n = 2
            m.quarantine_span(1, 40, 75)
            removed = True
    for sid in (2, 3):
        _compare(got[sid][:6], alone[sid])
    clean = prompts[1][:40] + prompts[1][75:] + [t for t, _ in got[1][:before_n]]
    _compare(got[1][before_n:6], _clean_run(tiny, clean, 6 - before_n))


def test_evict_prefix_drops_and_bans(tiny) -> None:
    prompt = _tokens(200, seed=9)
    m = _model(tiny)
    m.add_sequence(1, prompt, dict(SAMPLING))
    _steps(m, 1, 1)
    m.remove_sequence(1)
    n_before = m.stats()["prefix_cache_blocks"]
    dropped = m.evict_prefix(prompt[:150], 120)  # the span starts in block 3
    assert dropped == n_before - 3
    assert m.stats()["prefix_cache_blocks"] == 3
    m.add_sequence(2, prompt, dict(SAMPLING))
    _steps(m, 2, 1)
    assert not any(_contains(c, prompt[118:150]) for c in _chains(m.prefix_cache_contents())), \
        "banned: never cached again"
    assert m.evict_prefix([1, 2, 3], 0) == 0
    with pytest.raises(ValueError):
        m.evict_prefix([1, 2], 2)
    with pytest.raises(ValueError):
        m.quarantine_span(2, 0, 10_000)
    with pytest.raises(ValueError):
        m.quarantine_span(99, 0, 1)


def test_prefix_cache_off(tiny) -> None:
    prompt = _tokens(120, seed=4)
    m = _model(tiny, prefix_cache=False)
    m.add_sequence(1, prompt, dict(SAMPLING))
    before = _steps(m, 1, 2)
    assert m.quarantine_span(1, 10, 50) == 0
    after = _steps(m, 1, 3)
    _compare(after, _clean_run(tiny, prompt[:10] + prompt[50:] + [t for t, _ in before], 3))


def test_engine_stream_quarantine_span(tiny) -> None:
    """``fak.Engine.quarantine_span`` on a running stream: the rest of the generation is what a
    fresh generation from the clean prompt (plus the tokens already streamed) gives."""
    from fak.engine import Engine

    prompt = _tokens(180, seed=21)
    with Engine(str(tiny), backend="cpu", n_ctx=1024, max_batch=4) as engine:
        stream = engine.stream(prompt, max_tokens=64, temperature=0.0)
        first = next(stream).token_ids
        while len(first) < 3:
            first += next(stream).token_ids
        assert engine.quarantine_span(stream, 50, 90) >= 1
        out = first + [t for d in stream for t in d.token_ids]
        # the engine thread may have stepped further before the removal applied: it applied
        # between two steps, after some k >= len(first) tokens, and from there on the output is the
        # clean prompt's
        clean = prompt[:50] + prompt[90:]
        ok = [k for k in range(len(first), len(out))
              if out[k:] == engine.generate(clean + out[:k], max_tokens=len(out) - k, temperature=0.0).token_ids[
                  :len(out) - k]]
        assert ok, out
        with pytest.raises(ValueError):
            engine.quarantine_span(stream, 10, 5)
        done = engine.stream(prompt[:40], max_tokens=2, temperature=0.0)
        list(done)
        assert engine.quarantine_span(done, 0, 10) == 0, "a finished stream is left alone"
