#!/usr/bin/env python3
"""Float64 emulation of the CUDA backend's arithmetic on a real model, against fak's CPU backend.

Why: the CUDA backend's quantized matmuls now quantize their activations exactly as the CPU
backend does (``rust/src/backend/cpu/matmul/act.rs``: Q8_K over 256 values for the k-quants,
Q8_0/Q8_1 with the AVX2 scale formula and f16 ``d`` for the legacy formats) and sum exact integer
sub-block dot products scaled as the CPU does (``rust/kernels/mmvq.cu``, ``mmq.cu``). Such a
forward differs from the CPU backend only by float32 summation order, so its next-token logits
must match the CPU backend's to ~1e-6 (1 − cosine). This script shows it before any GPU time is
spent, and shows the gap of the previous CUDA arithmetic (q8_1 activations: 32 values per f32
scale, ``q = round(x/d)``) for contrast.

Variants (all float64, weights dequantized with ``gguf.quants.dequantize``; an integer-exact
block dot product scaled by ``d_w·d_x`` equals the float64 product of the dequantized values):
- ``cpu-faithful``: every matmul input quantized as ``act.rs`` (the new GPU arithmetic); in
  attention ``q`` and the probabilities rounded to f16 (as the tensor-core attention and the CPU
  backend do), K/V rounded to f16 (the cache);
- ``q8_1``: the previous CUDA arithmetic (q8_1 activations for every format);
- ``exact``: no activation rounding (K/V still f16).

Usage: ``python scripts/emulate_cuda_numerics.py MODEL.gguf [--max-tokens 600] [--json OUT]``.
Prompts: ``tests/data/golden_prompts.json`` (token ids as ``tests/cuda/test_e2e.py`` takes them).
Prints, per prompt, 1 − cosine of each variant's next-token logits against the CPU backend's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "cuda"))

LEGACY = ("Q4_0", "Q5_0", "Q8_0", "Q4_1", "Q5_1")


def q_cpu(x: np.ndarray, wtype: str) -> np.ndarray:
    """``x`` ([T, k]) rounded as fak's CPU matmul quantizes it for a ``wtype`` weight (act.rs)."""
    x32 = x.astype(np.float32)
    if wtype in LEGACY:
        b = x32.reshape(-1, 32)
        amax = np.abs(b).max(1, keepdims=True)
        inv = np.divide(np.float32(127.0), amax, out=np.zeros_like(amax), where=amax > 0)
        q = np.clip(np.rint(b * inv), -128, 127)  # np.rint: round half to even
        d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float64)
        return (q.astype(np.float64) * d).reshape(x.shape)
    if wtype.endswith("_K"):
        b = x32.reshape(-1, 256)
        big = np.take_along_axis(b, np.abs(b).argmax(1)[:, None], 1)  # first of largest |x|
        iscale = np.divide(np.float32(-127.0), big, out=np.zeros_like(big), where=big != 0)
        q = np.minimum(np.rint(iscale * b), 127)
        d = np.divide(np.float32(1.0), iscale, out=np.zeros_like(iscale), where=iscale != 0)
        return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)
    if wtype == "F16":
        return x32.astype(np.float16).astype(np.float64)
    if wtype == "BF16":
        u = x32.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return u.astype(np.uint32).view(np.float32).astype(np.float64)
    return x


def q_q81(x: np.ndarray, wtype: str) -> np.ndarray:
    """The previous CUDA arithmetic: q8_1 (32 values, f32 d = amax/127, q = round(x·(1/d)))."""
    if wtype in ("F32", "F16", "BF16"):
        return x
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(1, keepdims=True)
    d = amax / np.float32(127.0)
    inv = np.divide(np.float32(1.0), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(b * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def q_none(x: np.ndarray, wtype: str) -> np.ndarray:
    return x


VARIANTS = {"cpu-faithful": (q_cpu, True), "q8_1": (q_q81, True), "exact": (q_none, False)}


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


class Weights:
    """Tensors of a GGUF file, dequantized to float64 on demand."""

    def __init__(self, path: Path) -> None:
        self.r = gguf.GGUFReader(str(path))
        self.t = {t.name: t for t in self.r.tensors}
        arch = self.field("general.architecture")
        self.arch = arch
        self.n_layer = int(self.field(f"{arch}.block_count"))
        self.n_head = int(self.field(f"{arch}.attention.head_count"))
        self.n_kv = int(self.field(f"{arch}.attention.head_count_kv"))
        self.n_embd = int(self.field(f"{arch}.embedding_length"))
        self.eps = float(self.field(f"{arch}.attention.layer_norm_rms_epsilon"))
        self.base = float(self.field(f"{arch}.rope.freq_base") or 10000.0)
        self.head_dim = int(self.field(f"{arch}.attention.key_length") or self.n_embd // self.n_head)

    def field(self, key: str):
        f = self.r.fields.get(key)
        return None if f is None else f.contents()

    def has(self, name: str) -> bool:
        return name in self.t

    def type(self, name: str) -> str:
        return self.t[name].tensor_type.name

    def get(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        t = self.t[name]
        data = np.asarray(t.data)
        shape = [int(x) for x in reversed(t.shape)]
        if rows is not None:
            data = data.reshape(shape[0], -1)[rows]
            shape = [len(rows)] + shape[1:]
        return gguf.quants.dequantize(data, t.tensor_type).astype(np.float64).reshape(shape)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def rope_neox(x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
    t, h, d = x.shape
    half = d // 2
    ang = pos[:, None] * (base ** (-2.0 * np.arange(half) / d))[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    x0, x1 = x[..., :half], x[..., half:]
    out[..., :half] = x0 * c - x1 * s
    out[..., half:] = x0 * s + x1 * c
    return out


def forward_all(w: Weights, prompts: list[list[int]]) -> dict[str, np.ndarray]:
    """Last-position logits of every prompt for every variant: {variant: [n_prompts, n_vocab]}.
    All prompts' rows go through each matmul together (activation rounding is per row)."""
    assert w.arch == "qwen2", "this emulation covers the qwen2 layout (NEOX RoPE, QKV biases)"
    lens = [len(p) for p in prompts]
    starts = np.cumsum([0] + lens)
    toks = np.concatenate([np.asarray(p) for p in prompts])
    pos = np.concatenate([np.arange(n, dtype=np.float64) for n in lens])
    emb = w.get("token_embd.weight", rows=toks)
    xs = {v: emb.copy() for v in VARIANTS}
    nh, nkv, hd = w.n_head, w.n_kv, w.head_dim
    g = nh // nkv
    for il in range(w.n_layer):
        p = f"blk.{il}."
        W = {n: w.get(p + n + ".weight") for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
        T_ = {n: w.type(p + n + ".weight") for n in W}
        B = {n: w.get(p + n + ".bias") for n in ("attn_q", "attn_k", "attn_v") if w.has(p + n + ".bias")}
        an, fn = w.get(p + "attn_norm.weight"), w.get(p + "ffn_norm.weight")
        for v, (qf, att_round) in VARIANTS.items():
            x = xs[v]

            def mm(a: np.ndarray, n: str) -> np.ndarray:
                return qf(a, T_[n]) @ W[n].T + B.get(n, 0.0)

            h = rmsnorm(x, an, w.eps)
            q, k, vv = mm(h, "attn_q"), mm(h, "attn_k"), mm(h, "attn_v")
            att = np.empty((len(toks), nh * hd))
            for s0, s1 in zip(starts[:-1], starts[1:]):
                n = s1 - s0
                qs = rope_neox(q[s0:s1].reshape(n, nh, hd), pos[s0:s1], w.base)
                ks = f16(rope_neox(k[s0:s1].reshape(n, nkv, hd), pos[s0:s1], w.base))
                vs = f16(vv[s0:s1].reshape(n, nkv, hd))
                mask = np.triu(np.full((n, n), -np.inf), k=1)
                for hh in range(nh):
                    qh = f16(qs[:, hh]) if att_round else qs[:, hh]
                    sc = qh @ ks[:, hh // g].T / math.sqrt(hd) + mask
                    e = np.exp(sc - sc.max(axis=1, keepdims=True))
                    pr = e / e.sum(axis=1, keepdims=True)
                    if att_round:
                        pr = f16(pr)
                    att[s0:s1, hh * hd:(hh + 1) * hd] = pr @ vs[:, hh // g]
            x = x + mm(att, "attn_output")
            h = rmsnorm(x, fn, w.eps)
            gt, up = mm(h, "ffn_gate"), mm(h, "ffn_up")
            x = x + mm(gt / (1.0 + np.exp(-gt)) * up, "ffn_down")
            xs[v] = x
        print(f"  layer {il + 1}/{w.n_layer}", file=sys.stderr, flush=True)
    last = starts[1:] - 1
    on = w.get("output_norm.weight")
    head = "output.weight" if w.has("output.weight") else "token_embd.weight"
    Wo, To = w.get(head), w.type(head)
    out = {}
    for v, (qf, _) in VARIANTS.items():
        h = rmsnorm(xs[v][last], on, w.eps)
        out[v] = qf(h, To) @ Wo.T
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--max-tokens", type=int, default=600, help="skip longer prompts (the e2e test compares logits up to 600 tokens)")
    ap.add_argument("--json", type=Path, help="write the per-prompt results here")
    a = ap.parse_args()
    from test_e2e import prompts as e2e_prompts  # noqa: E402  (tests/cuda on sys.path)

    from fak import _native

    name = a.model.name.removesuffix(".gguf")
    items = [(n, ids) for n, ids in e2e_prompts(name) if len(ids) <= a.max_tokens]
    t0 = time.time()
    m = _native.EngineCore(str(a.model), backend="cpu", n_ctx=4096, max_batch=1)
    cpu = np.stack([np.asarray(m.logits(ids)[-1], dtype=np.float64) for _, ids in items])
    del m
    t1 = time.time()
    emu = forward_all(Weights(a.model), [ids for _, ids in items])
    t2 = time.time()

    def one_minus_cos(x: np.ndarray, y: np.ndarray) -> float:
        return float(1.0 - x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))

    rows = []
    print(f"{name}: {len(items)} prompts; CPU backend {t1 - t0:.0f} s, emulation {t2 - t1:.0f} s")
    print(f"{'prompt':16} {'tokens':>6}  " + "  ".join(f"1-cos({v},cpu)".rjust(22) for v in VARIANTS) + "  argmax equal")
    for i, (pn, ids) in enumerate(items):
        r = {"prompt": pn, "tokens": len(ids)}
        for v in VARIANTS:
            r[v] = one_minus_cos(emu[v][i], cpu[i])
        r["argmax_equal"] = bool(int(np.argmax(emu["cpu-faithful"][i])) == int(np.argmax(cpu[i])))
        rows.append(r)
        print(f"{pn:16} {len(ids):6d}  " + "  ".join(f"{r[v]:22.3e}" for v in VARIANTS) + f"  {r['argmax_equal']}")
    worst = {v: max(r[v] for r in rows) for v in VARIANTS}
    print("worst 1-cos: " + ", ".join(f"{v} {worst[v]:.3e} (cos {1 - worst[v]:.7f})" for v in VARIANTS))
    if a.json:
        a.json.write_text(json.dumps({"model": name, "rows": rows, "worst": worst}, indent=1))


if __name__ == "__main__":
    main()
