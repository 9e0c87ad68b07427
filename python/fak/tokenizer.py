"""Tokenization from GGUF metadata, matching llama.cpp's ``llama_tokenize`` / ``llama_token_to_piece``.

A GGUF file of ``tokenizer.ggml.model == "gpt2"`` carries a byte-level BPE vocabulary: the token
strings (``tokenizer.ggml.tokens``), their merges (``tokenizer.ggml.merges``, rank = position), a
type per token (``tokenizer.ggml.token_type``: 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte), the special ids (``tokenizer.ggml.{bos,eos,eot,eom,padding,...}_token_id``),
``add_bos_token`` / ``add_eos_token``, and the name of the pre-tokenizer (``tokenizer.ggml.pre``)
whose split regexes are defined in llama.cpp's ``src/llama-vocab.cpp`` (``llm_tokenizer_bpe``).

:class:`Tokenizer` rebuilds that tokenizer with the ``tokenizers`` library (BPE model, a sequence
of isolating regex splits, byte-level mapping) and reproduces llama.cpp's behaviour around it:

- special-token partition (``tokenizer_st_partition``): control, user-defined and unknown tokens
  are cut out of the text before BPE, longest text first; with ``parse_special=False`` control and
  unknown tokens are left as plain text while user-defined ones (Qwen's ``<tool_call>``) are still
  cut out;
- BOS/EOS insertion from ``add_bos_token`` / ``add_eos_token`` (defaults per pre-tokenizer family);
- the end-of-generation set (``special_eog_ids``): EOS, EOT, EOM, FIM pad/repo/sep and the tokens
  llama.cpp recognizes by their text (``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``, ...);
- pieces (``token_to_piece``): byte-level decoding of normal tokens, the raw text of user-defined
  tokens, and control tokens rendered empty unless ``skip_special=False``.

:class:`IncrementalDetokenizer` turns a stream of token ids into text deltas that never split a
UTF-8 character, and :class:`StopMatcher` finds stop strings across token boundaries.
"""

from __future__ import annotations

import codecs
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fak.errors import UnsupportedError

__all__ = [
    "TokenAttr",
    "PreTokenizer",
    "PRE_TOKENIZERS",
    "Tokenizer",
    "IncrementalDetokenizer",
    "StopMatcher",
    "read_gguf_metadata",
]


class TokenAttr(enum.IntFlag):
    """llama.cpp's ``llama_token_attr`` bits, derived from the GGUF ``token_type`` of each token."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


# GGUF token_type (llama_token_type) -> attribute, as in llama_vocab::impl::load.
_TYPE_TO_ATTR = {
    0: TokenAttr.UNDEFINED,
    1: TokenAttr.NORMAL,
    2: TokenAttr.UNKNOWN,
    3: TokenAttr.CONTROL,
    4: TokenAttr.USER_DEFINED,
    5: TokenAttr.UNUSED,
    6: TokenAttr.BYTE,
}

# --- pre-tokenizers (llama-vocab.cpp, llm_tokenizer_bpe) -------------------------------------
# llama.cpp applies the regexes in order; each one splits every piece produced by the previous
# one into its matches and the gaps between them (tokenizers' Split behaviour "isolated").
# The contraction alternatives are llama.cpp's adapted form ('[sS] instead of (?i:'s)).

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer family: its split regexes and the vocab flags it sets.

    ``regexes`` are applied in order (each isolates its matches); ``ignore_merges`` takes a whole
    pre-tokenized word as one token when it is in the vocabulary (llama 3); ``add_bos`` is the
    default of ``tokenizer.ggml.add_bos_token`` when the file does not say.
    """

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


_FAMILIES: dict[PreTokenizer, tuple[str, ...]] = {
    PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")): ("default",),
    PreTokenizer((_GPT2,)): (
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
        "jina-v1-en", "jina-v2-code", "roberta-bpe",
    ),
    PreTokenizer((r"\p{N}", _GPT2)): (
        "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2",
    ),
    PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True): (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano",
    ),
    PreTokenizer((_LLAMA3,)): ("dbrx", "smaug-bpe", "chatglm-bpe"),
    PreTokenizer((_LLAMA3,), ignore_merges=True): ("glm4", "glm5"),
    PreTokenizer((_QWEN2,)): (
        "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "solar-open", "grok-2",
    ),
    PreTokenizer((_QWEN35,)): ("qwen35",),
    PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")): ("deepseek-coder",),
    PreTokenizer((
        "[\r\n]",
        "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
        "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
        "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8"
        "-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-"
        "\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-"
        "\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-"
        "\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
        "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149"
        "\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
        "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13"
        "-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
        "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
        "\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    )): ("deepseek-llm",),
    PreTokenizer((
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    )): ("deepseek-v3",),
    PreTokenizer((
        r"[\p{P}\$\+<=>\^~\|`]+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
        "[0-9][0-9][0-9]",
    )): ("falcon",),
}

#: ``tokenizer.ggml.pre`` name -> its pre-tokenizer, for every family fak supports.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {name: pre for pre, names in _FAMILIES.items() for name in names}

# Token texts that llama.cpp treats as end of generation (llama_vocab::impl::load).
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_OTHER_CONTROL_TEXTS = (  # FIM prefix/suffix/middle: forced to control type, not end of generation
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>",
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (``bytes_to_unicode`` in openai/gpt-2)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_ENCODER = _bytes_to_unicode()
_BYTE_DECODER = {ch: b for b, ch in _BYTE_ENCODER.items()}


def _byte_level_decode(text: str) -> bytes:
    """Bytes of a byte-level BPE token string; characters outside the table are rendered as
    llama.cpp's ``llama_decode_text`` does (``[UNK_BYTE_0x..<text>]``)."""
    out = bytearray()
    for ch in text:
        b = _BYTE_DECODER.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of a GGUF file as a dict (arrays as lists, strings as ``str``), read with fak's
    own reader (``fak.gguf.GGUFFile``: only the header is parsed).

    Raises:
        OSError: the file cannot be read.
        fak.GGUFError: the file is not valid GGUF.
    """
    from fak.gguf import GGUFFile

    with GGUFFile(str(path)) as f:
        return dict(f.metadata)


class Tokenizer:
    """A byte-level BPE tokenizer built from GGUF metadata, tokenizing exactly as llama.cpp does.

    Args:
        tokens: token strings, index = token id (``tokenizer.ggml.tokens``).
        token_types: GGUF token type per token (``tokenizer.ggml.token_type``); all normal if None.
        merges: BPE merges ``"left right"`` in rank order (``tokenizer.ggml.merges``).
        pre: pre-tokenizer name (``tokenizer.ggml.pre``), a key of :data:`PRE_TOKENIZERS`.
        bos_id, eos_id, eot_id, eom_id, pad_id: special ids from the metadata (None if absent).
        add_bos, add_eos: whether ``encode(add_special=True)`` adds BOS/EOS (None: the family's
            default, as llama.cpp).

    Raises:
        fak.UnsupportedError: an unknown pre-tokenizer name.
        ValueError: inconsistent lists (token types shorter than the vocabulary).
    """

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int] | None,
        merges: Sequence[str],
        pre: str = "default",
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        eot_id: int | None = None,
        eom_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
    ) -> None:
        if pre not in PRE_TOKENIZERS:
            raise UnsupportedError(
                f"unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre); fak supports: "
                + ", ".join(sorted(PRE_TOKENIZERS)))
        n = len(tokens)
        if token_types is not None and len(token_types) < n:
            raise ValueError(f"token_type has {len(token_types)} entries for {n} tokens")
        self.pre = pre
        self._pre = PRE_TOKENIZERS[pre]
        self._tokens: list[str] = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self._token_to_id: dict[str, int] = {t: i for i, t in enumerate(self._tokens)}
        attrs = [_TYPE_TO_ATTR.get(int(t), TokenAttr.UNDEFINED) for t in token_types] if token_types \
            is not None else [TokenAttr.NORMAL] * n
        self._attrs: list[TokenAttr] = list(attrs[:n])

        def valid(i: int | None) -> int | None:
            return i if i is not None and 0 <= int(i) < n else None

        # llama.cpp's defaults for the gpt2 model: BOS = EOS = 11 unless the file gives a valid id.
        self.bos_id = valid(bos_id) if valid(bos_id) is not None else valid(11)
        self.eos_id = valid(eos_id) if valid(eos_id) is not None else valid(11)
        self.pad_id = valid(pad_id)
        self.add_bos = self._pre.add_bos if add_bos is None else bool(add_bos)
        self.add_eos = False if add_eos is None else bool(add_eos)
        self.eot_id = valid(eot_id)
        self.eom_id = valid(eom_id)
        self.eog_ids = self._find_eog()
        self._special_ids = self._special_cache()
        # special tokens left as text when parse_special is False (control and unknown ones)
        self._skipped_ids = [i for i in self._special_ids if self._attrs[i] & (TokenAttr.CONTROL | TokenAttr.UNKNOWN)]
        self._piece_cache: dict[int, bytes] = {}  # token_to_piece(special=False)
        self._special_piece_cache: dict[int, bytes] = {}  # token_to_piece(special=True)
        self._hf = self._build_hf(merges)

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Builds the tokenizer from a GGUF metadata mapping (``tokenizer.ggml.*`` keys).

        Raises:
            fak.UnsupportedError: a tokenizer model other than ``gpt2`` (byte-level BPE), or an
                unknown pre-tokenizer.
            fak.ModelError: required keys missing.
        """
        from fak.errors import ModelError

        model = metadata.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise UnsupportedError(
                f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); fak supports byte-level "
                "BPE ('gpt2')")
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            if key not in metadata:
                raise ModelError(f"GGUF metadata has no {key}")

        def opt_int(key: str) -> int | None:
            v = metadata.get(key)
            return None if v is None else int(v)

        def opt_bool(key: str) -> bool | None:
            v = metadata.get(key)
            return None if v is None else bool(v)

        return cls(
            list(metadata["tokenizer.ggml.tokens"]),
            metadata.get("tokenizer.ggml.token_type"),
            list(metadata["tokenizer.ggml.merges"]),
            pre=str(metadata.get("tokenizer.ggml.pre") or "default"),
            bos_id=opt_int("tokenizer.ggml.bos_token_id"),
            eos_id=opt_int("tokenizer.ggml.eos_token_id"),
            eot_id=opt_int("tokenizer.ggml.eot_token_id"),
            eom_id=opt_int("tokenizer.ggml.eom_token_id"),
            pad_id=opt_int("tokenizer.ggml.padding_token_id"),
            add_bos=opt_bool("tokenizer.ggml.add_bos_token"),
            add_eos=opt_bool("tokenizer.ggml.add_eos_token"),
        )

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """Reads the metadata of the GGUF file at ``path`` and builds its tokenizer."""
        return cls.from_gguf_metadata(read_gguf_metadata(path))

    def _find_eog(self) -> frozenset[int]:
        """End-of-generation ids, and the CONTROL overrides, as llama_vocab::impl::load does."""
        ids = self._token_to_id

        def first(texts: Iterable[str]) -> int | None:
            for t in texts:
                if t in ids:
                    return ids[t]
            return None

        def force_control(i: int) -> None:
            self._attrs[i] |= TokenAttr.CONTROL

        if self.eot_id is None:
            self.eot_id = first(_EOT_TEXTS)
        if self.eom_id is None:
            self.eom_id = first(_EOM_TEXTS)
        fim = [first(texts) for texts in (_FIM_PAD_TEXTS, _FIM_REP_TEXTS, _FIM_SEP_TEXTS)]
        for i in (self.eot_id, self.eom_id, *fim, *(ids[t] for t in _OTHER_CONTROL_TEXTS if t in ids)):
            if i is not None:
                force_control(i)
        eog = {i for i in fim if i is not None}
        for text in _EOG_TEXTS:
            if text in ids:
                eog.add(ids[text])
                force_control(ids[text])
        for i in (self.eos_id, self.eot_id, self.eom_id):
            if i is not None:
                eog.add(i)
        # o200k_harmony / solar-open: "<|end|>" is not an end of generation there.
        texts = {self._tokens[i] for i in eog}
        if "<|end|>" in texts and "<|call|>" in texts | {"<|calls|>"} and (
                "<|return|>" in texts or "<|flush|>" in texts):
            end = ids["<|end|>"]
            eog.discard(end)
            self._attrs[end] = TokenAttr.USER_DEFINED
        return frozenset(eog)

    def _special_cache(self) -> list[int]:
        """Ids cut out of text before BPE, longest text first (``cache_special_tokens``)."""
        mask = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
        special = [i for i, a in enumerate(self._attrs) if a & mask]
        special.sort(key=lambda i: (-len(self._tokens[i].encode("utf-8")), i))
        return special

    def _build_hf(self, merges: Sequence[str]) -> Any:
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        vocab = self._token_to_id
        pairs: list[tuple[str, str]] = []
        for m in merges:
            pos = m.find(" ", 1)  # llama.cpp splits at the first space after the first character
            if pos < 0:
                continue
            a, b = m[:pos], m[pos + 1:]
            # tokenizers refuses merges whose parts or result are not tokens; llama.cpp would fall
            # back to single bytes for such a symbol, which no real vocabulary relies on.
            if a in vocab and b in vocab and a + b in vocab:
                pairs.append((a, b))
        bpe = models.BPE(vocab=dict(vocab), merges=pairs, ignore_merges=self._pre.ignore_merges)
        hf = HFTokenizer(bpe)
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self._pre.regexes]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        hf.decoder = decoders.ByteLevel()
        added = []
        for i in sorted(self._special_ids):
            user_defined = bool(self._attrs[i] & TokenAttr.USER_DEFINED)
            added.append(AddedToken(self._tokens[i], special=not user_defined,
                                    normalized=False, single_word=False, lstrip=False, rstrip=False))
        hf.add_tokens(added)
        return hf

    # --- properties -----------------------------------------------------------------------

    @property
    def hf(self) -> Any:
        """The equivalent ``tokenizers.Tokenizer`` (control tokens added as special, user-defined
        ones as added non-special tokens). Its own ``encode`` matches :meth:`encode` except in the
        order special tokens are matched; use :meth:`encode` for llama.cpp-exact ids."""
        return self._hf

    @property
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary."""
        return len(self._tokens)

    @property
    def tokens(self) -> list[str]:
        """The raw GGUF token strings (byte-level encoded), index = id."""
        return self._tokens

    def token_attr(self, token_id: int) -> TokenAttr:
        """llama.cpp attribute bits of ``token_id``."""
        return self._attrs[token_id]

    def is_eog(self, token_id: int) -> bool:
        """Whether ``token_id`` ends generation (llama.cpp's ``llama_vocab_is_eog``)."""
        return token_id in self.eog_ids

    def token_to_id(self, text: str) -> int | None:
        """Id of the token whose GGUF string is exactly ``text`` (e.g. ``"<|im_end|>"``), or None."""
        return self._token_to_id.get(text)

    # --- encoding -------------------------------------------------------------------------

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cuts special tokens out of ``text`` (llama.cpp's ``tokenizer_st_partition``).

        Returns raw-text fragments (``str``) and special token ids (``int``) in order.
        """
        fragments: list[str | int] = [text]
        skip = TokenAttr.CONTROL | TokenAttr.UNKNOWN
        for tid in self._special_ids:
            if not parse_special and self._attrs[tid] & skip:
                continue
            special = self._tokens[tid]
            if not any(isinstance(f, str) and special in f for f in fragments):
                continue
            out: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or special not in frag:
                    out.append(frag)
                    continue
                parts = frag.split(special)
                for k, part in enumerate(parts):
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            fragments = out
        return fragments

    def _bpe(self, fragments: list[str], parse_special: bool) -> list[list[int]]:
        """BPE ids of raw-text fragments, never matching added tokens inside them.

        After :meth:`_partition` a fragment can still hold the text of a control token only when
        ``parse_special`` is False; such fragments bypass the added-token matcher of ``tokenizers``
        (pre-tokenizer then BPE model directly), the others are encoded in one batch.
        """
        hf = self._hf
        literal = [not parse_special and any(self._tokens[i] in f for i in self._skipped_ids) for f in fragments]
        plain = [f for f, lit in zip(fragments, literal) if not lit]
        plain_ids = iter([e.ids for e in hf.encode_batch(plain, add_special_tokens=False)] if plain else [])
        out: list[list[int]] = []
        for frag, lit in zip(fragments, literal):
            if lit:
                ids: list[int] = []
                for piece, _ in hf.pre_tokenizer.pre_tokenize_str(frag):
                    ids.extend(t.id for t in hf.model.tokenize(piece))
                out.append(ids)
            else:
                out.append(next(plain_ids))
        return out

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``, identical to llama.cpp's ``llama_tokenize``.

        Args:
            text: the text to tokenize.
            add_special: add BOS/EOS when the model asks for them (``add_bos_token`` etc.).
            parse_special: recognize control tokens written in the text (``"<|im_start|>"`` becomes
                its id); when False they are tokenized as plain text. User-defined tokens are
                recognized either way, as in llama.cpp.

        Returns:
            list of token ids (int, ``0 <= id < n_vocab``).
        """
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        if text:
            fragments = self._partition(text, parse_special)
            raw = [f for f in fragments if isinstance(f, str)]
            encoded = iter(self._bpe(raw, parse_special) if raw else [])
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out.extend(next(encoded))
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        return out

    # --- decoding -------------------------------------------------------------------------

    def token_bytes(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes of one token (llama.cpp's ``token_to_piece``).

        Normal tokens are byte-level decoded; user-defined tokens give their text; control and
        unknown tokens give ``b""`` when ``skip_special`` (llama.cpp ``special=false``) and their
        text otherwise; unused and undefined tokens give ``b""``. A piece may be an incomplete
        UTF-8 sequence (a multi-byte character split across tokens).

        Raises:
            IndexError: ``token_id`` outside ``[0, n_vocab)``.
        """
        cache = self._piece_cache if skip_special else self._special_piece_cache
        piece = cache.get(token_id)
        if piece is None:
            piece = self._make_piece(token_id, skip_special)
            cache[token_id] = piece
        return piece

    def _make_piece(self, token_id: int, skip_special: bool) -> bytes:
        if not 0 <= token_id < len(self._tokens):
            raise IndexError(f"token id {token_id} outside the vocabulary [0, {len(self._tokens)})")
        attr = self._attrs[token_id]
        text = self._tokens[token_id]
        if attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN):
            return b"" if skip_special else text.encode("utf-8")
        if attr & TokenAttr.USER_DEFINED:
            return text.encode("utf-8")
        if attr & TokenAttr.NORMAL:
            return _byte_level_decode(text)
        if attr & TokenAttr.BYTE:
            return _byte_level_decode(text)[:1]
        return b""

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = True) -> bytes:
        """Concatenated :meth:`token_bytes` of ``ids``."""
        return b"".join(self.token_bytes(int(i), skip_special) for i in ids)

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``: the concatenated pieces decoded as UTF-8, invalid or incomplete
        sequences replaced by U+FFFD. Equals the concatenation of what an
        :class:`IncrementalDetokenizer` streams for the same ids (no clean-up of spaces)."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")


class IncrementalDetokenizer:
    """Turns token ids into text deltas, holding back the bytes of an incomplete UTF-8 character.

    ``"".join(d.add(t) for t in ids) + d.flush() == tokenizer.decode(ids)``, and every delta is a
    valid string (no lone surrogates, no half characters). Invalid byte sequences become U+FFFD as
    soon as they are known to be invalid.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """Feeds one token; returns the text completed by it (may be ``""``)."""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id, self._skip_special))

    def add_many(self, token_ids: Iterable[int]) -> str:
        """Feeds several tokens; returns the text they complete."""
        return self._decoder.decode(self._tokenizer.decode_bytes(token_ids, self._skip_special))

    def flush(self) -> str:
        """Ends the stream: bytes still held (an incomplete character) come out as U+FFFD."""
        return self._decoder.decode(b"", final=True)

    @property
    def pending_bytes(self) -> int:
        """Number of bytes held back (0 to 3)."""
        buffered, _ = self._decoder.getstate()
        return len(buffered)


class StopMatcher:
    """Finds stop strings in streamed text, across token boundaries.

    :meth:`feed` returns the text that is safe to emit: everything before the stop string that
    completes first (it is not emitted; the result is the same however the text is chunked), or,
    while no stop has matched, everything except the longest tail that could still be the
    beginning of a stop string. :meth:`flush` releases that
    tail when the stream ends for another reason (EOS, max_tokens). Matching is on the decoded text,
    the same semantics as the OpenAI API's ``stop`` and vLLM's stop strings.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops: tuple[str, ...] = tuple(stops)
        self._held = ""
        self.stopped: str | None = None
        self._max_hold = max((len(s) for s in self.stops), default=1) - 1

    def feed(self, text: str) -> tuple[str, bool]:
        """Adds ``text``; returns ``(text to emit, stopped)``. After a stop, feeding is an error."""
        if self.stopped is not None:
            raise RuntimeError("StopMatcher.feed after a stop string matched")
        if not self.stops:
            return text, False
        buf = self._held + text
        # The stop that completes first (smallest end; on a tie the longest), as if the text had
        # arrived one character at a time, so the result never depends on how it was chunked.
        best: tuple[int, int] | None = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < best):
                best, self.stopped = (i + len(s), i), s
        if best is not None:
            self._held = ""
            return buf[:best[1]], True
        hold = 0
        for k in range(min(len(buf), self._max_hold), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                hold = k
                break
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        """Ends the stream without a stop: returns the text held back."""
        held, self._held = self._held, ""
        return held

    @property
    def held(self) -> str:
        """Text currently held back as a possible stop-string prefix."""
        return self._held
