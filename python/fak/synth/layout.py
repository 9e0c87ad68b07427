"""Tensor layouts of real architectures and llama.cpp's choice of quant type per tensor.

Names and shapes: llama.cpp's tensor names (``gguf-py`` ``MODEL_TENSORS``; ``src/models/<arch>.cpp``
``load_arch_tensors`` for the shapes) for ``qwen2``, ``llama``, ``qwen3``, ``qwen3moe`` and the
Qwen3.5/3.6 hybrids ``qwen35`` / ``qwen35moe`` (``src/models/qwen35.cpp``, ``qwen35moe.cpp``).

- ``qwen3`` is ``qwen2`` without the Q/K/V biases, plus a per-head RMSNorm of Q and K
  (``blk.N.attn_q_norm.weight`` / ``attn_k_norm.weight``, shape ``[head_dim]``). The head dimension
  is ``{arch}.attention.key_length`` (= ``value_length``) and need not be ``n_embd / n_head``:
  ``attn_q`` is ``[n_embd, n_head * head_dim]`` and ``attn_output`` ``[n_head * head_dim, n_embd]``
  in ggml order (Qwen3-30B-A3B: n_embd 2048, 32 heads of 128).
- ``qwen3moe`` replaces the dense FFN by ``n_expert`` SwiGLU experts: the router
  ``ffn_gate_inp`` ``[n_embd, n_expert]`` (F32 in real files: llama.cpp never quantizes it) and the
  stacked experts ``ffn_gate_exps`` / ``ffn_up_exps`` ``[n_embd, n_ff_exp, n_expert]`` and
  ``ffn_down_exps`` ``[n_ff_exp, n_embd, n_expert]`` (numpy order: expert first).
- ``qwen35`` / ``qwen35moe`` interleave Gated DeltaNet layers with gated full-attention layers:
  layer ``i`` is recurrent unless ``(i + 1) % full_attention_interval == 0`` (llama.cpp's default
  when the file has no ``attention.recurrent_layers`` array). Every layer has ``attn_norm`` and
  ``post_attention_norm`` (the FFN's input norm). A recurrent layer has ``attn_qkv``
  ``[n_embd, 2 key_dim + value_dim]`` (q, k, v rows in that order, ``key_dim = ssm.state_size *
  ssm.group_count``, ``value_dim = ssm.inner_size = ssm.state_size * ssm.time_step_rank``),
  ``attn_gate`` ``[n_embd, value_dim]`` (the output gate z), ``ssm_conv1d`` ``[conv_kernel,
  2 key_dim + value_dim]`` (F32, never quantized), ``ssm_dt.bias`` and ``ssm_a`` (no ``.weight``
  suffix; ``-exp(A_log)``) ``[time_step_rank]``, ``ssm_beta`` / ``ssm_alpha``
  ``[n_embd, time_step_rank]``, ``ssm_norm`` ``[state_size]`` and ``ssm_out`` ``[value_dim, n_embd]``.
  A full-attention layer has ``attn_q`` ``[n_embd, 2 n_head head_dim]`` (per head: head_dim query
  rows then head_dim gate rows), ``attn_k`` / ``attn_v``, ``attn_output`` and the per-head
  ``attn_q_norm`` / ``attn_k_norm``. The FFN is dense SwiGLU (``qwen35``) or, for ``qwen35moe``,
  the router and stacked experts of ``qwen3moe`` plus a shared expert: ``ffn_gate_inp_shexp``
  ``[n_embd]`` (its sigmoid gate, F32), ``ffn_gate_shexp`` / ``ffn_up_shexp``
  ``[n_embd, n_ff_shexp]`` and ``ffn_down_shexp`` ``[n_ff_shexp, n_embd]``.

Order: for ``qwen2`` / ``llama`` the order ``convert_hf_to_gguf.py`` emits them for a single-file
Hugging Face checkpoint, i.e. sorted by Hugging Face name (``lm_head`` < ``model.embed_tokens`` <
``model.layers.0.*`` < ``model.layers.1.*`` < ``model.layers.10.*`` < ... < ``model.norm``), which
is what the real Qwen2.5 GGUF files show. For ``qwen3`` / ``qwen3moe`` / ``qwen35`` / ``qwen35moe``
the order of a file written
by today's ``llama-quantize``: its ``weights_map`` is a ``std::map`` ordered by
``weight_name_comparer`` (``src/llama-model-loader.h``: the ``blk.N.`` layer number, -1 for the
other tensors, then the name), and it writes the tensors in that order, so the file starts with
``output.weight``, ``output_norm.weight``, ``token_embd.weight`` and then has layer 0, 1, 2, ...
with each layer's tensors sorted by name.

Types: ``quant_types`` follows llama.cpp's ``llama_tensor_get_type`` (``src/llama-quant.cpp``) for
the mixes fak writes. For ``Q4_K_M``: ``output.weight`` (and a tied ``token_embd.weight``) Q6_K;
``attn_v.weight`` and ``ffn_down.weight`` Q6_K where ``use_more_bits(i, n)`` holds, i.e.
``i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2`` with integer division, Q4_K elsewhere; other 2-D
and 3-D weights Q4_K; 1-D tensors (norms, biases) and the MoE router ``ffn_gate_inp`` stay F32.
``i`` is llama.cpp's running count of ``attn_v`` (or ``ffn_down``) tensors *in file order*, not
the layer number, so with the string order above the "more bits" set of a 28-layer model is layers
{0, 1, 5-10, 13, 16, 19, 21, 24, 27} (checked against the real Qwen2.5-Coder-1.5B Q4_K_M file); in
the layer order of ``qwen3`` files the count is the layer number. For a model with experts
(``n_expert > 1``) llama.cpp takes ``i`` of ``ffn_down`` / ``ffn_down_exps`` from the tensor's
name (``layer_info``), and a model of exactly 8 experts (Mixtral's rule) gets ``attn_v`` and
``attn_k`` in Q8_0 and ``attn_output`` in Q5_K. In the hybrids a recurrent layer's ``attn_qkv`` is
"attention-v-like" for llama.cpp (``category_is_attn_v``): it takes the ``attn_v`` rule and counter,
so ``i`` is the layer number there too; ``ffn_down_shexp`` follows the ``ffn_down`` rule (layer from
the name); ``ssm_conv1d`` stays F32 and ``ssm_a`` (no ``weight`` suffix) is never quantized; the
small ``ssm_alpha`` / ``ssm_beta`` take the base type. A row length that is not a multiple of the type's
block size falls back as llama.cpp's ``tensor_type_fallback`` does (Q2_K/Q3_K → Q4_0, Q4_K → Q5_0,
Q5_K → Q5_1, Q6_K → Q8_0, then F16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fak.synth.blocks import format_of

__all__ = ["FILE_TYPES", "HYBRID_ARCHS", "MIXES", "Arch", "ArchConfig", "TensorSpec", "layer_of", "quant_types",
           "quantize_order_key", "tensor_layout", "use_more_bits"]

Role = Literal["weight", "embedding", "norm", "bias", "router", "conv", "ssm_a", "ssm_dt"]

Arch = Literal["qwen2", "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe"]

HYBRID_ARCHS = ("qwen35", "qwen35moe")
"""Architectures with Gated DeltaNet (recurrent) layers between full-attention layers."""


@dataclass(frozen=True)
class ArchConfig:
    """Hyper-parameters of a decoder-only transformer (names as in the GGUF metadata keys).

    ``n_embd`` is ``{arch}.embedding_length``, ``n_ff`` ``feed_forward_length``, ``n_head`` /
    ``n_head_kv`` ``attention.head_count`` / ``head_count_kv``, ``n_ctx_train``
    ``context_length``. The head dimension is ``n_embd_head`` (``attention.key_length`` =
    ``value_length``) when given, else ``n_embd // n_head``. ``qk_norm``: per-head RMSNorm of Q
    and K (qwen3). ``n_expert`` / ``n_expert_used`` / ``n_ff_exp``: ``expert_count`` /
    ``expert_used_count`` / ``expert_feed_forward_length`` of a MoE model (0: dense).

    Hybrids (``qwen35``, ``qwen35moe``): ``ssm_conv_kernel`` / ``ssm_state_size`` /
    ``ssm_group_count`` / ``ssm_time_step_rank`` are ``ssm.conv_kernel`` (taps of the causal
    convolution), ``ssm.state_size`` (head dimension of the linear-attention q, k and v heads),
    ``ssm.group_count`` (q/k heads) and ``ssm.time_step_rank`` (v heads; a multiple of the q/k
    heads); ``full_attention_interval`` makes every n-th layer full attention; ``n_rot`` is
    ``rope.dimension_count`` (partial RoPE: the first ``n_rot`` of ``head_dim`` dimensions rotate)
    and ``rope_sections`` ``rope.dimension_sections`` (M-RoPE sections, 4 ints); ``n_ff_shexp``
    is ``expert_shared_feed_forward_length`` (the shared expert of ``qwen35moe``).
    """

    arch: Arch
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
    n_embd_head: int | None = None
    qk_norm: bool = False
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    ssm_conv_kernel: int = 0
    ssm_state_size: int = 0
    ssm_group_count: int = 0
    ssm_time_step_rank: int = 0
    full_attention_interval: int = 0
    n_rot: int | None = None
    rope_sections: tuple[int, ...] = ()
    n_ff_shexp: int = 0

    def __post_init__(self) -> None:
        if self.n_embd_head is None and self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_ff, self.n_vocab, self.n_ctx_train,
               self.head_dim) <= 0:
            raise ValueError(f"all sizes must be positive: {self}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE rotates pairs)")
        if self.n_expert:
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ValueError(f"n_expert_used {self.n_expert_used} must be in 1..n_expert ({self.n_expert})")
            if self.n_ff_exp <= 0:
                raise ValueError(f"n_ff_exp {self.n_ff_exp} must be positive for a MoE model")
            if self.n_expert > 512:  # LLAMA_MAX_EXPERTS
                raise ValueError(f"n_expert {self.n_expert} is more than llama.cpp's LLAMA_MAX_EXPERTS (512)")
        if self.is_hybrid:
            self._check_hybrid()

    def _check_hybrid(self) -> None:
        ssm = (self.ssm_conv_kernel, self.ssm_state_size, self.ssm_group_count, self.ssm_time_step_rank,
               self.full_attention_interval)
        if min(ssm) <= 0:
            raise ValueError(f"{self.arch} needs positive ssm_conv_kernel, ssm_state_size, ssm_group_count, "
                             f"ssm_time_step_rank and full_attention_interval, got {ssm}")
        if self.ssm_time_step_rank % self.ssm_group_count:
            raise ValueError(f"ssm_time_step_rank (v heads) {self.ssm_time_step_rank} is not a multiple of "
                             f"ssm_group_count (q/k heads) {self.ssm_group_count}")
        if self.rope_dim <= 0 or self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"n_rot {self.rope_dim} must be even and in 2..head_dim ({self.head_dim})")
        if len(self.rope_sections) != 4 or min(self.rope_sections) < 0 or not any(self.rope_sections) \
                or sum(self.rope_sections) > self.head_dim:  # ggml_mrope_cache_init: sect_dims <= ne0
            raise ValueError(f"rope_sections must be 4 non-negative ints, not all 0, summing to at most head_dim "
                             f"({self.head_dim}): {self.rope_sections}")
        if self.arch == "qwen35moe" and self.n_ff_shexp <= 0:
            raise ValueError(f"qwen35moe needs a positive n_ff_shexp (the shared expert), got {self.n_ff_shexp}")

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head (``attention.key_length``)."""
        return self.n_embd_head if self.n_embd_head is not None else self.n_embd // self.n_head

    @property
    def q_dim(self) -> int:
        """Rows of ``attn_q`` (``n_head * head_dim``), columns of ``attn_output``."""
        return self.n_head * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_hybrid(self) -> bool:
        """Gated DeltaNet layers between full-attention layers (``qwen35``, ``qwen35moe``)."""
        return self.arch in HYBRID_ARCHS

    @property
    def rope_dim(self) -> int:
        """Rotated dimensions per head (``rope.dimension_count``; default the whole head)."""
        return self.n_rot if self.n_rot is not None else self.head_dim

    @property
    def ssm_key_dim(self) -> int:
        """Rows of q (and of k) in a recurrent layer's ``attn_qkv``: ``state_size * group_count``."""
        return self.ssm_state_size * self.ssm_group_count

    @property
    def ssm_inner_size(self) -> int:
        """``ssm.inner_size``: rows of v and of the gate z, ``state_size * time_step_rank``."""
        return self.ssm_state_size * self.ssm_time_step_rank

    @property
    def ssm_conv_channels(self) -> int:
        """Channels of the causal convolution (rows of ``attn_qkv``): ``2 key_dim + inner_size``."""
        return 2 * self.ssm_key_dim + self.ssm_inner_size

    def is_recurrent(self, layer: int) -> bool:
        """Whether ``layer`` is a Gated DeltaNet layer (llama.cpp's ``hparams.is_recr``, from
        ``full_attention_interval``: every n-th layer, counting from 1, is full attention)."""
        return self.is_hybrid and (layer + 1) % self.full_attention_interval != 0


@dataclass
class TensorSpec:
    """One tensor to write.

    ``shape`` is numpy order, slowest axis first: a weight of ``n_out`` rows of ``k`` inputs is
    ``(n_out, k)`` (ggml ``ne = [k, n_out]``); stacked experts are ``(n_expert, n_out, k)``.
    ``role`` picks the value distribution of a synthetic tensor (``norm``: about 1.0; ``bias``,
    ``weight``, ``embedding``: about 0; ``router``: a MoE router, wider so that routing is not
    uniform, see ``fak.synth.writer``).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: Role = "weight"
    hf_name: str = field(default="", repr=False)


def _hybrid_layer_tensors(cfg: ArchConfig, i: int) -> list[TensorSpec]:
    """Layer ``i`` of a ``qwen35`` / ``qwen35moe`` model (see the module docstring). Hugging Face
    names of Qwen3.5's checkpoints (``linear_attn.*``, ``self_attn.*``, ``mlp.*``)."""
    e, kv, q, d = cfg.n_embd, cfg.n_head_kv * cfg.head_dim, cfg.q_dim, cfg.head_dim
    hf = f"model.layers.{i}."
    blk = f"blk.{i}."
    out = [
        TensorSpec(blk + "attn_norm.weight", (e,), "F32", "norm", hf + "input_layernorm.weight"),
        TensorSpec(blk + "post_attention_norm.weight", (e,), "F32", "norm", hf + "post_attention_layernorm.weight"),
    ]
    if cfg.is_recurrent(i):
        la = hf + "linear_attn."
        ch, inner, heads = cfg.ssm_conv_channels, cfg.ssm_inner_size, cfg.ssm_time_step_rank
        out += [
            TensorSpec(blk + "attn_qkv.weight", (ch, e), "F32", "weight", la + "in_proj_qkv.weight"),
            TensorSpec(blk + "attn_gate.weight", (inner, e), "F32", "weight", la + "in_proj_z.weight"),
            TensorSpec(blk + "ssm_conv1d.weight", (ch, cfg.ssm_conv_kernel), "F32", "conv", la + "conv1d.weight"),
            TensorSpec(blk + "ssm_dt.bias", (heads,), "F32", "ssm_dt", la + "dt_bias"),
            TensorSpec(blk + "ssm_a", (heads,), "F32", "ssm_a", la + "A_log"),
            TensorSpec(blk + "ssm_beta.weight", (heads, e), "F32", "weight", la + "in_proj_b.weight"),
            TensorSpec(blk + "ssm_alpha.weight", (heads, e), "F32", "weight", la + "in_proj_a.weight"),
            TensorSpec(blk + "ssm_norm.weight", (cfg.ssm_state_size,), "F32", "norm", la + "norm.weight"),
            TensorSpec(blk + "ssm_out.weight", (e, inner), "F32", "weight", la + "out_proj.weight"),
        ]
    else:
        sa = hf + "self_attn."
        out += [
            TensorSpec(blk + "attn_q.weight", (2 * q, e), "F32", "weight", sa + "q_proj.weight"),
            TensorSpec(blk + "attn_k.weight", (kv, e), "F32", "weight", sa + "k_proj.weight"),
            TensorSpec(blk + "attn_v.weight", (kv, e), "F32", "weight", sa + "v_proj.weight"),
            TensorSpec(blk + "attn_output.weight", (e, q), "F32", "weight", sa + "o_proj.weight"),
            TensorSpec(blk + "attn_q_norm.weight", (d,), "F32", "norm", sa + "q_norm.weight"),
            TensorSpec(blk + "attn_k_norm.weight", (d,), "F32", "norm", sa + "k_norm.weight"),
        ]
    mlp = hf + "mlp."
    if cfg.is_moe:
        x, fe, fs = cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp
        out += [
            TensorSpec(blk + "ffn_gate_inp.weight", (x, e), "F32", "router", mlp + "gate.weight"),
            TensorSpec(blk + "ffn_gate_exps.weight", (x, fe, e), "F32", "weight", mlp + "experts.gate_proj"),
            TensorSpec(blk + "ffn_up_exps.weight", (x, fe, e), "F32", "weight", mlp + "experts.up_proj"),
            TensorSpec(blk + "ffn_down_exps.weight", (x, e, fe), "F32", "weight", mlp + "experts.down_proj"),
            TensorSpec(blk + "ffn_gate_inp_shexp.weight", (e,), "F32", "weight", mlp + "shared_expert_gate.weight"),
            TensorSpec(blk + "ffn_gate_shexp.weight", (fs, e), "F32", "weight", mlp + "shared_expert.gate_proj.weight"),
            TensorSpec(blk + "ffn_up_shexp.weight", (fs, e), "F32", "weight", mlp + "shared_expert.up_proj.weight"),
            TensorSpec(blk + "ffn_down_shexp.weight", (e, fs), "F32", "weight", mlp + "shared_expert.down_proj.weight"),
        ]
    else:
        f = cfg.n_ff
        out += [
            TensorSpec(blk + "ffn_down.weight", (e, f), "F32", "weight", mlp + "down_proj.weight"),
            TensorSpec(blk + "ffn_gate.weight", (f, e), "F32", "weight", mlp + "gate_proj.weight"),
            TensorSpec(blk + "ffn_up.weight", (f, e), "F32", "weight", mlp + "up_proj.weight"),
        ]
    return out


def _layer_tensors(cfg: ArchConfig, i: int) -> list[TensorSpec]:
    if cfg.is_hybrid:
        return _hybrid_layer_tensors(cfg, i)
    e, f, kv, q = cfg.n_embd, cfg.n_ff, cfg.n_head_kv * cfg.head_dim, cfg.q_dim
    hf = f"model.layers.{i}."
    blk = f"blk.{i}."
    out = [
        TensorSpec(blk + "attn_norm.weight", (e,), "F32", "norm", hf + "input_layernorm.weight"),
        TensorSpec(blk + "ffn_norm.weight", (e,), "F32", "norm", hf + "post_attention_layernorm.weight"),
        TensorSpec(blk + "attn_k.weight", (kv, e), "F32", "weight", hf + "self_attn.k_proj.weight"),
        TensorSpec(blk + "attn_output.weight", (e, q), "F32", "weight", hf + "self_attn.o_proj.weight"),
        TensorSpec(blk + "attn_q.weight", (q, e), "F32", "weight", hf + "self_attn.q_proj.weight"),
        TensorSpec(blk + "attn_v.weight", (kv, e), "F32", "weight", hf + "self_attn.v_proj.weight"),
    ]
    if cfg.is_moe:
        x, fe = cfg.n_expert, cfg.n_ff_exp
        out += [
            TensorSpec(blk + "ffn_gate_inp.weight", (x, e), "F32", "router", hf + "mlp.gate.weight"),
            TensorSpec(blk + "ffn_gate_exps.weight", (x, fe, e), "F32", "weight", hf + "mlp.experts.gate_proj"),
            TensorSpec(blk + "ffn_up_exps.weight", (x, fe, e), "F32", "weight", hf + "mlp.experts.up_proj"),
            TensorSpec(blk + "ffn_down_exps.weight", (x, e, fe), "F32", "weight", hf + "mlp.experts.down_proj"),
        ]
    else:
        out += [
            TensorSpec(blk + "ffn_down.weight", (e, f), "F32", "weight", hf + "mlp.down_proj.weight"),
            TensorSpec(blk + "ffn_gate.weight", (f, e), "F32", "weight", hf + "mlp.gate_proj.weight"),
            TensorSpec(blk + "ffn_up.weight", (f, e), "F32", "weight", hf + "mlp.up_proj.weight"),
        ]
    if cfg.qk_norm:
        d = cfg.head_dim
        out += [
            TensorSpec(blk + "attn_k_norm.weight", (d,), "F32", "norm", hf + "self_attn.k_norm.weight"),
            TensorSpec(blk + "attn_q_norm.weight", (d,), "F32", "norm", hf + "self_attn.q_norm.weight"),
        ]
    if cfg.attn_bias:
        out += [
            TensorSpec(blk + "attn_k.bias", (kv,), "F32", "bias", hf + "self_attn.k_proj.bias"),
            TensorSpec(blk + "attn_q.bias", (q,), "F32", "bias", hf + "self_attn.q_proj.bias"),
            TensorSpec(blk + "attn_v.bias", (kv,), "F32", "bias", hf + "self_attn.v_proj.bias"),
        ]
    return out


def layer_of(name: str) -> int:
    """The ``N`` of a ``blk.N.`` tensor name, -1 for any other name (``sscanf("blk.%d.")``)."""
    if not name.startswith("blk."):
        return -1
    digits = name[4:].split(".", 1)[0]
    return int(digits) if digits.isdigit() else -1


def quantize_order_key(name: str) -> tuple[int, str]:
    """Sort key of llama.cpp's ``weight_name_comparer``: layer number (-1 first), then the name."""
    return (layer_of(name), name)


def tensor_layout(cfg: ArchConfig) -> list[TensorSpec]:
    """Every tensor of ``cfg``'s model in file order (see the module docstring), all typed F32
    (``quant_types`` sets the types).

    ``qwen2`` / ``llama``: the converter's order (Hugging Face names sorted); ``qwen3`` /
    ``qwen3moe`` / ``qwen35`` / ``qwen35moe``: ``llama-quantize``'s output order
    (``quantize_order_key``).
    """
    specs = [TensorSpec("token_embd.weight", (cfg.n_vocab, cfg.n_embd), "F32", "embedding", "model.embed_tokens.weight"),
             TensorSpec("output_norm.weight", (cfg.n_embd,), "F32", "norm", "model.norm.weight")]
    if not cfg.tied_embeddings:
        specs.append(TensorSpec("output.weight", (cfg.n_vocab, cfg.n_embd), "F32", "weight", "lm_head.weight"))
    for i in range(cfg.n_layer):
        specs += _layer_tensors(cfg, i)
    if cfg.arch in ("qwen3", "qwen3moe") or cfg.is_hybrid:
        specs.sort(key=lambda t: quantize_order_key(t.name))
    else:
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
                overrides: dict[str, str] | None = None, n_expert: int = 0) -> None:
    """Set ``dtype`` of each 2-D and 3-D weight in ``specs`` (in place), as llama.cpp's quantizer
    would (``llama_tensor_get_type``; see the module docstring).

    Args:
        specs: the layout, in file order (the order matters for the Q4_K_M counters).
        weight_type: a ggml type name (``"Q8_0"``, ``"Q4_K"``, ``"F16"``, ...), applied to every
            2-D/3-D weight like ``llama-quantize --pure``, or a mix name from ``MIXES``
            (``"Q4_K_M"``). MoE routers (``ffn_gate_inp``), the hybrids' ``ssm_conv1d`` and 1-D
            tensors stay F32 either way.
        n_layer: number of blocks (``n_attention_wv`` / ``n_ffn_down`` in llama.cpp; in the hybrids
            every layer has one ``attn_v`` or one ``attn_qkv``, so the count is still the layers).
        overrides: tensor name → type, applied after the rule (like ``--tensor-type``); still
            subject to the block-size fallback.
        n_expert: ``{arch}.expert_count`` (0 for a dense model): with more than one expert the
            ``ffn_down`` rule takes the layer from the tensor's name; with exactly 8 the mix puts
            ``attn_v`` / ``attn_k`` in Q8_0 and ``attn_output`` in Q5_K.

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
        if len(t.shape) < 2 or t.role == "router" or "ssm_conv1d" in t.name:
            t.dtype = overrides.get(t.name, "F32") if t.role == "router" else "F32"
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
            elif t.name.endswith(("attn_v.weight", "attn_qkv.weight")):  # llama.cpp's category_is_attn_v
                if use_more_bits(i_attn_v, n_layer):
                    dtype = "Q6_K"
                if n_expert == 8:
                    dtype = "Q8_0"
                i_attn_v += 1
            elif t.name.endswith("attn_k.weight") and n_expert == 8:
                dtype = "Q8_0"
            elif t.name.endswith("attn_output.weight") and n_expert == 8:
                dtype = "Q5_K"
            elif ".ffn_down" in t.name:
                i_layer = layer_of(t.name) if n_expert > 1 else i_ffn_down
                if use_more_bits(i_layer, n_layer):
                    dtype = "Q6_K"
                i_ffn_down += 1
        if t.name in overrides:
            dtype = overrides[t.name]
        t.dtype = _fallback(dtype, row) if dtype not in ("F32", "F16", "BF16") else dtype
