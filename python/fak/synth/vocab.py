"""The tokenizer a synthetic model carries: a real byte-level BPE, special tokens, chat template.

Format: llama.cpp's GGUF tokenizer keys for a GPT-2-style BPE (``tokenizer.ggml.model = "gpt2"``):
``tokens`` are byte-level strings (GPT-2's ``bytes_to_unicode`` alphabet), ``merges`` are
``"left right"`` pairs in rank order, ``token_type`` uses llama.cpp's ``llama_token_type``
(1 normal, 3 control, 4 user-defined, 5 unused). The vocabulary is:

- ids ``0..255``: the 256 byte symbols, in ``bytes_to_unicode`` order (as Qwen2's and GPT-2's
  vocabularies start);
- then one token per merge of ``data/bpe.json`` (learned by ``scripts/train-synth-bpe``), in rank
  order;
- then the family's special tokens, at ``special_base`` (right after the merges for tiny models;
  151643 for a Qwen2.5-sized twin, where the real vocabulary has them);
- padding up to ``n_vocab``: ``[PAD<id>]`` unused tokens for qwen2 (as llama.cpp's converter pads
  Qwen's 151665 tokens to 151936), ``<|reserved_special_token_N|>`` control tokens for llama
  (as Llama 3 reserves 128000..128255).

Special tokens, ids and flags follow the families' real GGUF files: Qwen2.5 (bos = pad =
``<|endoftext|>``, eos = ``<|im_end|>``, ``add_bos_token = false``, ``<tool_call>`` and
``</tool_call>`` user-defined, the rest control), Qwen3 (Qwen2.5's 22 plus ``<tool_response>``,
``</tool_response>``, ``<think>``, ``</think>``, user-defined: 26 specials), Qwen3-Coder (the
same tokens, no bos id), Qwen3.5/3.6 (Qwen3's 26 plus seven control tokens, pad ``<|vision_pad|>``,
pre-tokenizer ``qwen35``) and Llama 3.x Instruct (bos ``<|begin_of_text|>``, eos = eot =
``<|eot_id|>``, pad ``<|finetune_right_pad_id|>``, ``add_bos_token = true``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

__all__ = ["FAMILIES", "QWEN2_SPECIALS", "QWEN35_SPECIALS", "QWEN3_SPECIALS", "TokenizerSpec", "bpe_merges",
           "build_tokenizer", "byte_symbols", "chat_template"]

# llama.cpp llama_token_type
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

QWEN2_SPECIALS: list[tuple[str, int]] = [
    ("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
    ("<|object_ref_start|>", CONTROL), ("<|object_ref_end|>", CONTROL), ("<|box_start|>", CONTROL),
    ("<|box_end|>", CONTROL), ("<|quad_start|>", CONTROL), ("<|quad_end|>", CONTROL),
    ("<|vision_start|>", CONTROL), ("<|vision_end|>", CONTROL), ("<|vision_pad|>", CONTROL),
    ("<|image_pad|>", CONTROL), ("<|video_pad|>", CONTROL), ("<tool_call>", USER_DEFINED),
    ("</tool_call>", USER_DEFINED), ("<|fim_prefix|>", CONTROL), ("<|fim_middle|>", CONTROL),
    ("<|fim_suffix|>", CONTROL), ("<|fim_pad|>", CONTROL), ("<|repo_name|>", CONTROL),
    ("<|file_sep|>", CONTROL),
]

# Qwen3 (and Qwen3-Coder) add four user-defined tokens after Qwen2.5's 22 (151665..151668 in the
# real vocabulary; HF ``added_tokens_decoder`` marks them ``special: false``, and llama.cpp's
# converter makes a non-special added token that does not look like ``<|...|>`` USER_DEFINED).
QWEN3_SPECIALS: list[tuple[str, int]] = QWEN2_SPECIALS + [
    ("<tool_response>", USER_DEFINED), ("</tool_response>", USER_DEFINED),
    ("<think>", USER_DEFINED), ("</think>", USER_DEFINED),
]

# Qwen3.5 / 3.6 (qwen35, qwen35moe): Qwen3's 26 at 248044.. (<|endoftext|> = 248044, <|im_end|> = 248046,
# <think> = 248068 in the real 248320-token vocabulary) and seven more control tokens: llama.cpp's
# loader counts "special tokens cache size = 33" in the real files. Their texts are Qwen3-Omni's
# audio / TTS tokens, in its order (an assumption: the count and ids are what llama.cpp reports; no
# conversation or template of fak uses them).
QWEN35_SPECIALS: list[tuple[str, int]] = QWEN3_SPECIALS + [
    ("<|audio_start|>", CONTROL), ("<|audio_end|>", CONTROL), ("<tts_pad>", CONTROL), ("<tts_text_bos>", CONTROL),
    ("<tts_text_eod>", CONTROL), ("<tts_text_bos_single>", CONTROL), ("<|audio_pad|>", CONTROL),
]

LLAMA3_SPECIALS: list[tuple[str, int]] = [
    ("<|begin_of_text|>", CONTROL), ("<|end_of_text|>", CONTROL),
    ("<|reserved_special_token_0|>", CONTROL), ("<|reserved_special_token_1|>", CONTROL),
    ("<|finetune_right_pad_id|>", CONTROL), ("<|reserved_special_token_2|>", CONTROL),
    ("<|start_header_id|>", CONTROL), ("<|end_header_id|>", CONTROL), ("<|eom_id|>", CONTROL),
    ("<|eot_id|>", CONTROL), ("<|python_tag|>", CONTROL),
]


@dataclass(frozen=True)
class Family:
    """One model family's tokenizer conventions."""

    pre: str                                  # tokenizer.ggml.pre
    specials: list[tuple[str, int]]
    ids: dict[str, str]                       # metadata key suffix -> special token text
    add_bos: bool
    template: str                             # file under templates/
    pad_unused: bool                          # pad with [PAD<id>] unused (qwen2) or reserved control (llama)


FAMILIES: dict[str, Family] = {
    "qwen2": Family(
        pre="qwen2", specials=QWEN2_SPECIALS,
        ids={"eos_token_id": "<|im_end|>", "padding_token_id": "<|endoftext|>", "bos_token_id": "<|endoftext|>"},
        add_bos=False, template="qwen2.jinja", pad_unused=True),
    # Qwen3 dense (the Qwen/Qwen3-8B GGUF: ids as Qwen2.5's), Hermes JSON tool calls, <think>.
    "qwen3": Family(
        pre="qwen2", specials=QWEN3_SPECIALS,
        ids={"eos_token_id": "<|im_end|>", "padding_token_id": "<|endoftext|>", "bos_token_id": "<|endoftext|>"},
        add_bos=False, template="qwen3.jinja", pad_unused=True),
    # Qwen3-Coder-30B-A3B-Instruct: its config.json has no bos_token_id, so the converter writes
    # none (llama.cpp then takes id 11, unused with add_bos false); pad is tokenizer_config.json's
    # <|endoftext|>. XML tool calls (<function=NAME><parameter=P>).
    "qwen3moe": Family(
        pre="qwen2", specials=QWEN3_SPECIALS,
        ids={"eos_token_id": "<|im_end|>", "padding_token_id": "<|endoftext|>"},
        add_bos=False, template="qwen3-coder.jinja", pad_unused=True),
    # Qwen3.5 / 3.6 (the loader logs of the real Qwen3.6-27B and -35B-A3B GGUFs): pre-tokenizer
    # "qwen35" (Qwen2's split with \p{M} joined to letters), eos <|im_end|>, pad <|vision_pad|>
    # (248055), bos <|endoftext|>, in that key order; no bos added. Template: thinking on by
    # default, XML tool calls (<function=NAME><parameter=P>), tools listed as JSON.
    "qwen35": Family(
        pre="qwen35", specials=QWEN35_SPECIALS,
        ids={"eos_token_id": "<|im_end|>", "padding_token_id": "<|vision_pad|>", "bos_token_id": "<|endoftext|>"},
        add_bos=False, template="qwen35.jinja", pad_unused=True),
    "qwen35moe": Family(
        pre="qwen35", specials=QWEN35_SPECIALS,
        ids={"eos_token_id": "<|im_end|>", "padding_token_id": "<|vision_pad|>", "bos_token_id": "<|endoftext|>"},
        add_bos=False, template="qwen35.jinja", pad_unused=True),
    "llama": Family(
        pre="llama-bpe", specials=LLAMA3_SPECIALS,
        ids={"bos_token_id": "<|begin_of_text|>", "eos_token_id": "<|eot_id|>", "eot_token_id": "<|eot_id|>",
             "padding_token_id": "<|finetune_right_pad_id|>"},
        add_bos=True, template="llama3.jinja", pad_unused=False),
}


def byte_symbols() -> list[str]:
    """GPT-2's ``bytes_to_unicode`` alphabet in vocabulary order: the printable bytes ``!``..``~``,
    ``¡``..``¬``, ``®``..``ÿ`` map to themselves, the other 68 bytes to U+0100 onwards."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    symbols = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in printable] + [symbols[b] for b in range(256) if b not in printable]


@lru_cache(maxsize=1)
def bpe_merges() -> list[str]:
    """The committed merges (``"left right"``, rank order) of ``data/bpe.json``."""
    text = resources.files("fak.synth").joinpath("data/bpe.json").read_text(encoding="utf-8")
    return list(json.loads(text)["merges"])


def chat_template(family: str) -> str:
    """The chat template (jinja2 source) fak writes for ``family`` (a key of ``FAMILIES``:
    ``"qwen2"``, ``"qwen3"``, ``"qwen3moe"``, ``"qwen35"``, ``"qwen35moe"``, ``"llama"``)."""
    return resources.files("fak.synth").joinpath("templates", FAMILIES[family].template).read_text(encoding="utf-8")


@dataclass
class TokenizerSpec:
    """A complete GGUF tokenizer: ``tokens``/``token_type``/``merges`` and the special ids.

    ``metadata()`` gives the ``tokenizer.*`` keys in the order llama.cpp's converter writes them.
    """

    family: str
    tokens: list[str]
    token_type: list[int]
    merges: list[str]
    special_ids: dict[str, int] = field(default_factory=dict)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def id(self, text: str) -> int:
        """Id of a token given its text. Raises ``KeyError`` when absent."""
        return self.tokens.index(text)

    def metadata(self) -> list[tuple[str, str, object]]:
        """``(key, gguf value type, value)`` triples; array types are ``"ARRAY[STRING]"`` etc."""
        fam = FAMILIES[self.family]
        out: list[tuple[str, str, object]] = [
            ("tokenizer.ggml.model", "STRING", "gpt2"),
            ("tokenizer.ggml.pre", "STRING", fam.pre),
            ("tokenizer.ggml.tokens", "ARRAY[STRING]", self.tokens),
            ("tokenizer.ggml.token_type", "ARRAY[INT32]", self.token_type),
            ("tokenizer.ggml.merges", "ARRAY[STRING]", self.merges),
        ]
        for key, value in self.special_ids.items():
            out.append((f"tokenizer.ggml.{key}", "UINT32", value))
        out.append(("tokenizer.ggml.add_bos_token", "BOOL", fam.add_bos))
        out.append(("tokenizer.chat_template", "STRING", chat_template(self.family)))
        return out


def build_tokenizer(family: str, n_vocab: int | None = None, *, special_base: int | None = None,
                    n_merges: int | None = None) -> TokenizerSpec:
    """The synthetic tokenizer of ``family`` with ``n_vocab`` tokens.

    Args:
        family: a key of ``FAMILIES`` (``"qwen2"``, ``"qwen3"``, ``"qwen3moe"``, ``"qwen35"``,
            ``"qwen35moe"``, ``"llama"``).
        n_vocab: total tokens (the model's vocabulary rows). Default: the smallest multiple of 64
            that holds bytes, merges and specials.
        special_base: id of the first special token. Default: right after the merges. Between the
            merges and ``special_base`` the ids are filled with ``[PAD<id>]`` unused tokens.
        n_merges: use only the first ``n_merges`` merges (default all).

    Raises:
        ValueError: unknown family, or ``n_vocab``/``special_base`` too small for the tokens.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; known: {', '.join(FAMILIES)}")
    fam = FAMILIES[family]
    merges = bpe_merges()[:n_merges]
    tokens = byte_symbols()
    for merge in merges:
        left, right = merge.split(" ")
        tokens.append(left + right)
    token_type = [NORMAL] * len(tokens)
    if special_base is None:
        special_base = len(tokens)
    if special_base < len(tokens):
        raise ValueError(f"special_base {special_base} overlaps the {len(tokens)} byte and merge tokens")
    while len(tokens) < special_base:
        tokens.append(f"[PAD{len(tokens)}]")
        token_type.append(UNUSED)
    for text, ttype in fam.specials:
        tokens.append(text)
        token_type.append(ttype)
    if n_vocab is None:
        n_vocab = -(-len(tokens) // 64) * 64
    if n_vocab < len(tokens):
        raise ValueError(f"n_vocab {n_vocab} is smaller than the {len(tokens)} tokens of the {family} vocabulary")
    reserved = 3
    while len(tokens) < n_vocab:
        if fam.pad_unused:
            tokens.append(f"[PAD{len(tokens)}]")
            token_type.append(UNUSED)
        else:
            tokens.append(f"<|reserved_special_token_{reserved}|>")
            token_type.append(CONTROL)
            reserved += 1
    if len(set(tokens)) != len(tokens):  # a merge spelling a special token's text would collide
        raise ValueError("synthetic vocabulary has duplicate tokens")
    index = {t: i for i, t in enumerate(tokens)}
    ids = {key: index[text] for key, text in fam.ids.items()}
    return TokenizerSpec(family, tokens, token_type, merges, ids)
