"""The pipeline's prompts, as Jinja templates (``*.j2`` beside this file), rendered with the
agent's renderer (``fak.agent.prompts.render``): short, concrete, one question each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fak.agent.prompts import render as _render

PROMPTS_DIR = Path(__file__).resolve().parent


def render(name: str, **variables: Any) -> str:
    """Render ``name`` (e.g. ``"repair.j2"``). Raises ``jinja2.UndefinedError`` for a missing
    variable."""
    return _render(name, directory=PROMPTS_DIR, **variables)
