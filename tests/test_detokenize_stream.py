"""Streaming detokenization: deltas never split a UTF-8 character and add up to the full decode.

Property tests (hypothesis) over a byte-level vocabulary where every byte is its own token, so
multi-byte characters (accents, CJK, emoji) are split across tokens at every possible point, and
over the real Qwen vocabulary.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fak.tokenizer import IncrementalDetokenizer, Tokenizer

import model_meta
from fake_native import tiny_tokenizer

TINY = tiny_tokenizer()
ALL_IDS = st.integers(min_value=0, max_value=TINY.n_vocab - 1)


def _stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    d = IncrementalDetokenizer(tok)
    return [d.add(i) for i in ids] + [d.flush()]


@given(st.lists(ALL_IDS, max_size=64))
def test_deltas_add_up_to_full_decode(ids: list[int]) -> None:
    deltas = _stream(TINY, ids)
    assert "".join(deltas) == TINY.decode(ids)
    for d in deltas:
        d.encode("utf-8")  # no lone surrogates: every delta is valid UTF-8


@given(st.text(max_size=40))
def test_valid_text_split_at_every_byte_never_shows_replacement(text: str) -> None:
    ids = list(text.encode("utf-8"))  # one token per byte
    deltas = _stream(TINY, ids)
    assert "".join(deltas) == text
    assert sum(d.count("\ufffd") for d in deltas) == text.count("\ufffd")


@given(st.text(max_size=40), st.integers(min_value=1, max_value=5))
def test_add_many_equals_add(text: str, chunk: int) -> None:
    ids = list(text.encode("utf-8"))
    d = IncrementalDetokenizer(TINY)
    out = [d.add_many(ids[i:i + chunk]) for i in range(0, len(ids), chunk)] + [d.flush()]
    assert "".join(out) == "".join(_stream(TINY, ids))


def test_held_bytes_are_released_when_complete() -> None:
    d = IncrementalDetokenizer(TINY)
    emoji = "😀".encode()
    assert [d.add(b) for b in emoji[:3]] == ["", "", ""]
    assert d.pending_bytes == 3
    assert d.add(emoji[3]) == "😀" and d.pending_bytes == 0
    # an incomplete character at the end of the stream becomes U+FFFD, once
    assert d.add(0xE6) == "" and d.flush() == "\ufffd"


def test_invalid_bytes_become_replacement_immediately() -> None:
    d = IncrementalDetokenizer(TINY)
    assert d.add(0xFF) == "\ufffd"
    assert d.add(ord("a")) == "a"


def test_control_tokens_are_empty_unless_asked() -> None:
    im_end = TINY.token_to_id("<|im_end|>")
    assert im_end is not None
    assert IncrementalDetokenizer(TINY).add(im_end) == ""
    assert IncrementalDetokenizer(TINY, skip_special=False).add(im_end) == "<|im_end|>"


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=60))
def test_real_vocabulary_stream_roundtrip(model_05b, text: str) -> None:  # type: ignore[no-untyped-def]
    tok = model_meta.tokenizer(model_05b)
    ids = tok.encode(text, add_special=False, parse_special=False)
    deltas = _stream(tok, ids)
    assert "".join(deltas) == text
