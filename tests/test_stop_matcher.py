"""Stop strings across token boundaries: found wherever the text is cut, never emitted, and text
that may start a stop string is held back until it cannot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fak.tokenizer import StopMatcher


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """Text before the stop that completes first (char by char), or the whole text."""
    for end in range(1, len(text) + 1):
        for s in sorted(stops, key=len, reverse=True):
            if text[:end].endswith(s):
                return text[: end - len(s)], True
    return text, False


def run(chunks: list[str], stops: list[str]) -> tuple[str, bool, list[str]]:
    m = StopMatcher(stops)
    out = []
    for c in chunks:
        emit, stopped = m.feed(c)
        out.append(emit)
        if stopped:
            return "".join(out), True, out
    out.append(m.flush())
    return "".join(out), False, out


ALPHABET = st.sampled_from("ab\n<>|é😀 ")
TEXT = st.text(ALPHABET, max_size=30)


@given(st.lists(TEXT, max_size=8), st.lists(st.text(ALPHABET, min_size=1, max_size=5), min_size=1, max_size=3))
def test_matches_reference_for_any_chunking(chunks: list[str], stops: list[str]) -> None:
    text, stopped, _ = run(chunks, stops)
    assert (text, stopped) == reference("".join(chunks), stops)


@given(TEXT, st.lists(st.text(ALPHABET, min_size=1, max_size=5), min_size=1, max_size=3))
def test_char_by_char_equals_one_chunk(text: str, stops: list[str]) -> None:
    assert run(list(text), stops)[:2] == run([text], stops)[:2]


@given(st.lists(TEXT, max_size=8), st.text(ALPHABET, min_size=1, max_size=5))
def test_never_emits_a_stop_string(chunks: list[str], stop: str) -> None:
    text, _, _ = run(chunks, [stop])
    assert stop not in text


def test_stop_split_across_tokens() -> None:
    m = StopMatcher(["</answer>"])
    assert m.feed("The answer is 4<") == ("The answer is 4", False)
    assert m.held == "<"
    assert m.feed("/ans") == ("", False)
    assert m.feed("wer> trailing") == ("", True)
    assert m.stopped == "</answer>"
    with pytest.raises(RuntimeError):
        m.feed("more")


def test_held_text_released_when_it_cannot_start_a_stop() -> None:
    m = StopMatcher(["###"])
    assert m.feed("a#") == ("a", False)
    assert m.feed("#b") == ("##b", False)
    assert m.feed("##") == ("", False)
    assert m.flush() == "##"


def test_no_stops_passes_through() -> None:
    m = StopMatcher([])
    assert m.feed("anything") == ("anything", False)
    assert m.flush() == ""


def test_empty_stop_rejected() -> None:
    with pytest.raises(ValueError):
        StopMatcher([""])
