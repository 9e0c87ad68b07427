"""Python-side cost of fak.Engine per generated token, measured over a zero-cost fake model.

What it measures: the engine loop (token outputs delivered across threads) plus the consumer side
(per-token detokenization and stop matching in the sync iterator or the asyncio streams), with a
native ``step()`` that costs nothing. This is the ceiling the engine loop puts on tok/s and the share of a GIL the
gateway competes with; compare it with the model's own decode tok/s.

Run: PYTHONPATH=python:tests python -m pytest benches/test_engine_overhead.py --benchmark-only
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fak.engine import Engine  # noqa: E402

from fake_native import FakeModel, tiny_tokenizer  # noqa: E402

TOK = tiny_tokenizer()
N_TOKENS = 256


@pytest.fixture(scope="module")
def engine() -> Engine:
    e = Engine.from_model(FakeModel(TOK, n_ctx=4096, kv_blocks=1 << 20), TOK)
    yield e
    e.close()


def test_sync_stream_one_request(benchmark, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    def run() -> int:
        return sum(len(d.token_ids) for d in engine.stream("x", temperature=0, max_tokens=N_TOKENS))

    n = benchmark(run)
    assert n == N_TOKENS
    benchmark.extra_info["tokens_per_round"] = N_TOKENS


@pytest.mark.parametrize("concurrency", [8, 64])
def test_async_streams(benchmark, engine: Engine, concurrency: int) -> None:  # type: ignore[no-untyped-def]
    async def one(i: int) -> int:
        n = 0
        async for d in engine.astream(f"p{i}", temperature=0, max_tokens=N_TOKENS, stop=["never"]):
            n += len(d.token_ids)
        return n

    async def main() -> int:
        return sum(await asyncio.gather(*[one(i) for i in range(concurrency)]))

    n = benchmark.pedantic(lambda: asyncio.run(main()), rounds=3, iterations=1)
    assert n == N_TOKENS * concurrency
    benchmark.extra_info["tokens_per_round"] = N_TOKENS * concurrency
