"""Prefix-cache hits per conversation: how much of each conversation's prompts the engine's
prefix cache held (their prefill skipped).

Every generation reports its prompt tokens and the tokens the cache held (``Delta.cached_tokens``
of ``fak.Engine``, from the native core's per-admission hits); ``PrefixCacheStats`` sums them
per conversation key (the policy's: ``X-Fak-Conversation``, the request's ``user``, Claude
Code's ``metadata.user_id``, Codex's ``prompt_cache_key``, else a hash of the first messages),
for the last ``capacity`` conversations, and in total. ``/health`` shows it as ``prefix_cache``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

__all__ = ["ConversationHits", "PrefixCacheStats"]


@dataclass
class ConversationHits:
    """One conversation's requests, prompt tokens and prompt tokens the prefix cache held."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """``cached_tokens / prompt_tokens`` (0 with no prompt tokens)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class PrefixCacheStats:
    """Per-conversation prefix-cache hit rates, bounded (least recently seen dropped first).

    Args:
        capacity: conversations kept.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self.total = ConversationHits()
        self._by: OrderedDict[str, ConversationHits] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, conversation: str, prompt_tokens: int, cached_tokens: int | None) -> None:
        """One generation of ``conversation``: its prompt tokens and those the cache held
        (``None``: the engine does not report hits; nothing is recorded)."""
        if cached_tokens is None:
            return
        with self._lock:
            c = self._by.pop(conversation, None) or ConversationHits()
            self._by[conversation] = c
            while len(self._by) > self.capacity:
                self._by.popitem(last=False)
            for h in (c, self.total):
                h.requests += 1
                h.prompt_tokens += prompt_tokens
                h.cached_tokens += cached_tokens

    def get(self, conversation: str) -> ConversationHits | None:
        """A conversation's counts (``None`` when not held)."""
        with self._lock:
            return self._by.get(conversation)

    def summary(self, limit: int = 32) -> dict[str, Any]:
        """``{"requests", "prompt_tokens", "cached_tokens", "hit_rate", "conversations": [...]}``:
        the totals and the ``limit`` most recently seen conversations, most recent first."""
        with self._lock:
            recent = list(self._by.items())[-limit:][::-1]
            total = self.total
            return {
                "requests": total.requests, "prompt_tokens": total.prompt_tokens,
                "cached_tokens": total.cached_tokens, "hit_rate": round(total.hit_rate, 4),
                "conversations": [{"conversation": k, "requests": h.requests, "prompt_tokens": h.prompt_tokens,
                                   "cached_tokens": h.cached_tokens, "hit_rate": round(h.hit_rate, 4)}
                                  for k, h in recent],
            }
