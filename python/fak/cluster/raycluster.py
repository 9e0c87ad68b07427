"""Starting or joining a Ray cluster, and the one place that imports Ray.

Ray is the optional extra ``pip install 'fak[ray]'``. ``require_ray()`` imports it or raises
``RayMissing`` naming that command; ``connect(address)`` joins a running cluster
(``"auto"``, ``"ray://host:10001"``, ``"host:6379"``) or, with ``None``/``"local"``, starts a
local one on this machine (loopback, no dashboard) with ``num_cpus`` CPUs.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["RayMissing", "connect", "require_ray"]

INSTALL_HINT = "pip install 'fak[ray]'"


class RayMissing(ImportError):
    """Ray is not installed; the message says how to install it."""


def require_ray() -> Any:
    """The ``ray`` module.

    Raises:
        RayMissing: Ray is not installed (message: ``pip install 'fak[ray]'``).
    """
    try:
        import ray
    except ImportError as exc:
        raise RayMissing(f"this needs Ray, an optional extra of fak: {INSTALL_HINT} "
                         f"({exc})") from None
    return ray


def connect(address: str | None = None, *, num_cpus: int | None = None,
            memory_bytes: int | None = None) -> Any:
    """Join or start the Ray cluster; returns the ``ray`` module (already initialised if it
    was). ``address`` ``None``/``""``/``"local"``: a new local cluster of ``num_cpus`` CPUs (and
    ``memory_bytes`` of memory, when given); anything else is passed to ``ray.init(address=...)``.

    Raises:
        RayMissing: Ray is not installed.
        ConnectionError: no cluster answers at ``address`` (Ray's own error).
    """
    ray = require_ray()
    if ray.is_initialized():
        return ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address in (None, "", "local"):
        kwargs: dict[str, Any] = {"num_cpus": num_cpus, "include_dashboard": False,
                                  "_node_ip_address": "127.0.0.1"}
        if memory_bytes:
            kwargs["_memory"] = memory_bytes
        ray.init(**kwargs)
    else:
        ray.init(address=address)
    return ray
