"""Synthetic GGUF models: real architectures, real tokenizers, random but valid weights.

Two kinds of file, both valid GGUF v3 that llama.cpp and fak load:

- **Tiny models** (``write_tiny_model``): a complete qwen2 or llama model of a few hundred KB to a
  few MB, with the architecture's real tensor names, shapes and metadata keys, a real byte-level
  BPE tokenizer (``vocab.py``) and the family's chat template. For CI: engine, tokenizer and
  gateway tests run end to end on them.
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
from typing import Literal

from fak.errors import UnsupportedError
from fak.gguf import GGUFFile
from fak.synth.blocks import FORMATS
from fak.synth.layout import FILE_TYPES, MIXES, ArchConfig, TensorSpec, quant_types, tensor_layout
from fak.synth.vocab import FAMILIES, TokenizerSpec, build_tokenizer
from fak.synth.writer import GGUFPlan, MetaEntry, write_plan

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
    "write_plan",
    "write_tiny_model",
    "write_twin",
]

QWEN2_SPECIAL_BASE = 151643  # id of <|endoftext|> in Qwen2.5's vocabulary


@dataclass(frozen=True)
class Preset:
    """A known release's layout: hyper-parameters, quant mix and ``general.*`` naming."""

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
}


def _model_metadata(cfg: ArchConfig, *, name: str, file_type: int, tokenizer: list[MetaEntry],
                    general: list[tuple[str, str]], provenance: str) -> list[MetaEntry]:
    """Metadata in the order llama.cpp's converter writes it (as the real Qwen2.5 files show)."""
    a = cfg.arch
    meta = [MetaEntry("general.architecture", "STRING", a), MetaEntry("general.type", "STRING", "model"),
            MetaEntry("general.name", "STRING", name)]
    meta += [MetaEntry(f"general.{k}", "STRING", v) for k, v in general]
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
    if a == "llama":
        meta += [MetaEntry("llama.attention.key_length", "UINT32", cfg.head_dim),
                 MetaEntry("llama.attention.value_length", "UINT32", cfg.head_dim)]
    meta.append(MetaEntry("general.file_type", "UINT32", file_type))
    if a == "llama":
        meta += [MetaEntry("llama.vocab_size", "UINT32", cfg.n_vocab),
                 MetaEntry("llama.rope.dimension_count", "UINT32", cfg.head_dim)]
    meta += tokenizer
    meta.append(MetaEntry("general.quantization_version", "UINT32", 2))
    meta.append(MetaEntry("fak.synthetic", "STRING", provenance))
    return meta


def _tokenizer_entries(spec: TokenizerSpec) -> list[MetaEntry]:
    return [MetaEntry(k, t, v) for k, t, v in spec.metadata()]


def plan_tiny_model(arch: Literal["qwen2", "llama"] = "qwen2", *, n_layer: int = 2, n_embd: int = 64,
                    n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, n_vocab: int | None = None,
                    ctx: int = 2048, weight_type: str = "Q8_0", tied_embeddings: bool | None = None,
                    tensor_types: dict[str, str] | None = None, rope_freq_base: float | None = None,
                    rms_eps: float | None = None, sliding_window: int | None = None,
                    sliding_window_pattern: int | list[bool] | None = None, seed: int = 0) -> GGUFPlan:
    """The plan (metadata and tensor layout) of a tiny model; ``write_tiny_model`` writes it.

    Arguments are those of ``write_tiny_model``. Raises ``ValueError`` for inconsistent sizes or an
    unknown type.
    """
    if arch not in FAMILIES:
        raise ValueError(f"unknown architecture {arch!r}; fak.synth writes: {', '.join(FAMILIES)}")
    tok = build_tokenizer(arch, n_vocab)
    is_qwen = arch == "qwen2"
    cfg = ArchConfig(
        arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_vocab=tok.n_vocab,
        n_ctx_train=ctx, rope_freq_base=rope_freq_base or (1e6 if is_qwen else 5e5),
        rms_eps=rms_eps or (1e-6 if is_qwen else 1e-5),
        tied_embeddings=(not is_qwen) if tied_embeddings is None else tied_embeddings, attn_bias=is_qwen)
    tensors = tensor_layout(cfg)
    quant_types(tensors, weight_type, n_layer=n_layer, overrides=tensor_types)
    file_type = FILE_TYPES.get(weight_type, 0)
    meta = _model_metadata(cfg, name=f"fak tiny {arch}", file_type=file_type, tokenizer=_tokenizer_entries(tok),
                           general=[("size_label", _size_label(cfg))],
                           provenance=f"tiny {arch} model, weight_type {weight_type}, random weights (seed {seed})")
    swa = _sliding_window_entries(arch, n_layer, sliding_window, sliding_window_pattern)
    if swa:
        at = next(i for i, e in enumerate(meta) if e.key == "general.file_type")
        meta[at:at] = swa
    return GGUFPlan(arch, meta, tensors)


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


def write_tiny_model(path: str | os.PathLike[str], arch: Literal["qwen2", "llama"] = "qwen2", *,
                     n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128,
                     n_vocab: int | None = None, ctx: int = 2048, weight_type: str = "Q8_0",
                     tied_embeddings: bool | None = None, tensor_types: dict[str, str] | None = None,
                     rope_freq_base: float | None = None, rms_eps: float | None = None,
                     sliding_window: int | None = None, sliding_window_pattern: int | list[bool] | None = None,
                     seed: int = 0) -> Path:
    """Write a complete tiny ``qwen2`` or ``llama`` model to ``path`` and return the path.

    Args:
        arch: ``"qwen2"`` (Q/K/V biases, untied ``output.weight``, rope base 1e6, eps 1e-6, Qwen2.5
            tokenizer conventions and ChatML template with tools) or ``"llama"`` (no biases, tied
            embeddings so no ``output.weight``, rope base 5e5, eps 1e-5, Llama 3 conventions).
        n_layer, n_embd, n_head, n_head_kv, n_ff: hyper-parameters; ``n_embd % n_head == 0`` and
            ``n_head % n_head_kv == 0``. The head dimension is ``n_embd // n_head`` (16 by default).
        n_vocab: vocabulary size; default: the tokenizer's 256 bytes + 400 merges + specials rounded
            up to a multiple of 64 (704 for qwen2, 704 for llama); larger values pad the vocabulary.
        ctx: ``{arch}.context_length`` (tokens).
        weight_type: type of every 2-D weight (``"Q8_0"``, ``"Q4_0"``, ``"Q4_K"``, ``"Q6_K"``,
            ``"F16"``, ... any of ``fak.synth.blocks.FORMATS``), or ``"Q4_K_M"`` for llama.cpp's mix.
            Where the row length (``n_embd``, or ``n_ff`` for ``ffn_down``) is not a multiple of
            the type's block size, the tensor falls back as llama.cpp does (Q4_K → Q5_0, Q6_K →
            Q8_0, ...): use ``n_embd=256, n_ff=512`` to get real K-quant tensors.
        tied_embeddings: override the family default.
        tensor_types: tensor name → type overrides (e.g. ``{"output.weight": "Q6_K"}``).
        rope_freq_base, rms_eps: override the family defaults.
        sliding_window: write ``{arch}.attention.sliding_window`` (tokens; llama.cpp's key): the
            model declares sliding-window attention (docs/long-context.md). None: no key.
        sliding_window_pattern: write ``{arch}.attention.sliding_window_pattern``: a list of one
            bool per layer (True: windowed; what llama.cpp's converter writes from Hugging Face's
            ``layer_types``) or an int period ``n`` (llama.cpp's ``set_swa_pattern``: layer ``il``
            windowed iff ``n == 0 or il % n < n - 1``). None: no key (every layer windowed).
        seed: seed of the random weights (same arguments and seed → identical file).

    Raises:
        ValueError: inconsistent sizes, unknown architecture or type.
        OSError: the file cannot be written.
    """
    plan = plan_tiny_model(arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                           n_vocab=n_vocab, ctx=ctx, weight_type=weight_type, tied_embeddings=tied_embeddings,
                           tensor_types=tensor_types, rope_freq_base=rope_freq_base, rms_eps=rms_eps,
                           sliding_window=sliding_window, sliding_window_pattern=sliding_window_pattern, seed=seed)
    return write_plan(path, plan, seed=seed)


def _size_label(cfg: ArchConfig) -> str:
    n = cfg.n_vocab * cfg.n_embd * (1 if cfg.tied_embeddings else 2)
    n += cfg.n_layer * (2 * cfg.n_embd * cfg.n_embd + 2 * cfg.n_embd * cfg.n_head_kv * cfg.head_dim
                        + 3 * cfg.n_embd * cfg.n_ff)
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
    quant_types(tensors, p.mix, n_layer=cfg.n_layer)
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
        preset: a name in ``PRESETS`` (``"qwen2.5-7b-q4_k_m"``, ``"qwen2.5-coder-1.5b-q4_k_m"``):
            the release's hyper-parameters and llama.cpp's Q4_K_M types (see ``layout.py``).
        seed: seed of the random weights.
        tokenizer_from: a real GGUF whose ``tokenizer.*`` keys the twin carries (its vocabulary
            padded with unused ``[PAD<id>]`` tokens to the model's rows). Without it a preset twin
            gets fak's synthetic BPE padded to the model's vocabulary, with the specials at Qwen's
            ids (``<|endoftext|>`` = 151643, ``<|im_end|>`` = 151645).
        progress: called as ``progress(done_bytes, total_bytes)`` while the data is written.

    Raises:
        ValueError: neither or both of ``like``/``preset``, an unknown preset, a tokenizer larger
            than the model's vocabulary.
        fak.UnsupportedError: ``like`` has tensor types fak cannot generate.
        OSError: a file cannot be read or written.
    """
    plan = plan_twin(like=like, preset=preset, seed=seed, tokenizer_from=tokenizer_from)
    return write_plan(path, plan, seed=seed, progress=progress)

