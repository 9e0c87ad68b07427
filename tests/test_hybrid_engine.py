"""The engine on a hybrid model (qwen35 / qwen35moe: Gated DeltaNet layers with a recurrent state
per sequence beside gated full attention), on the CPU backend: what the engine promises for dense
models must hold with the recurrent state too.

- a batch equals each sequence alone (each sequence has its own state slot), token for token and
  logit for logit;
- a sequence preempted for KV memory and resumed gives the same tokens (its state is recomputed
  from position 0);
- quarantining a span gives the logits of a sequence that never saw it (the state is recomputed:
  it cannot be cut like KV blocks);
- the prefix cache resumes a grown conversation from a checkpoint of the recurrent state at the
  last block of the earlier turn, with the logits of a cold prefill;
- ``logits()`` on the side (its own state slot) does not disturb running sequences.

Parity with llama.cpp is tests/test_parity_llamacpp.py (``tiny-qwen35*``).
"""

from __future__ import annotations

import numpy as np
import pytest
from fak import _native
from engine_util import greedy_run as _run


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def hybrid(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    from fak.synth import write_tiny_model

    arch = request.param
    return str(write_tiny_model(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, weight_type="Q8_0", seed=11))


def _prompts(model: _native.EngineCore, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(10, model.n_vocab - 10, size=n)] for n in lengths]


def test_batch_equals_each_alone(hybrid: str) -> None:
    m = _native.EngineCore(hybrid, backend="cpu", n_ctx=512, max_batch=4)
    prompts = _prompts(m, [40, 73, 120])
    together = _run(m, prompts, 10)
    for i, p in enumerate(prompts):
        alone = _run(m, [p], 10, base=100 + i)
        assert alone[100 + i] == together[i], f"sequence {i} alone differs from the batch"


def test_preemption_and_resume_give_the_same_tokens(hybrid: str) -> None:
    prompts = _prompts(_native.EngineCore(hybrid, backend="cpu", n_ctx=512), [60, 60, 60], seed=1)
    ample = _native.EngineCore(hybrid, backend="cpu", n_ctx=160, max_batch=3, kv_cache_tokens=2048)
    want = _run(ample, prompts, 80)
    tight = _native.EngineCore(hybrid, backend="cpu", n_ctx=160, max_batch=3, kv_cache_tokens=288)
    got = _run(tight, prompts, 80)
    assert tight.stats()["preemptions"] > 0, "the small cache should have preempted a sequence"
    assert got == want


def test_quarantine_equals_never_saw_the_span(hybrid: str) -> None:
    m = _native.EngineCore(hybrid, backend="cpu", n_ctx=512)
    (p,) = _prompts(m, [90], seed=2)
    start, end = 30, 50
    m.add_sequence(1, p, {"temperature": 0.0, "max_tokens": 6, "n_logprobs": 5})
    before = [(t, dict(top or [])) for _, t, _, top, _ in m.step()]  # the span is in the state now
    assert m.quarantine_span(1, start, end) >= 0
    got = []
    while m.n_running:
        got += [(t, dict(top or [])) for _, t, _, top, _ in m.step()]
    clean = p[:start] + p[end:]
    fresh = _native.EngineCore(hybrid, backend="cpu", n_ctx=512)
    fresh.add_sequence(2, clean, {"temperature": 0.0, "max_tokens": 6, "n_logprobs": 5})
    want = []
    while fresh.n_running or fresh.n_waiting:
        want += [(t, dict(top or [])) for _, t, _, top, _ in fresh.step()]
    # a token sampled before the quarantine (a first step that reached the prompt's end) is not
    # compared: what comes after the cut is
    want = want[len(before):]
    assert [t for t, _ in got] == [t for t, _ in want[:len(got)]]
    for (_, a), (_, b) in zip(got, want):
        assert a == b, "log-probabilities after the quarantine differ from never having seen the span"


def test_prefix_cache_resumes_from_a_state_checkpoint(hybrid: str) -> None:
    cold = _native.EngineCore(hybrid, backend="cpu", n_ctx=2048, prefix_cache=False)
    warm = _native.EngineCore(hybrid, backend="cpu", n_ctx=2048, prefix_cache=True)
    (turn1,) = _prompts(cold, [300], seed=3)
    turn2 = turn1 + _prompts(cold, [150], seed=4)[0]
    _run(warm, [turn1], 1, base=10)
    warm.take_prefix_hits()
    lw = None
    warm.add_sequence(11, turn2, {"temperature": 0.0, "max_tokens": 1, "n_logprobs": 8})
    while warm.n_running or warm.n_waiting:
        for _, t, _, top, _ in warm.step():
            lw = (t, dict(top or []))
    hits = dict(warm.take_prefix_hits()).get(11, 0)
    assert 0 < hits <= len(turn1), f"turn 2 found {hits} tokens of turn 1 in the cache"
    assert hits % 32 == 0
    cold.add_sequence(12, turn2, {"temperature": 0.0, "max_tokens": 1, "n_logprobs": 8})
    lc = None
    while cold.n_running or cold.n_waiting:
        for _, t, _, top, _ in cold.step():
            lc = (t, dict(top or []))
    assert lw == lc, "resuming from the checkpoint changed the first token's log-probabilities"


def test_logits_on_the_side_leave_running_sequences_alone(hybrid: str) -> None:
    m = _native.EngineCore(hybrid, backend="cpu", n_ctx=512, max_batch=2)
    a, b = _prompts(m, [60, 45], seed=5)
    want = _run(_native.EngineCore(hybrid, backend="cpu", n_ctx=512, max_batch=2), [a], 8)[0]
    m.add_sequence(0, a, {"temperature": 0.0, "max_tokens": 8})
    got: list[int] = []
    m.step()
    m.logits(b)  # a stateless forward on the spare state slot
    while m.n_running:
        got += [t for _, t, *_ in m.step()]
    full = _run(_native.EngineCore(hybrid, backend="cpu", n_ctx=512), [a], 8)[0]
    assert full == want
    assert got == want[len(want) - len(got):]


def _resume(m: _native.EngineCore, seq_id: int, prompt: list[int]) -> tuple[int, tuple[int, dict[int, float]] | None]:
    """Runs ``prompt`` for one greedy token on ``m``: (its prefix-cache hit in tokens, (token,
    top log-probabilities))."""
    m.take_prefix_hits()
    m.add_sequence(seq_id, prompt, {"temperature": 0.0, "max_tokens": 1, "n_logprobs": 8})
    out = None
    while m.n_running or m.n_waiting:
        for _, t, _, top, _ in m.step():
            out = (t, dict(top or []))
    return dict(m.take_prefix_hits()).get(seq_id, 0), out


@pytest.mark.parametrize("n", [1, 4])
def test_state_checkpoints_option_sets_how_many_conversations_resume(hybrid: str, n: int) -> None:
    """Conversations A, B, A: each 100-token prompt leaves one checkpoint (at token 96, the last
    block boundary before its last token). With one checkpoint B's takes A's slot, so A's second
    turn finds its KV blocks but no state to resume from (no hit); with four it resumes at 96
    with the logits of a cold prefill, bit for bit."""
    m = _native.EngineCore(hybrid, backend="cpu", n_ctx=1024, max_batch=2, state_checkpoints=n)
    assert m.config["state_checkpoints"] == n
    a1, b = _prompts(m, [100, 100], seed=6)
    a2 = a1 + _prompts(m, [60], seed=7)[0]
    assert _resume(m, 1, a1)[0] == 0
    assert _resume(m, 2, b)[0] == 0
    hit, got = _resume(m, 3, a2)
    assert hit == (0 if n == 1 else 96), f"with {n} checkpoints A's second turn found {hit} tokens"
    cold = _native.EngineCore(hybrid, backend="cpu", n_ctx=1024, prefix_cache=False)
    assert got == _resume(cold, 4, a2)[1], "resuming from the checkpoint changed the logits"


def test_state_checkpoints_memory_is_reported(hybrid: str) -> None:
    """The state slots (one per sequence of ``max_batch``, one for ``logits()``, the checkpoints)
    are reported with the KV cache; none without the prefix cache."""
    for n, cache in [(0, True), (3, True), (5, False)]:
        m = _native.EngineCore(hybrid, backend="cpu", n_ctx=512, max_batch=2, state_checkpoints=n, prefix_cache=cache)
        c = m.config
        want = n if cache else 0
        assert c["state_checkpoints"] == want
        assert c["state_slot_bytes"] > 0
        assert c["state_bytes"] == (2 + 1 + want) * c["state_slot_bytes"]


def test_state_checkpoints_zero_never_resumes(hybrid: str) -> None:
    m = _native.EngineCore(hybrid, backend="cpu", n_ctx=512, state_checkpoints=0)
    (p,) = _prompts(m, [100], seed=8)
    assert _resume(m, 1, p)[0] == 0
    assert _resume(m, 2, p + [11, 12])[0] == 0


@pytest.mark.parametrize("bad, says", [(-1, "must be ≥ 0"), (17, "more than the KV cache's 16 blocks")])
def test_bad_state_checkpoints_are_refused(hybrid: str, bad: int, says: str) -> None:
    import fak

    with pytest.raises(fak.InvalidArgumentError, match=says) as err:
        _native.EngineCore(hybrid, backend="cpu", n_ctx=512, kv_cache_tokens=512, state_checkpoints=bad)
    assert err.value.param == "state_checkpoints"


def test_a_long_prompts_chunk_checkpoints_give_way_to_other_conversations_ends(hybrid: str) -> None:
    """Conversation A's 100-token turn, then B's 1,200-token prompt (prefilled in 512-token
    chunks: checkpoints at 512 and 1024, and its end at 1184) with 2 checkpoints: B's chunk ends are
    evicted before A's end (and B's end takes one of theirs), so A's next turn still resumes at
    96, and so does B's."""
    m = _native.EngineCore(hybrid, backend="cpu", n_ctx=2048, max_batch=2, state_checkpoints=2)
    a1, b1 = _prompts(m, [100, 1200], seed=9)
    a2, b2 = a1 + [11, 12, 13], b1 + [14, 15]
    _resume(m, 1, a1)
    _resume(m, 2, b1)
    assert _resume(m, 3, a2)[0] == 96
    assert _resume(m, 4, b2)[0] == 1184


def _branches(model: _native.EngineCore) -> list[list[int]]:
    """Prompts A, B, C: a shared 200-token prefix (6 whole blocks and 8 tokens) then 40, 50 and
    60 tokens of their own."""
    (p,) = _prompts(model, [200], seed=10)
    return [p + t for t in _prompts(model, [40, 50, 60], seed=11)]


def _steps(m: _native.EngineCore, seq_id: int, prompt: list[int]) -> tuple[int, int, tuple[int, dict[int, float]] | None]:
    """``_resume`` and the forwards it took: (forwards, hit tokens, (token, top log-probs))."""
    before = m.stats()["steps"]
    hit, out = _resume(m, seq_id, prompt)
    return m.stats()["steps"] - before, hit, out


def test_a_third_prompt_resumes_where_two_others_branched(hybrid: str) -> None:
    """A, B, C share 200 tokens. B finds A's first 6 blocks (192 tokens) in the KV cache but no
    state checkpoint there (A's is at its end, 224): it computes from 0, its prefill cut at its
    branch point 192 (a checkpoint taken) and at its end cut 224, then its last rows. C resumes
    at 192 from B's branch checkpoint. B's and C's logits equal a cold run's, bit for bit."""
    m = _native.EngineCore(hybrid, backend="cpu", n_ctx=2048, max_batch=2)
    a, b, c = _branches(m)
    assert _steps(m, 1, a)[:2] == (2, 0)  # to its end cut (224), then its last 16 rows
    n_b, hit_b, got_b = _steps(m, 2, b)
    assert (n_b, hit_b) == (3, 0), f"B: {n_b} forwards, {hit_b} tokens from the cache"
    n_c, hit_c, got_c = _steps(m, 3, c)
    assert hit_c == 192, f"C resumed at {hit_c}, not at the shared prefix's last block"
    assert n_c == 2  # 192 → its end cut 256, then its last 3 rows
    cold = _native.EngineCore(hybrid, backend="cpu", n_ctx=2048, prefix_cache=False)
    assert got_b == _resume(cold, 12, b)[1], "cutting B's prefill at its branch point changed its logits"
    assert got_c == _resume(cold, 13, c)[1], "resuming C from B's branch checkpoint changed its logits"


def test_no_branch_cut_without_checkpoints_or_on_a_dense_model(hybrid: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The branch cut is a hybrid's with checkpoints: a hybrid with ``state_checkpoints=0`` and a
    dense model prefill B in one forward, as before (the dense model from its 192-token hit)."""
    from fak.synth import write_tiny_model

    dense = str(write_tiny_model(tmp_path_factory.mktemp("dense") / "qwen3.gguf", "qwen3", weight_type="Q8_0", seed=11))
    for path, kw, want_hit in [(hybrid, {"state_checkpoints": 0}, 0), (dense, {}, 192)]:
        m = _native.EngineCore(path, backend="cpu", n_ctx=2048, max_batch=2, **kw)
        a, b, c = _branches(m)
        _steps(m, 1, a)
        assert _steps(m, 2, b)[:2] == (1, want_hit), path
        assert _steps(m, 3, c)[:2] == (1, want_hit), path
