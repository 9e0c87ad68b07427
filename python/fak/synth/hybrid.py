"""The Qwen3.5/3.6 hybrids (``qwen35``, ``qwen35moe``): their metadata keys and tiny-model defaults.

Gated DeltaNet layers (llama.cpp's ``ssm.*`` keys) between gated full-attention layers; the tensor
layout is ``fak.synth.layout`` (``ArchConfig.is_hybrid``). Sources, in llama.cpp of 2026-10-01:
``src/models/qwen35.cpp`` / ``qwen35moe.cpp`` (``load_arch_hparams``: ``ssm.conv_kernel``,
``ssm.inner_size``, ``ssm.state_size``, ``ssm.time_step_rank``, ``ssm.group_count``, then
``attention.recurrent_layers`` or else ``full_attention_interval``; ``rope.dimension_sections``
required), ``src/llama-arch.cpp`` (the key names), and the loader logs of the real Qwen3.6-27B and
Qwen3.6-35B-A3B GGUFs for the order the converter writes them in. ``docs/synth.md`` has the whole
picture and ``docs/hybrid.md`` how llama.cpp's CPU computes these layers.
"""

from __future__ import annotations

from fak.synth.layout import ArchConfig
from fak.synth.writer import MetaEntry

__all__ = ["default_rope_sections", "hybrid_arch_metadata"]


def default_rope_sections(n_rot: int) -> tuple[int, int, int, int]:
    """M-RoPE sections for ``n_rot`` rotated dimensions, split as Qwen3.5's ``mrope_section``: the
    ``n_rot / 2`` rotated pairs in three near-equal parts, larger first (64 -> ``(11, 11, 10, 0)``,
    what the converter writes for every Qwen3.5/3.6 model). For text every section gets the same
    position, so the split only has to cover the pairs (llama.cpp ``ggml_mrope_cache_init``)."""
    pairs = n_rot // 2
    t = -(-pairs // 3)
    h = -(-(pairs - t) // 2)
    return (t, h, pairs - t - h, 0)


def hybrid_arch_metadata(cfg: ArchConfig) -> list[MetaEntry]:
    """The ``{arch}.*`` keys of a ``qwen35`` / ``qwen35moe`` file, in the order of the real files'
    loader logs.

    ``qwen35`` (Qwen3.6-27B): ``block_count``, ``context_length``, ``embedding_length``,
    ``feed_forward_length``, ``attention.head_count``, ``attention.head_count_kv``,
    ``rope.dimension_sections``, ``rope.freq_base``, ``attention.layer_norm_rms_epsilon``,
    ``attention.key_length``, ``attention.value_length``, ``ssm.conv_kernel``, ``ssm.state_size``,
    ``ssm.group_count``, ``ssm.time_step_rank``, ``ssm.inner_size``, ``full_attention_interval``,
    ``rope.dimension_count``. ``qwen35moe`` (Qwen3.6-35B-A3B) has no ``feed_forward_length`` and
    puts ``expert_count``, ``expert_used_count`` after the epsilon and
    ``expert_feed_forward_length``, ``expert_shared_feed_forward_length`` after ``value_length``.
    """
    a = cfg.arch
    if not cfg.is_hybrid:
        raise ValueError(f"{a} is not a hybrid architecture")
    meta = [MetaEntry(f"{a}.block_count", "UINT32", cfg.n_layer),
            MetaEntry(f"{a}.context_length", "UINT32", cfg.n_ctx_train),
            MetaEntry(f"{a}.embedding_length", "UINT32", cfg.n_embd)]
    if not cfg.is_moe:
        meta.append(MetaEntry(f"{a}.feed_forward_length", "UINT32", cfg.n_ff))
    meta += [MetaEntry(f"{a}.attention.head_count", "UINT32", cfg.n_head),
             MetaEntry(f"{a}.attention.head_count_kv", "UINT32", cfg.n_head_kv),
             MetaEntry(f"{a}.rope.dimension_sections", "ARRAY[INT32]", list(cfg.rope_sections)),
             MetaEntry(f"{a}.rope.freq_base", "FLOAT32", cfg.rope_freq_base),
             MetaEntry(f"{a}.attention.layer_norm_rms_epsilon", "FLOAT32", cfg.rms_eps)]
    if cfg.is_moe:
        meta += [MetaEntry(f"{a}.expert_count", "UINT32", cfg.n_expert),
                 MetaEntry(f"{a}.expert_used_count", "UINT32", cfg.n_expert_used)]
    meta += [MetaEntry(f"{a}.attention.key_length", "UINT32", cfg.head_dim),
             MetaEntry(f"{a}.attention.value_length", "UINT32", cfg.head_dim)]
    if cfg.is_moe:
        meta += [MetaEntry(f"{a}.expert_feed_forward_length", "UINT32", cfg.n_ff_exp),
                 MetaEntry(f"{a}.expert_shared_feed_forward_length", "UINT32", cfg.n_ff_shexp)]
    meta += [MetaEntry(f"{a}.ssm.conv_kernel", "UINT32", cfg.ssm_conv_kernel),
             MetaEntry(f"{a}.ssm.state_size", "UINT32", cfg.ssm_state_size),
             MetaEntry(f"{a}.ssm.group_count", "UINT32", cfg.ssm_group_count),
             MetaEntry(f"{a}.ssm.time_step_rank", "UINT32", cfg.ssm_time_step_rank),
             MetaEntry(f"{a}.ssm.inner_size", "UINT32", cfg.ssm_inner_size),
             MetaEntry(f"{a}.full_attention_interval", "UINT32", cfg.full_attention_interval),
             MetaEntry(f"{a}.rope.dimension_count", "UINT32", cfg.rope_dim)]
    return meta
