"""The engine's scheduling on the CUDA backend, on a synthetic twin of the real 1.5B Q4_K_M layout
(written here by ``fak.synth.write_twin``, so the GPU machine needs no real model file):

- automatic prefix caching: with the cache on but empty, greedy output equals the cache off; a
  prompt sent again reuses its full KV blocks (the stats say so). Its continuation then starts
  the same, but is not required to be bit-identical: on CUDA the rest of the prompt (4 rows) goes
  through the GEMV and the whole prompt (104 rows) through the f16 tensor-core GEMM, which round
  differently (on CPU the matmul is row-invariant and the test there, tests/test_prefix_cache.py,
  requires identity); the number of identical tokens is printed;
- batching: greedy continuations of several prompts decoded together equal each one alone.

Both compare the CUDA backend with itself, so the bar is exact token equality.
"""

from __future__ import annotations

import numpy as np
import pytest
from fak import _native
from native_greedy import greedy_batched

N_NEW = 12


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fak.synth import write_twin

    return str(write_twin(tmp_path_factory.mktemp("twin") / "twin-1.5b.gguf", preset="qwen2.5-coder-1.5b-q4_k_m"))


def _prompts(n: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [[int(t) for t in rng.integers(0, 150_000, size=length + 5 * i)] for i in range(n)]


@pytest.mark.cuda
def test_prefix_cache_reuses_blocks_on_cuda(require_cuda: None, twin: str) -> None:
    prompt = _prompts(1, 100)[0]  # three full 32-token blocks and a partial one
    plain = _native.Model(twin, backend="cuda", n_ctx=512, max_batch=4, prefix_cache=False)
    want = greedy_batched(plain, [prompt], N_NEW)[0]
    del plain
    cached = _native.Model(twin, backend="cuda", n_ctx=512, max_batch=4, prefix_cache=True)
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
    model = _native.Model(twin, backend="cuda", n_ctx=512, max_batch=8, prefix_cache=False)
    alone = [greedy_batched(model, [p], N_NEW)[0] for p in prompts]
    together = greedy_batched(model, prompts, N_NEW)
    assert together == alone
