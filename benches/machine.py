"""What a bench result records of the machine it ran on: the CPU's model name (``/proc/cpuinfo``:
these machines are Intel with AVX-512 or AMD EPYC with AVX2), logical cores, Python, load."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def cpu_name(default: str = "unknown") -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (its first ``model name`` line), else ``default``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def machine() -> dict[str, Any]:
    """``{"cpu": model name or "unknown", "cores": logical CPUs, "python": version, "load": the
    1-minute load average at the call (None where the OS has none)}``."""
    cpu = cpu_name()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
