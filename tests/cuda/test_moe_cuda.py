"""The mixture-of-experts FFN and Qwen3's per-head norm on the CUDA backend against the CPU
reference (and both against float64), op by op on fresh random inputs, then whole tiny qwen3 /
qwen3moe models written by ``fak synth``.

The MoE FFN (``OpRunner.moe_ffn``: router GEMV/GEMM, fused softmax-top-k, expert products,
SwiGLU, weighted sum into the residual) runs two CUDA paths: the expert GEMV over (row, expert)
pairs for ≤ 16 rows (decode) and the expert-sorted grouped int8 GEMM above (prefill). Both
quantize activations bit-exactly as the CPU and sum exact integer sub-block products, so they
differ from the CPU only in f32 summation order: the router's choice is compared on the rows whose
k-th and (k+1)-th probabilities are apart (a near-tie may flip on an ulp of the router's f32
logits), and the output within ``CPU_NEAR`` (the SwiGLU's 8-bit quantization can round one value
a step apart) on rows whose choice agrees.

Each op test runs for ``cpu`` (CI) and ``cuda`` (marked ``cuda``); the model tests need a GPU.
To add a case, extend a ``parametrize`` list: shapes must keep ``d`` and ``n_ff`` multiples of
the format's block (256 for the k-quants).
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from fak import _native

from cuda_util import BACKENDS, dequantized, random_weights, rel_err, runner

CPU_NEAR = 1e-3
Q8 = 2.5e-2


def seed(*parts: object) -> np.random.Generator:
    return np.random.default_rng([zlib.crc32(repr(parts).encode()), int(os.environ.get("FAK_TEST_SEED", "0"))])


def moe_reference(h, res, gate_inp, gd, ud, dd, n_ff, k):
    """float64 MoE FFN with the ids of the op under test (the choice is checked separately)."""
    n, d = h.shape
    logits = h.astype(np.float64) @ gate_inp.T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = res.astype(np.float64).copy()
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    for r in range(n):
        w = p[r, ids[r]]
        w = w / w.sum()
        for s, e in enumerate(ids[r]):
            g = gd[e * n_ff:(e + 1) * n_ff] @ h[r]
            u = ud[e * n_ff:(e + 1) * n_ff] @ h[r]
            a = g / (1 + np.exp(-g)) * u
            out[r] += w[s] * (dd[e * d:(e + 1) * d] @ a)
    return out, ids, p


CASES = [
    # (gate/up type, down type, d, n_ff, n_expert, k)
    ("Q4_K", "Q6_K", 256, 256, 8, 2),
    ("Q4_K", "Q4_K", 512, 256, 32, 8),
    ("Q8_0", "Q8_0", 256, 128, 16, 4),
    ("Q4_0", "Q5_0", 256, 64, 8, 3),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_rows", [1, 3, 16, 17, 100, 300])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_moe_ffn(backend: str, case: tuple, n_rows: int) -> None:
    gt, dt, d, n_ff, ne, k = case
    rng = seed("moe", case)
    gate = random_weights(gt, ne * n_ff, d, rng)
    up = random_weights(gt, ne * n_ff, d, rng)
    down = random_weights(dt, ne * d, n_ff, rng)
    gate_inp = (rng.standard_normal((ne, d)) * (2.0 / np.sqrt(d))).astype(np.float32)
    xr = seed("x", case, n_rows)
    h = xr.standard_normal((n_rows, d)).astype(np.float32)
    res = xr.standard_normal((n_rows, d)).astype(np.float32)
    args = (d, n_ff, ne, k, gate_inp.reshape(-1), gt, gate, gt, up, dt, down)
    out, ids, w = runner(backend).moe_ffn(h.reshape(-1), res.reshape(-1), *args)
    out, ids, w = out.reshape(n_rows, d), ids.reshape(n_rows, k).astype(np.int64), w.reshape(n_rows, k)
    assert np.isfinite(out).all(), "an output was not written (NaN poison) or overflowed"
    gd, ud, dd = dequantized(gt, gate, ne * n_ff, d), dequantized(gt, up, ne * n_ff, d), dequantized(dt, down, ne * d, n_ff)
    ref, ref_ids, p = moe_reference(h, res, gate_inp.astype(np.float64), gd, ud, dd, n_ff, k)
    srt = -np.sort(-np.log(p), axis=1)  # log-probabilities: the logits' gaps
    clear = (srt[:, k - 1] - srt[:, k]) > 1e-3 if k < ne else np.ones(n_rows, bool)
    assert clear.sum() >= n_rows // 2, "too many near-ties in the random router"
    assert (np.sort(ids[clear], axis=1) == np.sort(ref_ids[clear], axis=1)).all(), "the router chose other experts"
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-5), "weights not renormalized"
    assert (np.diff(w, axis=1) <= 1e-7).all(), "slots not in descending weight order"
    err = rel_err(out[clear] - res[clear], ref[clear] - res[clear].astype(np.float64))
    assert err <= Q8, f"{backend} MoE vs float64: {err:.3g}"
    if backend == "cuda":
        c_out, c_ids, c_w = runner("cpu").moe_ffn(h.reshape(-1), res.reshape(-1), *args)
        c_out, c_ids = c_out.reshape(n_rows, d), c_ids.reshape(n_rows, k).astype(np.int64)
        same = clear & (np.sort(c_ids, axis=1) == np.sort(ids, axis=1)).all(axis=1)
        assert same.sum() >= clear.sum() - 1, "CUDA and CPU routers disagree beyond a near-tie"
        diff = rel_err(out[same] - res[same], c_out[same].astype(np.float64) - res[same])
        assert diff <= CPU_NEAR, f"cuda vs cpu MoE rows={n_rows}: {diff:.3g} > {CPU_NEAR}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim,n_rows", [(128, 1), (128, 96), (64, 7), (256, 33)])
def test_head_norm(backend: str, head_dim: int, n_rows: int) -> None:
    rng = seed("head_norm", head_dim, n_rows)
    x = (rng.standard_normal((n_rows, head_dim)) * 3).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(head_dim)).astype(np.float32)
    y = runner(backend).head_norm(x.reshape(-1), w, 1e-6).reshape(n_rows, head_dim)
    xd = x.astype(np.float64)
    ref = xd / np.sqrt((xd ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert rel_err(y, ref) <= 1e-6
    if backend == "cuda":
        c = runner("cpu").head_norm(x.reshape(-1), w, 1e-6).reshape(n_rows, head_dim)
        assert rel_err(y, c.astype(np.float64)) <= 1e-6


# ---------------------------------------------------------------- whole tiny models


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from fak.synth import write_tiny_model

    d = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch in ("qwen3", "qwen3moe"):
        for wt in ("Q8_0", "Q4_K_M"):
            kw = dict(n_embd=256, n_ff=512) if wt == "Q4_K_M" else {}
            out[f"{arch}-{wt}"] = str(write_tiny_model(d / f"{arch}-{wt}.gguf", arch, weight_type=wt, **kw))
    return out


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    model.add_sequence(1, prompt, {"temperature": 0.0, "max_tokens": n})
    toks: list[int] = []
    while model.n_running or model.n_waiting:
        toks += [t for (_, t, _, _, _) in model.step()]
    assert len(toks) == n
    return toks


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["qwen3-Q8_0", "qwen3-Q4_K_M", "qwen3moe-Q8_0", "qwen3moe-Q4_K_M"])
@pytest.mark.parametrize("n_prompt", [5, 200])
def test_tiny_model_cuda_matches_cpu(require_cuda: None, tiny_models: dict[str, str], name: str, n_prompt: int) -> None:
    path = tiny_models[name]
    rng = np.random.default_rng(n_prompt)
    cpu = _native.EngineCore(path, backend="cpu", n_ctx=512)
    gpu = _native.EngineCore(path, backend="cuda", n_ctx=512)
    prompt = [int(t) for t in rng.integers(10, cpu.n_vocab - 10, size=n_prompt)]
    lc, lg = cpu.logits(prompt), gpu.logits(prompt)
    cos = (lc * lg).sum(axis=1) / np.linalg.norm(lc, axis=1) / np.linalg.norm(lg, axis=1)
    # Random tiny models have flat, near-tied logits: the bound is the dense path's own noise there
    # (CPU vs CUDA on tiny qwen3 at 200 tokens: 1 - cos 1.5e-4, argmax 97%; H100, 2026-12-07).
    assert cos.min() >= 0.999, f"{name}: min cosine {cos.min():.6f}"
    agree = (lc.argmax(axis=1) == lg.argmax(axis=1)).mean()
    assert agree >= 0.9, f"{name}: argmax agrees on {agree:.1%} of positions"
    want = _greedy(cpu, prompt, 16)
    got = _greedy(gpu, prompt, 16)  # decode steps: CUDA graphs (FAK_CUDA_GRAPHS unset)
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    print(f"{name} n_prompt={n_prompt}: min cos {cos.min():.7f}, greedy tokens identical {same}/16")
    assert same >= 8, f"{name}: greedy diverges at token {same}: {got} vs {want}"


@pytest.mark.cuda
@pytest.mark.parametrize("n_cpu_moe", [1, 1 << 30])
def test_cpu_moe_matches_all_on_gpu(require_cuda: None, tiny_models: dict[str, str], n_cpu_moe: int) -> None:
    """``--n-cpu-moe N`` / ``--cpu-moe``: the first N layers' experts run on the CPU (host memory),
    the rest on the GPU; the logits stay those of the all-GPU run within the noise of one
    f32 summation order against another, greedy decode (no graphs then) the same tokens."""
    path = tiny_models["qwen3moe-Q4_K_M"]
    gpu = _native.EngineCore(path, backend="cuda", n_ctx=512)
    mixed = _native.EngineCore(path, backend="cuda", n_ctx=512, n_cpu_moe=n_cpu_moe)
    assert mixed.config["host_expert_layers"] == min(n_cpu_moe, mixed.config["n_layer"])
    rng = np.random.default_rng(3)
    for n_prompt in (5, 100):
        prompt = [int(t) for t in rng.integers(10, gpu.n_vocab - 10, size=n_prompt)]
        lg, lm = gpu.logits(prompt), mixed.logits(prompt)
        cos = (lg * lm).sum(axis=1) / np.linalg.norm(lg, axis=1) / np.linalg.norm(lm, axis=1)
        assert cos.min() >= 0.999, f"n_cpu_moe={n_cpu_moe} n_prompt={n_prompt}: min cosine {cos.min():.6f}"
        want, got = _greedy(gpu, prompt, 12), _greedy(mixed, prompt, 12)
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
        assert same >= 6, f"greedy diverges at {same}: {got} vs {want}"


@pytest.mark.cuda
@pytest.mark.parametrize("pin", ["1", "0"])
def test_host_experts_run_on_gpu_for_large_batches(require_cuda: None, tiny_models: dict[str, str], pin: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With the upload on (``FAK_MOE_UPLOAD_MIN_ROWS=32``, read when the engine's backend is made;
    off by default until this has run on a GPU), at 32 rows and more a host layer's experts are
    copied to the GPU (a copy stream, two staging slots used in turn) and the GPU's expert kernels
    run on the copies:
    the logits are those of the all-GPU engine (the same kernels on the same bytes), not merely
    near them as the CPU's are, and ``expert_uploads`` counts every layer's three tensors.
    Below 32 rows nothing is uploaded (the CPU computes the experts). With the host pages
    page-locked (``FAK_MOE_HOST_PIN=1``: the copies are DMAs from the file's map) and pageable
    (``0``: the driver stages them) alike."""
    path = tiny_models["qwen3moe-Q4_K_M"]
    gpu = _native.EngineCore(path, backend="cuda", n_ctx=512)
    # read when the mixed engine's backend is made (the all-GPU one above has no host experts)
    monkeypatch.setenv("FAK_MOE_HOST_PIN", pin)
    monkeypatch.setenv("FAK_MOE_UPLOAD_MIN_ROWS", "32")
    m0 = _native.cuda_memory()
    mixed = _native.EngineCore(path, backend="cuda", n_ctx=512, n_cpu_moe=1 << 30)
    m1 = _native.cuda_memory()
    host = m1["host_experts"] - m0["host_experts"]
    pinned = m1["host_experts_pinned"] - m0["host_experts_pinned"]
    print(f"\npin={pin}: host experts {host} bytes, page-locked {pinned}")
    assert host > 0
    if pin == "0":
        assert pinned == 0
    else:
        # whole pages only, and the driver may refuse (the copies are then staged): never more
        assert 0 <= pinned <= host
    rng = np.random.default_rng(5)
    short = [int(t) for t in rng.integers(10, gpu.n_vocab - 10, size=5)]
    before = _native.cuda_memory()["expert_uploads"]
    mixed.logits(short)
    assert _native.cuda_memory()["expert_uploads"] == before, "a 5-row forward uploaded experts"
    for n_prompt in (32, 200):
        prompt = [int(t) for t in rng.integers(10, gpu.n_vocab - 10, size=n_prompt)]
        before = _native.cuda_memory()["expert_uploads"]
        lm = mixed.logits(prompt)
        uploaded = _native.cuda_memory()["expert_uploads"] - before
        # once per forward (a prompt longer than a step's rows takes several)
        assert uploaded > 0 and uploaded % host == 0, f"{n_prompt} rows: {uploaded} bytes uploaded, the host experts are {host}"
        lg = gpu.logits(prompt)
        err = float(np.abs(lg - lm).max() / np.abs(lg).max())
        assert err <= 1e-5, f"{n_prompt} rows: staged experts' logits differ from the all-GPU run by {err:.2e}"


@pytest.mark.cuda
def test_host_experts_stay_on_the_cpu_without_the_upload(require_cuda: None, tiny_models: dict[str, str]) -> None:
    """``FAK_MOE_UPLOAD_MIN_ROWS`` unset: a 100-row forward computes the host experts on the CPU
    (nothing uploaded, nothing page-locked) — the default until the upload has run on a GPU."""
    assert "FAK_MOE_UPLOAD_MIN_ROWS" not in os.environ
    m0 = _native.cuda_memory()
    mixed = _native.EngineCore(tiny_models["qwen3moe-Q4_K_M"], backend="cuda", n_ctx=512, n_cpu_moe=1 << 30)
    assert _native.cuda_memory()["host_experts_pinned"] == m0["host_experts_pinned"]
    before = _native.cuda_memory()["expert_uploads"]
    mixed.logits([int(t) for t in np.random.default_rng(2).integers(10, mixed.n_vocab - 10, size=100)])
    assert _native.cuda_memory()["expert_uploads"] == before


@pytest.mark.cuda
def test_grouped_decode_graph_survives_scratch_growth(require_cuda: None, tiny_models: dict[str, str]) -> None:
    """A decode step past the expert GEMV's rows (the expert-sorted grouped GEMM) is captured as a
    CUDA graph; a later, longer prefill grows the grouped GEMM's index and gathered activations;
    the graph's replays must still read live memory. Both phases' tokens equal those of the same
    steps without graphs. (The grown buffers used to be freed: the 64-sequence decode graph of the
    30B-A3B twin faulted with CUDA_ERROR_ILLEGAL_ADDRESS after the 512-token prompts' prefill.)"""
    path = tiny_models["qwen3moe-Q4_K_M"]
    rng = np.random.default_rng(11)
    n_seq = 24
    short = [[int(t) for t in rng.integers(10, 200, size=4)] for _ in range(n_seq)]
    long = [[int(t) for t in rng.integers(10, 200, size=300)] for _ in range(n_seq)]

    def run(graphs: str) -> dict[int, list[int]]:
        old = os.environ.get("FAK_CUDA_GRAPHS")
        os.environ["FAK_CUDA_GRAPHS"] = graphs
        try:
            m = _native.EngineCore(path, backend="cuda", n_ctx=512, max_batch=n_seq, kv_cache_tokens=512 * n_seq)
        finally:
            if old is None:
                os.environ.pop("FAK_CUDA_GRAPHS", None)
            else:
                os.environ["FAK_CUDA_GRAPHS"] = old
        toks: dict[int, list[int]] = {}
        for phase, prompts in enumerate((short, long)):
            for i, p in enumerate(prompts):
                m.add_sequence(phase * 100 + i, p, {"temperature": 0.0, "max_tokens": 6})
            while m.n_running or m.n_waiting:
                for sid, t, *_ in m.step():
                    toks.setdefault(sid, []).append(t)
        return toks

    with_graphs, without = run("1"), run("0")
    assert sorted(with_graphs) == sorted(without) and len(without) == 2 * n_seq
    assert all(len(v) == 6 for v in without.values())
    assert with_graphs == without, "a graph replayed after the grouped GEMM's scratch grew gave other tokens"
