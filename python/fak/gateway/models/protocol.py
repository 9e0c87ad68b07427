"""Schemas of ``GET /v1/models`` (OpenAI's model list)."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["ModelCard", "ModelList"]


class ModelCard(msgspec.Struct):
    """One served model. ``max_model_len`` (the context window in tokens, vLLM's name) and
    ``context_length`` (the same number, as LM Studio and OpenRouter name it) are extensions that
    let a client read the window."""

    id: str
    created: int
    object: str = "model"
    owned_by: str = "fak"
    max_model_len: int | UnsetType = UNSET
    context_length: int | UnsetType = UNSET


class ModelList(msgspec.Struct):
    """``{"object": "list", "data": [...]}``."""

    data: list[ModelCard]
    object: str = "list"
