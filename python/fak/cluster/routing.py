"""The routing policy of the replica router: conversation affinity, longest cached prefix, least loaded.

Pure Python, no I/O: ``Router.choose(key, conversation)`` names the replica for one request and
``Router.done(name)`` ends it. The HTTP side is ``fak.cluster.router``.

Order of preference for a request (the SGLang router's cache-aware policy, simplified):

1. its conversation (``X-Fak-Conversation``) is pinned to a live replica → that replica (the
   replica that holds the conversation's earlier turns in its prefix cache);
2. the live replica whose prompt index holds the longest prefix of this prompt, unless it is
   busier than the least loaded one by more than ``balance_slack`` requests in flight (then 3);
   ties go to the least loaded;
3. the least loaded live replica (fewest requests in flight; ties in turn).

The prompt index is what the router has sent to each replica, not the replica's own KV cache: a
prompt's text is cut into ``block_chars``-character blocks, each block hashed together with the
hash of the blocks before it (the chained block hashes of vLLM's automatic prefix caching, over
characters instead of tokens: the router has no tokenizer), and each replica keeps the last
``index_blocks`` hashes it was sent (LRU). A replica's prefix cache is LRU too, so the two forget
in roughly the same order; a replica marked down loses its index and its pinned conversations.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NoReplicaError", "Replica", "Router", "block_hashes", "prompt_key"]


class NoReplicaError(Exception):
    """No live replica to send a request to (all are down or excluded)."""


def prompt_key(body: dict[str, Any]) -> str:
    """The text whose prefix a replica caches, from an OpenAI request body: the messages
    (role, content, tool calls, in order) of a chat request, or a completion's ``prompt``.
    Only the order of text matters to the policy, not the exact chat template."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if not isinstance(content, str):
                content = json.dumps(content, sort_keys=True, ensure_ascii=False)
            parts.append(f"<{m.get('role')}>{content}")
            if m.get("tool_calls"):
                parts.append(json.dumps(m["tool_calls"], sort_keys=True, ensure_ascii=False))
        return "\x1e".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return json.dumps(prompt, ensure_ascii=False)


def block_hashes(text: str, block_chars: int) -> list[int]:
    """Chained hashes of ``text``'s whole ``block_chars``-character blocks (a trailing partial
    block has none, as a partial KV block is not cached). ``hash`` is per process: the index
    lives in the router only."""
    out: list[int] = []
    prev = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        prev = hash((prev, text[start:start + block_chars]))
        out.append(prev)
    return out


@dataclass
class Replica:
    """One replica as the router sees it.

    Attributes:
        name: its name in logs, headers (``X-Fak-Replica``) and audit records.
        url: its base URL (``http://host:port``, no ``/v1``).
        up: whether requests may go to it.
        in_flight: requests sent to it and not yet finished.
        requests: requests sent to it in all.
        failures: requests to it that failed on the connection (each marks it down).
    """

    name: str
    url: str
    up: bool = True
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    index: OrderedDict[int, None] = field(default_factory=OrderedDict, repr=False)
    down_reason: str = ""

    def matched_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt this replica was sent before."""
        n = 0
        for h in hashes:
            if h not in self.index:
                break
            n += 1
        return n


class Router:
    """The routing state of a set of replicas; thread-safe.

    Args:
        replicas: ``(name, url)`` pairs, names unique.
        block_chars: characters per prompt block of the prefix index.
        index_blocks: block hashes remembered per replica (LRU).
        balance_slack: a prefix match is followed unless its replica has more than this many
            more requests in flight than the least loaded live one.
        max_conversations: conversations pinned at most (LRU).
        prefix_aware: ``False`` turns steps 1–2 off: plain round robin (the benchmark's peer).

    Raises:
        ValueError: no replicas, or a name given twice.
    """

    def __init__(self, replicas: Iterable[tuple[str, str]], *, block_chars: int = 128,
                 index_blocks: int = 200_000, balance_slack: int = 4,
                 max_conversations: int = 100_000, prefix_aware: bool = True) -> None:
        self.replicas: dict[str, Replica] = {}
        for name, url in replicas:
            if name in self.replicas:
                raise ValueError(f"replica name {name!r} given twice")
            self.replicas[name] = Replica(name, url.rstrip("/"))
        if not self.replicas:
            raise ValueError("a router needs at least one replica")
        self.block_chars = block_chars
        self.index_blocks = index_blocks
        self.balance_slack = balance_slack
        self.max_conversations = max_conversations
        self.prefix_aware = prefix_aware
        self.conversations: OrderedDict[str, str] = OrderedDict()
        self.decisions = {"conversation": 0, "prefix": 0, "least_loaded": 0, "round_robin": 0}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def choose(self, key: str, conversation: str | None = None,
               exclude: Iterable[str] = ()) -> tuple[Replica, str]:
        """Pick the replica for one request and count it in flight there; returns
        ``(replica, why)`` with ``why`` one of ``conversation``, ``prefix``, ``least_loaded``,
        ``round_robin``. Call ``done(replica.name)`` when the request ends.

        Args:
            key: the prompt text (``prompt_key``).
            conversation: the ``X-Fak-Conversation`` value, or ``None``.
            exclude: replicas already tried for this request.

        Raises:
            NoReplicaError: no live replica outside ``exclude``.
        """
        excluded = set(exclude)
        hashes = block_hashes(key, self.block_chars) if self.prefix_aware else []
        with self._lock:
            live = [r for r in self.replicas.values() if r.up and r.name not in excluded]
            if not live:
                down = ", ".join(f"{r.name} ({r.down_reason or 'excluded'})"
                                 for r in self.replicas.values())
                raise NoReplicaError(f"no replica can take the request: {down}")
            chosen, why = self._pick(live, hashes, conversation)
            chosen.in_flight += 1
            chosen.requests += 1
            self.decisions[why] += 1
            if self.prefix_aware:
                if conversation:
                    self.conversations[conversation] = chosen.name
                    self.conversations.move_to_end(conversation)
                    while len(self.conversations) > self.max_conversations:
                        self.conversations.popitem(last=False)
                index = chosen.index
                for h in hashes:
                    index[h] = None
                    index.move_to_end(h)
                while len(index) > self.index_blocks:
                    index.popitem(last=False)
            return chosen, why

    def _pick(self, live: list[Replica], hashes: list[int],
              conversation: str | None) -> tuple[Replica, str]:
        if not self.prefix_aware:
            return live[next(self._turn) % len(live)], "round_robin"
        if conversation:
            pinned = self.replicas.get(self.conversations.get(conversation, ""))
            if pinned is not None and pinned in live:
                return pinned, "conversation"
        least = min(r.in_flight for r in live)
        if hashes:
            best = max(r.matched_blocks(hashes) for r in live)
            if best > 0:
                candidates = [r for r in live if r.matched_blocks(hashes) == best
                              and r.in_flight - least <= self.balance_slack]
                if candidates:
                    return min(candidates, key=lambda r: r.in_flight), "prefix"
        idle = [r for r in live if r.in_flight == least]
        return idle[next(self._turn) % len(idle)], "least_loaded"

    def done(self, name: str) -> None:
        """One request to replica ``name`` ended (answered, failed or cancelled)."""
        with self._lock:
            r = self.replicas[name]
            r.in_flight = max(0, r.in_flight - 1)

    def mark_down(self, name: str, reason: str) -> None:
        """Stop sending to replica ``name`` (its connection failed): its prompt index and pinned
        conversations are dropped, so they move to the others."""
        with self._lock:
            r = self.replicas[name]
            r.failures += 1
            if not r.up:
                return
            r.up = False
            r.down_reason = reason
            r.index.clear()
            for conv in [c for c, n in self.conversations.items() if n == name]:
                del self.conversations[conv]

    def mark_up(self, name: str) -> None:
        """Replica ``name`` answers again (health probe): requests may go to it."""
        with self._lock:
            r = self.replicas[name]
            r.up = True
            r.down_reason = ""

    def snapshot(self) -> dict[str, Any]:
        """The state for ``/health``: each replica's status, load and counts, and the decisions."""
        with self._lock:
            return {
                "replicas": [{"name": r.name, "url": r.url, "up": r.up, "in_flight": r.in_flight,
                              "requests": r.requests, "failures": r.failures,
                              "indexed_blocks": len(r.index),
                              **({"down_reason": r.down_reason} if r.down_reason else {})}
                             for r in self.replicas.values()],
                "decisions": dict(self.decisions),
                "conversations": len(self.conversations),
                "policy": "prefix_aware" if self.prefix_aware else "round_robin",
            }
