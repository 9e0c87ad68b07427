"""Tensor parallelism on the CPU backend (``tensor_parallel=N``: N shards on threads with the
in-process communicator; docs/tensor-parallel.md).

Checked on the real Qwen2.5-Coder-0.5B (and 1.5B at N = 2): logits of N = 2, 3, 4 shards against
one shard within the CPU backend's own summation-order noise; greedy tokens identical over a
batched decode through ``fak._native.EngineCore`` (plain greedy and the host-sampler path); a sequence
batched equals it alone under N = 2; ``fak.Engine(tensor_parallel=2)``. On synthetic models: both
architectures (qwen2 with Q/K/V biases, llama with tied embeddings, so its LM head is a slice of
``token_embd``), qwen3 (per-head Q/K norms) and qwen3moe (experts divided whole or cut by columns,
``FAK_TP_MOE``, router replicated: logits, greedy decode, router ties, ``fak.Engine`` chat; their own
noise bound, below), the typed ``fak.ShardError`` of a k-quant whose K per shard is not whole
256-element blocks (``ffn_down_exps`` too), and the loud failures of ``backend="cuda"`` / ``fak serve
--backend cuda`` with N > 1.

The bound. Splitting ``attn_output`` and ``ffn_down`` along K changes only where their f32 dot
products are summed (each shard's partial sum is rounded, then the shards are added in rank
order). The CPU backend's own summation-order noise, measured the same way, is the difference
between its scalar path (``FAK_CPU_SIMD=scalar``: the same integer block sums, accumulated in
another f32 order) and its SIMD path, over the three ``TEXTS`` below (99 positions x 151936 logits):
0.5B max |dlogit| 0.58 / 0.69 / 0.52, mean 0.058 / 0.063 / 0.051; 1.5B max 0.65 / 0.60 / 0.61,
mean 0.071 / 0.077 / 0.073 (2026-12-06, Xeon with AVX-512; ``benches/bench_tensor_parallel.py
--noise`` re-measures it). Measured TP against one shard on the same texts: 0.5B max 0.45-0.66,
mean 0.049-0.061 (N = 2, 3, 4); 1.5B max 0.60-0.68, mean 0.068-0.080 (N = 2, 4). The bounds are
``MAX_ABS = 1.0`` and ``MEAN_ABS = 0.10``: about 1.45x and 1.3x the largest noise measured. A
shard whose all-reduce is dropped, whose KV head is the wrong one, or whose vocabulary slice is
gathered out of place moves the logits by several units (docs/tensor-parallel.md lists the
mutations tried).

To add a case: a new text goes in ``TEXTS`` (re-measure the noise first); a new model needs its own
noise measurement before it borrows these bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import fak
from fak import _native
from fak.cli import main
from fak.engine import Engine
from fak.synth import write_tiny_model
from fak.tokenizer import Tokenizer, read_gguf_metadata

MAX_ABS = 1.0
MEAN_ABS = 0.10

TEXTS = [
    "def quicksort(xs):\n    \"\"\"Sort a list of integers.\"\"\"\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n",
    "The quick brown fox jumps over the lazy dog. Tensor parallelism splits the attention heads and the "
    "feed-forward layers of a transformer across devices, ",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a bash one-liner that "
    "counts the lines of every Python file in a repository.<|im_end|>\n<|im_start|>assistant\n",
]


def _tokens(path) -> list[list[int]]:  # type: ignore[no-untyped-def]
    tok = Tokenizer.from_gguf_metadata(read_gguf_metadata(path))
    return [tok.encode(t) for t in TEXTS]


def _model(path, n: int, **kw) -> _native.EngineCore:  # type: ignore[no-untyped-def]
    kw.setdefault("n_ctx", 512)
    kw.setdefault("max_batch", 4)
    return _native.EngineCore(str(path), backend="cpu", threads=2, tensor_parallel=n, **kw)


def _within_noise(ref: np.ndarray, got: np.ndarray, what: str) -> None:
    d = np.abs(got - ref)
    assert np.isfinite(got).all(), what
    assert d.max() <= MAX_ABS and d.mean() <= MEAN_ABS, \
        f"{what}: max |dlogit| {d.max():.3f} (bound {MAX_ABS}), mean {d.mean():.4f} (bound {MEAN_ABS})"
    # Where one shard's top token leads by more than twice the bound, every N picks it too.
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * MAX_ABS
    assert clear.sum() > 0
    assert (ref.argmax(1)[clear] == got.argmax(1)[clear]).all(), what


@pytest.fixture(scope="module")
def ref_05b(model_05b):  # type: ignore[no-untyped-def]
    """One shard's logits of every text (the reference)."""
    m = _model(model_05b, 1)
    return [m.logits(t) for t in _tokens(model_05b)]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_logits_of_n_shards_equal_one_shard_within_cpu_noise(model_05b, ref_05b, n: int) -> None:  # type: ignore[no-untyped-def]
    m = _model(model_05b, n)
    assert m.config["tensor_parallel"] == n and len(m.shard_plan) == n
    for i, toks in enumerate(_tokens(model_05b)):
        _within_noise(ref_05b[i], m.logits(toks), f"0.5B N={n} text {i}")


def test_the_05b_plan_splits_gqa_heads_unevenly_at_four_shards(model_05b) -> None:  # type: ignore[no-untyped-def]
    """14 query heads over 2 KV heads: each KV head on two shards, its 7 query heads 4 + 3; n_ff 4864
    is 19 Q4_K/Q6_K blocks of ffn_down's K: 5 + 5 + 5 + 4 blocks."""
    plan = _model(model_05b, 4, n_ctx=64).shard_plan
    assert [p["q_heads"] for p in plan] == [(0, 4), (4, 7), (7, 11), (11, 14)]
    assert [p["kv_heads"] for p in plan] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [p["ffn"] for p in plan] == [(0, 1280), (1280, 2560), (2560, 3840), (3840, 4864)]
    assert [p["vocab"] for p in plan] == [(0, 37984), (37984, 75968), (75968, 113952), (113952, 151936)]
    assert _model(model_05b, 1, n_ctx=64).shard_plan == []


def test_15b_two_shards_within_cpu_noise(model_15b) -> None:  # type: ignore[no-untyped-def]
    """Every projection of the 1.5B is a k-quant: attn_output is cut at K = 768 (3 Q4_K blocks),
    ffn_down at 4608 of 8960 (18 of 35 blocks)."""
    toks = _tokens(model_15b)[0]
    ref = _model(model_15b, 1, n_ctx=128).logits(toks)
    m = _model(model_15b, 2, n_ctx=128)
    assert [p["ffn"] for p in m.shard_plan] == [(0, 4608), (4608, 8960)]
    got = m.logits(toks)
    _within_noise(ref, got, "1.5B N=2")
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() > 0.995, cos.min()


def _decode(m: _native.EngineCore, prompts: list[list[int]], max_tokens: int, n_logprobs: int) -> dict[int, list]:
    """Greedy batched decode of every prompt: per sequence, ``[(token, top_logprobs | None), ...]``."""
    for i, p in enumerate(prompts):
        m.add_sequence(i, p, {"temperature": 0.0, "max_tokens": max_tokens, "n_logprobs": n_logprobs})
    out: dict[int, list] = {i: [] for i in range(len(prompts))}
    while steps := m.step():
        for seq_id, token, _lp, top, _finish in steps:
            out[seq_id].append((token, top))
    return out


@pytest.fixture(scope="module")
def greedy_ref(model_05b):  # type: ignore[no-untyped-def]
    """One shard's greedy tokens with their top-2 log-probabilities (the margins)."""
    return _decode(_model(model_05b, 1), _tokens(model_05b), 24, 2)


@pytest.mark.parametrize("n,n_logprobs", [(2, 0), (2, 2), (4, 0)])
def test_greedy_batched_decode_equals_one_shard(model_05b, greedy_ref, n: int, n_logprobs: int) -> None:  # type: ignore[no-untyped-def]
    """Three sequences decoded together through ``_native.EngineCore`` (plain greedy: the argmax of the
    gathered logits; with logprobs: the host sampler) give one shard's tokens. Summation-order
    noise may flip a near tie: a sequence may leave the reference only where the reference's top
    two tokens are within 2 x MAX_ABS of each other (after that its context differs, so the rest
    is not compared)."""
    got = _decode(_model(model_05b, n), _tokens(model_05b), 24, n_logprobs)
    compared = 0
    for i, ref in greedy_ref.items():
        toks = [t for t, _ in got[i]]
        for j, (want, top) in enumerate(ref):
            if toks[j] != want:
                margin = top[0][1] - top[1][1]
                assert margin < 2 * MAX_ABS, f"N={n} seq {i} token {j}: {toks[j]} != {want} (margin {margin:.3f})"
                break
            compared += 1
            if n_logprobs:
                assert got[i][j][1][0][0] == want
    assert compared >= 48, compared


def test_batched_equals_alone_with_two_shards(model_05b) -> None:  # type: ignore[no-untyped-def]
    """Row invariance holds across the shards: a prompt's last-position logits are the same bits in a
    batch of three as from ``logits()`` alone (the all-reduce is element-wise, every op per row)."""
    prompts = _tokens(model_05b)
    m = _model(model_05b, 2)
    alone = [m.logits(p)[-1] for p in prompts]
    for i, p in enumerate(prompts):
        m.add_sequence(i, p, {"temperature": 0.0, "max_tokens": 1, "n_logprobs": 1})
    m.step()
    for i in range(len(prompts)):
        batched = m.last_logits(i)
        assert batched is not None and np.array_equal(batched, alone[i]), i


def test_engine_tensor_parallel_generates_one_shards_text(model_05b) -> None:  # type: ignore[no-untyped-def]
    with Engine(model_05b, backend="cpu", n_ctx=256, threads=2, max_batch=2, tensor_parallel=2) as e2, \
            Engine(model_05b, backend="cpu", n_ctx=256, threads=2, max_batch=2) as e1:
        assert e2._loop.model.config["tensor_parallel"] == 2 and len(e2._loop.model.shard_plan) == 2
        a = e1.generate("def fibonacci(n):", temperature=0, max_tokens=12, logprobs=2)
        b = e2.generate("def fibonacci(n):", temperature=0, max_tokens=12, logprobs=2)
        assert a.logprobs is not None and b.logprobs is not None
        for j, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
            if x.token_id != y.token_id:
                margin = x.top_logprobs[0].logprob - x.top_logprobs[1].logprob
                assert margin < 2 * MAX_ABS, (j, margin)
                break
            assert abs(x.logprob - y.logprob) < MAX_ABS
        assert e2.stats()["kv_blocks_total"] == e1.stats()["kv_blocks_total"]
    with pytest.raises(ValueError, match="tensor_parallel"):
        Engine(model_05b, backend="cpu", tensor_parallel=0)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_synthetic_models_of_both_architectures(tmp_path, arch: str) -> None:  # type: ignore[no-untyped-def]
    """qwen2 (Q/K/V biases sliced with their heads, untied output.weight) and llama (no biases, tied
    embeddings: each shard's LM head is its rows of token_embd), N up to one query head per shard."""
    p = write_tiny_model(tmp_path / f"{arch}.gguf", arch, n_layer=2, n_embd=256, n_head=8, n_head_kv=4,
                         n_ff=768, weight_type="Q8_0")
    toks = list(range(5, 40))
    ref = _model(p, 1, n_ctx=64).logits(toks)
    for n in (2, 3, 4, 8):
        got = _model(p, n, n_ctx=64).logits(toks)
        d = np.abs(got - ref)
        assert d.max() <= 1e-3 * np.abs(ref).max(), (n, d.max())
        assert (got.argmax(1) == ref.argmax(1)).all(), n


# Tiny qwen3 / qwen3moe models (3 layers, n_embd 256, 8 query heads of 64 over 2 KV heads; qwen3moe:
# 32 experts, 4 per token, n_ff_exp 512; qwen3: n_ff 1024). Their logits are small (|logit| <= 1.6),
# and a last-bit difference anywhere can flip the rounding of one 8-bit activation (Q8_0 / Q8_K, as
# llama.cpp quantizes them), which moves a logit by about 1e-2 here. The CPU backend's own noise
# measured the same way (FAK_CPU_SIMD=scalar vs SIMD, 64 positions, Q8_0 and Q4_K_M, seeds 0-2;
# 2026-12-07): max |dlogit| 0.013-0.049 (qwen3moe) and 0.008-0.019 (qwen3), mean 0.0003-0.0022; the
# shards against one shard (N = 2, 3, 4, 8; qwen3moe's experts divided either way): max 0-0.030, mean
# 0-0.0022. The bounds are about 1.2x and 1.4x the largest noise. With the MoE all-reduce dropped (each
# shard keeps its partial sum) or the partial sum not started from zeros, the qwen3moe tests fail
# with max 0.23-0.38 and mean 0.025-0.062 (each mutation built and run, then reverted).
TINY_MAX_ABS = 0.06
TINY_MEAN_ABS = 0.003


def _tiny_qwen3(tmp_path, arch: str, weight_type: str = "Q8_0", **kw):  # type: ignore[no-untyped-def]
    shape = dict(n_expert=32, n_expert_used=4, n_ff_exp=512) if arch == "qwen3moe" else dict(n_ff=1024)
    return write_tiny_model(tmp_path / f"{arch}-{weight_type}.gguf", arch, n_layer=3, n_embd=256, n_head=8,
                            n_head_kv=2, head_dim=64, weight_type=weight_type, **{**shape, **kw})


def _within_tiny_noise(ref: np.ndarray, got: np.ndarray, what: str) -> None:
    d = np.abs(got - ref)
    assert np.isfinite(got).all(), what
    assert d.max() <= TINY_MAX_ABS and d.mean() <= TINY_MEAN_ABS, \
        f"{what}: max |dlogit| {d.max():.4f} (bound {TINY_MAX_ABS}), mean {d.mean():.5f} (bound {TINY_MEAN_ABS})"
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * TINY_MAX_ABS
    assert clear.sum() > 0
    assert (ref.argmax(1)[clear] == got.argmax(1)[clear]).all(), what


def _covers(ranges: list, total: int) -> bool:
    return ranges[0][0] == 0 and ranges[-1][1] == total and all(a[1] == b[0] < b[1] for a, b in zip(ranges, ranges[1:]))


@pytest.mark.parametrize("arch,weight_type,split,shards", [
    ("qwen3moe", "Q8_0", "experts", (2, 3, 4, 8)),
    ("qwen3moe", "Q8_0", "columns", (2, 3, 4, 8)),
    ("qwen3moe", "Q4_K_M", "experts", (2,)),
    ("qwen3moe", "Q4_K_M", "columns", (2,)),
    ("qwen3", "Q8_0", None, (2, 3, 4, 8)),
    ("qwen3", "Q4_K_M", None, (2,)),
])
def test_qwen3_and_qwen3moe_shards_within_cpu_noise(tmp_path, monkeypatch, arch: str, weight_type: str, split, shards) -> None:  # type: ignore[no-untyped-def]
    """qwen3's per-head Q/K RMSNorm runs on each shard's own heads (one [head_dim] weight for every
    head). qwen3moe's experts are divided (FAK_TP_MOE): by expert (the default), each shard holds
    32/N experts whole and computes the chosen pairs among them; by column, each shard holds the same
    n_ff_exp columns of every expert (rows of each ffn_gate_exps / ffn_up_exps matrix, K of each
    ffn_down_exps row). Either way it routes with the whole replicated router and all-reduces its
    partial weighted sum. In Q4_K_M attn_output's K is 2 blocks of 256 (and the experts' down K
    too), so 2 shards; in Q8_0 up to 8."""
    if split:
        monkeypatch.setenv("FAK_TP_MOE", split)
    p = _tiny_qwen3(tmp_path, arch, weight_type)
    toks = list(range(5, 69))
    ref = _model(p, 1, n_ctx=128).logits(toks)
    n_ff = 512 if arch == "qwen3moe" else 1024
    for n in shards:
        m = _model(p, n, n_ctx=128)
        plan = m.shard_plan
        if split == "experts":
            assert all(s["ffn"] == (0, n_ff) for s in plan) and _covers([s["experts"] for s in plan], 32), plan
        else:
            assert _covers([s["ffn"] for s in plan], n_ff) and all(s["experts"] is None for s in plan), plan
        _within_tiny_noise(ref, m.logits(toks), f"{arch} {weight_type} {split} N={n}")


@pytest.mark.parametrize("arch,split", [("qwen3moe", "experts"), ("qwen3moe", "columns"), ("qwen3", None)])
def test_tiny_qwen3_greedy_batched_decode_equals_one_shard(tmp_path, monkeypatch, arch: str, split) -> None:  # type: ignore[no-untyped-def]
    """Three sequences decoded together (prefill, then one row each per step: the MoE layers route
    one row at a time) give one shard's greedy tokens at N = 2, 4 and 8. As on the real models, a
    sequence may leave the reference only at a near tie (one shard's top two within 2 x
    TINY_MAX_ABS; the rest of it is then not compared): qwen3moe's tokens are all identical here,
    qwen3's third sequence leaves at token 21 at N = 2 (its top two 8e-5 apart)."""
    if split:
        monkeypatch.setenv("FAK_TP_MOE", split)
    p = _tiny_qwen3(tmp_path, arch)
    prompts = [list(range(5, 30)), list(range(40, 47)), [7, 300, 9, 200, 11, 100]]
    ref = _decode(_model(p, 1, n_ctx=128), prompts, 32, 2)
    for n in (2, 4, 8):
        got = _decode(_model(p, n, n_ctx=128), prompts, 32, 0)
        compared = 0
        for i, want in ref.items():
            toks = [t for t, _ in got[i]]
            for j, (w, top) in enumerate(want):
                if toks[j] != w:
                    margin = top[0][1] - top[1][1]
                    assert margin < 2 * TINY_MAX_ABS, f"{arch} N={n} seq {i} token {j}: {toks[j]} != {w} (margin {margin:.4f})"
                    break
                compared += 1
        assert compared >= 80, (arch, n, compared)
        if arch == "qwen3moe":
            assert got == {i: [(t, None) for t, _ in want] for i, want in ref.items()}, n


@pytest.mark.parametrize("split", ["experts", "columns"])
def test_qwen3moe_router_ties_pick_the_same_experts_on_every_shard(tmp_path, monkeypatch, split: str) -> None:  # type: ignore[no-untyped-def]
    """Router rows tied in pairs (exact ties: equal logits whatever the input): every shard breaks
    them as one shard does (the same std::sort over the same bits), so the logits stay within the
    noise at every position and the greedy tokens are one shard's."""
    monkeypatch.setenv("FAK_TP_MOE", split)
    p = _tiny_qwen3(tmp_path, "qwen3moe", router_ties=2)
    toks = list(range(5, 69))
    ref = _model(p, 1, n_ctx=128).logits(toks)
    for n in (2, 4):
        _within_tiny_noise(ref, _model(p, n, n_ctx=128).logits(toks), f"ties N={n}")
    want = _decode(_model(p, 1, n_ctx=128), [toks[:10]], 16, 0)
    assert _decode(_model(p, 2, n_ctx=128), [toks[:10]], 16, 0) == want


def test_moe_split_limits_and_the_switch(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The experts' K (n_ff_exp 256) is one Q4_K block of ffn_down_exps: by column there is no 2-way
    cut, named as such (attn_output in Q8_0, so the heads would split); by expert (the default) its 8
    experts go 4 + 4 (and 5 experts cannot make 8 shards). FAK_TP_MOE takes experts or columns only."""
    q8_wo = {f"blk.{i}.attn_output.weight": "Q8_0" for i in range(2)}
    p = write_tiny_model(tmp_path / "moe_q4k.gguf", "qwen3moe", n_layer=2, n_embd=256, n_head=8, n_head_kv=2,
                         head_dim=64, n_expert=8, n_expert_used=2, n_ff_exp=256, weight_type="Q4_K",
                         tensor_types=q8_wo)
    ref = _model(p, 1, n_ctx=64).logits([1, 2, 3])
    m = _model(p, 2, n_ctx=64)
    assert [s["experts"] for s in m.shard_plan] == [(0, 4), (4, 8)]
    _within_tiny_noise(ref, m.logits([1, 2, 3]), "8 experts over 2 shards")
    monkeypatch.setenv("FAK_TP_MOE", "columns")
    with pytest.raises(fak.ShardError) as e:
        _model(p, 2, n_ctx=64)
    msg = str(e.value)
    assert "blk.0.ffn_down_exps.weight" in msg and "Q4_K" in msg and "n_ff_exp 256" in msg, msg
    monkeypatch.setenv("FAK_TP_MOE", "rows")
    with pytest.raises(ValueError, match="FAK_TP_MOE"):
        _model(p, 2, n_ctx=64)
    monkeypatch.delenv("FAK_TP_MOE")
    p5 = write_tiny_model(tmp_path / "moe5.gguf", "qwen3moe", n_layer=1, n_embd=256, n_head=8, n_head_kv=8, head_dim=32,
                          n_expert=5, n_expert_used=2, n_ff_exp=64)
    with pytest.raises(fak.ShardError, match="5 experts per layer"):
        _model(p5, 8, n_ctx=64)
    assert [s["experts"] for s in _model(p5, 5, n_ctx=64).shard_plan] == [(i, i + 1) for i in range(5)]


def test_engine_tensor_parallel_chats_on_the_tiny_qwen3moe(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """fak.Engine with tensor_parallel=2 on a MoE model (its experts divided, the default): the chat
    template, the tokenizer and the sharded engine core give one shard's greedy text."""
    p = _tiny_qwen3(tmp_path, "qwen3moe")
    msgs = [{"role": "user", "content": "Write a function that adds two numbers."}]
    with Engine(p, backend="cpu", n_ctx=256, threads=2) as e1, \
            Engine(p, backend="cpu", n_ctx=256, threads=2, tensor_parallel=2) as e2:
        a = e1.chat(msgs, temperature=0, max_tokens=24)
        b = e2.chat(msgs, temperature=0, max_tokens=24)
    assert a.token_ids == b.token_ids and a.text == b.text


def test_sharded_sliding_window_stream_equals_one_shard(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Tensor parallelism and a sliding window together: each shard's attention reads only the
    window and the one logical block table releases the blocks before it, so a stream 20x the
    window decodes on 2 shards as on one (greedy tokens; the tiny model's shards sum exactly
    enough for that), in a KV pool far smaller than the stream."""
    p = write_tiny_model(tmp_path / "swa.gguf", "qwen2", n_layer=2, n_embd=256, n_head=8, n_head_kv=4,
                         n_ff=768, weight_type="Q8_0", sliding_window=32)
    runs = []
    for n in (1, 2):
        m = _model(p, n, n_ctx=1024, kv_cache_tokens=256, max_tokens_per_step=64)
        assert m.config["kv_window"] == 32
        m.add_sequence(1, list(range(5, 105)), {"temperature": 0.0, "max_tokens": 540})
        toks, peak = [], 0
        while True:
            out = m.step()
            peak = max(peak, m.kv_blocks_total - m.kv_blocks_free)
            toks += [t for (_, t, _, _, fin) in out]
            if any(fin for *_, fin in out):
                break
        assert len(toks) == 540 and peak <= 5, (n, len(toks), peak)  # 640 positions, 20 windows
        runs.append(toks)
    assert runs[0] == runs[1]


def test_k_quant_that_cannot_be_cut_on_its_blocks_is_a_shard_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A k-quant attn_output with K = 256 (4 heads of 64) is one block per row: no 2-way cut. With
    attn_output in Q8_0 (32-element blocks) the heads split, but ffn_down (Q4_K, n_ff 512 = 2 blocks)
    cannot make 4 shards; 2 shards load and run."""
    p = write_tiny_model(tmp_path / "q4k.gguf", "qwen2", n_layer=2, n_embd=256, n_head=4, n_head_kv=2,
                         n_ff=512, weight_type="Q4_K")
    with pytest.raises(fak.ShardError) as e:
        _model(p, 2, n_ctx=64)
    msg = str(e.value)
    assert "blk.0.attn_output.weight" in msg and "Q4_K" in msg and "2 tensor-parallel shards" in msg, msg
    assert isinstance(e.value, fak.UnsupportedError)
    q8_wo = {f"blk.{i}.attn_output.weight": "Q8_0" for i in range(2)}
    p2 = write_tiny_model(tmp_path / "q4k_down.gguf", "qwen2", n_layer=2, n_embd=256, n_head=4, n_head_kv=2,
                          n_ff=512, weight_type="Q4_K", tensor_types=q8_wo)
    with pytest.raises(fak.ShardError) as e:
        _model(p2, 4, n_ctx=64)
    msg = str(e.value)
    assert "ffn_down.weight" in msg and "Q4_K" in msg and "4 tensor-parallel shards" in msg, msg
    m = _model(p2, 2, n_ctx=64)
    assert [s["ffn"] for s in m.shard_plan] == [(0, 256), (256, 512)]
    assert np.isfinite(m.logits([1, 2, 3])).all()


def test_more_shards_than_query_heads_and_zero_shards(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = write_tiny_model(tmp_path / "t.gguf", "qwen2", n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128)
    with pytest.raises(fak.ShardError, match="4 query heads"):
        _model(p, 5, n_ctx=64)
    with pytest.raises(ValueError, match="tensor_parallel"):
        _model(p, 0, n_ctx=64)


def test_cuda_with_tensor_parallel_fails_loudly(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Multi-GPU is not built: ``backend="cuda"`` with N > 1 raises (never a silent CPU fallback),
    whether or not this machine has a GPU; ``fak serve`` refuses the flags before loading."""
    p = write_tiny_model(tmp_path / "t.gguf", "qwen2", n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128)
    with pytest.raises(fak.BackendError, match="cuda"):
        _native.EngineCore(str(p), backend="cuda", n_ctx=64, tensor_parallel=2)
    r = CliRunner().invoke(main, ["serve", "--gguf", str(p), "--backend", "cuda", "--tensor-parallel", "2"])
    assert r.exit_code == 2 and "multi-GPU tensor parallelism" in r.output and "not built" in r.output, r.output
    r = CliRunner().invoke(main, ["serve", "--help"])
    assert "--tensor-parallel" in r.output


def test_serve_loads_the_sharded_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fak.gateway.cli import _load_engine

    p = write_tiny_model(tmp_path / "t.gguf", "qwen2", n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128)
    engine = _load_engine(p, "cpu", 128, 2, max_batch=2, kv_cache_tokens=None, tensor_parallel=2)
    try:
        assert engine._loop.model.config["tensor_parallel"] == 2
        assert engine.generate("hello", temperature=0, max_tokens=3).usage.completion_tokens >= 1
    finally:
        engine.close()


# The layout of `nvidia-smi topo -m` (tab-separated; GPU columns first, then NICs and affinities;
# legend below), written for this test with two GPUs on 18 NVLinks and a third behind the host
# bridge. Not captured from a machine: no multi-GPU machine was available.
TOPO = (
    "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tPHB\tPXB\t0-31\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tSYS\t0-31\t0\t\tN/A\n"
    "GPU2\tPHB\tSYS\t X \tNODE\t32-63\t1\t\tN/A\n"
    "NIC0\tPXB\tSYS\tNODE\t X \n"
    "\n"
    "Legend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


def test_doctor_reads_the_gpu_links_of_nvidia_smi_topo() -> None:
    from fak.doctor import describe_link, parse_topo_matrix

    links = parse_topo_matrix(TOPO)
    assert links == {(0, 1): "NV18", (0, 2): "PHB", (1, 0): "NV18", (1, 2): "SYS", (2, 0): "PHB", (2, 1): "SYS"}
    assert describe_link("NV18") == "NVLink x18" and describe_link("PHB") == "PCIe host bridge"
    # pasted with spaces instead of tabs, the GPU cells still parse
    assert parse_topo_matrix(TOPO.replace("\t", "   ")) == links
    assert parse_topo_matrix("No devices were found\n") == {}


def test_doctor_lists_the_gpus_or_says_there_are_none() -> None:
    from fak.doctor import gpu_report

    g = gpu_report()
    assert g["available"] == bool(g["devices"])
    if not g["devices"]:
        assert g["reason"] and g["links"] == []
        r = CliRunner().invoke(main, ["doctor", "--no-kernels"])
        assert r.exit_code == 0 and "GPUs: none found" in r.output, r.output
    else:
        n = len(g["devices"])
        assert len(g["links"]) == n * (n - 1) // 2
