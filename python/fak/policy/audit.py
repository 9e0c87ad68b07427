"""The audit log: one JSON line per decided tool call (JSON Lines, https://jsonlines.org).

Each line is an object with, in this order: ``time`` (ISO-8601 UTC with microseconds and a
``Z``), ``conversation``, ``tool``, ``arguments_digest`` (``sha256:`` and the hex SHA-256 of the
arguments' canonical JSON: ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False)`` encoded as UTF-8; arguments that are not valid JSON are hashed as their raw
UTF-8 text: :func:`fak.toolcalls.wire.arguments_digest`), ``verdict`` (``"allow"``/``"deny"``),
``reason`` and ``rule``. The arguments themselves are not stored: they may hold file contents or
secrets; the digest lets an auditor match a line to a trajectory that has them. A denial's reason quotes the part that matched (the
offending command line, at most 160 characters), since that is what the client is told.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from typing import Any

from fak.policy.compile import Verdict
from fak.toolcalls.wire import arguments_digest


class AuditLog:
    """Append-only JSONL audit log at ``path`` (created with its parent folders if missing).

    Thread-safe: each :meth:`record` writes one whole line to the operating system in one
    ``write(2)`` on an ``O_APPEND`` file (no fsync: a machine crash may lose the last lines, a
    process crash does not), so the replicas behind a router can share one log. ``replica``: a
    name put in every record as ``"replica"`` (``fak serve --replica-name``). Use as a context
    manager or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str], *, replica: str | None = None):
        self.path = os.fspath(path)
        self.replica = replica
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        # unbuffered O_APPEND: each line is one write(2) at the end of the file, so several
        # replicas (processes) can share one log without interleaving their lines
        self._f = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()

    def _write(self, entry: dict[str, Any]) -> dict[str, Any]:
        if self.replica is not None and "replica" not in entry:
            entry = {**entry, "replica": self.replica}
        data = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            self._f.write(data)
        return entry

    def record(self, *, conversation: str, tool: str,
               arguments: str | bytes | dict[str, Any], verdict: Verdict) -> dict[str, Any]:
        """Append one decision; returns the entry written (a dict)."""
        entry = {
            "time": datetime.now(timezone.utc).isoformat(timespec="microseconds")
                    .replace("+00:00", "Z"),
            "conversation": conversation,
            "tool": tool,
            "arguments_digest": arguments_digest(arguments),
            "verdict": "allow" if verdict.allowed else "deny",
            "reason": verdict.reason,
            "rule": verdict.rule,
        }
        return self._write(entry)

    def write_entry(self, entry: dict[str, Any]) -> None:
        """Append one JSON object as a line (other event kinds, e.g. the gateway's quarantine
        decisions), under the same lock as :meth:`record`."""
        self._write(entry)

    def close(self) -> None:
        """Close the file (further records raise ``ValueError``)."""
        with self._lock:
            self._f.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
