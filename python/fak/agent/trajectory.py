"""The trajectory of one agent run, written to JSON after every step (atomic replace).

Shape (``"format": "fak-trajectory/1"``)::

    {"format", "instance_id", "run_id", "model", "protocol", "config": {...},
     "messages": [OpenAI message dicts, as sent to the model],
     "steps": [{"step", "started_at" (unix s), "model_latency_s", "attempts", "finish_reason",
                "usage": {"prompt_tokens", "completion_tokens"},
                "verdicts": [gateway fak_policy verdicts], "format_error": str | null,
                "resamples": [{"attempt", "temperature", "seed", "repeated_call": {"name",
                               "arguments"}, "repeat_of_step", "response", "usage",
                               "model_latency_s", "verdicts"}]   (replies dropped as repeats),
                "actions": [{"id", "name", "arguments", "denied", "verdict", "executed", "ok",
                             "returncode", "output", "duration_s",
                             "repeated"?, "repeat_of"? (a call identical to the one of that
                             step, not run again)}]}],
     "tokens": {"prompt", "completion"}, "n_steps", "n_denied", "n_format_errors",
     "n_repeated" (calls not run as repeats), "n_resampled" (turns asked again),
     "timings": {"started_at", "ended_at", "wall_s", "model_s", "tools_s"},
     "exit_reason": "submitted" | "max_steps" | "model_error" | "interrupted" | "error" | null,
     "exit_message", "patch" (str, set by the fleet),
     "info": {"seed_locations": [{"path", "line"?, "symbol"?}], "prompt_examples": {...},
              "python": {...} (the fleet's interpreter choice), ...}}
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

FORMAT = "fak-trajectory/1"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


class Trajectory:
    """Mutable trajectory record; ``save()`` writes it to ``path`` (when a path is set)."""

    def __init__(self, path: Path | None, **header: Any):
        self.path = path
        self.data: dict[str, Any] = {
            "format": FORMAT, **header, "messages": [], "steps": [],
            "tokens": {"prompt": 0, "completion": 0}, "n_steps": 0, "n_denied": 0,
            "n_format_errors": 0, "n_repeated": 0, "n_resampled": 0,
            "timings": {"started_at": time.time(), "ended_at": None, "wall_s": 0.0,
                        "model_s": 0.0, "tools_s": 0.0},
            "exit_reason": None, "exit_message": None, "info": {},
        }

    def save(self) -> None:
        t = self.data["timings"]
        t["wall_s"] = round((t["ended_at"] or time.time()) - t["started_at"], 3)
        if self.path is not None:
            write_json_atomic(self.path, self.data)
