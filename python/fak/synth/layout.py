"""Tensor layouts of real architectures and llama.cpp's choice of quant type per tensor.

Names and shapes: llama.cpp's tensor names (``gguf-py`` ``MODEL_TENSORS``) for ``qwen2`` and
``llama``. Order: the order ``convert_hf_to_gguf.py`` emits them for a single-file Hugging Face
checkpoint, i.e. sorted by Hugging Face name (``lm_head`` < ``model.embed_tokens`` <
``model.layers.0.*`` < ``model.layers.1.*`` < ``model.layers.10.*`` < ... < ``model.norm``), which
is what the real Qwen2.5 GGUF files show.

Types: ``quant_types`` follows llama.cpp's ``llama_tensor_get_type`` (``src/llama-quant.cpp``) for
the mixes fak writes. For ``Q4_K_M``: ``output.weight`` (and a tied ``token_embd.weight``) Q6_K;
``attn_v.weight`` and ``ffn_down.weight`` Q6_K where ``use_more_bits(i, n)`` holds, i.e.
``i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2`` with integer division, Q4_K elsewhere; other 2-D
weights Q4_K; 1-D tensors (norms, biases) stay F32. ``i`` is llama.cpp's running count of
``attn_v`` (or ``ffn_down``) tensors *in file order*, not the layer number, so with the string
order above the "more bits" set of a 28-layer model is layers {0, 1, 5-10, 13, 16, 19, 21, 24, 27}
(checked against the real Qwen2.5-Coder-1.5B Q4_K_M file). A row length that is not a multiple of
the type's block size falls back as llama.cpp's ``tensor_type_fallback`` does (Q2_K/Q3_K → Q4_0,
Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, then F16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fak.synth.blocks import format_of

__all__ = ["FILE_TYPES", "MIXES", "ArchConfig", "TensorSpec", "quant_types", "tensor_layout", "use_more_bits"]

Role = Literal["weight", "embedding", "norm", "bias"]


@dataclass(frozen=True)
class ArchConfig:
    """Hyper-parameters of a decoder-only transformer (names as in the GGUF metadata keys).

    ``n_embd`` is ``{arch}.embedding_length``, ``n_ff`` ``feed_forward_length``, ``n_head`` /
    ``n_head_kv`` ``attention.head_count`` / ``head_count_kv``, ``n_ctx_train``
    ``context_length``; the head dimension is ``n_embd // n_head``.
    """

    arch: Literal["qwen2", "llama"]
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_freq_base: float
    rms_eps: float
    tied_embeddings: bool
    attn_bias: bool

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_ff, self.n_vocab, self.n_ctx_train) <= 0:
            raise ValueError(f"all sizes must be positive: {self}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class TensorSpec:
    """One tensor to write.

    ``shape`` is numpy order, slowest axis first: a weight of ``n_out`` rows of ``k`` inputs is
    ``(n_out, k)`` (ggml ``ne = [k, n_out]``). ``role`` picks the value distribution of a synthetic
    tensor (``norm``: about 1.0; ``bias``, ``weight``, ``embedding``: about 0).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role = "weight"
    hf_name: str = field(default="", repr=False)


def _layer_tensors(cfg: ArchConfig, i: int) -> list[TensorSpec]:
    e, f, kv = cfg.n_embd, cfg.n_ff, cfg.n_head_kv * cfg.head_dim
    hf = f"model.layers.{i}."
    blk = f"blk.{i}."
    out = [
        TensorSpec(blk + "attn_norm.weight", (e,), "F32", "norm", hf + "input_layernorm.weight"),
        TensorSpec(blk + "ffn_down.weight", (e, f), "F32", "weight", hf + "mlp.down_proj.weight"),
        TensorSpec(blk + "ffn_gate.weight", (f, e), "F32", "weight", hf + "mlp.gate_proj.weight"),
        TensorSpec(blk + "ffn_up.weight", (f, e), "F32", "weight", hf + "mlp.up_proj.weight"),
        TensorSpec(blk + "ffn_norm.weight", (e,), "F32", "norm", hf + "post_attention_layernorm.weight"),
        TensorSpec(blk + "attn_k.weight", (kv, e), "F32", "weight", hf + "self_attn.k_proj.weight"),
        TensorSpec(blk + "attn_output.weight", (e, e), "F32", "weight", hf + "self_attn.o_proj.weight"),
        TensorSpec(blk + "attn_q.weight", (e, e), "F32", "weight", hf + "self_attn.q_proj.weight"),
        TensorSpec(blk + "attn_v.weight", (kv, e), "F32", "weight", hf + "self_attn.v_proj.weight"),
    ]
    if cfg.attn_bias:
        out += [
            TensorSpec(blk + "attn_k.bias", (kv,), "F32", "bias", hf + "self_attn.k_proj.bias"),
            TensorSpec(blk + "attn_q.bias", (e,), "F32", "bias", hf + "self_attn.q_proj.bias"),
            TensorSpec(blk + "attn_v.bias", (kv,), "F32", "bias", hf + "self_attn.v_proj.bias"),
        ]
    return out


def tensor_layout(cfg: ArchConfig) -> list[TensorSpec]:
    """Every tensor of ``cfg``'s model, in converter order, all typed F32 (see ``quant_types``)."""
    specs = [TensorSpec("token_embd.weight", (cfg.n_vocab, cfg.n_embd), "F32", "embedding", "model.embed_tokens.weight"),
             TensorSpec("output_norm.weight", (cfg.n_embd,), "F32", "norm", "model.norm.weight")]
    if not cfg.tied_embeddings:
        specs.append(TensorSpec("output.weight", (cfg.n_vocab, cfg.n_embd), "F32", "weight", "lm_head.weight"))
    for i in range(cfg.n_layer):
        specs += _layer_tensors(cfg, i)
    specs.sort(key=lambda t: t.hf_name)
    return specs


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits(i_layer, n_layers)`` (integer division, as in C++)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(dtype: str, row: int) -> str:
    """llama.cpp ``tensor_type_fallback``: a type whose block size divides the row length."""
    if row % format_of(dtype).block_size == 0:
        return dtype
    alt = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}.get(dtype, "F16")
    if row % format_of(alt).block_size:
        alt = "F16"
    return alt


# Mixes: the llama.cpp ftype names fak knows, and their base type.
MIXES = {"Q4_K_M": "Q4_K"}

# general.file_type (llama.cpp llama_ftype) for a pure type or a mix.
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
              "Q3_K": 11, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18, "BF16": 32, "Q4_K_M": 15}


def quant_types(specs: list[TensorSpec], weight_type: str, *, n_layer: int,
                overrides: dict[str, str] | None = None) -> None:
    """Set ``dtype`` of each 2-D tensor in ``specs`` (in place), as llama.cpp's quantizer would.

    Args:
        specs: the layout, in file order (the order matters for the Q4_K_M counters).
        weight_type: a ggml type name (``"Q8_0"``, ``"Q4_K"``, ``"F16"``, ...), applied to every
            2-D weight like ``llama-quantize --pure``, or a mix name from ``MIXES`` (``"Q4_K_M"``).
        n_layer: number of blocks (``n_attention_wv`` / ``n_ffn_down`` in llama.cpp).
        overrides: tensor name → type, applied after the rule (like ``--tensor-type``); still
            subject to the block-size fallback.

    Raises:
        ValueError: unknown type or mix.
    """
    if weight_type not in MIXES:
        format_of(weight_type)
    overrides = dict(overrides or {})
    for dtype in overrides.values():
        format_of(dtype)
    tied = not any(t.name == "output.weight" for t in specs)
    i_attn_v = i_ffn_down = 0
    for t in specs:
        if len(t.shape) < 2:
            t.dtype = "F32"
            continue
        row = t.shape[-1]
        if weight_type not in MIXES:
            dtype = weight_type
        else:
            base = MIXES[weight_type]
            dtype = base
            is_output = t.name == "output.weight" or (tied and t.name == "token_embd.weight")
            if is_output:
                dtype = "Q8_0" if row % format_of(base).block_size else "Q6_K"
            elif t.name.endswith("attn_v.weight"):
                if use_more_bits(i_attn_v, n_layer):
                    dtype = "Q6_K"
                i_attn_v += 1
            elif ".ffn_down" in t.name:
                if use_more_bits(i_ffn_down, n_layer):
                    dtype = "Q6_K"
                i_ffn_down += 1
        if t.name in overrides:
            dtype = overrides[t.name]
        t.dtype = _fallback(dtype, row) if dtype not in ("F32", "F16", "BF16") else dtype
