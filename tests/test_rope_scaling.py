"""RoPE scaling (issue 14, "Long context") against llama.cpp goldens made with the same settings.

The goldens in ``tests/data/goldens/rope-scaling.*`` are written by ``scripts/make_rope_goldens.py``
(llama.cpp through ``llama-cpp-python``, CPU): YaRN as Qwen2.5's model cards set it for 128k
(factor 4 over 32768 trained tokens) on the real 0.5B, on short prompts and a ~4k-token
needle-in-a-haystack prompt; linear interpolation (factor 2) on the 0.5B; Llama 3.1's NTK-by-parts
(factor 8, low 1, high 4, original 8192) on a tiny random-weight ``llama`` model that llama.cpp runs
with the ``rope_freqs.weight`` tensor its converter writes, while fak runs it both from that tensor
and, from the same model without it, by ``rope_scaling="llama3"``.

The bounds are those of the parity tests (tests/test_parity_llamacpp.py): next-token logits cosine
≥ 0.999, first-token argmax identical, a greedy continuation identical or diverging only at a near
tie (llama.cpp's top two logits within 1%). A scaled run must also be closer to llama.cpp's scaled
logits than fak's unscaled run is (the settings took effect). With scaling unset, logits are bit
for bit those of the unscaled path (also checked by the parity tests and by ``cargo test``'s
``unscaled_angles_are_the_pre_yarn_ones_bit_for_bit``).

To add a case: add it to ``scripts/make_rope_goldens.py``, re-run it, and list it in ``CASES``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
from fak import _native

GOLDENS = Path(__file__).parent / "data" / "goldens"
REPO = Path(__file__).resolve().parents[1]
N_THREADS = os.cpu_count()


def _golden() -> tuple[dict, dict[str, np.ndarray]]:
    data = json.loads((GOLDENS / "rope-scaling.json").read_text())
    with np.load(GOLDENS / "rope-scaling.logits.npz") as z:
        logits = {k: z[k].astype(np.float32) for k in z.files}
    return data, logits


GOLDEN, GOLDEN_LOGITS = _golden() if (GOLDENS / "rope-scaling.json").exists() else ({}, {})


@pytest.fixture(autouse=True)
def _goldens_present(request) -> None:
    if request.node.get_closest_marker("goldens") and not GOLDEN:
        pytest.fail("tests/data/goldens/rope-scaling.json is missing: run scripts/make_rope_goldens.py")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def _script():
    spec = importlib.util.spec_from_file_location("make_rope_goldens", REPO / "scripts" / "make_rope_goldens.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(model: _native.EngineCore, prompt: list[int], n_new: int) -> tuple[np.ndarray, list[int]]:
    """fak's next-token logits after prefilling ``prompt`` (the full row, through the engine's
    chunked prefill: no [n_tokens, n_vocab] array) and its greedy ``n_new``-token continuation."""
    model.add_sequence(1, prompt, {"temperature": 0.0, "n_logprobs": 1})
    first, toks = None, []
    while len(toks) < n_new:
        for _sid, tok, _lp, _top, _fin in model.step():
            if first is None:
                first = np.array(model.last_logits(1))
            toks.append(tok)
    model.remove_sequence(1)
    assert first is not None
    return first, toks


def _check(case: str, pid: str, rec: dict, ours: np.ndarray, cont: list[int]) -> dict:
    ref = GOLDEN_LOGITS[f"{case}__{pid}"]
    assert np.isfinite(ours).all(), (case, pid)
    cos = _cosine(ours, ref)
    assert cos >= 0.999, (case, pid, cos)
    top = rec["greedy_steps"][0]["top10"]["logits"]
    if int(np.argmax(ours)) != rec["greedy"][0]:
        margin = abs(top[0] - top[1]) / max(abs(top[0]), 1e-6)
        pytest.fail(f"{case}/{pid}: first token {int(np.argmax(ours))} vs llama.cpp {rec['greedy'][0]} "
                    f"(top-2 margin {margin:.4f})")
    golden = rec["greedy"]
    if cont[: len(golden)] != golden:
        step = next(i for i, (a, b) in enumerate(zip(cont, golden)) if a != b)
        t = rec["greedy_steps"][step]["top10"]["logits"]
        margin = abs(t[0] - t[1]) / max(abs(t[0]), 1e-6)
        assert margin <= 0.01, (case, pid, "greedy diverges at step", step, margin)
    # share of the vocabulary where fak's logit rounds to llama.cpp's float16 golden exactly
    f16_equal = float(np.mean(ours.astype(np.float16) == ref.astype(np.float16)))
    return {"cosine": cos, "max_abs_diff": float(np.abs(ours - ref).max()), "f16_equal": f16_equal}


@pytest.fixture(scope="module")
def qwen(model_05b: Path):
    def make(**rope) -> _native.EngineCore:
        return _native.EngineCore(str(model_05b), backend="cpu", n_ctx=8192, threads=N_THREADS, max_batch=1,
                             kv_cache_tokens=8192, **rope)
    return model_05b, make


@pytest.mark.goldens
@pytest.mark.parametrize("case", ["yarn", "linear"])
def test_qwen_scaling_matches_llamacpp(qwen, case: str) -> None:
    path, qwen = qwen
    c = GOLDEN["cases"][case]
    model = qwen(**c["fak"])
    cfg = model.config
    assert cfg["rope_scaling"] == c["fak"]["rope_scaling"]
    assert cfg["rope_freq_scale"] == pytest.approx(1.0 / c["fak"]["rope_scale"])
    plain = qwen()
    report = {}
    for pid, rec in c["records"].items():
        ours, cont = _run(model, rec["prompt_tokens"], GOLDEN["n_greedy"])
        report[pid] = _check(case, pid, rec, ours, cont)
        if len(rec["prompt_tokens"]) <= 512:  # the settings took effect: unscaled is farther off
            unscaled = plain.logits(rec["prompt_tokens"])[-1]
            ref = GOLDEN_LOGITS[f"{case}__{pid}"]
            d_scaled = float(np.abs(ours - ref).max())
            d_plain = float(np.abs(unscaled - ref).max())
            report[pid]["max_abs_diff_unscaled"] = d_plain
            assert d_scaled < d_plain, (case, pid, d_scaled, d_plain)
        if "needle" in pid and "violet-harbor-42" in rec["greedy_text"]:
            assert "violet-harbor-42" in _tokens_text(path, cont), (pid, cont)
    print(json.dumps({case: report}, indent=1))


def _tokens_text(path: Path, toks: list[int]) -> str:
    from fak.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(path)
    return b"".join(tok.token_bytes(t) for t in toks).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def tiny_llama3(tmp_path_factory):
    mod = _script()
    plain, with_freqs = mod.tiny_llama3(tmp_path_factory.mktemp("llama3"))
    return plain, with_freqs


@pytest.mark.goldens
def test_llama3_matches_llamacpp(tiny_llama3) -> None:
    plain, with_freqs = tiny_llama3
    c = GOLDEN["cases"]["llama3"]
    assert hashlib.sha256(with_freqs.read_bytes()).hexdigest() == c["model_sha256"], "tiny model changed: re-run scripts/make_rope_goldens.py"
    from_file = _native.EngineCore(str(with_freqs), backend="cpu", n_ctx=4096, threads=N_THREADS, max_batch=1)
    from_flag = _native.EngineCore(str(plain), backend="cpu", n_ctx=4096, threads=N_THREADS, max_batch=1, **c["fak"])
    unscaled = _native.EngineCore(str(plain), backend="cpu", n_ctx=4096, threads=N_THREADS, max_batch=1)
    assert from_flag.config["rope_scaling"] == "llama3"
    report = {}
    for pid, rec in c["records"].items():
        a, cont_a = _run(from_file, rec["prompt_tokens"], GOLDEN["n_greedy"])
        b, cont_b = _run(from_flag, rec["prompt_tokens"], GOLDEN["n_greedy"])
        # fak's own factors are the converter's to the bit: the same logits either way
        assert np.array_equal(a, b) and cont_a == cont_b, pid
        report[pid] = _check("llama3", pid, rec, a, cont_a)
        u, _ = _run(unscaled, rec["prompt_tokens"], 1)
        ref = GOLDEN_LOGITS[f"llama3__{pid}"]
        report[pid]["max_abs_diff_unscaled"] = float(np.abs(u - ref).max())
        if len(rec["prompt_tokens"]) > 1024:  # long enough for the low-frequency pairs to matter
            assert report[pid]["max_abs_diff"] < report[pid]["max_abs_diff_unscaled"], (pid, report[pid])
    print(json.dumps({"llama3": report}, indent=1))


def test_unset_equals_explicit_unscaled(tiny_llama3) -> None:
    """No scaling given = ``rope_scaling="none"`` = linear with factor 1, bit for bit."""
    plain, _ = tiny_llama3
    toks = list(range(3, 300))
    base = _native.EngineCore(str(plain), backend="cpu", n_ctx=1024, threads=N_THREADS)
    assert base.config["rope_freq_scale"] == 1.0 and base.config["rope_attn_factor"] == 1.0
    ref = base.logits(toks)
    for rope in ({"rope_scaling": "none"}, {"rope_scaling": "none", "rope_scale": 4.0},
                 {"rope_scaling": "linear", "rope_scale": 1.0}):
        m = _native.EngineCore(str(plain), backend="cpu", n_ctx=1024, threads=N_THREADS, **rope)
        assert np.array_equal(m.logits(toks), ref), rope


def test_bad_settings_raise(tiny_llama3) -> None:
    plain, _ = tiny_llama3
    with pytest.raises(ValueError, match="rope_scaling"):
        _native.EngineCore(str(plain), rope_scaling="longrope")
    with pytest.raises(ValueError, match="rope_scale"):
        _native.EngineCore(str(plain), rope_scaling="yarn", rope_scale=-1.0)


def test_engine_and_cli_pass_settings(tiny_llama3) -> None:
    """``fak.Engine(rope_scaling=...)``, ``fak serve`` / ``fak generate`` options reach the model."""
    from click.testing import CliRunner
    from fak.cli_generate import generate
    from fak.engine import Engine
    from fak.gateway.cli import _load_engine, serve

    plain, _ = tiny_llama3
    with Engine(plain, backend="cpu", n_ctx=256, rope_scaling="yarn", rope_scale=4.0, yarn_orig_ctx=1024) as e:
        cfg = e._loop.model.config
        assert (cfg["rope_scaling"], cfg["rope_scale"], cfg["rope_orig_ctx"], cfg["rope_ext_factor"]) == ("yarn", 4.0, 1024, 1.0)
        assert e.generate("hello", max_tokens=3, temperature=0.0).usage.completion_tokens >= 1
    e = _load_engine(plain, "cpu", 256, None, 1, None, rope_scaling="linear", rope_scale=2.0)
    try:
        assert e._loop.model.config["rope_freq_scale"] == 0.5
    finally:
        e.close()
    for cmd in (serve, generate):
        out = CliRunner().invoke(cmd, ["--help"]).output
        assert "--rope-scaling" in out and "--rope-scale" in out and "--yarn-orig-ctx" in out


def test_scaling_read_from_gguf_metadata(tmp_path) -> None:
    """``{arch}.rope.scaling.type`` / ``.factor`` / ``.original_context_length`` in the file give
    the same model as the flags; a flag overrides the file."""
    import gguf
    from fak.synth import write_tiny_model
    from fak.synth.edit import copy_gguf, with_yarn

    plain = write_tiny_model(tmp_path / "tiny-qwen2.gguf", "qwen2", ctx=4096, seed=3)
    F32, STR, U32 = gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32
    yarn_file = copy_gguf(plain, tmp_path / "tiny-qwen2-yarn.gguf", kv={
        "qwen2.rope.scaling.type": ("yarn", STR), "qwen2.rope.scaling.factor": (4.0, F32),
        "qwen2.rope.scaling.original_context_length": (1024, U32)})
    # The benches' helper writes the same file.
    assert with_yarn(plain, tmp_path / "tiny-qwen2-yarn-2.gguf", 4.0, 1024).read_bytes() == yarn_file.read_bytes()
    toks = list(range(3, 400))
    from_file = _native.EngineCore(str(yarn_file), backend="cpu", n_ctx=1024, threads=N_THREADS)
    cfg = from_file.config
    assert (cfg["rope_scaling"], cfg["rope_scale"], cfg["rope_orig_ctx"], cfg["rope_ext_factor"]) == ("yarn", 4.0, 1024, 1.0)
    from_flag = _native.EngineCore(str(plain), backend="cpu", n_ctx=1024, threads=N_THREADS,
                              rope_scaling="yarn", rope_scale=4.0, yarn_orig_ctx=1024)
    a = from_file.logits(toks)
    assert np.array_equal(a, from_flag.logits(toks))
    unscaled = _native.EngineCore(str(plain), backend="cpu", n_ctx=1024, threads=N_THREADS).logits(toks)
    assert not np.array_equal(a, unscaled)
    off = _native.EngineCore(str(yarn_file), backend="cpu", n_ctx=1024, threads=N_THREADS, rope_scaling="none")
    assert off.config["rope_freq_scale"] == 1.0 and np.array_equal(off.logits(toks), unscaled)
