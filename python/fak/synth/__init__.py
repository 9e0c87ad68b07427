"""Synthetic GGUF models: real architectures, real tokenizers, random but valid weights.

Two kinds of file, both valid GGUF v3 that llama.cpp and fak load:

- **Tiny models** (``write_tiny_model``): a complete qwen2, llama, qwen3, qwen3moe, or Qwen3.5/3.6
  hybrid (qwen35, qwen35moe) model of a few hundred KB to a few tens of MB, with the architecture's
  real tensor names, shapes and metadata keys,
  a real byte-level BPE tokenizer (``vocab.py``) and the family's chat template. For CI: engine,
  tokenizer and gateway tests run end to end on them, and llama.cpp's outputs on them are the
  parity goldens of the new architectures (``scripts/make_goldens.py --tiny``).
- **Twins** (``write_twin``): the exact tensor layout (names, shapes, types, order, alignment) of a
  real file (``like=``) or of a known release (``preset=``), filled with random valid blocks.
  Speed does not depend on weight values, so twins are what speed is measured on when the real
  weights are too big to move.

Weights are random (``blocks.py``): dequantized values have mean ≈ 0 and std ≈ 0.02, RMSNorm
weights ≈ 1.0, every f16 scale finite and of the magnitude real files have, so a forward pass gives
finite activations. Every file carries ``fak.synthetic`` (a string saying what it is) and is a pure
function of its arguments and ``seed``. Writing streams (``writer.py``): memory use does not grow
with the model size.

Example::

    from fak.synth import write_tiny_model, write_twin
    tiny = write_tiny_model("tiny.gguf", "qwen2", weight_type="Q8_0")
    twin = write_twin("7b.gguf", preset="qwen2.5-7b-q4_k_m")
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fak.errors import UnsupportedError
from fak.gguf import GGUFFile
from fak.synth.blocks import FORMATS
from fak.synth.hybrid import default_rope_sections, hybrid_arch_metadata
from fak.synth.layout import FILE_TYPES, HYBRID_ARCHS, MIXES, Arch, ArchConfig, TensorSpec, quant_types, tensor_layout
from fak.synth.vocab import FAMILIES, TokenizerSpec, build_tokenizer
from fak.synth.writer import GGUFPlan, MetaEntry, router_std, write_plan

__all__ = [
    "MIXES",
    "PRESETS",
    "ArchConfig",
    "GGUFPlan",
    "MetaEntry",
    "Preset",
    "TensorSpec",
    "build_tokenizer",
    "plan_tiny_model",
    "plan_twin",
    "router_tie_rows",
    "write_plan",
    "write_tiny_model",
    "write_twin",
]

QWEN2_SPECIAL_BASE = 151643  # id of <|endoftext|> in Qwen2.5's (and Qwen3's) vocabulary
QWEN35_SPECIAL_BASE = 248044  # id of <|endoftext|> in Qwen3.5's / Qwen3.6's vocabulary (248320 rows)


@dataclass(frozen=True)
class Preset:
    """A known release's layout: hyper-parameters, quant mix and ``general.*`` naming
    (``finetune`` empty: no ``general.finetune`` key)."""

    config: ArchConfig
    mix: str
    name: str
    basename: str
    finetune: str
    size_label: str
    special_base: int


PRESETS: dict[str, Preset] = {
    # Qwen2.5-7B-Instruct (config.json: hidden 3584, 28 layers, 28 heads, 4 KV heads, intermediate
    # 18944, vocab 152064, rope_theta 1e6, rms_norm_eps 1e-6, untied lm_head), Q4_K_M.
    "qwen2.5-7b-q4_k_m": Preset(
        ArchConfig("qwen2", n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944, n_vocab=152064,
                   n_ctx_train=32768, rope_freq_base=1e6, rms_eps=1e-6, tied_embeddings=False, attn_bias=True),
        mix="Q4_K_M", name="Qwen2.5 7B Instruct", basename="Qwen2.5", finetune="Instruct", size_label="7.6B",
        special_base=QWEN2_SPECIAL_BASE),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: the layout of the real file fak tests against.
    "qwen2.5-coder-1.5b-q4_k_m": Preset(
        ArchConfig("qwen2", n_layer=28, n_embd=1536, n_head=12, n_head_kv=2, n_ff=8960, n_vocab=151936,
                   n_ctx_train=32768, rope_freq_base=1e6, rms_eps=1e-6, tied_embeddings=False, attn_bias=True),
        mix="Q4_K_M", name="Qwen2.5 Coder 1.5B Instruct", basename="Qwen2.5-Coder", finetune="Instruct",
        size_label="1.5B", special_base=QWEN2_SPECIAL_BASE),
    # Qwen3-Coder-30B-A3B-Instruct, Q4_K_M (17.28 GiB, 579 tensors: 241 F32, 289 Q4_K, 49 Q6_K).
    # Hyper-parameters: its config.json (hidden 2048, 48 layers, 32 heads of head_dim 128, 4 KV heads,
    # intermediate 5472, 128 experts, 8 per token, moe_intermediate 768, vocab 151936, 262144
    # positions, rope_theta 1e7, rms_norm_eps 1e-6, untied lm_head). Metadata keys and their order:
    # the llama.cpp loader log of unsloth's Qwen3-Coder-30B-A3B-Instruct GGUF (also
    # expert_shared_feed_forward_length = 0). Types: llama.cpp's Q4_K_M rule over the quantizer's
    # layer order (layout.py): attn_v and ffn_down_exps Q6_K in the 24 layers where
    # use_more_bits(layer, 48) holds, output Q6_K, router and norms F32, the rest Q4_K; the type
    # counts and the 17.28 GiB are those of the published Q4_K_M of the same architecture
    # (unsloth Qwen3-30B-A3B-Q4_K_M.gguf: "type f32: 241, q4_K: 289, q6_K: 49, 17.28 GiB").
    "qwen3-coder-30b-a3b-q4_k_m": Preset(
        ArchConfig("qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5472, n_vocab=151936,
                   n_ctx_train=262144, rope_freq_base=1e7, rms_eps=1e-6, tied_embeddings=False, attn_bias=False,
                   n_embd_head=128, qk_norm=True, n_expert=128, n_expert_used=8, n_ff_exp=768),
        mix="Q4_K_M", name="Qwen3 Coder 30B A3B Instruct", basename="Qwen3-Coder", finetune="Instruct",
        size_label="30B-A3B", special_base=QWEN2_SPECIAL_BASE),
    # Qwen3-8B, Q4_K_M (Qwen/Qwen3-8B config.json: hidden 4096, 36 layers, 32 heads of head_dim 128,
    # 8 KV heads, intermediate 12288, vocab 151936, 40960 positions, rope_theta 1e6, rms_norm_eps 1e-6,
    # untied lm_head); llama.cpp's Q4_K_M rule as above (18 layers' attn_v / ffn_down in Q6_K).
    "qwen3-8b-q4_k_m": Preset(
        ArchConfig("qwen3", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288, n_vocab=151936,
                   n_ctx_train=40960, rope_freq_base=1e6, rms_eps=1e-6, tied_embeddings=False, attn_bias=False,
                   n_embd_head=128, qk_norm=True),
        mix="Q4_K_M", name="Qwen3 8B", basename="Qwen3", finetune="", size_label="8B",
        special_base=QWEN2_SPECIAL_BASE),
    # Qwen3.6-27B, Q4_K_M (dense hybrid, general.architecture qwen35). Hyper-parameters: the model
    # card / config.json text_config (hidden 5120, 64 layers = 16 x (3 Gated DeltaNet + 1 gated
    # attention), attention 24 q heads / 4 kv heads of head_dim 256, partial_rotary_factor 0.25 ->
    # 64 rotated dims, mrope_section [11, 11, 10], rope_theta 1e7, Gated DeltaNet 48 v heads / 16
    # q-k heads of 128, conv kernel 4, intermediate 17408, vocab 248320, 262144 positions, untied
    # lm_head). Metadata keys, values and order: the llama.cpp loader log of a Qwen3.6-27B GGUF
    # (ssm.time_step_rank 48, ssm.inner_size 6144, ssm.group_count 16, full_attention_interval 4,
    # rope.dimension_count 64). Without the MTP block (nextn_predict_layers: newer conversions add
    # it as a 65th block that the main pass never runs). Types: llama.cpp's Q4_K_M rule (layout.py).
    "qwen3.6-27b-q4_k_m": Preset(
        ArchConfig("qwen35", n_layer=64, n_embd=5120, n_head=24, n_head_kv=4, n_ff=17408, n_vocab=248320,
                   n_ctx_train=262144, rope_freq_base=1e7, rms_eps=1e-6, tied_embeddings=False, attn_bias=False,
                   n_embd_head=256, qk_norm=True, ssm_conv_kernel=4, ssm_state_size=128, ssm_group_count=16,
                   ssm_time_step_rank=48, full_attention_interval=4, n_rot=64, rope_sections=(11, 11, 10, 0)),
        mix="Q4_K_M", name="Qwen3.6 27B", basename="Qwen3.6", finetune="", size_label="27B",
        special_base=QWEN35_SPECIAL_BASE),
    # Qwen3.6-35B-A3B, Q4_K_M (qwen35moe): the model card (hidden 2048, 40 layers = 10 x (3 Gated
    # DeltaNet + 1 gated attention), attention 16 q / 2 kv heads of 256, 64 rotated dims, Gated
    # DeltaNet 32 v heads / 16 q-k heads of 128, 256 experts, 8 routed + 1 shared, expert
    # intermediate 512, vocab 248320, 262144 positions); the loader logs of its GGUFs for the keys
    # (expert_shared_feed_forward_length 512, ssm.inner_size 4096, no feed_forward_length) and their
    # order; 733 tensors, 301 of them F32, as llama.cpp counts in the published files.
    "qwen3.6-35b-a3b-q4_k_m": Preset(
        ArchConfig("qwen35moe", n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, n_ff=512, n_vocab=248320,
                   n_ctx_train=262144, rope_freq_base=1e7, rms_eps=1e-6, tied_embeddings=False, attn_bias=False,
                   n_embd_head=256, qk_norm=True, n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512,
                   ssm_conv_kernel=4, ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=32,
                   full_attention_interval=4, n_rot=64, rope_sections=(11, 11, 10, 0)),
        mix="Q4_K_M", name="Qwen3.6 35B A3B", basename="Qwen3.6", finetune="", size_label="35B-A3B",
        special_base=QWEN35_SPECIAL_BASE),
}

# Per-family defaults of the tiny models: (rope_freq_base, rms_eps, tied, attn_bias).
_TINY_DEFAULTS: dict[str, tuple[float, float, bool, bool]] = {
    "qwen2": (1e6, 1e-6, False, True),
    "llama": (5e5, 1e-5, True, False),
    "qwen3": (1e6, 1e-6, False, False),
    "qwen3moe": (1e7, 1e-6, False, False),
    "qwen35": (1e7, 1e-6, False, False),
    "qwen35moe": (1e7, 1e-6, False, False),
}


def _model_metadata(cfg: ArchConfig, *, name: str, file_type: int, tokenizer: list[MetaEntry],
                    general: list[tuple[str, str]], provenance: str,
                    arch_extra: list[MetaEntry] | None = None) -> list[MetaEntry]:
    """Metadata in the order llama.cpp writes it: the converter's order for qwen2 / llama (as the
    real Qwen2.5 files show), for qwen3 / qwen3moe the order of the real Qwen3 GGUFs' loader
    logs (``expert_used_count`` between the norm epsilon and ``key_length``, the expert sizes
    after ``value_length``, ``general.file_type`` last, after ``quantization_version``), for the
    hybrids that of the real Qwen3.6 GGUFs (``fak.synth.hybrid.hybrid_arch_metadata``).
    ``arch_extra`` (e.g. sliding-window keys) follows the architecture's own keys."""
    a = cfg.arch
    meta = [MetaEntry("general.architecture", "STRING", a), MetaEntry("general.type", "STRING", "model"),
            MetaEntry("general.name", "STRING", name)]
    meta += [MetaEntry(f"general.{k}", "STRING", v) for k, v in general if v]
    if cfg.is_hybrid:
        meta += hybrid_arch_metadata(cfg) + (arch_extra or []) + tokenizer
        meta += [MetaEntry("general.quantization_version", "UINT32", 2),
                 MetaEntry("general.file_type", "UINT32", file_type),
                 MetaEntry("fak.synthetic", "STRING", provenance)]
        return meta
    meta += [
        MetaEntry(f"{a}.block_count", "UINT32", cfg.n_layer),
        MetaEntry(f"{a}.context_length", "UINT32", cfg.n_ctx_train),
        MetaEntry(f"{a}.embedding_length", "UINT32", cfg.n_embd),
        MetaEntry(f"{a}.feed_forward_length", "UINT32", cfg.n_ff),
        MetaEntry(f"{a}.attention.head_count", "UINT32", cfg.n_head),
        MetaEntry(f"{a}.attention.head_count_kv", "UINT32", cfg.n_head_kv),
        MetaEntry(f"{a}.rope.freq_base", "FLOAT32", cfg.rope_freq_base),
        MetaEntry(f"{a}.attention.layer_norm_rms_epsilon", "FLOAT32", cfg.rms_eps),
    ]
    if cfg.is_moe:
        meta.append(MetaEntry(f"{a}.expert_used_count", "UINT32", cfg.n_expert_used))
    if a in ("llama", "qwen3", "qwen3moe"):
        meta += [MetaEntry(f"{a}.attention.key_length", "UINT32", cfg.head_dim),
                 MetaEntry(f"{a}.attention.value_length", "UINT32", cfg.head_dim)]
    if cfg.is_moe:
        meta += [MetaEntry(f"{a}.expert_count", "UINT32", cfg.n_expert),
                 MetaEntry(f"{a}.expert_feed_forward_length", "UINT32", cfg.n_ff_exp),
                 MetaEntry(f"{a}.expert_shared_feed_forward_length", "UINT32", 0)]
    meta += arch_extra or []
    late_file_type = a in ("qwen3", "qwen3moe")
    if not late_file_type:
        meta.append(MetaEntry("general.file_type", "UINT32", file_type))
    if a == "llama":
        meta += [MetaEntry("llama.vocab_size", "UINT32", cfg.n_vocab),
                 MetaEntry("llama.rope.dimension_count", "UINT32", cfg.head_dim)]
    meta += tokenizer
    meta.append(MetaEntry("general.quantization_version", "UINT32", 2))
    if late_file_type:
        meta.append(MetaEntry("general.file_type", "UINT32", file_type))
    meta.append(MetaEntry("fak.synthetic", "STRING", provenance))
    return meta


def _tokenizer_entries(spec: TokenizerSpec) -> list[MetaEntry]:
    return [MetaEntry(k, t, v) for k, t, v in spec.metadata()]


def plan_tiny_model(arch: Arch = "qwen2", *, n_layer: int | None = None, n_embd: int = 64,
                    n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, n_vocab: int | None = None,
                    ctx: int = 2048, weight_type: str = "Q8_0", tied_embeddings: bool | None = None,
                    tensor_types: dict[str, str] | None = None, rope_freq_base: float | None = None,
                    rms_eps: float | None = None, sliding_window: int | None = None,
                    sliding_window_pattern: int | list[bool] | None = None, head_dim: int | None = None,
                    n_expert: int | None = None, n_expert_used: int | None = None, n_ff_exp: int | None = None,
                    router_ties: int = 0, ssm_state_size: int | None = None, ssm_group_count: int | None = None,
                    ssm_time_step_rank: int | None = None, ssm_conv_kernel: int | None = None,
                    full_attention_interval: int | None = None, n_rot: int | None = None,
                    rope_sections: list[int] | None = None, n_ff_shexp: int | None = None,
                    seed: int = 0) -> GGUFPlan:
    """The plan (metadata and tensor layout) of a tiny model; ``write_tiny_model`` writes it.

    Arguments are those of ``write_tiny_model``. Raises ``ValueError`` for inconsistent sizes or an
    unknown type.
    """
    if arch not in FAMILIES:
        raise ValueError(f"unknown architecture {arch!r}; fak.synth writes: {', '.join(FAMILIES)}")
    moe = arch in ("qwen3moe", "qwen35moe")
    hybrid = arch in HYBRID_ARCHS
    if not moe and any(v is not None for v in (n_expert, n_expert_used, n_ff_exp)) or (not moe and router_ties):
        raise ValueError(f"n_expert, n_expert_used, n_ff_exp and router_ties apply to qwen3moe / qwen35moe, not {arch}")
    ssm_args: dict[str, Any] = {"ssm_state_size": ssm_state_size, "ssm_group_count": ssm_group_count,
                "ssm_time_step_rank": ssm_time_step_rank, "ssm_conv_kernel": ssm_conv_kernel,
                "full_attention_interval": full_attention_interval, "n_rot": n_rot, "rope_sections": rope_sections}
    if not hybrid and any(v is not None for v in ssm_args.values()):
        raise ValueError(f"{', '.join(k for k, v in ssm_args.items() if v is not None)} apply to qwen35 / qwen35moe, "
                         f"not {arch}")
    if n_ff_shexp is not None and arch != "qwen35moe":
        raise ValueError(f"n_ff_shexp (the shared expert) applies to qwen35moe, not {arch}")
    if head_dim is not None and arch not in ("qwen3", "qwen3moe", *HYBRID_ARCHS):
        raise ValueError(f"head_dim applies to qwen3 / qwen3moe / qwen35 / qwen35moe; {arch}'s head dimension is "
                         f"n_embd / n_head")
    if n_layer is None:
        n_layer = 4 if hybrid else 2  # a hybrid's 4th layer is its first full-attention layer
    if arch in ("qwen3", "qwen3moe", *HYBRID_ARCHS) and head_dim is None:
        if (2 * n_embd) % n_head:
            raise ValueError(f"2 * n_embd ({2 * n_embd}) is not a multiple of n_head {n_head}: give head_dim")
        head_dim = 2 * n_embd // n_head  # q_dim = 2 * n_embd != n_embd, as in Qwen3-30B-A3B
    tok = build_tokenizer(arch, n_vocab)
    rope_default, eps_default, tied_default, bias = _TINY_DEFAULTS[arch]
    cfg = ArchConfig(
        arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_vocab=tok.n_vocab,
        n_ctx_train=ctx, rope_freq_base=rope_freq_base or rope_default, rms_eps=rms_eps or eps_default,
        tied_embeddings=tied_default if tied_embeddings is None else tied_embeddings, attn_bias=bias,
        n_embd_head=head_dim, qk_norm=arch in ("qwen3", "qwen3moe", *HYBRID_ARCHS),
        n_expert=(32 if n_expert is None else n_expert) if moe else 0,
        n_expert_used=(4 if n_expert_used is None else n_expert_used) if moe else 0,
        n_ff_exp=(n_embd if n_ff_exp is None else n_ff_exp) if moe else 0,
        **(_tiny_hybrid_args(arch, head_dim or 0, n_embd if n_ff_exp is None else n_ff_exp, ssm_args, n_ff_shexp)
           if hybrid else {}))
    if moe and cfg.n_expert < 2:
        raise ValueError(f"a {arch} model needs at least 2 experts, got {cfg.n_expert}")
    tensors = tensor_layout(cfg)
    quant_types(tensors, weight_type, n_layer=n_layer, overrides=tensor_types, n_expert=cfg.n_expert)
    values = {}
    if router_ties:
        if router_ties < 2 or router_ties > cfg.n_expert:
            raise ValueError(f"router_ties {router_ties} must be a group size in 2..n_expert ({cfg.n_expert})")
        for t in tensors:
            if t.role == "router":
                if t.dtype != "F32":
                    raise ValueError(f"router_ties needs F32 routers, {t.name} is {t.dtype}")
                values[t.name] = _tied_router_fill(cfg.n_expert, cfg.n_embd, router_ties)
    file_type = FILE_TYPES.get(weight_type, 0)
    what = f"tiny {arch} model, weight_type {weight_type}"
    if router_ties:
        what += f", router rows tied in groups of {router_ties}"
    meta = _model_metadata(cfg, name=f"fak tiny {arch}", file_type=file_type, tokenizer=_tokenizer_entries(tok),
                           general=[("size_label", _size_label(cfg))],
                           provenance=f"{what}, random weights (seed {seed})",
                           arch_extra=_sliding_window_entries(arch, n_layer, sliding_window, sliding_window_pattern))
    return GGUFPlan(arch, meta, tensors, values=values)


def _tiny_hybrid_args(arch: str, head_dim: int, n_ff_exp: int, given: dict[str, Any],
                      n_ff_shexp: int | None) -> dict[str, Any]:
    """ArchConfig's hybrid fields of a tiny model: the given ones, the rest defaulted (4 taps, 64-wide
    Gated DeltaNet heads, 2 q/k heads, 4 v heads, every 4th layer full attention, a quarter of each
    attention head rotated as in Qwen3.5, Qwen3.5's section split, shared expert as wide as one)."""
    n_rot = given["n_rot"] if given["n_rot"] is not None else max(2, head_dim // 4 // 2 * 2)
    sections = given["rope_sections"]
    out: dict[str, Any] = {
        "ssm_state_size": 64, "ssm_group_count": 2, "ssm_time_step_rank": 4, "ssm_conv_kernel": 4,
        "full_attention_interval": 4,
        **{k: v for k, v in given.items() if v is not None and k not in ("n_rot", "rope_sections")},
        "n_rot": n_rot,
        "rope_sections": tuple(sections) if sections is not None else default_rope_sections(n_rot),
    }
    if arch == "qwen35moe":
        out["n_ff_shexp"] = n_ff_exp if n_ff_shexp is None else n_ff_shexp
    return out


def router_tie_rows(n_expert: int, n_embd: int, group: int, rng: np.random.Generator) -> np.ndarray:
    """Router weights ``[n_expert, n_embd]`` (float32) whose rows tie in groups of ``group``.

    Experts ``g*j .. g*j + g - 1`` share one random row (std ``router_std(n_embd)``), so their
    router logits are bit-identical for every token: an exact tie. With ``group >= 3`` the last
    expert of each group gets that row moved by one ulp towards +inf in every element
    (``np.nextafter``): its logit differs from the others' by rounding-level amounts, a near tie.
    With ``n_expert_used`` not a multiple of ``group``, some group always straddles the top-k
    boundary, so which tied expert llama.cpp keeps is exercised on every token.
    """
    n_groups = -(-n_expert // group)
    base = (rng.standard_normal((n_groups, n_embd), dtype=np.float32)
            * np.float32(router_std(n_embd))).astype(np.float32)
    rows = base[np.arange(n_expert) // group].copy()
    if group >= 3:
        last = np.arange(n_expert) % group == group - 1
        rows[last] = np.nextafter(rows[last], np.float32(np.inf))
    return rows


def _tied_router_fill(n_expert: int, n_embd: int, group: int):  # type: ignore[no-untyped-def]
    def fill(rng: np.random.Generator, count: int) -> np.ndarray:
        if count != n_expert * n_embd:
            raise AssertionError(f"router written in chunks of {count}, expected {n_expert * n_embd}")
        return router_tie_rows(n_expert, n_embd, group, rng).astype("<f4").view(np.uint8).reshape(-1)
    return fill


def _sliding_window_entries(arch: str, n_layer: int, window: int | None,
                            pattern: int | list[bool] | None) -> list[MetaEntry]:
    """The sliding-window keys (llama.cpp's ``LLM_KV_ATTENTION_SLIDING_WINDOW`` and
    ``..._PATTERN``) as ``gguf.GGUFWriter.add_sliding_window`` / ``add_sliding_window_pattern``
    write them: UINT32, and UINT32 or ARRAY[BOOL]."""
    out = []
    if window is not None:
        if window < 0:
            raise ValueError(f"sliding_window must be >= 0, got {window}")
        out.append(MetaEntry(f"{arch}.attention.sliding_window", "UINT32", int(window)))
    if pattern is not None:
        if isinstance(pattern, bool) or not isinstance(pattern, (int, list, tuple)):
            raise ValueError(f"sliding_window_pattern must be an int period or a list of bools, got {pattern!r}")
        if isinstance(pattern, int):
            if pattern < 0:
                raise ValueError(f"sliding_window_pattern must be >= 0, got {pattern}")
            out.append(MetaEntry(f"{arch}.attention.sliding_window_pattern", "UINT32", pattern))
        else:
            if len(pattern) != n_layer:
                raise ValueError(f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
            out.append(MetaEntry(f"{arch}.attention.sliding_window_pattern", "ARRAY[BOOL]", [bool(x) for x in pattern]))
    return out


def write_tiny_model(path: str | os.PathLike[str], arch: Arch = "qwen2", *,
                     n_layer: int | None = None, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128,
                     n_vocab: int | None = None, ctx: int = 2048, weight_type: str = "Q8_0",
                     tied_embeddings: bool | None = None, tensor_types: dict[str, str] | None = None,
                     rope_freq_base: float | None = None, rms_eps: float | None = None,
                     sliding_window: int | None = None, sliding_window_pattern: int | list[bool] | None = None,
                     head_dim: int | None = None, n_expert: int | None = None, n_expert_used: int | None = None,
                     n_ff_exp: int | None = None, router_ties: int = 0, ssm_state_size: int | None = None,
                     ssm_group_count: int | None = None, ssm_time_step_rank: int | None = None,
                     ssm_conv_kernel: int | None = None, full_attention_interval: int | None = None,
                     n_rot: int | None = None, rope_sections: list[int] | None = None, n_ff_shexp: int | None = None,
                     seed: int = 0) -> Path:
    """Write a complete tiny ``qwen2``, ``llama``, ``qwen3``, ``qwen3moe``, ``qwen35`` or
    ``qwen35moe`` model to ``path`` and return the path.

    Args:
        arch: ``"qwen2"`` (Q/K/V biases, untied ``output.weight``, rope base 1e6, eps 1e-6, Qwen2.5
            tokenizer conventions and ChatML template with tools), ``"llama"`` (no biases, tied
            embeddings so no ``output.weight``, rope base 5e5, eps 1e-5, Llama 3 conventions),
            ``"qwen3"`` (no biases, per-head Q/K RMSNorm ``attn_q_norm`` / ``attn_k_norm``, untied,
            rope base 1e6, eps 1e-6, Qwen3's 26 special tokens, a Qwen3 template: Hermes JSON tool
            calls and ``<think>``) or ``"qwen3moe"`` (qwen3 attention and an MoE FFN: router
            ``ffn_gate_inp`` and stacked experts ``ffn_{gate,up,down}_exps``, rope base 1e7 as
            Qwen3-Coder, a Qwen3-Coder template: XML tool calls ``<function=NAME><parameter=P>``),
            ``"qwen35"`` (the Qwen3.5/3.6 dense hybrid: Gated DeltaNet layers and every
            ``full_attention_interval``-th layer gated full attention with partial M-RoPE, a dense
            SwiGLU FFN, rope base 1e7, untied, Qwen3.5's 33 special tokens and ``qwen35``
            pre-tokenizer, a Qwen3.5 template: thinking on by default, XML tool calls) or
            ``"qwen35moe"`` (the same layers with qwen3moe's experts plus a sigmoid-gated shared
            expert).
        n_layer, n_embd, n_head, n_head_kv, n_ff: hyper-parameters; ``n_head % n_head_kv == 0``.
            ``n_layer`` defaults to 2, and to 4 for the hybrids (three recurrent layers and one
            full-attention layer).
            For qwen2 / llama the head dimension is ``n_embd // n_head`` (16 by default). For
            qwen3moe ``n_ff`` is only the ``feed_forward_length`` key (llama.cpp reads the experts'
            size from ``expert_feed_forward_length``).
        n_vocab: vocabulary size; default: the tokenizer's 256 bytes + 400 merges + specials rounded
            up to a multiple of 64 (704 for every family); larger values pad the vocabulary.
        ctx: ``{arch}.context_length`` (tokens).
        weight_type: type of every 2-D and 3-D weight (``"Q8_0"``, ``"Q4_0"``, ``"Q4_K"``,
            ``"Q6_K"``, ``"F16"``, ... any of ``fak.synth.blocks.FORMATS``), or ``"Q4_K_M"`` for
            llama.cpp's mix; MoE routers stay F32 as in real files. Where the row length
            (``n_embd``, or ``n_ff`` / ``n_ff_exp`` for the down projections, ``n_head * head_dim``
            for ``attn_output``) is not a multiple of the type's block size, the tensor falls back
            as llama.cpp does (Q4_K → Q5_0, Q6_K → Q8_0, ...): use ``n_embd=256, n_ff=512`` (and
            ``n_ff_exp=256``) to get real K-quant tensors.
        tied_embeddings: override the family default.
        tensor_types: tensor name → type overrides (e.g. ``{"output.weight": "Q6_K"}``).
        rope_freq_base, rms_eps: override the family defaults.
        sliding_window: write ``{arch}.attention.sliding_window`` (tokens; llama.cpp's key): the
            model declares sliding-window attention (docs/long-context.md). None: no key.
        sliding_window_pattern: write ``{arch}.attention.sliding_window_pattern``: a list of one
            bool per layer (True: windowed; what llama.cpp's converter writes from Hugging Face's
            ``layer_types``) or an int period ``n`` (llama.cpp's ``set_swa_pattern``: layer ``il``
            windowed iff ``n == 0 or il % n < n - 1``). None: no key (every layer windowed).
        head_dim: qwen3 / qwen3moe / qwen35 / qwen35moe: ``attention.key_length`` = ``value_length``. Default
            ``2 * n_embd // n_head``, so that ``n_head * head_dim`` (the rows of ``attn_q``) is not
            ``n_embd``, as in Qwen3-30B-A3B (2048 = 32 heads × 64, but its heads are 128 wide).
        n_expert, n_expert_used, n_ff_exp: qwen3moe / qwen35moe: ``expert_count`` (default 32, more than
            16 so that llama.cpp's expert sort takes the same introsort path as with the real 128),
            ``expert_used_count`` (default 4) and ``expert_feed_forward_length`` (default
            ``n_embd``). Router weights have std ``fak.synth.writer.router_std(n_embd)``: peaked,
            token-dependent routing.
        router_ties: qwen3moe / qwen35moe: when >= 2, each layer's router rows tie in groups of this
            size (``router_tie_rows``: exact ties, and one-ulp near ties for groups of 3 or more).
        ssm_state_size, ssm_group_count, ssm_time_step_rank, ssm_conv_kernel: qwen35 / qwen35moe:
            the Gated DeltaNet layers' ``ssm.state_size`` (head dimension of q, k and v, default 64),
            ``ssm.group_count`` (q/k heads, default 2), ``ssm.time_step_rank`` (v heads, default 4; a
            multiple of the q/k heads: llama.cpp maps v head ``h`` to q/k head ``h % group_count``)
            and ``ssm.conv_kernel`` (taps of the causal convolution, default 4, as the real models).
        full_attention_interval: qwen35 / qwen35moe: layer ``i`` is full attention iff
            ``(i + 1) % full_attention_interval == 0`` (default 4, as the real models).
        n_rot, rope_sections: qwen35 / qwen35moe: ``rope.dimension_count`` (rotated dimensions of
            each attention head, default a quarter of ``head_dim`` as Qwen3.5's
            ``partial_rotary_factor``) and ``rope.dimension_sections`` (default
            ``fak.synth.hybrid.default_rope_sections(n_rot)``).
        n_ff_shexp: qwen35moe only: ``expert_shared_feed_forward_length`` (default ``n_ff_exp``).
        seed: seed of the random weights (same arguments and seed → identical file).

    Raises:
        ValueError: inconsistent sizes, an argument given to an architecture without it, unknown
            architecture or type.
        OSError: the file cannot be written.
    """
    plan = plan_tiny_model(arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                           n_vocab=n_vocab, ctx=ctx, weight_type=weight_type, tied_embeddings=tied_embeddings,
                           tensor_types=tensor_types, rope_freq_base=rope_freq_base, rms_eps=rms_eps,
                           sliding_window=sliding_window, sliding_window_pattern=sliding_window_pattern,
                           head_dim=head_dim, n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp,
                           router_ties=router_ties, ssm_state_size=ssm_state_size, ssm_group_count=ssm_group_count,
                           ssm_time_step_rank=ssm_time_step_rank, ssm_conv_kernel=ssm_conv_kernel,
                           full_attention_interval=full_attention_interval, n_rot=n_rot, rope_sections=rope_sections,
                           n_ff_shexp=n_ff_shexp, seed=seed)
    return write_plan(path, plan, seed=seed)


def _size_label(cfg: ArchConfig) -> str:
    if cfg.is_hybrid:
        return _count_label(sum(int(np.prod(t.shape, dtype=np.int64)) for t in tensor_layout(cfg)))
    n = cfg.n_vocab * cfg.n_embd * (1 if cfg.tied_embeddings else 2)
    ffn = (3 * cfg.n_ff_exp + 1) * cfg.n_expert * cfg.n_embd if cfg.is_moe else 3 * cfg.n_embd * cfg.n_ff
    n += cfg.n_layer * (2 * cfg.n_embd * cfg.q_dim + 2 * cfg.n_embd * cfg.n_head_kv * cfg.head_dim + ffn)
    return _count_label(n)


def _count_label(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}".rstrip("0").rstrip(".") + unit
    return str(n)


# --- reading another file (twins) ---------------------------------------------------------------

def read_header(path: str | os.PathLike[str]) -> tuple[list[MetaEntry], list[TensorSpec], int]:
    """Metadata (in file order, with GGUF types), tensor specs and alignment of a GGUF file.

    Raises:
        fak.GGUFError: the file is not valid GGUF (message names the problem and byte offset).
        fak.UnsupportedError: a tensor type fak cannot generate (IQ*, TQ*, ...) or a nested
            metadata array.
    """
    with GGUFFile(path) as f:
        values, types = f.metadata, f.metadata_types
        meta = []
        for key, value in values.items():
            vtype = types[key]
            if vtype.count("ARRAY") > 1:
                raise UnsupportedError(f"metadata {key}: nested arrays cannot be copied by fak.synth")
            meta.append(MetaEntry(key, vtype, value))
        tensors = [_tensor_spec(t.name, tuple(t.shape), t.dtype) for t in f.tensors]
        return meta, tensors, int(f.alignment)


def _tensor_spec(name: str, shape: tuple[int, ...], dtype: str) -> TensorSpec:
    if dtype not in FORMATS:
        raise UnsupportedError(f"tensor {name}: type {dtype} cannot be generated by fak.synth "
                               f"(supported: {', '.join(FORMATS)})")
    role = "norm" if name.endswith("norm.weight") else "bias" if name.endswith(".bias") else "weight"
    # the hybrids' Gated DeltaNet parameters: a twin must run stably (negative ssm_a) for speed runs
    if name.endswith(".ssm_a"):
        role = "ssm_a"
    elif name.endswith(".ssm_dt.bias"):
        role = "ssm_dt"
    elif name.endswith(".ssm_conv1d.weight"):
        role = "conv"
    return TensorSpec(name, shape, dtype, role)  # type: ignore[arg-type]


def _copy_tokenizer(src: str | os.PathLike[str], n_vocab: int) -> list[MetaEntry]:
    """The ``tokenizer.*`` entries of ``src``, the vocabulary padded with ``[PAD<id>]`` unused tokens
    to ``n_vocab`` (as llama.cpp's converter pads Qwen's). Raises ``ValueError`` if it is larger."""
    meta, _, _ = read_header(src)
    out = []
    for e in meta:
        if not e.key.startswith("tokenizer."):
            continue
        if e.key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            values = list(e.value)  # type: ignore[call-overload]
            if len(values) > n_vocab:
                raise ValueError(f"{src}: tokenizer has {len(values)} tokens, more than the model's {n_vocab}")
            for i in range(len(values), n_vocab):
                values.append(f"[PAD{i}]" if e.key == "tokenizer.ggml.tokens"
                              else 5 if e.key == "tokenizer.ggml.token_type" else -1000.0)
            e = replace(e, value=values)
        out.append(e)
    if not out:
        raise ValueError(f"{src} has no tokenizer.* metadata")
    return out


def _replace_tokenizer(meta: list[MetaEntry], tokenizer: list[MetaEntry]) -> list[MetaEntry]:
    """``meta`` with its tokenizer keys replaced by ``tokenizer`` (at the first tokenizer key's place)."""
    out, placed = [], False
    for e in meta:
        if e.key.startswith("tokenizer."):
            if not placed:
                out += tokenizer
                placed = True
            continue
        out.append(e)
    if not placed:
        out += tokenizer
    return out


def plan_twin(*, like: str | os.PathLike[str] | None = None, preset: str | None = None, seed: int = 0,
              tokenizer_from: str | os.PathLike[str] | None = None) -> GGUFPlan:
    """The plan of a twin (see ``write_twin``); nothing is written."""
    if (like is None) == (preset is None):
        raise ValueError("give exactly one of like= (a real GGUF file) or preset= (a name in PRESETS)")
    if like is not None:
        meta, tensors, alignment = read_header(like)
        arch = next((e.value for e in meta if e.key == "general.architecture"), b"")
        arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        if tokenizer_from is not None:
            rows = next((t.shape[0] for t in tensors if t.name == "token_embd.weight"), None)
            n_vocab = rows if rows is not None else len(next(e.value for e in meta if e.key == "tokenizer.ggml.tokens"))  # type: ignore[arg-type]
            meta = _replace_tokenizer(meta, _copy_tokenizer(tokenizer_from, n_vocab))
        meta = [e for e in meta if e.key != "fak.synthetic"]
        meta.append(MetaEntry("fak.synthetic", "STRING", f"twin of {Path(like).name}: its header and tensor "
                                                          f"layout, random weights (seed {seed})"))
        return GGUFPlan(arch, meta, tensors, alignment)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    p = PRESETS[preset]
    cfg = p.config
    tensors = tensor_layout(cfg)
    quant_types(tensors, p.mix, n_layer=cfg.n_layer, n_expert=cfg.n_expert)
    if tokenizer_from is not None:
        tok = _copy_tokenizer(tokenizer_from, cfg.n_vocab)
    else:
        tok = _tokenizer_entries(build_tokenizer(cfg.arch, cfg.n_vocab, special_base=p.special_base))
    meta = _model_metadata(cfg, name=f"{p.name} (fak synthetic twin)", file_type=FILE_TYPES[p.mix], tokenizer=tok,
                           general=[("finetune", p.finetune), ("basename", p.basename), ("size_label", p.size_label)],
                           provenance=f"twin of preset {preset}: its tensor layout, random weights (seed {seed})")
    return GGUFPlan(cfg.arch, meta, tensors)


def write_twin(path: str | os.PathLike[str], *, like: str | os.PathLike[str] | None = None,
               preset: str | None = None, seed: int = 0, tokenizer_from: str | os.PathLike[str] | None = None,
               progress: Callable[[int, int], None] | None = None) -> Path:
    """Write a twin of a real layout to ``path`` and return the path.

    Args:
        like: a real GGUF file: the twin copies its whole header (every metadata key with its GGUF
            type and value, tokenizer and chat template included) and tensor layout (names,
            shapes, types, order, alignment), so tensor offsets relative to the data section are
            identical; ``fak.synthetic`` is the only key added. Written as GGUF v3.
        preset: a name in ``PRESETS`` (``"qwen2.5-7b-q4_k_m"``, ``"qwen2.5-coder-1.5b-q4_k_m"``,
            ``"qwen3-8b-q4_k_m"``, ``"qwen3-coder-30b-a3b-q4_k_m"``): the release's
            hyper-parameters and llama.cpp's Q4_K_M types (see ``layout.py`` and the sources
            beside each preset). Written in streams: a few tens of MB of memory at any size.
        seed: seed of the random weights.
        tokenizer_from: a real GGUF whose ``tokenizer.*`` keys the twin carries (its vocabulary
            padded with unused ``[PAD<id>]`` tokens to the model's rows). Without it a preset twin
            gets fak's synthetic BPE padded to the model's vocabulary, with the specials at Qwen's
            ids (``<|endoftext|>`` = 151643, ``<|im_end|>`` = 151645; Qwen3's ``<think>`` = 151667).
        progress: called as ``progress(done_bytes, total_bytes)`` while the data is written.

    Raises:
        ValueError: neither or both of ``like``/``preset``, an unknown preset, a tokenizer larger
            than the model's vocabulary.
        fak.UnsupportedError: ``like`` has tensor types fak cannot generate.
        OSError: a file cannot be read or written.
    """
    plan = plan_twin(like=like, preset=preset, seed=seed, tokenizer_from=tokenizer_from)
    return write_plan(path, plan, seed=seed, progress=progress)

