"""Stored responses (``store: true``), for ``previous_response_id`` and ``GET /v1/responses/{id}``.

Bounded three ways, oldest first out: at most ``max_items`` responses, ``max_bytes`` of their
conversations and bodies, each for ``ttl_s`` seconds after it was stored. A response past any of
these is gone: a request naming it gets a 400 (``previous_response_not_found``), as OpenAI
answers for an id it does not hold. In memory only: a restart forgets everything (clients such as
Codex send ``store: false`` and the whole history, which never depends on this store).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

__all__ = ["ResponseStore", "StoredResponse"]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: the conversation it ended (canonical chat messages, without the
    request's ``instructions``, with the answer as its last turns), its body, and its size."""

    messages: list[Any]
    body: dict[str, Any]
    n_bytes: int
    stored_at: float


class ResponseStore:
    """Responses by id, bounded by count, bytes and age (see the module doc). Thread-safe.

    Args:
        max_items: responses kept.
        max_bytes: bytes of conversation text and bodies kept (an estimate: the texts' lengths).
        ttl_s: seconds a response is kept.
    """

    def __init__(self, *, max_items: int = 1024, max_bytes: int = 256 << 20, ttl_s: float = 3600.0) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire(time.monotonic())
            return len(self._items)

    def put(self, response_id: str, messages: list[Any], body: dict[str, Any], n_bytes: int) -> None:
        """Keep a response (one larger than ``max_bytes`` is not kept)."""
        if n_bytes > self.max_bytes:
            return
        now = time.monotonic()
        with self._lock:
            self._drop(response_id)
            self._items[response_id] = StoredResponse(messages, body, n_bytes, now)
            self._bytes += n_bytes
            self._expire(now)
            while len(self._items) > self.max_items or self._bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or ``None`` (never stored, expired, evicted or deleted)."""
        with self._lock:
            self._expire(time.monotonic())
            return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Forget a response; ``False`` when it was not held."""
        with self._lock:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        item = self._items.pop(response_id, None)
        if item is None:
            return False
        self._bytes -= item.n_bytes
        return True

    def _expire(self, now: float) -> None:
        while self._items:
            first = next(iter(self._items.values()))
            if now - first.stored_at <= self.ttl_s:
                break
            self._drop(next(iter(self._items)))
