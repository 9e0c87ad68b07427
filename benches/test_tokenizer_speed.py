"""Tokenization and streaming-detokenization speed of fak's tokenizer on the real Qwen vocabulary,
with llama.cpp's tokenizer (llama-cpp-python, vocab only) measured in the same run as the peer
when it is installed.

Text: fak's own Python sources (code, the agent's typical input), about 150k characters.
Run: PYTHONPATH=python:tests python -m pytest benches/test_tokenizer_speed.py --benchmark-only
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import model_meta  # noqa: E402
from conftest import MODEL_05B, real_model  # noqa: E402

from fak.tokenizer import IncrementalDetokenizer  # noqa: E402

TEXT = "".join(p.read_text() for p in sorted((REPO / "python" / "fak").glob("*.py")))


@pytest.fixture(scope="module")
def model_05b() -> Path:
    return real_model(MODEL_05B)


@pytest.fixture(scope="module")
def tok(model_05b):  # type: ignore[no-untyped-def]
    return model_meta.tokenizer(model_05b)


def test_fak_encode(benchmark, tok) -> None:  # type: ignore[no-untyped-def]
    ids = benchmark(tok.encode, TEXT)
    benchmark.extra_info.update(chars=len(TEXT), tokens=len(ids))


def test_llama_cpp_encode(benchmark, model_05b) -> None:  # type: ignore[no-untyped-def]
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(model_05b), vocab_only=True, verbose=False)
    data = TEXT.encode()
    ids = benchmark(llm.tokenize, data, add_bos=False, special=True)
    benchmark.extra_info.update(chars=len(TEXT), tokens=len(ids))


def test_fak_stream_detokenize(benchmark, tok) -> None:  # type: ignore[no-untyped-def]
    ids = tok.encode(TEXT)

    def run() -> str:
        d = IncrementalDetokenizer(tok, skip_special=False)  # the sources contain control-token texts
        return "".join(d.add(i) for i in ids) + d.flush()

    assert benchmark(run) == TEXT
    benchmark.extra_info.update(tokens=len(ids))
