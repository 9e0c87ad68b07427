"""Sliding-window attention (issue 14; docs/long-context.md, "Sliding-window attention") on the CPU
backend: the window read from GGUF metadata (``{arch}.attention.sliding_window`` and
``.sliding_window_pattern``, llama.cpp's keys) or set by the caller, attention over the last ``W``
positions, and KV blocks outside the window returned to the pool.

- unset: the logits of a model that declares no window are today's, bit for bit (digests of the
  build before sliding windows, ``tests/data/sliding-window-unset.json``);
- correct: logits of windowed models against the float64 reference of
  ``test_forward_reference.py`` with the window mask (``0 <= i − j < W``), per-layer patterns
  included; the op itself against a brute-force mask in ``tests/cuda/test_ops.py`` (CPU half runs
  here) and ``cargo test`` (``backend::cpu::attention``);
- consistent: one long prefill vs prefill + decode, chunk sizes, alone vs batched, prefix cache on
  vs off, blocks released vs kept — exact where the engine promises bits;
- bounded: a stream 100× the window through a KV pool far smaller than the stream, blocks in use
  checked after every step and at the forward's high-water mark.

To add a case: build a model with ``fak.synth.write_tiny_model(..., sliding_window=W,
sliding_window_pattern=...)`` and compare two ``_native.EngineCore`` runs with ``_run``.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fak import _native
from fak.synth import write_tiny_model
from test_forward_reference import reference_logits

BLOCK = 32
THREADS = 2
REPO = Path(__file__).resolve().parents[1]
DIGESTS = REPO / "tests" / "data" / "sliding-window-unset.json"
SAMPLING = {"temperature": 0.0, "n_logprobs": 3}

#: name → write_tiny_model arguments of a windowed tiny model.
WINDOWED = {
    # every layer windowed, W one block: KV memory bounded by the window
    "qwen2-w32": dict(arch="qwen2", n_layer=2, sliding_window=32),
    # every layer windowed, W not a multiple of the block size, MHA-ish GQA, 3 layers
    "llama-w45": dict(arch="llama", n_layer=3, n_head=4, n_head_kv=4, sliding_window=45),
}


def _write(tmp: Path, name: str, **kw) -> Path:
    kw = dict(kw)
    arch = kw.pop("arch")
    return write_tiny_model(tmp / f"{name}.gguf", arch, n_embd=64, n_ff=128, seed=11, **kw)


@pytest.fixture(scope="module", params=list(WINDOWED))
def windowed(request, tmp_path_factory) -> tuple[str, Path, int]:
    """``(name, path, W)`` of a tiny model whose every layer is windowed."""
    kw = WINDOWED[request.param]
    return request.param, _write(tmp_path_factory.mktemp("swa"), request.param, **kw), kw["sliding_window"]


def _tokens(n: int, seed: int, n_vocab: int = 700) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, n_vocab, size=n)]


Step = tuple[int, float, tuple[tuple[int, float], ...]]


def _run(model, prompts: dict[int, list[int]], n_new: int, arrivals: dict[int, int] | None = None,
         watch=None) -> dict[int, list[Step]]:
    """Steps ``model`` until each sequence has ``n_new`` tokens (then removes it); returns every
    sequence's ``(token, logprob, top_logprobs)``. ``arrivals[id]``: the step it joins;
    ``watch(model)`` runs after every step."""
    arrivals = arrivals or {}
    out: dict[int, list[Step]] = {}
    step = 0
    while len(out) < len(prompts) or any(len(v) < n_new for v in out.values()):
        for sid, p in prompts.items():
            if arrivals.get(sid, 0) == step:
                model.add_sequence(sid, p, dict(SAMPLING))
                out[sid] = []
        for sid, tok, lp, top, _fin in model.step():
            out[sid].append((tok, lp, tuple(top or ())))
            if len(out[sid]) == n_new:
                model.remove_sequence(sid)
        if watch is not None:
            watch(model)
        step += 1
        assert step < 50_000
    return out


def _ids(steps: list[Step]) -> list[int]:
    return [t for t, _, _ in steps]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


# ------------------------------------------------------------------------------ configuration


def test_metadata_keys_and_config(tmp_path) -> None:
    """The synthetic writer's keys are llama.cpp's (gguf-py's ``add_sliding_window`` /
    ``add_sliding_window_pattern`` types), and the model reads them per layer."""
    from fak.gguf import GGUFFile

    cases = [
        # (pattern written, windowed layers of 4)
        (None, [0, 1, 2, 3]),
        ([True, False, False, True], [0, 3]),
        (2, [0, 2]),      # llama.cpp set_swa_pattern(2): il % 2 < 1 (gemma2)
        (4, [0, 1, 2]),   # il % 4 < 3 (cohere2): the last layer of each period is full
        (0, [0, 1, 2, 3]),
    ]
    for i, (pattern, want) in enumerate(cases):
        path = write_tiny_model(tmp_path / f"p{i}.gguf", "qwen2", n_layer=4, sliding_window=24,
                                sliding_window_pattern=pattern, seed=1)
        with GGUFFile(path) as f:
            meta, types = f.metadata, f.metadata_types
        assert (meta["qwen2.attention.sliding_window"], types["qwen2.attention.sliding_window"]) == (24, "UINT32")
        if pattern is None:
            assert "qwen2.attention.sliding_window_pattern" not in meta
        else:
            key = "qwen2.attention.sliding_window_pattern"
            assert types[key] == ("UINT32" if isinstance(pattern, int) else "ARRAY[BOOL]")
            assert meta[key] == pattern
        cfg = _native.EngineCore(str(path), n_ctx=256, threads=1).config
        assert (cfg["sliding_window"], cfg["swa_layers"]) == (24, want), pattern
        assert cfg["kv_window"] == (24 if want == [0, 1, 2, 3] else 0)
    plain = _native.EngineCore(str(write_tiny_model(tmp_path / "plain.gguf", "qwen2", seed=1)), n_ctx=256, threads=1)
    assert (plain.config["sliding_window"], plain.config["swa_layers"], plain.config["kv_window"]) == (0, [], 0)
    with pytest.raises(ValueError, match="sliding_window_pattern has 3 entries for 4 layers"):
        write_tiny_model(tmp_path / "bad.gguf", "qwen2", n_layer=4, sliding_window=8, sliding_window_pattern=[True] * 3)


def test_override_flows_from_engine_and_cli(tmp_path) -> None:
    """``EngineCore(sliding_window=)``, ``fak.Engine(sliding_window=)``, ``fak serve`` / ``generate`` /
    ``chat --sliding-window`` and ``fak synth --sliding-window`` reach the model."""
    from click.testing import CliRunner

    from fak.cli_generate import chat, generate
    from fak.engine import Engine
    from fak.gateway.cli import _load_engine, serve
    from fak.synth.cli import synth_command

    out = tmp_path / "cli.gguf"
    r = CliRunner().invoke(synth_command, [str(out), "--tiny", "llama", "--n-layer", "3", "--sliding-window", "40",
                                           "--sliding-window-pattern", "1,0,1"])
    assert r.exit_code == 0, r.output
    m = _native.EngineCore(str(out), n_ctx=256, threads=1)
    assert (m.config["n_layer"], m.config["sliding_window"], m.config["swa_layers"], m.config["kv_window"]) == (3, 40, [0, 2], 0)
    r = CliRunner().invoke(synth_command, [str(tmp_path / "p.gguf"), "--tiny", "qwen2", "--sliding-window", "8",
                                           "--sliding-window-pattern", "2"])
    assert r.exit_code == 0 and _native.EngineCore(str(tmp_path / "p.gguf"), threads=1).config["swa_layers"] == [0]
    r = CliRunner().invoke(synth_command, [str(tmp_path / "x.gguf"), "--preset", "qwen2.5-7b-q4_k_m", "--sliding-window", "8"])
    assert r.exit_code != 0 and "apply to --tiny" in r.output

    plain = write_tiny_model(tmp_path / "plain.gguf", "qwen2", seed=2)
    m = _native.EngineCore(str(plain), n_ctx=256, threads=1, sliding_window=16)
    assert (m.config["sliding_window"], m.config["swa_layers"], m.config["kv_window"]) == (16, [0, 1], 16)
    m = _native.EngineCore(str(out), n_ctx=256, threads=1, sliding_window=0)
    assert (m.config["sliding_window"], m.config["swa_layers"]) == (0, [])
    m = _native.EngineCore(str(plain), n_ctx=256, threads=1, sliding_window=16, free_window_blocks=False)
    assert m.config["kv_window"] == 0
    with Engine(plain, backend="cpu", n_ctx=256, sliding_window=24) as e:
        assert e._loop.model.config["sliding_window"] == 24
        assert e.generate("hello", max_tokens=3, temperature=0.0).usage.completion_tokens >= 1
    e = _load_engine(plain, "cpu", 256, None, 1, None, sliding_window=12)
    try:
        assert e._loop.model.config["sliding_window"] == 12
    finally:
        e.close()
    for cmd in (serve, generate, chat):
        assert "--sliding-window" in CliRunner().invoke(cmd, ["--help"]).output


def test_kv_cache_only_needs_the_window(tmp_path) -> None:
    """With every layer windowed the KV cache only has to hold one sequence's windows: the
    default size follows, ``n_ctx`` may exceed it, and a cache below one window is refused."""
    plain = write_tiny_model(tmp_path / "plain.gguf", "qwen2", seed=2)
    full = _native.EngineCore(str(plain), n_ctx=8192, threads=1, max_batch=4)
    assert full.kv_blocks_total == 8192 * 4 // BLOCK
    win = _native.EngineCore(str(plain), n_ctx=8192, threads=1, max_batch=4, sliding_window=32, max_tokens_per_step=64)
    # ⌈(32 − 1 + 64)/32⌉ + 1 = 4 blocks per sequence, times min(max_batch, 8).
    assert win.kv_blocks_total == 4 * 4
    _native.EngineCore(str(plain), n_ctx=8192, threads=1, sliding_window=32, max_tokens_per_step=64, kv_cache_tokens=128)
    with pytest.raises(ValueError, match="sliding window of 32"):
        _native.EngineCore(str(plain), n_ctx=8192, threads=1, sliding_window=32, max_tokens_per_step=64, kv_cache_tokens=96)
    with pytest.raises(ValueError, match="n_ctx"):
        _native.EngineCore(str(plain), n_ctx=8192, threads=1, kv_cache_tokens=4096)


# ------------------------------------------------------------------------------ unset = today


def _digest_script():
    spec = importlib.util.spec_from_file_location("sliding_window_digests", REPO / "scripts" / "sliding_window_digests.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["tiny", "real-0.5b"])
def test_unset_is_bit_identical_to_before(real: bool, request, tmp_path) -> None:
    """A model that declares no window gives the logits (every position) and the greedy steps
    (tokens, logprobs, top logprobs) of the build before sliding windows (commit a3de7c2), bit for
    bit. The digests were written by ``scripts/sliding_window_digests.py`` with that build, for
    each matmul SIMD level this x86 machine runs (``FAK_CPU_SIMD``); the test checks the level it
    runs at."""
    script = _digest_script()
    recorded = json.loads(DIGESTS.read_text())
    level = _native.simd_level()
    assert level in recorded["levels"], f"no digests for SIMD level {level}: re-run scripts/sliding_window_digests.py"
    cases = script.cases(tmp_path, request.getfixturevalue("model_05b") if real else None)
    assert script.file_digest(cases[script.TINY][0]) == recorded["tiny_file_sha256"], "fak.synth wrote another tiny model"
    name = script.REAL if real else script.TINY
    got = script.digests({name: cases[name]}, threads=THREADS)[name]
    assert got == recorded["levels"][level][name], (level, name)


def test_window_past_the_context_changes_nothing(tmp_path) -> None:
    """A declared window at least as long as the sequence, and a window turned off by the caller,
    give the unwindowed bits."""
    plain = write_tiny_model(tmp_path / "a.gguf", "qwen2", n_embd=64, seed=4)
    wide = write_tiny_model(tmp_path / "b.gguf", "qwen2", n_embd=64, seed=4, sliding_window=300)
    narrow = write_tiny_model(tmp_path / "c.gguf", "qwen2", n_embd=64, seed=4, sliding_window=20)
    toks = _tokens(300, 3)
    ref = _native.EngineCore(str(plain), n_ctx=512, threads=THREADS).logits(toks)
    assert np.array_equal(_native.EngineCore(str(wide), n_ctx=512, threads=THREADS).logits(toks), ref)
    assert np.array_equal(_native.EngineCore(str(narrow), n_ctx=512, threads=THREADS, sliding_window=0).logits(toks), ref)
    windowed = _native.EngineCore(str(narrow), n_ctx=512, threads=THREADS).logits(toks)
    assert np.array_equal(windowed[:20], ref[:20]), "positions < W see their whole context"
    assert not np.array_equal(windowed[20:], ref[20:])


# ------------------------------------------------------------------------------ correctness


@pytest.mark.parametrize("pattern,window", [(None, 20), ([True, False, True], 20), (3, 37), (None, 1)],
                         ids=["all-20", "layers-0-2", "period-3", "all-1"])
def test_logits_match_float64_reference_with_the_mask(tmp_path, pattern, window) -> None:
    """The whole forward pass of a windowed model against the float64 reference with the window
    mask on the windowed layers (positions below and above W, 150 tokens in 3 chunks), closer to it
    than the unwindowed reference is."""
    path = write_tiny_model(tmp_path / "m.gguf", "llama", n_layer=3, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                            sliding_window=window, sliding_window_pattern=pattern, seed=9)
    toks = _tokens(150, 12)
    got = _native.EngineCore(str(path), n_ctx=512, threads=THREADS).logits(toks).astype(np.float64)
    want = reference_logits(path, toks)
    full = reference_logits(path, toks, sliding_window=0)
    cos, cos_full = _cos(got, want), _cos(got, full)
    # The bounds of test_synth_models_match_reference (fak.synth models; 8-bit activations and f16
    # attention roundings on both sides of the windowed/unwindowed comparison below).
    assert cos.min() >= 0.9998, (cos.argmin(), cos.min())
    n = min(window, 150)
    assert np.allclose(want[:n], full[:n], rtol=1e-12, atol=1e-12), "below W the window changes nothing"
    # Past W the window matters, and fak follows it.
    assert (1 - cos[n:]).mean() < 0.1 * (1 - cos_full[n:]).mean(), ((1 - cos[n:]).mean(), (1 - cos_full[n:]).mean())
    print(f"\n{pattern} W={window}: 1 - cos vs windowed reference max {1 - cos.min():.2e}, "
          f"vs unwindowed past W mean {(1 - cos_full[n:]).mean():.2e}")
    want_q = reference_logits(path, toks, llama_rounding=True)
    assert _cos(got, want_q).min() >= 0.9998


# ------------------------------------------------------------------------------ engine consistency


def test_one_prefill_equals_prefill_and_decode(windowed) -> None:
    """Greedy tokens of prefill + decode (``step()``) equal the argmax of one long prefill
    (``logits()``) over the growing sequence, and the logits rows agree (decode and prefill rows
    sum in llama.cpp's two orders, so only near ties may differ)."""
    _, path, w = windowed
    model = _native.EngineCore(str(path), n_ctx=1024, threads=THREADS)
    prompt = _tokens(3 * w + 5, 21)
    n_new = 2 * w + 7
    model.add_sequence(1, prompt, dict(SAMPLING))
    toks, rows = [], []
    while len(toks) < n_new:
        for sid, tok, _lp, _top, _ in model.step():
            toks.append(tok)
            rows.append(model.last_logits(sid))
    model.remove_sequence(1)
    full = model.logits(prompt + toks[:-1])[len(prompt) - 1:]
    cos = _cos(np.array(rows, np.float64), full.astype(np.float64))
    assert cos.min() >= 0.9999, (cos.argmin(), cos.min())
    for i, (t, row) in enumerate(zip(toks, full)):
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > 1e-3:
            assert t == int(row.argmax()), i
    assert np.array_equal(rows[0], model.logits(prompt)[-1]), "the step's prefill row is logits()'s"
    print(f"\n{windowed[0]}: decode vs one prefill, 1 - cosine max {1 - cos.min():.2e}")


def test_chunking_and_batching_are_bit_identical(windowed) -> None:
    """Chunked prefill (64 vs 512 rows per forward), alone vs batched with sequences of other
    lengths (shorter and longer than W, staggered so prefills join running decodes): the same
    bits."""
    _, path, w = windowed
    prompts = {i: _tokens(n, 30 + i) for i, n in enumerate([5, w - 1, w, w + 1, 3 * w + 17, 600])}
    n_new = w + 9
    big = _native.EngineCore(str(path), n_ctx=1024, threads=THREADS, max_batch=8)
    small = _native.EngineCore(str(path), n_ctx=1024, threads=THREADS, max_batch=8, max_tokens_per_step=64,
                          kv_cache_tokens=4096)
    alone = {sid: _run(big, {sid: p}, n_new)[sid] for sid, p in prompts.items()}
    assert big.kv_blocks_free == big.kv_blocks_total
    assert _run(small, {5: prompts[5]}, n_new)[5] == alone[5], "600-token prompt in 10 chunks vs 2"
    assert _run(big, prompts, n_new) == alone
    staggered = _run(small, prompts, n_new, arrivals={0: 0, 1: 3, 2: 0, 3: 7, 4: 2, 5: 1})
    assert staggered == alone
    assert small.kv_blocks_free == small.kv_blocks_total


# ------------------------------------------------------------------------------ memory


def test_stream_100x_the_window_runs_in_bounded_memory(tmp_path) -> None:
    """W = 32 and a stream of 3,232 tokens (101 × W: a 1,600-token prompt in 64-token chunks, then
    1,632 decode steps) through a KV pool of 8 blocks (256 tokens): blocks in use stay within the
    bound after every step (≤ 2 while decoding, one window) and at every forward's high-water mark
    (≤ ⌈(W − 1 + 64)/32⌉ + 1 = 4 while prefilling), and the outputs equal a run that keeps every
    block (101 of them)."""
    w = 32
    path = _write(tmp_path, "stream", arch="qwen2", n_layer=2, sliding_window=w)
    prompt = _tokens(1600, 77)
    n_new = 1632
    common = dict(n_ctx=4096, threads=THREADS, max_tokens_per_step=64, prefix_cache=False)
    bounded = _native.EngineCore(str(path), kv_cache_tokens=8 * BLOCK, **common)
    keeping = _native.EngineCore(str(path), kv_cache_tokens=4096, free_window_blocks=False, **common)
    assert (bounded.config["kv_window"], keeping.config["kv_window"]) == (w, 0)
    used: list[int] = []
    got = _run(bounded, {1: prompt}, n_new, watch=lambda m: used.append(m.kv_blocks_total - m.kv_blocks_free))
    peak = bounded.stats()["kv_blocks_peak"]
    want = _run(keeping, {1: prompt}, n_new)
    assert got == want
    assert len(prompt) + n_new >= 100 * w
    n_prefill = math.ceil(len(prompt) / 64)
    assert max(used[:n_prefill]) <= 3 and max(used[n_prefill:-1]) <= 2, (max(used[:n_prefill]), max(used[n_prefill:-1]))
    assert used[-1] == 0, "the finished sequence released everything"
    assert peak <= 4, peak
    assert keeping.stats()["kv_blocks_peak"] == math.ceil((len(prompt) + n_new - 1) / BLOCK)
    s = bounded.stats()
    assert s["preemptions"] == 0 and s["prefill_tokens"] == len(prompt)
    print(f"\nstream of {len(prompt) + n_new} tokens, W={w}: peak {peak} blocks in use "
          f"(pool {bounded.kv_blocks_total}); after-step max {max(used[:n_prefill])} (prefill) / "
          f"{max(used[n_prefill:-1])} (decode); the run keeping every block peaked at "
          f"{keeping.stats()['kv_blocks_peak']}")


def test_long_logits_through_a_small_pool(windowed) -> None:
    """``logits()`` of a list many windows long through a pool that holds a few windows, equal to
    the same model keeping every block."""
    _, path, w = windowed
    toks = _tokens(20 * w, 5)
    small = _native.EngineCore(str(path), n_ctx=4096, threads=THREADS, max_tokens_per_step=64,
                          kv_cache_tokens=(math.ceil((w + 63) / BLOCK) + 1) * BLOCK)
    keep = _native.EngineCore(str(path), n_ctx=4096, threads=THREADS, free_window_blocks=False)
    assert small.kv_blocks_total < len(toks) // BLOCK
    assert np.array_equal(small.logits(toks), keep.logits(toks))
    assert small.kv_blocks_free == small.kv_blocks_total


def test_mixed_layers_window_attention_but_keep_blocks(tmp_path) -> None:
    """With a full-attention layer the window applies in the windowed layers' attention only: every
    block is kept (that layer reads them), the outputs differ from the unwindowed model's."""
    path = write_tiny_model(tmp_path / "mixed.gguf", "llama", n_layer=3, n_embd=64, n_ff=128,
                            sliding_window=16, sliding_window_pattern=[True, False, True], seed=2)
    m = _native.EngineCore(str(path), n_ctx=1024, threads=THREADS)
    assert (m.config["swa_layers"], m.config["kv_window"]) == ([0, 2], 0)
    used: list[int] = []
    got = _run(m, {1: _tokens(100, 1)}, 100, watch=lambda mm: used.append(mm.kv_blocks_total - mm.kv_blocks_free))
    assert max(used) == math.ceil(199 / BLOCK)
    off = _native.EngineCore(str(path), n_ctx=1024, threads=THREADS, sliding_window=0)
    assert _run(off, {1: _tokens(100, 1)}, 100) != got


# ------------------------------------------------------------------------------ prefix cache


def test_prefix_cache_shares_a_windowed_prefix(windowed) -> None:
    """Sequences sharing a prefix of a windowed sequence, with the cache on: bit-identical to the
    cache off (a fresh prefill). A hit needs only the blocks the window of its first computed
    position reads (vLLM's sliding-window hit): the conversation continued right after the stream
    finds its last window even in a pool that has long evicted (overwritten) the stream's first
    blocks; with a pool large enough to keep everything, every shared full block is found."""
    _, path, w = windowed
    first = _tokens(10 * w, 40)
    common = 7 * w + 3
    shared = first[:common] + _tokens(50, 41)
    for kv_tokens, big in [(4096, True), ((math.ceil((w + 63) / BLOCK) + 1) * BLOCK, False)]:
        kw = dict(n_ctx=2048, threads=THREADS, kv_cache_tokens=kv_tokens, max_tokens_per_step=64)
        on = _native.EngineCore(str(path), prefix_cache=True, **kw)
        off = _native.EngineCore(str(path), prefix_cache=False, **kw)
        runs, hits = [], []
        for model in (on, off):
            out = [_run(model, {1: first}, 12)[1]]
            hits.append(model.stats()["prefix_cache_hit_tokens"])
            # the conversation goes on: the stream's tokens (all but the last have K/V) + a turn
            turn = first + _ids(out[0]) + _tokens(9, 42)
            out.append(_run(model, {6: turn}, 12)[6])
            hits.append(model.stats()["prefix_cache_hit_tokens"])
            out.append(_run(model, {2: shared}, 12)[2])
            hits.append(model.stats()["prefix_cache_hit_tokens"])
            out.append(_run(model, {3: list(first)}, 12)[3])
            hits.append(model.stats()["prefix_cache_hit_tokens"])
            # two at once: the second takes the first's blocks from the cache as they complete
            out.append(_run(model, {4: shared, 5: shared[:-7]}, 12))
            runs.append(out)
        assert runs[0] == runs[1]
        h1, h6, h2, h3 = hits[0], hits[1] - hits[0], hits[2] - hits[1], hits[3] - hits[2]
        assert h1 == 0 and hits[4:] == [0, 0, 0, 0]

        def reused(k: int) -> int:
            """Tokens a hit on the first k blocks takes from the cache: the blocks the window of
            position k·BLOCK reads (the earlier ones are skipped, not reused, and not counted)."""
            return (k - max(0, k * BLOCK + 1 - w) // BLOCK) * BLOCK

        # every full block of the stream's computed tokens (first + 11 generated) is skipped
        assert h6 == reused((len(first) + 11) // BLOCK), h6
        if big:
            # the full blocks of the common prefix; then every full block before the last token
            assert (h2, h3) == (reused(common // BLOCK), reused((len(first) - 1) // BLOCK))
        print(f"\n{windowed[0]} pool {on.kv_blocks_total} blocks: hit tokens continuation {h6}, shared prefix {h2}, "
              f"same prompt {h3}")
        assert on.kv_blocks_free == on.kv_blocks_total
