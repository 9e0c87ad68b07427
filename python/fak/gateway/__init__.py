"""``fak serve``: an OpenAI-compatible gateway over ``fak.Engine`` (or an upstream server).

Layout (one folder per endpoint, as vLLM's ``entrypoints/openai``): ``app.py`` builds the
Litestar app; ``chat_completions/``, ``completions/``, ``models/``, ``health/``, ``metrics/``
hold each endpoint's routes, protocol (msgspec schemas) and serving logic; ``toolcalls.py``
parses Qwen2.5 tool calls; ``policy_filter.py`` adjudicates them; ``proxy.py`` relays to an
upstream server; ``cli.py`` is ``fak serve``. See ``docs/gateway.md``.

The public names are imported lazily, so ``fak --help`` does not load the web stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fak.gateway.app import Gateway, GatewayConfig, create_app
    from fak.gateway.proxy import Upstream
    from fak.gateway.server import BackgroundServer

__all__ = ["BackgroundServer", "Gateway", "GatewayConfig", "Upstream", "create_app"]

_WHERE = {"Gateway": "app", "GatewayConfig": "app", "create_app": "app", "Upstream": "proxy",
          "BackgroundServer": "server"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"fak.gateway.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'fak.gateway' has no attribute {name!r}")
