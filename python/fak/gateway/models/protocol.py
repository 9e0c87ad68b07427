"""Schemas of ``GET /v1/models`` (OpenAI's model list)."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["ModelCard", "ModelList"]


class ModelCard(msgspec.Struct):
    """One served model. ``max_model_len`` (context window in tokens) is a vLLM-style extension."""

    id: str
    created: int
    object: str = "model"
    owned_by: str = "fak"
    max_model_len: int | UnsetType = UNSET


class ModelList(msgspec.Struct):
    """``{"object": "list", "data": [...]}``."""

    data: list[ModelCard]
    object: str = "list"
