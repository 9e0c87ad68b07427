"""The native forward pass (``fak._native.EngineCore``) against a float64 numpy reference, and the
engine's batching, sampling and error contract.

The reference (``reference_logits``) is written from the model definitions, not from fak's code:
weights are dequantized with the ``gguf`` package (``gguf.quants.dequantize``), then RMSNorm,
Q/K/V projections (+bias), RoPE (NEOX pairs ``(i, i + n_rot/2)`` for qwen2, NORM pairs
``(2i, 2i+1)`` for llama, as llama.cpp's ``LLAMA_ROPE_TYPE_*``), causal grouped-query attention,
SwiGLU, residuals, final norm and the LM head (``output.weight`` or the tied ``token_embd.weight``)
in float64. K and V are rounded to float16 as the engine's KV cache (and llama.cpp's default
cache) stores them; everything else stays float64, so the remaining differences are fak's float32
arithmetic and the 8-bit activation quantization of its quantized matmul (as llama.cpp's).

Tiny models are written here with ``gguf.GGUFWriter`` (``write_tiny_model``): both architectures,
mixed block formats (F32, F16, Q8_0, Q5_0, Q4_0 quantized by the ``gguf`` package; Q4_K and Q6_K by
the small quantizers below, whose packing ``test_k_quantizers_round_trip`` checks against
``gguf.quants.dequantize``). To add a case, add a ``TinySpec`` to
``SPECS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import pytest

import fak
from fak import _native

# --------------------------------------------------------------------------------------------
# Tiny GGUF models
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TinySpec:
    """A tiny model: shapes, architecture and the block format of each weight kind."""

    name: str
    arch: str
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 512
    n_layer: int = 2
    n_vocab: int = 320
    tied: bool = False
    types: dict[str, str] = field(default_factory=dict)
    rope_base: float = 10000.0
    eps: float = 1e-6
    #: Standard deviation of the token embedding (a tied LM head with a dominant embedding
    #: predicts the input token itself; keep it small there).
    embd_std: float = 1.0
    #: ``attention.key_length`` when the head size is not ``n_embd / n_head``.
    head_dim: int | None = None
    #: Linear RoPE scaling factor (``rope.scaling.type = linear``).
    rope_linear: float | None = None
    #: Write a llama3-style ``rope_freqs.weight`` (per-pair frequency divisors).
    rope_freqs: bool = False
    #: Another ``rope.scaling.type`` to write (for the unsupported-scaling test).
    rope_scaling_type: str | None = None


SPECS = [
    TinySpec("qwen2-mixed", "qwen2", types={"attn_q": "Q5_0", "attn_k": "Q8_0", "attn_v": "Q6_K", "attn_output": "Q4_K",
                                            "ffn_gate": "Q4_K", "ffn_up": "Q4_0", "ffn_down": "Q6_K",
                                            "token_embd": "Q8_0", "output": "Q6_K"}, rope_base=1e6),
    TinySpec("llama-tied", "llama", n_head=8, n_head_kv=2, tied=True, embd_std=0.15,
             types={"attn_q": "Q8_0", "attn_k": "F16", "attn_v": "Q5_0", "attn_output": "Q8_0",
                    "ffn_gate": "Q4_K", "ffn_up": "Q8_0", "ffn_down": "F32", "token_embd": "Q4_K"}),
    TinySpec("llama-rope-scaled", "llama", n_head=4, n_head_kv=1, head_dim=96, n_layer=1, rope_linear=4.0,
             rope_freqs=True, rope_base=500000.0,
             types={"attn_q": "Q8_0", "attn_k": "Q8_0", "attn_v": "Q8_0", "attn_output": "Q5_0",
                    "ffn_gate": "Q8_0", "ffn_up": "Q8_0", "ffn_down": "Q6_K", "token_embd": "Q8_0", "output": "Q8_0"}),
]


def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """``w`` (float32 [n_out, k], k % 256 == 0) as Q4_K blocks (uint8 [n_out, k/256·144]).

    Layout of ggml-common.h ``block_q4_K``: f16 ``d``, f16 ``dmin``, 12 bytes of 6-bit scales and
    mins of the eight 32-element sub-blocks (packed as ``get_scale_min_k4`` reads them), 128 bytes
    of 4-bit quants (``x = d·sc·q − dmin·m``). A plain min/max fit, not llama.cpp's search."""
    x = w.reshape(-1, 8, 32).astype(np.float32)
    mn = np.minimum(x.min(-1), 0.0)
    scale, mins = (x.max(-1) - mn) / 15.0, -mn
    d, dmin = _f16(scale.max(-1) / 63.0), _f16(mins.max(-1) / 63.0)
    df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(np.divide(mins, dmf, out=np.zeros_like(mins), where=dmf > 0)), 0, 63).astype(np.uint8)
    eff_s, eff_m = (df * sc)[..., None], (dmf * m)[..., None]
    q = np.clip(np.rint(np.divide(x + eff_m, eff_s, out=np.zeros_like(x), where=eff_s > 0)), 0, 15).astype(np.uint8)
    nb = x.shape[0]
    scales = np.zeros((nb, 12), np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    q = q.reshape(nb, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128)
    out = np.concatenate([d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2), scales, qs], axis=1)
    return out.reshape(w.shape[0], -1)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """``w`` (float32 [n_out, k], k % 256 == 0) as Q6_K blocks (uint8 [n_out, k/256·210]).

    Layout of ggml-common.h ``block_q6_K``: 128 bytes of low 4 bits, 64 bytes of high 2 bits of
    the 6-bit quants (element ``128n + 32t + l`` of half ``n``), 16 int8 scales (one per 16
    elements), f16 ``d`` (``x = d·scale·(q − 32)``)."""
    x = w.reshape(-1, 16, 16).astype(np.float32)
    big = np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]
    scale = big / -32.0
    d = _f16(np.abs(scale).max(-1) / 127.0)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), -128, 127).astype(np.int8)
    eff = (df * sc.astype(np.float32))[..., None]
    q = np.clip(np.rint(np.divide(x, eff, out=np.zeros_like(x), where=eff != 0)), -32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(-1, 2, 4, 32)
    nb = q.shape[0]
    ql = np.zeros((nb, 2, 64), np.uint8)
    ql[:, :, :32] = (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:] = (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    out = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8).reshape(nb, 16),
                          d.view(np.uint8).reshape(nb, 2)], axis=1)
    return out.reshape(w.shape[0], -1)


def _quantize(w: np.ndarray, dtype: str) -> np.ndarray:
    """``w`` (float32 [n_out, k]) in block format ``dtype`` (the ``gguf`` package's quantizers,
    plus the Q4_K / Q6_K ones above)."""
    if dtype == "Q4_K":
        return quantize_q4_k(w)
    if dtype == "Q6_K":
        return quantize_q6_k(w)
    return gguf.quants.quantize(w.astype(np.float32), gguf.GGMLQuantizationType[dtype])


def write_tiny_model(path: Path, spec: TinySpec, seed: int = 0) -> Path:
    """Writes ``spec`` as a GGUF file at ``path`` with random weights (fixed ``seed``)."""
    rng = np.random.default_rng(seed)
    arch = spec.arch
    hd = spec.head_dim or spec.n_embd // spec.n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(spec.n_layer)
    w.add_context_length(2048)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(spec.eps)
    if spec.head_dim is not None:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    if spec.rope_linear is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(spec.rope_linear)
    if spec.rope_scaling_type is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType(spec.rope_scaling_type))
        w.add_rope_scaling_factor(4.0)

    def mat(name: str, kind: str, n_out: int, k: int, std: float) -> None:
        dtype = spec.types.get(kind, "F32")
        data = (rng.standard_normal((n_out, k)) * std).astype(np.float32)
        w.add_tensor(name, _quantize(data, dtype), raw_dtype=gguf.GGMLQuantizationType[dtype])

    def vec(name: str, n: int, mean: float, std: float) -> None:
        w.add_tensor(name, (mean + rng.standard_normal(n) * std).astype(np.float32))

    d, q, kv, ff = spec.n_embd, spec.n_head * hd, spec.n_head_kv * hd, spec.n_ff
    mat("token_embd.weight", "token_embd", spec.n_vocab, d, spec.embd_std)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", d, 1.0, 0.1)
        mat(p + "attn_q.weight", "attn_q", q, d, 0.04)
        mat(p + "attn_k.weight", "attn_k", kv, d, 0.04)
        mat(p + "attn_v.weight", "attn_v", kv, d, 0.025)
        if arch == "qwen2":
            vec(p + "attn_q.bias", q, 0.0, 0.2)
            vec(p + "attn_k.bias", kv, 0.0, 0.2)
            vec(p + "attn_v.bias", kv, 0.0, 0.2)
        mat(p + "attn_output.weight", "attn_output", d, q, 0.025)
        vec(p + "ffn_norm.weight", d, 1.0, 0.1)
        mat(p + "ffn_gate.weight", "ffn_gate", ff, d, 0.025)
        mat(p + "ffn_up.weight", "ffn_up", ff, d, 0.025)
        mat(p + "ffn_down.weight", "ffn_down", d, ff, 0.025)
    vec("output_norm.weight", d, 1.0, 0.1)
    if spec.rope_freqs:
        w.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, hd // 2).astype(np.float32))
    if not spec.tied:
        mat("output.weight", "output", spec.n_vocab, d, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------------------------------------
# float64 reference
# --------------------------------------------------------------------------------------------


def _field(r: gguf.GGUFReader, key: str):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def load_reference_weights(path: Path) -> tuple[dict, dict[str, np.ndarray], dict[str, str]]:
    """Hyper-parameters, every tensor dequantized to float64 ([n_out, k] / [n]), and each
    tensor's block format name."""
    r = gguf.GGUFReader(str(path))
    arch = _field(r, "general.architecture")
    hp = {
        "arch": arch,
        "n_layer": int(_field(r, f"{arch}.block_count")),
        "n_head": int(_field(r, f"{arch}.attention.head_count")),
        "n_head_kv": int(_field(r, f"{arch}.attention.head_count_kv")),
        "n_embd": int(_field(r, f"{arch}.embedding_length")),
        "eps": float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon")),
        "base": float(_field(r, f"{arch}.rope.freq_base") or 10000.0),
        "head_dim": _field(r, f"{arch}.attention.key_length"),
        "rope_scale": 1.0 / float(_field(r, f"{arch}.rope.scaling.factor") or 1.0),
        "sliding_window": int(_field(r, f"{arch}.attention.sliding_window") or 0),
        "sliding_window_pattern": _field(r, f"{arch}.attention.sliding_window_pattern"),
    }
    ws, types = {}, {}
    for t in r.tensors:
        types[t.name] = t.tensor_type.name
        a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
        shape = [int(x) for x in reversed(t.shape)]
        ws[t.name] = a.reshape(shape)
    return hp, ws, types


def quantize_activations(x: np.ndarray, wtype: str) -> np.ndarray:
    """``x`` ([T, k]) as the quantized matmul sees it: rounded to the weight format's ggml
    ``vec_dot_type`` like llama.cpp's CPU backend (``quantize_row_q8_0``: per 32, ``d = amax/127``
    stored as f16, ``q = round(x·127/amax)``; ``quantize_row_q8_K_ref``: per 256, ``iscale =
    −127/max`` with ``max`` the element of largest magnitude, ``q = min(127, round(iscale·x))``,
    ``d = 1/iscale``; F16 weights take f16 activations; F32 none)."""
    x32 = x.astype(np.float32)
    if wtype in ("Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1"):
        b = x32.reshape(-1, 32)
        amax = np.abs(b).max(1, keepdims=True)
        inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0)
        q = np.clip(np.rint(b * inv), -128, 127)
        d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
        return (q * d).reshape(x.shape).astype(np.float64)
    if wtype.endswith("_K"):
        b = x32.reshape(-1, 256)
        big = np.take_along_axis(b, np.abs(b).argmax(1)[:, None], 1)
        iscale = np.divide(np.float32(-127.0), big, out=np.zeros_like(big), where=big != 0)
        q = np.minimum(np.rint(iscale * b), 127)
        d = np.divide(np.float32(1.0), iscale, out=np.zeros_like(iscale), where=iscale != 0)
        return (q * d).reshape(x.shape).astype(np.float64)
    if wtype == "F16":
        return x32.astype(np.float16).astype(np.float64)
    return x


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, pos: np.ndarray, base: float, neox: bool, scale: float = 1.0,
          freq_factors: np.ndarray | None = None) -> np.ndarray:
    """x: [T, H, D]; angle of pair i at position p: p · scale · base^(−2i/D) / freq_factors[i]."""
    t, h, d = x.shape
    half = d // 2
    inv = base ** (-2.0 * np.arange(half) / d) * scale
    if freq_factors is not None:
        inv = inv / freq_factors
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    if neox:
        x0, x1 = x[..., :half], x[..., half:]
        out[..., :half] = x0 * c - x1 * s
        out[..., half:] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
    return out


def swa_layers(hp: dict) -> list[bool]:
    """Which layers are windowed, from the file's ``sliding_window_pattern`` as llama.cpp reads
    it: one bool per layer, or an int period ``n`` (``llama_hparams::set_swa_pattern``: windowed
    iff ``n == 0 or il % n < n - 1``), or (absent) every layer."""
    n, pat = hp["n_layer"], hp["sliding_window_pattern"]
    if hp["sliding_window"] == 0:
        return [False] * n
    if pat is None:
        return [True] * n
    if isinstance(pat, (list, tuple)):
        return [bool(x) for x in pat]
    pat = int(pat)
    return [pat == 0 or il % pat < pat - 1 for il in range(n)]


def reference_logits(path: Path, tokens: list[int], llama_rounding: bool = False,
                     sliding_window: int | None = None) -> np.ndarray:
    """float64 logits [n_tokens, n_vocab] of ``tokens`` through the model at ``path``.

    A layer the file declares windowed (``{arch}.attention.sliding_window`` W, ``swa_layers``;
    ``sliding_window`` overrides W, 0 for none) masks key ``j`` of query ``i`` unless
    ``0 <= i − j < W`` (llama.cpp's ``LLAMA_SWA_TYPE_STANDARD``, Hugging Face's
    ``sliding_window_overlay``).

    With ``llama_rounding`` the values are rounded where llama.cpp's CPU path rounds them (and fak
    with it): every matmul input as its quantized matmul does (``quantize_activations``), and in
    attention ``q`` to f16 before ``q·k`` and the normalized probabilities to f16 before the
    product with V (ggml's f16 ``vec_dot_type`` in ``mul_mat(K, q)`` and ``mul_mat(Vᵀ, kq)``).
    What is left is float32 vs float64 arithmetic."""
    hp, w, types = load_reference_weights(path)

    def mm(x: np.ndarray, name: str) -> np.ndarray:
        if llama_rounding:
            x = quantize_activations(x, types[name])
        return x @ w[name].T

    nh, nkv, d = hp["n_head"], hp["n_head_kv"], hp["n_embd"]
    hd = int(hp["head_dim"] or d // nh)
    ff = w.get("rope_freqs.weight")
    neox = hp["arch"] == "qwen2"
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][tokens]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    if sliding_window is not None:
        hp = dict(hp, sliding_window=sliding_window)
    windowed = swa_layers(hp)
    W = hp["sliding_window"]
    ii, jj = np.arange(T)[:, None], np.arange(T)[None, :]
    swa_mask = np.where((ii - jj >= 0) & (ii - jj < max(W, 1)), 0.0, -np.inf)
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        layer_mask = swa_mask if windowed[i] else mask
        h = _rmsnorm(x, w[p + "attn_norm.weight"], hp["eps"])
        q = mm(h, p + "attn_q.weight") + w.get(p + "attn_q.bias", 0.0)
        k = mm(h, p + "attn_k.weight") + w.get(p + "attn_k.bias", 0.0)
        v = mm(h, p + "attn_v.weight") + w.get(p + "attn_v.bias", 0.0)
        q = _rope(q.reshape(T, nh, hd), pos, hp["base"], neox, hp["rope_scale"], ff)
        k = _rope(k.reshape(T, nkv, hd), pos, hp["base"], neox, hp["rope_scale"], ff)
        k = k.astype(np.float16).astype(np.float64)  # the f16 KV cache
        v = v.reshape(T, nkv, hd).astype(np.float16).astype(np.float64)
        g = nh // nkv
        att = np.empty((T, nh, hd))
        for hh in range(nh):
            qh = _f16(q[:, hh, :]).astype(np.float64) if llama_rounding else q[:, hh, :]
            s = qh @ k[:, hh // g, :].T / math.sqrt(hd) + layer_mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            pr = s / s.sum(axis=1, keepdims=True)
            if llama_rounding:
                pr = _f16(pr).astype(np.float64)
            att[:, hh, :] = pr @ v[:, hh // g, :]
        x = x + mm(att.reshape(T, nh * hd), p + "attn_output.weight")
        h = _rmsnorm(x, w[p + "ffn_norm.weight"], hp["eps"])
        gt = mm(h, p + "ffn_gate.weight")
        up = mm(h, p + "ffn_up.weight")
        x = x + mm(gt / (1.0 + np.exp(-gt)) * up, p + "ffn_down.weight")
    h = _rmsnorm(x, w["output_norm.weight"], hp["eps"])
    return mm(h, "output.weight" if "output.weight" in w else "token_embd.weight")


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=SPECS, ids=[s.name for s in SPECS])
def tiny(request, tmp_path_factory) -> tuple[TinySpec, Path]:
    spec: TinySpec = request.param
    return spec, write_tiny_model(tmp_path_factory.mktemp("tiny") / f"{spec.name}.gguf", spec)


def _prompt(n: int, n_vocab: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, size=n)]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def _generate(model, prompts: dict[int, list[int]], n_new: int, sampling: dict | None = None,
              arrivals: dict[int, int] | None = None) -> dict[int, list[int]]:
    """Runs ``step()`` until every sequence has ``n_new`` tokens. ``arrivals[id]`` is the step at
    which a sequence is added (default 0), so prefills join running decodes."""
    arrivals = arrivals or {}
    out: dict[int, list[int]] = {}
    step = 0
    while len(out) < len(prompts) or any(len(v) < n_new for v in out.values()):
        for sid, p in prompts.items():
            if arrivals.get(sid, 0) == step:
                model.add_sequence(sid, p, dict(sampling or {"temperature": 0.0}))
                out[sid] = []
        for sid, tok, lp, top, _fin in model.step():
            assert math.isfinite(lp) and lp <= 1e-6
            out[sid].append(tok)
            if len(out[sid]) == n_new:
                model.remove_sequence(sid)
        step += 1
        assert step < 10_000
    return out


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_synth_models_match_reference(arch, tmp_path):
    """The project's generator (``fak.synth.write_tiny_model``, llama.cpp's Q4_K_M type mix, its
    family defaults: qwen2 biases and untied head, llama tied embeddings) through the engine."""
    from fak import synth

    path = synth.write_tiny_model(tmp_path / f"{arch}.gguf", arch, n_embd=256, n_ff=512, weight_type="Q4_K_M")
    model = _native.EngineCore(str(path), n_ctx=256, threads=2)
    tokens = _prompt(100, model.n_vocab, 1)
    got = model.logits(tokens).astype(np.float64)
    for llama_rounding, bound in [(False, 0.999), (True, 0.9998)]:
        want = reference_logits(path, tokens, llama_rounding=llama_rounding)
        cos = np.array([_cosine(got[i], want[i]) for i in range(len(tokens))])
        assert cos.min() >= bound, (llama_rounding, cos.argmin(), cos.min())
        assert np.median(1 - cos) <= 2e-4, (llama_rounding, np.median(1 - cos))
    prompts = {i: _prompt(n, model.n_vocab, 30 + i) for i, n in enumerate([3, 40, 17])}
    alone = {sid: _generate(model, {sid: p}, 12)[sid] for sid, p in prompts.items()}
    assert _generate(model, prompts, 12) == alone


def test_k_quantizers_round_trip():
    w = (np.random.default_rng(0).standard_normal((8, 512)) * 0.08).astype(np.float32)
    for dtype, rel in [("Q4_K", 0.06), ("Q6_K", 0.015)]:
        back = gguf.quants.dequantize(_quantize(w, dtype), gguf.GGMLQuantizationType[dtype])
        assert back.shape == w.shape
        assert np.abs(back - w).std() / w.std() < rel, dtype


def test_logits_match_float64_reference(tiny):
    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=256, threads=2)
    assert model.n_vocab == spec.n_vocab
    cfg = model.config
    assert cfg["architecture"] == spec.arch
    assert cfg["rope_type"] == ("neox" if spec.arch == "qwen2" else "norm")
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]) == (spec.n_layer, spec.n_head, spec.n_head_kv, spec.head_dim or spec.n_embd // spec.n_head)
    assert cfg["rope_freq_scale"] == pytest.approx(1.0 / (spec.rope_linear or 1.0))
    tokens = _prompt(150, spec.n_vocab, 1)  # > LOGITS_CHUNK (64): several chunks, several KV blocks
    got = model.logits(tokens)
    assert got.dtype == np.float32 and got.shape == (len(tokens), spec.n_vocab)
    assert np.isfinite(got).all()
    got = got.astype(np.float64)

    # 1. The exact model (float64, weights as stored): every position within cosine 0.9999. The gap
    #    is the 8-bit activation quantization and the f16 attention roundings fak shares with
    #    llama.cpp.
    want = reference_logits(path, tokens)
    cos = np.array([_cosine(got[i], want[i]) for i in range(len(tokens))])
    assert cos.min() >= 0.9999, f"position {cos.argmin()}: cosine {cos.min()}"
    err, scale = np.abs(got - want).max(), np.abs(want).max()
    assert err <= 0.02 * scale, f"max abs error {err} vs logit scale {scale}"
    for i in np.nonzero(got.argmax(1) != want.argmax(1))[0]:
        top2 = np.sort(want[i])[-2:]
        assert top2[1] - top2[0] < 2 * err, f"position {i}: argmax differs with margin {top2[1] - top2[0]}"

    # 2. With values rounded where llama.cpp rounds them, what is left is float32 arithmetic
    #    (most positions agree to ~1e-12; where a value lands on a rounding boundary, f32 vs f64
    #    picks the other side and the flip propagates through the KV cache): closer everywhere, and
    #    the rounding accounts for most of the gap of (1).
    want_q = reference_logits(path, tokens, llama_rounding=True)
    cos_q = np.array([_cosine(got[i], want_q[i]) for i in range(len(tokens))])
    assert cos_q.min() >= 0.99995, f"position {cos_q.argmin()}: cosine {cos_q.min()}"
    assert np.median(1 - cos_q) < np.median(1 - cos) / 2, (np.median(1 - cos_q), np.median(1 - cos))


def test_logits_are_stateless_and_prefix_consistent(tiny):
    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=256, threads=2)
    tokens = _prompt(40, spec.n_vocab, 2)
    a = model.logits(tokens)
    b = model.logits(tokens[:25])
    np.testing.assert_array_equal(a, model.logits(tokens))
    # Causality: a prefix's logits are the prefix of the full run's.
    np.testing.assert_allclose(a[:25], b, rtol=0, atol=1e-5 * np.abs(a).max())
    assert model.kv_blocks_free == model.kv_blocks_total


def test_step_prefill_then_decode_matches_logits(tiny):
    """Greedy tokens from step() equal the argmax of logits() over the growing sequence."""
    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=256, threads=2)
    prompt = _prompt(20, spec.n_vocab, 3)
    toks = _generate(model, {7: prompt}, 12)[7]
    seq = list(prompt)
    for t in toks:
        lg = model.logits(seq)[-1]
        top2 = np.sort(lg)[-2:]
        if top2[1] - top2[0] > 1e-3:  # decode and prefill paths may round a near-tie differently
            assert t == int(lg.argmax())
        seq.append(t)


def test_batched_step_equals_sequential(tiny):
    spec, path = tiny
    prompts = {i: _prompt(n, spec.n_vocab, 10 + i) for i, n in enumerate([5, 33, 1, 70, 17, 600])}
    n_new = 10
    model = _native.EngineCore(str(path), n_ctx=1024, threads=2, max_batch=8)
    alone = {sid: _generate(model, {sid: p}, n_new)[sid] for sid, p in prompts.items()}
    assert model.kv_blocks_free == model.kv_blocks_total
    together = _generate(model, prompts, n_new)
    assert together == alone
    # Staggered arrivals: prefills (one chunked beyond 512 tokens) join running decodes.
    staggered = _generate(model, prompts, n_new, arrivals={0: 0, 1: 0, 2: 3, 3: 4, 4: 9, 5: 2})
    assert staggered == alone
    assert model.kv_blocks_free == model.kv_blocks_total


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny):
    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=256, threads=2)
    # A hot distribution (the tiny tied model is peaked, and top-p / min-p act before the
    # temperature as in llama.cpp, so they would leave one candidate): top-k and every penalty.
    samp = {"temperature": 8.0, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "seed": 1234,
            "repeat_penalty": 1.1, "repeat_last_n": 16, "presence_penalty": 0.3, "frequency_penalty": 0.2}
    prompts = {1: _prompt(9, spec.n_vocab, 5)}
    a = _generate(model, prompts, 16, samp)[1]
    b = _generate(model, prompts, 16, samp)[1]
    assert a == b
    others = {2: _prompt(30, spec.n_vocab, 6), 3: _prompt(4, spec.n_vocab, 7)}
    c = _generate(model, {**prompts, **others}, 16, samp)[1]
    assert c == a
    d = _generate(model, prompts, 16, {**samp, "seed": 99})[1]
    assert d != a
    assert len(set(a)) > 3, a


def test_logprobs_and_top_logprobs(tiny):
    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=256, threads=2)
    prompt = _prompt(12, spec.n_vocab, 8)
    model.add_sequence(1, prompt, {"temperature": 0.0, "n_logprobs": 5})
    [(sid, tok, lp, top, _fin)] = model.step()
    lg = model.logits(prompt)[-1].astype(np.float64)
    ls = lg - lg.max() - np.log(np.exp(lg - lg.max()).sum())
    assert sid == 1 and tok == int(lg.argmax())
    assert abs(lp - ls[tok]) < 1e-4
    assert [t for t, _ in top] == list(np.argsort(-lg, kind="stable")[:5])
    for t, l in top:
        assert abs(l - ls[t]) < 1e-4
    model.add_sequence(2, prompt, {"temperature": 0.0})
    outs = {o[0]: o for o in model.step()}
    assert outs[2][3] is None


def test_errors():
    with pytest.raises(OSError):
        _native.EngineCore("/nonexistent/model.gguf")


def test_error_contract(tiny, tmp_path):
    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=64, threads=1, max_batch=2)
    with pytest.raises(fak.ContextLengthError, match="64"):
        model.add_sequence(1, [1] * 64, {})
    model.add_sequence(1, [1] * 63, {})  # exactly fits: 63 + 1 = n_ctx
    for key, value in [("temperature", -1.0), ("top_p", 2.0), ("top_k", -5), ("min_p", 1.5), ("repeat_penalty", 0.0),
                       ("presence_penalty", 3.0), ("frequency_penalty", -2.5), ("n_logprobs", 50), ("seed", -1),
                       ("temperature", "hot"), ("bogus_key", 1)]:
        with pytest.raises(ValueError, match=key):
            model.add_sequence(2, [1, 2], {key: value})
    with pytest.raises(ValueError, match="seq_id"):
        model.add_sequence(1, [1, 2], {})
    with pytest.raises(ValueError, match="prompt_ids"):
        model.add_sequence(3, [], {})
    with pytest.raises(ValueError, match="prompt_ids"):
        model.add_sequence(3, [spec.n_vocab], {})
    with pytest.raises(ValueError, match="token_ids"):
        model.logits([spec.n_vocab + 5])
    with pytest.raises(fak.ContextLengthError):
        model.logits([1] * 65)
    model.remove_sequence(12345)  # unknown id: no-op
    model.remove_sequence(1)
    assert model.kv_blocks_free == model.kv_blocks_total
    with pytest.raises(fak.BackendError, match="CUDA"):
        _native.EngineCore(str(path), backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        _native.EngineCore(str(path), backend="tpu")
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        _native.EngineCore(str(path), n_ctx=256, kv_cache_tokens=100)
    with pytest.raises(ValueError, match="threads"):
        _native.EngineCore(str(path), threads=0)
    with pytest.raises(fak.BackendError, match="out of memory"):
        _native.EngineCore(str(path), n_ctx=10**13)  # a KV cache beyond any address space: an error, not an abort


def test_sequence_stops_at_context_end(tiny):
    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=32, threads=1)
    model.add_sequence(1, _prompt(28, spec.n_vocab, 9), {"temperature": 0.0})
    got = []
    for _ in range(10):
        got += model.step()
    assert len(got) == 4, "tokens 29..32 fill the context, then the sequence gets no more"
    assert [o[4] for o in got] == [None, None, None, "length"], "the core finishes it at a full context"
    assert model.kv_blocks_free == model.kv_blocks_total, "and frees its blocks"


def test_kv_cache_pressure_preempts_and_recovers(tiny):
    """A cache that holds one full context: concurrent sequences wait or are preempted and
    recomputed, and the tokens are those of each sequence run alone."""
    spec, path = tiny
    # 8 blocks of 32 tokens; four sequences admitted with one block each grow to four blocks each.
    model = _native.EngineCore(str(path), n_ctx=128, threads=2, kv_cache_tokens=256, max_batch=4)
    assert model.kv_blocks_total == 8
    prompts = {i: _prompt(10, spec.n_vocab, 20 + i) for i in range(4)}
    alone = {sid: _generate(model, {sid: p}, 100)[sid] for sid, p in prompts.items()}
    model.reset_stats()
    together = _generate(model, prompts, 100)
    assert model.stats()["preemptions"] > 0
    assert all(len(v) == 100 for v in together.values())
    if together != alone:
        # A preempted sequence is recomputed by a multi-row prefill where it first ran single-row
        # decodes; everything of fak's own is row-invariant, but the CPU quantized matmul
        # (backend/cpu/matmul) rounds a row differently depending on how many rows it is given.
        rowwise_ok = _matmul_is_row_invariant()
        assert not rowwise_ok, "the matmul is row-invariant, so recompute must reproduce the tokens"
        pytest.xfail("CPU matmul results depend on the row count; batch invariance needs row-invariant kernels")
    assert model.kv_blocks_free == model.kv_blocks_total
    stats = model.stats()
    assert set(stats) == {"running", "waiting", "kv_blocks_used", "kv_blocks_total", "prefill_tokens", "decode_tokens",
                          "prefill_seconds", "decode_seconds", "sample_seconds", "steps", "preemptions",
                          "prefix_cache_query_tokens", "prefix_cache_hit_tokens", "prefix_cache_blocks",
                          "device_sampled_rows", "device_sampled_host_rows", "tp_collective_seconds",
                          "tp_collective_wait_seconds", "kv_blocks_peak", "spec_steps", "spec_draft_tokens",
                          "spec_accepted_tokens", "spec_draft_forwards", "spec_draft_model_tokens",
                          "spec_draft_seconds", "draft_kv_blocks_total", "draft_kv_blocks_free"}
    assert stats["spec_steps"] == 0  # speculation is off unless asked for
    assert stats["draft_kv_blocks_total"] == 0 and stats["spec_draft_forwards"] == 0  # no draft model
    assert stats["tp_collective_seconds"] == 0.0  # one shard: no collectives
    assert stats["decode_tokens"] > 0 and stats["prefill_tokens"] > 0 and stats["steps"] > 0
    assert (stats["running"], stats["waiting"], stats["kv_blocks_used"]) == (0, 0, 0)
    model.reset_stats()
    assert model.stats()["decode_tokens"] == 0


def test_concurrent_calls_are_serialized(tiny):
    """Misuse from several Python threads: calls wait for each other (a lock inside), nothing
    crashes, and each thread's results are what it would get alone."""
    import threading

    spec, path = tiny
    model = _native.EngineCore(str(path), n_ctx=256, threads=2)
    tokens = _prompt(30, spec.n_vocab, 11)
    want = model.logits(tokens)
    errors: list[BaseException] = []

    def reader():
        try:
            for _ in range(5):
                np.testing.assert_array_equal(model.logits(tokens), want)
                assert 0 <= model.kv_blocks_free <= model.kv_blocks_total
                model.stats()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    got = _generate(model, {1: _prompt(10, spec.n_vocab, 12)}, 20)
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(got[1]) == 20


def _matmul_is_row_invariant() -> bool:
    """Whether ``_native.matmul`` gives each row the same bits alone as inside a batch."""
    rng = np.random.default_rng(0)
    for dtype in ("Q8_0", "Q5_0", "Q4_K", "Q6_K", "F16", "F32"):
        w = np.ascontiguousarray(_quantize((rng.standard_normal((16, 256)) * 0.1).astype(np.float32), dtype)).view(np.uint8).reshape(-1)
        x = rng.standard_normal((11, 256)).astype(np.float32)
        full = _native.matmul(dtype, w, 16, 256, x)
        for i in range(len(x)):
            if not np.array_equal(_native.matmul(dtype, w, 16, 256, np.ascontiguousarray(x[i:i + 1]))[0], full[i]):
                return False
    return True


def test_unsupported_architecture_and_missing_tensor(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(fak.UnsupportedError, match="mamba"):
        _native.EngineCore(str(tmp_path / "mamba.gguf"))
    longrope = write_tiny_model(tmp_path / "longrope.gguf", TinySpec("longrope", "qwen2", n_layer=1, rope_scaling_type="longrope"))
    with pytest.raises(fak.UnsupportedError, match="longrope"):
        _native.EngineCore(str(longrope))
    # YaRN is supported since issue 14 (tests/test_rope_scaling.py)
    yarn = write_tiny_model(tmp_path / "yarn.gguf", TinySpec("yarn", "qwen2", n_layer=1, rope_scaling_type="yarn"))
    assert _native.EngineCore(str(yarn)).config["rope_scaling"] == "yarn"
    spec = TinySpec("broken", "llama", n_layer=1, tied=True)
    path = write_tiny_model(tmp_path / "ok.gguf", spec)
    # Rewrite without blk.0.ffn_up.weight.
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "broken.gguf"), "llama")
    for k, f in r.fields.items():
        if k.startswith("llama.") and not isinstance(f.contents(), list):
            if isinstance(f.contents(), float):
                w.add_float32(k, f.contents())
            else:
                w.add_uint32(k, f.contents())
    for t in r.tensors:
        if t.name != "blk.0.ffn_up.weight":
            w.add_tensor(t.name, np.asarray(t.data), raw_shape=[int(x) for x in reversed(t.shape)] if t.tensor_type != gguf.GGMLQuantizationType.F32 else None,
                         raw_dtype=t.tensor_type)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(fak.ModelError, match=r"blk\.0\.ffn_up\.weight"):
        _native.EngineCore(str(tmp_path / "broken.gguf"))


# --------------------------------------------------------------------------------------------
# Real model
# --------------------------------------------------------------------------------------------


class _Vocab:
    """Byte-level BPE pieces of a GGUF vocabulary, enough to encode plain ASCII code by longest
    match and to decode ids (``Ġ`` = space, ``Ċ`` = newline in GPT-2's byte-to-unicode table).
    Not a tokenizer (no merges): the test only needs valid ids for a fixed prompt."""

    def __init__(self, path: Path):
        f = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"]
        self.pieces = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        self.index = {p: i for i, p in enumerate(self.pieces)}

    def encode(self, text: str) -> list[int]:
        s, out, i = text.replace(" ", "Ġ").replace("\n", "Ċ"), [], 0
        while i < len(s):
            j = next(j for j in range(len(s), i, -1) if s[i:j] in self.index)
            out.append(self.index[s[i:j]])
            i = j
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids).replace("Ġ", " ").replace("Ċ", "\n")


def test_real_model_logits_and_greedy_code(model_05b):
    vocab = _Vocab(model_05b)
    model = _native.EngineCore(str(model_05b), n_ctx=512, threads=2)
    assert model.config["architecture"] == "qwen2" and model.n_vocab == 151936
    prompt = vocab.encode("def fibonacci(n):\n")
    assert vocab.decode(prompt) == "def fibonacci(n):\n"
    lg = model.logits(prompt)
    assert lg.shape == (len(prompt), 151936) and np.isfinite(lg).all()
    out = _generate(model, {1: prompt}, 24)[1]
    text = vocab.decode(out)
    # A coherent body: indented, and it returns something / recurses on n.
    assert text.startswith("    "), text
    assert "return" in text and "n" in text, text
    # The step() path and the logits() path agree on the first generated token.
    assert out[0] == int(lg[-1].argmax())
    # Two prompts batched give the same greedy tokens as each alone.
    p2 = vocab.encode("import os\nimport sys\n\ndef main():\n")
    alone = _generate(model, {2: p2}, 8)[2]
    both = _generate(model, {1: prompt, 2: p2}, 8)
    assert both == {1: out[:8], 2: alone}
