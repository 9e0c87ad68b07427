"""The agent's prompts, as Jinja templates (``*.j2`` beside this file), written for small models."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

PROMPTS_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def _env(directory: str) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(directory),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=False,
                              autoescape=False)


def render(name: str, directory: Path | None = None, **variables: Any) -> str:
    """Render template ``name`` (e.g. ``"system_tools.j2"``) from ``directory`` (default: the
    packaged prompts). Raises ``jinja2.UndefinedError`` for a missing variable."""
    return _env(str(directory or PROMPTS_DIR)).get_template(name).render(**variables).strip()
