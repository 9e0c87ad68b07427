"""The engine's scheduling on the CUDA backend, on a synthetic twin of the real 1.5B Q4_K_M layout
(written here by ``fak.synth.write_twin``, so the GPU machine needs no real model file):

- automatic prefix caching: with the cache on but empty, greedy output equals the cache off; a
  prompt sent again reuses its full KV blocks (the stats say so). Its continuation then starts
  the same, but is not required to be bit-identical: on CUDA the rest of the prompt (4 rows) goes
  through the GEMV and the whole prompt (104 rows) through the f16 tensor-core GEMM, which round
  differently (on CPU the matmul is row-invariant and the test there, tests/test_prefix_cache.py,
  requires identity); the number of identical tokens is printed;
- batching: greedy continuations of several prompts decoded together equal each one alone
  (up to 8 sequences: the decode GEMV either way, so the bar is exact token equality);
- batched decode past 8 sequences (the int8 tensor-core GEMM with small tiles and split-K):
  within one row bucket of the kernel table a sequence's tokens do not depend on the batch
  (exact: 10 sequences alone vs the same 10 among 16); against each sequence decoded alone (the
  GEMV, another f32 summation order) the first two tokens' log-probabilities agree within
  ``TIE`` and a differing token is one of the other run's first ``TOPK`` choices, within ``TIE``
  of its first (the measured noise of the 8-bit activations on the twin; see ``TIE``);
- at 33 sequences every step returns a token for every sequence (no scheduler cap, no
  preemption with a cache sized for them).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from fak import _native
from native_greedy import greedy_batched

N_NEW = 12


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fak.synth import write_twin

    given = os.environ.get("FAK_TWIN_15B")  # a twin written earlier (the GPU run writes one for the benches)
    if given and os.path.exists(given):
        return given
    return str(write_twin(tmp_path_factory.mktemp("twin") / "twin-1.5b.gguf", preset="qwen2.5-coder-1.5b-q4_k_m"))


def _prompts(n: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[int(t) for t in rng.integers(0, 150_000, size=length + 5 * i)] for i in range(n)]


@pytest.mark.cuda
def test_prefix_cache_reuses_blocks_on_cuda(require_cuda: None, twin: str) -> None:
    prompt = _prompts(1, 100)[0]  # three full 32-token blocks and a partial one
    plain = _native.EngineCore(twin, backend="cuda", n_ctx=512, max_batch=4, prefix_cache=False)
    want = greedy_batched(plain, [prompt], N_NEW)[0]
    del plain
    cached = _native.EngineCore(twin, backend="cuda", n_ctx=512, max_batch=4, prefix_cache=True)
    first = greedy_batched(cached, [prompt], N_NEW)[0]
    hits_before = cached.stats()["prefix_cache_hit_tokens"]
    second = greedy_batched(cached, [prompt], N_NEW)[0]
    hits = cached.stats()["prefix_cache_hit_tokens"] - hits_before
    same = next((i for i, (a, b) in enumerate(zip(second, want)) if a != b), len(want))
    print(f"\ncache hit: {hits} prompt tokens from the cache; greedy identical for {same}/{N_NEW} tokens")
    assert first == want, (first, want)
    assert hits >= 96, cached.stats()
    assert second[0] == want[0], (second, want)


@pytest.mark.cuda
def test_batched_equals_alone_on_cuda(require_cuda: None, twin: str) -> None:
    prompts = _prompts(4, 20)
    model = _native.EngineCore(twin, backend="cuda", n_ctx=512, max_batch=8, prefix_cache=False)
    alone = [greedy_batched(model, [p], N_NEW)[0] for p in prompts]
    together = greedy_batched(model, prompts, N_NEW)
    assert together == alone


# Bound on the first two tokens alone vs batched. Their inputs differ only in f32 summation
# order: the first token's logit rows go through the last layer's tail and the LM head as one
# row alone (the GEMV) but with the other sequences' logit rows batched (the GEMM above 8 rows),
# the second token's whole forward likewise; ~1e-6 relative a product, but where such a
# difference moves an activation across a rounding boundary of its 8-bit form (the CPU-faithful
# int8 activations) that value moves by a whole quantum, and on the random-weight twin, whose
# next-token distribution is nearly flat (top-2 gaps of 0.03-0.1 nats), 28 layers of that add up:
# measured on the H200 on 2026-12-02 (commit f359b56, 40 sequences), the largest |Δ logprob| of an
# equal token was 0.22 nats, and 7 of 40 parted at the second token, at alone top-2 gaps of
# 0.03-0.10 (the first bound, 0.05, was a guess this measurement refuted). The bound is that
# measurement with margin; a parted token must be one of the alone run's TOPK choices, within TIE
# of its first. Later steps are not compared: on the twin a token that differs once changes
# everything after. (Within one row bucket the tokens are exact: the test above.)
TIE = 0.5
TOPK = 8


def _greedy_with_top(model, prompts: list[list[int]], n_new: int) -> list[list[tuple[int, list[tuple[int, float]]]]]:
    """Like greedy_batched, also returning each step's TOPK (token, logprob) choices."""
    out: dict[int, list] = {i: [] for i in range(len(prompts))}
    for i, toks in enumerate(prompts):
        model.add_sequence(i, toks, {"temperature": 0.0, "n_logprobs": TOPK})
    live = set(out)
    while live:
        for seq_id, token, _lp, top, _fin in model.step():
            out[seq_id].append((token, top))
            if len(out[seq_id]) >= n_new:
                model.remove_sequence(seq_id)
                live.discard(seq_id)
    return [out[i] for i in range(len(prompts))]


@pytest.mark.cuda
def test_batched_decode_same_bucket_is_exact_on_cuda(require_cuda: None, twin: str) -> None:
    # 12..15 tokens each, and every sequence starts and ends decoding in the same step.
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(0, 150_000, size=12 + i % 4)] for i in range(16)]
    model = _native.EngineCore(twin, backend="cuda", n_ctx=512, max_batch=16, prefix_cache=False)
    ten = greedy_batched(model, prompts[:10], N_NEW)
    sixteen = greedy_batched(model, prompts, N_NEW)
    assert sixteen[:10] == ten


@pytest.mark.cuda
def test_batched_decode_matches_alone_on_cuda(require_cuda: None, twin: str) -> None:
    prompts = _prompts(40, 20)
    model = _native.EngineCore(twin, backend="cuda", n_ctx=512, max_batch=40, prefix_cache=False)
    together = _greedy_with_top(model, prompts, 2)
    same, worst, parted = 0, 0.0, []
    for i, p in enumerate(prompts):
        alone = _greedy_with_top(model, [p], 2)[0]
        for j in range(2):
            (ta, top_a), (tb, top_b) = alone[j], together[i][j]
            if ta != tb:
                alone_lp = dict(top_a).get(tb)
                parted.append((i, j, None if alone_lp is None else top_a[0][1] - alone_lp))
                break
            worst = max(worst, abs(top_a[0][1] - top_b[0][1]))
        else:
            same += 1
    print(f"\n40 sequences batched vs alone: first two tokens identical for {same}; max |Δ logprob| of equal tokens "
          f"{worst:.2e}; parted at (seq, step, alone gap from its first to the batched token) {parted}")
    assert worst <= TIE
    assert all(gap is not None and gap <= TIE for _, _, gap in parted), parted


@pytest.mark.cuda
def test_every_sequence_decodes_every_step_on_cuda(require_cuda: None, twin: str) -> None:
    n, prompt, steps = 33, 40, 16
    model = _native.EngineCore(twin, backend="cuda", n_ctx=prompt + steps + 64, kv_cache_tokens=n * (prompt + steps + 64), max_batch=n)
    rng = np.random.default_rng(3)
    for i in range(n):
        model.add_sequence(i, [int(t) for t in rng.integers(0, 150_000, prompt)], {"temperature": 0.0})
    have: set[int] = set()
    while len(have) < n:
        have.update(o[0] for o in model.step())
    counts = [len(model.step()) for _ in range(steps)]
    assert counts == [n] * steps, (counts, model.stats())
    assert model.stats()["preemptions"] == 0
