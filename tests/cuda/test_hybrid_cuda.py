"""The Qwen3.5/3.6 hybrids (``qwen35``, ``qwen35moe``: Gated DeltaNet layers with a recurrent
state per sequence, gated full attention, a sigmoid-gated shared expert) on the CUDA backend
against the CPU reference, on tiny models written by ``fak synth``.

The CPU backend is bit-faithful to llama.cpp (tests/test_parity_llamacpp.py); the CUDA backend
sums in another order (its own dot products, f32 block reductions for the norms) and quantizes
activations as the CPU does, so the logits agree within float noise: cosine ≥ 0.999 per position
and the same argmax on ≥ 90% of them (random tiny models have flat, near-tied logits), and greedy
decode — decode steps captured as CUDA graphs — the same first 8 tokens of 16.

What the engine promises with the recurrent state is checked on CUDA too: a batch decodes as each
sequence alone (each has its own state slot, read from the batch's device arrays inside one
captured graph), graphs on and off give the same tokens, the prefix cache resumes from a state
checkpoint (``copy_state``) as a cold prefill, and ``logits()`` on the side leaves running
sequences alone.

The layer itself is also tested op by op (``OpRunner.delta_net``, f32 weights so that only the
summation order differs): CUDA against the CPU on random inputs and random initial states, a batch
of sequences decoding from a state slot beside a fresh one (n_past == 0: its slot's old contents
must be ignored) and prefills of several rows; and on each backend, one prefill split in two at
any row (the second part from the state the first left) equals the whole.

The models cover both compiled state sizes of interest: 64 (the synth default) and 128 (the
real models' ``ssm.state_size``, two threads per state row), and the synth default head_dim
(2·n_embd/n_head) beside the real models' 256 (``attention.key_length``, the attention kernel that
reads Q from shared memory; RoPE on a quarter of it). To add a case, extend ``MODELS``:
Q4_K_M needs ``n_embd=256, n_ff=512`` to get real k-quant tensors.

The chunked prefill (``gdn_chunk_d<D>``, taken when a sequence of the batch has at least
``FAK_GDN_CHUNK_MIN_ROWS`` rows — unset: off until the kernel has run on a GPU, then 64 is meant to
be the default; the variable is read when a backend is created, so
each test makes its runner or engine with the value it needs): op by op against the CPU, forced on
(1) and off (a huge value), at chunk boundaries and in a batch beside decoding sequences; whole
models against the CPU with it forced on, chunked against per-token on CUDA, and a decoding
sequence batched with a long prefill. Its arithmetic is modelled in numpy by
tests/test_gdn_chunk_model.py (CPU, CI).

The op test runs for ``cpu`` (CI) and ``cuda``; the rest is marked ``cuda`` and skips without a GPU
(a failure under FAK_REQUIRE_CUDA=1). To add an op case, extend ``GDN_CASES`` (``d`` and
``n_v·d_state`` multiples of 32; ``d_state`` one of 16, 32, 64, 128).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from fak import _native

from cuda_util import BACKENDS, rel_err, runner
from engine_util import greedy_run as _run


# ---------------------------------------------------------------- the layer, op by op

# (d, d_conv, d_state, n_k, n_v, seqs: (n_rows, n_past, state slot) each)
GDN_CASES = [
    (64, 4, 16, 2, 4, [(1, 0, 0)]),                      # decode from zeros, the smallest state
    (64, 4, 64, 2, 4, [(1, 5, 1), (1, 9, 0), (1, 3, 2)]),  # a decode batch from stored states
    (128, 4, 128, 2, 4, [(37, 0, 0), (5, 12, 2), (1, 7, 1)]),  # prefill beside decode, D = 128
    (64, 4, 32, 1, 2, [(70, 0, 1)]),                     # one long prefill, one q/k head
    (96, 3, 64, 2, 2, [(3, 0, 2), (2, 4, 0)]),           # three taps
]
N_SLOTS = 3


def _gdn_inputs(case: tuple, seed: int = 0) -> tuple[dict, np.ndarray, np.ndarray]:
    d, dc, ds, nk, nv, seqs = case
    rng = np.random.default_rng([seed, d, dc, ds, nk, nv, len(seqs)])
    cd, vd = (2 * nk + nv) * ds, nv * ds
    n = sum(s[0] for s in seqs)

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32).reshape(-1)

    w = dict(qkv=r(cd, d, scale=d ** -0.5), gate=r(vd, d, scale=d ** -0.5), beta=r(nv, d, scale=d ** -0.5),
             alpha=r(nv, d, scale=d ** -0.5), conv=r(cd, dc, scale=0.5), dt_bias=r(nv),
             a=(-np.exp(rng.standard_normal(nv) * 0.5)).astype(np.float32), norm=(1 + r(ds, scale=0.1)).astype(np.float32),
             out=r(d, vd, scale=vd ** -0.5))
    state_len = (dc - 1) * cd + nv * ds * ds
    return w, r(n, d), r(N_SLOTS, state_len, scale=0.1)


def _gdn(backend: str, case: tuple, w: dict, h: np.ndarray, state0: np.ndarray, seqs: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    d, dc, ds, nk, nv, case_seqs = case
    return runner(backend).delta_net(h, d, dc, ds, nk, nv, 1e-6, w["qkv"], w["gate"], w["beta"], w["alpha"], w["conv"],
                                     w["dt_bias"], w["a"], w["norm"], w["out"], seqs or case_seqs, N_SLOTS, state0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", GDN_CASES, ids=lambda c: f"d{c[0]}-conv{c[1]}-D{c[2]}-k{c[3]}v{c[4]}-{len(c[5])}seq")
def test_delta_net_op(backend: str, case: tuple) -> None:
    w, h, state0 = _gdn_inputs(case)
    y, st = _gdn(backend, case, w, h, state0)
    assert np.isfinite(y).all() and np.isfinite(st).all()
    seqs = case[5]
    used = {slot for _, _, slot in seqs}
    state_len = st.size // N_SLOTS
    for slot in range(N_SLOTS):
        if slot not in used:  # untouched
            assert np.array_equal(st[slot * state_len:(slot + 1) * state_len], state0[slot * state_len:(slot + 1) * state_len])
    if backend == "cuda":
        yc, stc = _gdn("cpu", case, w, h, state0)
        print(f"delta_net {case[:5]}: rel err out {rel_err(y, yc.astype(np.float64)):.2e}, state {rel_err(st, stc.astype(np.float64)):.2e}")
        assert rel_err(y, yc.astype(np.float64)) <= 1e-4
        assert rel_err(st, stc.astype(np.float64)) <= 1e-4
    # A prefill split in two (the second part from the state the first left) equals the whole.
    rows, n_past, slot = seqs[0]
    if rows >= 2:
        cut = rows // 3 + 1
        d = case[0]
        y1, s1 = _gdn(backend, case, w, h[:cut * d], state0, [(cut, n_past, slot)])
        y2, s2 = _gdn(backend, case, w, h[cut * d:rows * d], s1, [(rows - cut, n_past + cut, slot)])
        whole, sw = _gdn(backend, case, w, h[:rows * d], state0, [(rows, n_past, slot)])
        assert rel_err(np.concatenate([y1, y2]), whole.astype(np.float64)) <= 1e-5
        assert rel_err(s2, sw.astype(np.float64)) <= 1e-5


# The chunked prefill, op by op: (d, d_conv, d_state, n_k, n_v, seqs) as GDN_CASES.
GDN_CHUNK_CASES = [
    (64, 4, 16, 2, 4, [(200, 0, 0)]),                         # D = 16, four chunks and a part
    (64, 4, 32, 1, 2, [(63, 0, 1), (64, 5, 0), (65, 9, 2)]),  # around one chunk, from stored states
    (64, 4, 64, 2, 4, [(1, 3, 2), (130, 0, 0), (1, 8, 1)]),   # decoding beside a prefill
    (128, 4, 128, 2, 4, [(300, 0, 1), (1, 12, 2)]),           # the real state size
    (128, 4, 128, 4, 8, [(70, 40, 0)]),                       # GQA 2:1, a prefill from a state
    (96, 3, 64, 2, 2, [(1, 0, 2), (2, 4, 0)]),               # few rows, three taps
]
_CHUNK_RUNNERS: dict[str, _native.OpRunner] = {}


def _chunk_runner(min_rows: str) -> _native.OpRunner:
    """A CUDA runner whose backend was created under ``FAK_GDN_CHUNK_MIN_ROWS=min_rows``."""
    runner("cuda")  # skips without a GPU
    if min_rows not in _CHUNK_RUNNERS:
        _CHUNK_RUNNERS[min_rows] = _with_env("FAK_GDN_CHUNK_MIN_ROWS", min_rows, lambda: _native.OpRunner("cuda"))
    return _CHUNK_RUNNERS[min_rows]


def _gdn_on(r: _native.OpRunner, case: tuple, w: dict, h: np.ndarray, state0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, dc, ds, nk, nv, seqs = case
    return r.delta_net(h, d, dc, ds, nk, nv, 1e-6, w["qkv"], w["gate"], w["beta"], w["alpha"], w["conv"],
                       w["dt_bias"], w["a"], w["norm"], w["out"], seqs, N_SLOTS, state0)


@pytest.mark.cuda
@pytest.mark.parametrize("case", GDN_CHUNK_CASES, ids=lambda c: f"D{c[2]}-k{c[3]}v{c[4]}-" + "+".join(str(s[0]) for s in c[5]))
def test_delta_net_op_chunked(require_cuda: None, case: tuple) -> None:
    """The chunked kernel (forced on) against the CPU and against the per-token kernel (forced
    on): outputs and states within float noise, untouched slots untouched; the two CUDA paths
    are not bit-identical (so the variable did select another kernel)."""
    w, h, state0 = _gdn_inputs(case, seed=3)
    yc, sc = _gdn("cpu", case, w, h, state0)
    y1, s1 = _gdn_on(_chunk_runner("1"), case, w, h, state0)
    yt, st = _gdn_on(_chunk_runner("1000000000"), case, w, h, state0)
    eo, es = rel_err(y1, yc.astype(np.float64)), rel_err(s1, sc.astype(np.float64))
    to, ts = rel_err(y1, yt.astype(np.float64)), rel_err(s1, st.astype(np.float64))
    print(f"chunked delta_net {case[2:5]} {case[5]}: vs CPU out {eo:.2e} state {es:.2e}; vs per-token out {to:.2e} state {ts:.2e}")
    assert eo <= 1e-4 and es <= 1e-4
    assert to <= 1e-4 and ts <= 1e-4
    state_len = s1.size // N_SLOTS
    used = {slot for _, _, slot in case[5]}
    for slot in set(range(N_SLOTS)) - used:
        assert np.array_equal(s1[slot * state_len:(slot + 1) * state_len], state0[slot * state_len:(slot + 1) * state_len])
    if max(s[0] for s in case[5]) >= 8:
        assert not np.array_equal(y1, yt), "FAK_GDN_CHUNK_MIN_ROWS=1 gave the per-token kernel's bits: not chunked?"


@pytest.mark.cuda
def test_delta_net_op_default_threshold(require_cuda: None) -> None:
    """At the threshold meant as the default (``FAK_GDN_CHUNK_MIN_ROWS=64``), a batch whose longest
    sequence has 64 rows runs chunked and one of 63 rows per token; with the variable unset (the
    chunked path off until it has run on a GPU) 64 rows run per token: a step of each, against the
    forced runners, bit for bit."""
    old = os.environ.pop("FAK_GDN_CHUNK_MIN_ROWS", None)
    try:
        unset = _native.OpRunner("cuda")
    finally:
        if old is not None:
            os.environ["FAK_GDN_CHUNK_MIN_ROWS"] = old
    for runner_, rows, forced in ((_chunk_runner("64"), 64, "1"), (_chunk_runner("64"), 63, "1000000000"), (unset, 64, "1000000000")):
        case = (64, 4, 64, 2, 4, [(rows, 0, 0), (1, 6, 1)])
        w, h, state0 = _gdn_inputs(case, seed=4)
        y, s = _gdn_on(runner_, case, w, h, state0)
        yf, sf = _gdn_on(_chunk_runner(forced), case, w, h, state0)
        assert np.array_equal(y, yf) and np.array_equal(s, sf), f"{rows} rows did not take the {forced} path"


# ---------------------------------------------------------------- whole tiny models

# name → (arch, write_tiny_model keyword arguments)
MODELS: dict[str, tuple[str, dict]] = {
    "qwen35-Q8_0": ("qwen35", dict(weight_type="Q8_0")),
    "qwen35-Q4_K_M": ("qwen35", dict(weight_type="Q4_K_M", n_embd=256, n_ff=512, ssm_state_size=128)),
    "qwen35moe-Q8_0": ("qwen35moe", dict(weight_type="Q8_0", ssm_state_size=128)),
    "qwen35moe-Q4_K_M": ("qwen35moe", dict(weight_type="Q4_K_M", n_embd=256, n_ff=512, n_ff_exp=256)),
    # The real hybrids' attention head: head_dim 256 (key_length = value_length), a quarter of it
    # rotated (rope.dimension_count 64); 16 query heads over 2 KV heads as Qwen3.6-35B-A3B.
    "qwen35-hd256-Q8_0": ("qwen35", dict(weight_type="Q8_0", head_dim=256, ssm_state_size=128)),
    "qwen35moe-hd256-Q4_K_M": ("qwen35moe", dict(weight_type="Q4_K_M", n_embd=256, n_ff=512, n_ff_exp=256, head_dim=256,
                                                  n_head=16, n_head_kv=2)),
}


@pytest.fixture(scope="module")
def tiny_hybrids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from fak.synth import write_tiny_model

    d = tmp_path_factory.mktemp("tiny-hybrid")
    return {name: str(write_tiny_model(d / f"{name}.gguf", arch, seed=11, **kw)) for name, (arch, kw) in MODELS.items()}


def _prompts(n_vocab: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(10, n_vocab - 10, size=n)] for n in lengths]


def _same_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _with_env(name: str, value: str | None, make):
    """``make()`` with the environment variable `name` set to `value` (None: as it is)."""
    if value is None:
        return make()
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return make()
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _cuda_model(path: str, graphs: str | None = None, chunk_min_rows: str | None = None, **kw) -> _native.EngineCore:
    """A CUDA model, with ``FAK_CUDA_GRAPHS`` set to `graphs` and ``FAK_GDN_CHUNK_MIN_ROWS`` to
    `chunk_min_rows` while it is created (None: unset / as it is)."""
    return _with_env("FAK_GDN_CHUNK_MIN_ROWS", chunk_min_rows,
                     lambda: _with_env("FAK_CUDA_GRAPHS", graphs, lambda: _native.EngineCore(path, backend="cuda", **kw)))


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("n_prompt", [5, 200])
def test_tiny_hybrid_cuda_matches_cpu(require_cuda: None, tiny_hybrids: dict[str, str], name: str, n_prompt: int) -> None:
    """Logits of every position (``logits()`` runs in chunks of 64 tokens: the state carries over
    between chunks) and greedy decode on CUDA against the CPU."""
    path = tiny_hybrids[name]
    cpu = _native.EngineCore(path, backend="cpu", n_ctx=512)
    gpu = _native.EngineCore(path, backend="cuda", n_ctx=512)
    (prompt,) = _prompts(cpu.n_vocab, [n_prompt], seed=n_prompt)
    lc, lg = cpu.logits(prompt), gpu.logits(prompt)
    assert np.isfinite(lg).all(), f"{name}: non-finite CUDA logits"
    cos = (lc * lg).sum(axis=1) / np.linalg.norm(lc, axis=1) / np.linalg.norm(lg, axis=1)
    agree = (lc.argmax(axis=1) == lg.argmax(axis=1)).mean()
    print(f"{name} n_prompt={n_prompt}: min cos {cos.min():.7f} (at {int(cos.argmin())}), argmax agrees {agree:.1%}")
    assert cos.min() >= 0.999, f"{name}: min cosine {cos.min():.6f} at position {int(cos.argmin())}"
    assert agree >= 0.9, f"{name}: argmax agrees on {agree:.1%} of positions"
    want = _run(cpu, [prompt], 16)[0]
    got = _run(gpu, [prompt], 16)[0]  # decode steps: CUDA graphs (FAK_CUDA_GRAPHS unset)
    same = _same_prefix(got, want)
    print(f"{name} n_prompt={n_prompt}: greedy tokens identical {same}/16")
    if same < 8:
        # A random tiny model's logits are flat: an early divergence must be a near-tie that the
        # two backends' float noise at that position can flip (the 200-token qwen35 prompts of
        # the H100 run of 2026-12-07 diverged at tokens 5 and 6 with every logit's cosine
        # ≥ 0.9999), never a wrong state: the CPU's margin of its token over CUDA's there is
        # within twice the largest difference of the two backends' logits at that position.
        ctx = prompt + want[:same]
        c_last, g_last = cpu.logits(ctx)[-1], gpu.logits(ctx)[-1]
        noise = float(np.abs(c_last - g_last).max())
        margin = float(c_last[want[same]] - c_last[got[same]])
        print(f"  divergence at {same}: CPU margin {margin:.3g}, largest CPU/CUDA logit difference {noise:.3g}")
        assert margin <= 2 * noise, f"{name}: greedy diverges at token {same} by {margin:.3g} (noise {noise:.3g}): {got} vs {want}"


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["qwen35-Q8_0", "qwen35moe-Q8_0", "qwen35-hd256-Q8_0"])
def test_batch_equals_each_alone(require_cuda: None, tiny_hybrids: dict[str, str], name: str) -> None:
    """Three sequences prefilled and decoded together (one graph per decode step, three state
    slots) give each sequence's tokens alone."""
    m = _cuda_model(tiny_hybrids[name], n_ctx=512, max_batch=4)
    prompts = _prompts(m.n_vocab, [40, 73, 120])
    together = _run(m, prompts, 10)
    for i, p in enumerate(prompts):
        alone = _run(m, [p], 10, base=100 + i)[100 + i]
        same = _same_prefix(alone, together[i])
        print(f"{name} sequence {i}: alone and batched identical {same}/10")
        # a state slot mixed up diverges at once; only float noise (other GEMM shapes) may flip a
        # late near-tie of these flat random logits
        assert same >= 6, f"{name} sequence {i}: alone {alone} vs batched {together[i]}"


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["qwen35-Q4_K_M", "qwen35moe-Q8_0", "qwen35moe-hd256-Q4_K_M"])
def test_graphs_on_and_off_give_the_same_tokens(require_cuda: None, tiny_hybrids: dict[str, str], name: str) -> None:
    """Replayed decode graphs read each sequence's rows, n_past and state slot from the batch
    arrays: the same kernels launched one by one give the same tokens, bit for bit."""
    prompts = _prompts(512, [1, 30, 64], seed=7)
    on = _run(_cuda_model(tiny_hybrids[name], "1", n_ctx=512, max_batch=4), prompts, 12)
    off = _run(_cuda_model(tiny_hybrids[name], "0", n_ctx=512, max_batch=4), prompts, 12)
    assert on == off


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["qwen35-Q8_0", "qwen35moe-Q4_K_M"])
def test_prefix_cache_resumes_from_a_state_checkpoint(require_cuda: None, tiny_hybrids: dict[str, str], name: str) -> None:
    """A second turn that extends the first resumes from a checkpoint of the recurrent state
    (``copy_state`` on the device) with the first token and log-probabilities of a cold prefill
    (within float noise: the warm prefill runs other row counts); the same prompt twice gives the
    same tokens."""
    path = tiny_hybrids[name]
    cold = _cuda_model(path, n_ctx=2048, prefix_cache=False)
    warm = _cuda_model(path, n_ctx=2048, prefix_cache=True)
    turn1 = _prompts(cold.n_vocab, [300], seed=3)[0]
    turn2 = turn1 + _prompts(cold.n_vocab, [150], seed=4)[0]
    first = _run(warm, [turn1], 8, base=10)[10]
    warm.take_prefix_hits()
    again = _run(warm, [turn1], 8, base=20)[20]
    assert dict(warm.take_prefix_hits()).get(20, 0) > 0, "the same prompt again found nothing in the prefix cache"
    assert _same_prefix(again, first) >= 6, f"the same prompt twice: {first} then {again}"

    def first_token(m: _native.EngineCore, sid: int) -> tuple[int, dict[int, float]]:
        m.add_sequence(sid, turn2, {"temperature": 0.0, "max_tokens": 1, "n_logprobs": 8})
        res = None
        while m.n_running or m.n_waiting:
            for _, t, _, top, _ in m.step():
                res = (t, dict(top or []))
        assert res is not None
        return res

    tw, lw = first_token(warm, 11)
    hits = dict(warm.take_prefix_hits()).get(11, 0)
    assert 0 < hits <= len(turn2) and hits % 32 == 0, f"turn 2 found {hits} tokens in the cache"
    tc, lc = first_token(cold, 12)
    common = set(lw) & set(lc)
    diff = max(abs(lw[k] - lc[k]) for k in common)
    print(f"{name}: prefix hit {hits} tokens; first token warm {tw} cold {tc}; max |Δ logprob| {diff:.2e} over {len(common)}")
    assert len(common) >= 6
    assert diff <= 2e-2, f"resuming from the checkpoint moved log-probabilities by {diff}"
    if tw != tc:
        # only a near-tie may flip
        assert abs(lc.get(tw, -1e9) - lc[tc]) <= 2e-2, f"first token {tw} (warm) vs {tc} (cold)"


@pytest.mark.cuda
def test_logits_on_the_side_leave_running_sequences_alone(require_cuda: None, tiny_hybrids: dict[str, str]) -> None:
    path = tiny_hybrids["qwen35moe-Q8_0"]
    m = _cuda_model(path, n_ctx=512, max_batch=2)
    a, b = _prompts(m.n_vocab, [60, 45], seed=5)
    want = _run(_cuda_model(path, n_ctx=512, max_batch=2), [a], 8)[0]
    m.add_sequence(0, a, {"temperature": 0.0, "max_tokens": 8})
    got: list[int] = [t for _, t, *_ in m.step()]
    m.logits(b)  # a stateless forward on the spare state slot
    while m.n_running:
        got += [t for _, t, *_ in m.step()]
    assert got == want


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["qwen35-Q8_0", "qwen35-Q4_K_M", "qwen35moe-Q8_0", "qwen35moe-hd256-Q4_K_M"])
def test_chunked_prefill_matches_cpu(require_cuda: None, tiny_hybrids: dict[str, str], name: str) -> None:
    """A 300-token prompt with the chunked path forced on (every forward, decode steps too): the
    logits of every position against the CPU as test_tiny_hybrid_cuda_matches_cpu, and greedy
    decode (prefill chunks of 512 rows: 300 rows in one forward, five chunks of the kernel)."""
    path = tiny_hybrids[name]
    cpu = _native.EngineCore(path, backend="cpu", n_ctx=512)
    gpu = _cuda_model(path, chunk_min_rows="1", n_ctx=512)
    (prompt,) = _prompts(cpu.n_vocab, [300], seed=30)
    lc, lg = cpu.logits(prompt), gpu.logits(prompt)
    assert np.isfinite(lg).all()
    cos = (lc * lg).sum(axis=1) / np.linalg.norm(lc, axis=1) / np.linalg.norm(lg, axis=1)
    agree = (lc.argmax(axis=1) == lg.argmax(axis=1)).mean()
    print(f"{name} chunked: min cos {cos.min():.7f} (at {int(cos.argmin())}), argmax agrees {agree:.1%}")
    assert cos.min() >= 0.999, f"{name}: min cosine {cos.min():.6f} at position {int(cos.argmin())}"
    assert agree >= 0.9
    want, got = _run(cpu, [prompt], 16)[0], _run(gpu, [prompt], 16)[0]
    same = _same_prefix(got, want)
    print(f"{name} chunked: greedy tokens identical to the CPU's {same}/16")
    if same < 8:  # only a near-tie may flip (see test_tiny_hybrid_cuda_matches_cpu)
        ctx = prompt + want[:same]
        c_last, g_last = cpu.logits(ctx)[-1], gpu.logits(ctx)[-1]
        noise = float(np.abs(c_last - g_last).max())
        assert float(c_last[want[same]] - c_last[got[same]]) <= 2 * noise, f"{name}: {got} vs {want}"


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["qwen35-hd256-Q8_0", "qwen35moe-Q8_0", "qwen35-Q8_0"])
def test_chunked_equals_per_token_on_cuda(require_cuda: None, tiny_hybrids: dict[str, str], name: str) -> None:
    """The same 300-token prompt chunked (FAK_GDN_CHUNK_MIN_ROWS=1) and token by token (a huge
    threshold) on CUDA: every position's logits with cosine ≥ 0.99999, the same greedy tokens
    (the rest of the forward is the same kernels; only a near-tie at float noise may flip one)."""
    path = tiny_hybrids[name]
    chunked = _cuda_model(path, chunk_min_rows="1", n_ctx=1024, max_tokens_per_step=512)
    per_token = _cuda_model(path, chunk_min_rows="1000000000", n_ctx=1024, max_tokens_per_step=512)
    (prompt,) = _prompts(chunked.n_vocab, [300], seed=31)
    lc, lt = chunked.logits(prompt), per_token.logits(prompt)
    cos = (lc * lt).sum(axis=1) / np.linalg.norm(lc, axis=1) / np.linalg.norm(lt, axis=1)
    print(f"{name}: chunked vs per-token min cos {cos.min():.8f}, max |Δ logit| {np.abs(lc - lt).max():.2e}")
    assert cos.min() >= 0.99999, f"{name}: min cosine {cos.min():.8f} at {int(cos.argmin())}"
    assert not np.array_equal(lc, lt), "the two thresholds gave identical bits: did one path run twice?"
    a, b = _run(chunked, [prompt], 16)[0], _run(per_token, [prompt], 16)[0]
    same = _same_prefix(a, b)
    print(f"{name}: chunked and per-token greedy identical {same}/16")
    if same < 16:
        ctx = prompt + a[:same]
        la, lb = chunked.logits(ctx)[-1], per_token.logits(ctx)[-1]
        noise = float(np.abs(la - lb).max())
        margin = float(abs(lb[a[same]] - lb[b[same]]))
        assert margin <= 2 * noise, f"{name}: chunked {a} vs per-token {b} (margin {margin:.3g}, noise {noise:.3g})"


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["qwen35-Q8_0", "qwen35moe-hd256-Q4_K_M"])
def test_decode_batched_with_a_chunked_prefill(require_cuda: None, tiny_hybrids: dict[str, str], name: str) -> None:
    """A sequence decoding while a 300-token prompt arrives: the steps that prefill the newcomer
    (chunked, at the threshold 64) carry the decoding sequence's row too (a partial chunk of one
    row from its state slot). Both sequences' tokens equal each run alone."""
    path = tiny_hybrids[name]
    # no prefix cache: the runs alone must not leave the prompts cached (b would then prefill a
    # few rows from a checkpoint, not chunks)
    m = _cuda_model(path, chunk_min_rows="64", n_ctx=1024, max_batch=4, prefix_cache=False)
    a, b = _prompts(m.n_vocab, [20, 300], seed=32)
    alone_a = _run(m, [a], 24, base=50)[50]
    alone_b = _run(m, [b], 12, base=60)[60]
    got: dict[int, list[int]] = {0: [], 1: []}
    m.add_sequence(0, a, {"temperature": 0.0, "max_tokens": 24})
    for _ in range(4):  # prefill of a, then decoding
        for sid, t, *_ in m.step():
            got[sid].append(t)
    assert 1 <= len(got[0]) < 24
    m.add_sequence(1, b, {"temperature": 0.0, "max_tokens": 12})
    while m.n_running or m.n_waiting:
        for sid, t, *_ in m.step():
            got[sid].append(t)
    sa, sb = _same_prefix(got[0], alone_a), _same_prefix(got[1], alone_b)
    print(f"{name}: decoding beside the chunked prefill {sa}/24, the prefilled sequence {sb}/12")
    # a state slot mixed up or a decode row lost diverges at once; only float noise (other GEMM
    # shapes in a mixed step) may flip a late near-tie
    assert sa >= 16 and sb >= 8, f"{name}: {got} vs alone {alone_a} / {alone_b}"
