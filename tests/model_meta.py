"""Cached GGUF metadata and tokenizers of the real models, shared by the tokenizer, chat-template
and engine tests (reading a 150k-token vocabulary once per test session)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from fak.tokenizer import Tokenizer, read_gguf_metadata


@lru_cache(maxsize=4)
def metadata(path: Path) -> dict[str, Any]:
    return read_gguf_metadata(path)


@lru_cache(maxsize=4)
def tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata(path))
