"""The pipeline's artifacts: one JSONL file per instance and stage, ``OUTPUT/pipeline/ID/STAGE.jsonl``.

Line 1 is the stage's header::

    {"kind": "header", "stage", "instance_id", "input_digest", "content_digest", "config",
     "usage": {"requests", "prompt_tokens", "completion_tokens", "model_s"}, "seconds",
     "model", "created_at"}

the other lines are the stage's records (each with a ``kind``). A file is written whole, through a
temporary file and a rename, when its stage has finished: a file that exists is a finished stage.

``input_digest`` is the SHA-256 of the stage's configuration and of the ``content_digest`` of the
artifacts it reads; ``content_digest`` that of its own records (the header, with its timings, is
not part of it, nor are the records' timings, the test stage's timeline and output excerpts,
``VOLATILE``). A re-run reuses a finished stage whose ``input_digest`` is still the same, and
redoes it otherwise (the stage's budget changed, or an earlier stage was redone with a different
result), so a change runs down the chain and nothing else is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

#: record keys that say how a result was obtained, not what it is: left out of ``content_digest``
VOLATILE = frozenset({"seconds", "output_tail", "latency_s", "model_s", "wall_s", "timeline",
                      "workers"})


def _stable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _stable(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [_stable(v) for v in obj]
    return obj


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(obj: Any) -> str:
    """SHA-256 hex of the canonical JSON of ``obj``."""
    return hashlib.sha256(_canonical(obj).encode("utf-8", "surrogatepass")).hexdigest()


class Artifact:
    """A finished stage's file: ``header`` and ``records``."""

    def __init__(self, path: Path, header: dict[str, Any], records: list[dict[str, Any]]):
        self.path = path
        self.header = header
        self.records = records

    @property
    def content_digest(self) -> str:
        return str(self.header.get("content_digest", ""))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]


class Store:
    """The artifacts of one run folder (``OUTPUT/pipeline``)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, instance_id: str, stage: str) -> Path:
        return self.root / instance_id / f"{stage}.jsonl"

    def load(self, instance_id: str, stage: str) -> Artifact | None:
        """The finished stage's artifact, or ``None`` (missing or unreadable)."""
        path = self.path(instance_id, stage)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
            rows = [json.loads(ln) for ln in lines if ln.strip()]
        except (OSError, ValueError):
            return None
        if not rows or rows[0].get("kind") != "header":
            return None
        return Artifact(path, rows[0], rows[1:])

    def write(self, instance_id: str, stage: str, header: dict[str, Any],
              records: list[dict[str, Any]]) -> Artifact:
        """Write the stage's file (header completed with ``content_digest``); returns it."""
        header = {"kind": "header", "stage": stage, "instance_id": instance_id, **header,
                  "content_digest": digest(_stable(records)), "created_at": round(time.time(), 3)}
        path = self.path(instance_id, stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for row in [header, *records]:
                f.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")
        os.replace(tmp, path)
        return Artifact(path, header, records)
