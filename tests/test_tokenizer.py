"""Tokenizer built from GGUF metadata: llama.cpp-exact ids, special tokens, BOS/EOS, EOG set.

The ids are checked against llama.cpp itself: ``tests/data/tokenizer_goldens.json`` holds the ids
that ``llama_tokenize`` (llama-cpp-python, vocab only) returns for every prompt of
``TRICKY_PROMPTS`` on both real models (qwen2 pre-tokenizer) and on ``fak.synth``'s tiny models
(qwen2 and llama-bpe families), written by ``scripts/tokenizer-goldens``. To add a case, add the
prompt to ``TRICKY_PROMPTS`` in that script and re-run it (also after a change to ``fak.synth``'s
vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fak
from fak.tokenizer import PRE_TOKENIZERS, TokenAttr, Tokenizer, _BYTE_ENCODER

import model_meta

GOLDENS = Path(__file__).parent / "data" / "tokenizer_goldens.json"

QWEN_SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                "<tool_call>": 151657, "</tool_call>": 151658, "<|fim_pad|>": 151662}


@pytest.fixture(scope="module", params=["model_05b", "model_15b"])
def qwen(request: pytest.FixtureRequest) -> Tokenizer:
    return model_meta.tokenizer(request.getfixturevalue(request.param))


def _goldens() -> list[dict]:
    return json.loads(GOLDENS.read_text())["cases"]


def test_goldens_cover_both_models_and_modes() -> None:
    cases = _goldens()
    assert {c["model"] for c in cases} == {"qwen2.5-coder-0.5b-instruct-mixed", "qwen2.5-coder-1.5b-instruct-q4_k_m",
                                           "synth-tiny-qwen2", "synth-tiny-llama"}
    assert {c["parse_special"] for c in cases} == {True, False}
    assert len(cases) >= 900


def _check_goldens(tok: Tokenizer, model: str) -> None:
    cases = [c for c in _goldens() if c["model"] == model]
    assert cases
    mismatches = []
    for c in cases:
        ids = tok.encode(c["text"], add_special=c["add_special"], parse_special=c["parse_special"])
        if ids != c["ids"]:
            mismatches.append((c["text"][:60], c["parse_special"], c["add_special"], ids[:20], c["ids"][:20]))
    assert not mismatches, mismatches


@pytest.mark.parametrize("model_fixture", ["model_05b", "model_15b"])
def test_identical_to_llama_cpp(model_fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(model_fixture)
    _check_goldens(model_meta.tokenizer(path), path.stem)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_identical_to_llama_cpp_on_synthetic_models(arch: str, tmp_path: Path) -> None:
    synth = pytest.importorskip("fak.synth", reason="fak.synth has not landed in this checkout")
    path = synth.write_tiny_model(tmp_path / f"tiny-{arch}.gguf", arch=arch)
    tok = Tokenizer.from_gguf(path)
    assert tok.pre == {"qwen2": "qwen2", "llama": "llama-bpe"}[arch]
    _check_goldens(tok, f"synth-tiny-{arch}")


def test_special_tokens_parse_special(qwen: Tokenizer) -> None:
    text = "<|im_start|>user\nhi<|im_end|>\n"
    ids = qwen.encode(text)
    assert ids == [QWEN_SPECIAL["<|im_start|>"], 872, 198, 6023, QWEN_SPECIAL["<|im_end|>"], 198]
    plain = qwen.encode(text, parse_special=False)
    assert QWEN_SPECIAL["<|im_start|>"] not in plain and QWEN_SPECIAL["<|im_end|>"] not in plain
    assert qwen.decode(plain) == text  # written out as ordinary text
    # user-defined tokens are cut out even without parse_special (llama.cpp tokenizer_st_partition)
    call = qwen.encode("<tool_call>{}</tool_call>", parse_special=False)
    assert call[0] == QWEN_SPECIAL["<tool_call>"] and call[-1] == QWEN_SPECIAL["</tool_call>"]


def test_decode_control_tokens(qwen: Tokenizer) -> None:
    ids = qwen.encode("<|im_start|>assistant\nok<|im_end|>")
    assert qwen.decode(ids) == "assistant\nok"
    assert qwen.decode(ids, skip_special=False) == "<|im_start|>assistant\nok<|im_end|>"
    # user-defined tokens are text (the gateway parses them)
    assert qwen.decode(qwen.encode("<tool_call>\n{}\n</tool_call>")) == "<tool_call>\n{}\n</tool_call>"
    # unused padding tokens render as nothing
    assert qwen.token_attr(151700) == TokenAttr.UNUSED and qwen.token_bytes(151700) == b""


def test_qwen_flags_and_eog(qwen: Tokenizer) -> None:
    assert qwen.pre == "qwen2"
    assert qwen.n_vocab == 151936
    assert not qwen.add_bos and not qwen.add_eos
    assert qwen.encode("x", add_special=True) == qwen.encode("x", add_special=False)
    assert qwen.eos_id == QWEN_SPECIAL["<|im_end|>"]
    assert qwen.bos_id == QWEN_SPECIAL["<|endoftext|>"]
    # llama.cpp's EOG set for this vocabulary: eos, the EOG-looking texts, FIM pad/repo/sep
    expected = {151643, 151645, 151662, 151663, 151664, qwen.token_to_id("</s>")}
    assert qwen.eog_ids == frozenset(expected)
    assert all(qwen.is_eog(i) for i in expected) and not qwen.is_eog(QWEN_SPECIAL["<|im_start|>"])


@pytest.mark.parametrize("text", [
    "", " ", "\n\n\n", "   \t  \r\n", "Hello, world!", "don't I'M we'LL", "12345678901234567890",
    "日本語のテキスト、中文，한국어", "emoji 😀👨‍👩‍👧‍👦🏳️‍🌈 done", "def f(x):\n    return x  # é\n",
    "\u00a0\u2003\u3000 spaces", "a\u0301e\u0301 combining", "<|im_start|> not special? <|im_end|>",
    "\x00\x01\x7f control bytes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
])
@pytest.mark.parametrize("parse_special", [True, False])
def test_roundtrip(qwen: Tokenizer, text: str, parse_special: bool) -> None:
    ids = qwen.encode(text, add_special=False, parse_special=parse_special)
    assert qwen.decode(ids, skip_special=False) == text
    assert all(0 <= i < qwen.n_vocab for i in ids)


def test_digits_split_one_by_one(qwen: Tokenizer) -> None:
    ids = qwen.encode("2024", add_special=False)
    assert [qwen.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_hf_tokenizer_agrees_on_plain_text(qwen: Tokenizer) -> None:
    text = "import os\nprint(os.getcwd())  # 日本 😀\n<|im_start|>"
    assert qwen.hf.encode(text, add_special_tokens=False).ids == qwen.encode(text)


# --- synthetic vocabularies: families, BOS/EOS, errors ------------------------------------------


def _byte_vocab(extra: list[str], extra_types: list[int]) -> tuple[list[str], list[int]]:
    tokens = [_BYTE_ENCODER[b] for b in range(256)] + extra
    return tokens, [1] * 256 + extra_types


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_every_family_builds_and_roundtrips(pre: str) -> None:
    tokens, types = _byte_vocab(["<|eot_id|>"], [3])
    tok = Tokenizer(tokens, types, [], pre=pre, bos_id=None, eos_id=256)
    text = "Hello 123 日本 😀\n\n  x'll"
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text


def test_llama3_family_adds_bos_by_default_and_splits_digits_by_three() -> None:
    tokens, types = _byte_vocab(["<|begin_of_text|>", "<|eot_id|>"], [3, 3])
    tok = Tokenizer(tokens, types, [], pre="llama-bpe", bos_id=256, eos_id=257)
    ids = tok.encode("hi")
    assert ids[0] == 256 and tok.decode(ids) == "hi"
    assert [p for p, _ in tok.hf.pre_tokenizer.pre_tokenize_str("1234567")] == ["123", "456", "7"]
    off = Tokenizer(tokens, types, [], pre="llama-bpe", bos_id=256, eos_id=257, add_bos=False)
    assert off.encode("hi")[0] != 256
    eos = Tokenizer(tokens, types, [], pre="llama-bpe", bos_id=256, eos_id=257, add_eos=True)
    assert eos.encode("hi")[-1] == 257 and eos.encode("hi", add_special=False)[-1] != 257


def test_qwen2_pretokenizer_splits() -> None:
    tok = Tokenizer(*_byte_vocab([], []), [], pre="qwen2")
    pieces = [p for p, _ in tok.hf.pre_tokenizer.pre_tokenize_str("I'M   fine\n\n  ok 42")]
    # byte-level mapped: Ġ is a space, Ċ a newline
    assert pieces == ["I", "'M", "ĠĠ", "Ġfine", "ĊĊ", "Ġ", "Ġok", "Ġ", "4", "2"]


def test_merges_apply_in_rank_order() -> None:
    tokens, types = _byte_vocab(["ab", "bc", "abc"], [1, 1, 1])
    # "b c" ranks before "a b": "abc" -> a + bc (no "a bc" merge)
    tok = Tokenizer(tokens, types, ["b c", "a b", "ab c"], pre="qwen2")
    assert tok.encode("abc") == [ord("a"), tokens.index("bc")]
    tok2 = Tokenizer(tokens, types, ["a b", "ab c"], pre="qwen2")
    assert tok2.encode("abc") == [tokens.index("abc")]


def test_longest_special_token_wins() -> None:
    tokens, types = _byte_vocab(["<|a|>", "<|a|><|b|>"], [3, 3])
    tok = Tokenizer(tokens, types, [], pre="qwen2")
    assert tok.encode("x<|a|><|b|>y") == [ord("x"), 257, ord("y")]
    assert tok.encode("<|a|>") == [256]


def test_eog_detected_by_text_and_forced_control() -> None:
    tokens, types = _byte_vocab(["<|im_end|>", "<|endoftext|>", "<|file_sep|>"], [1, 3, 3])
    tok = Tokenizer(tokens, types, [], pre="qwen2", eos_id=257)
    assert tok.eog_ids == {256, 257, 258}
    # a normal-typed EOG token becomes control, as llama.cpp overrides it
    assert tok.token_attr(256) & TokenAttr.CONTROL
    assert tok.encode("<|im_end|>") == [256]


def test_unsupported_pre_tokenizer_and_model() -> None:
    with pytest.raises(fak.UnsupportedError, match="no-such-pre"):
        Tokenizer(*_byte_vocab([], []), [], pre="no-such-pre")
    with pytest.raises(fak.UnsupportedError, match="llama"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []})


def test_token_bytes_bounds() -> None:
    tok = Tokenizer(*_byte_vocab([], []), [], pre="qwen2")
    with pytest.raises(IndexError):
        tok.token_bytes(256)
