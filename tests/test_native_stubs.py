"""The hand-written stubs ``python/fak/_native.pyi`` match the built extension (mypy.stubtest).

Names of bindings that have not landed in this checkout are listed in
``tests/data/native_stubtest_allowlist.txt``; stubtest fails on an unused entry, so the list shrinks
as the bindings land and cannot hide a stale stub.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_stubtest() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), MYPYPATH=str(REPO / "python"))
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "fak._native",
         "--allowlist", str(REPO / "tests" / "data" / "native_stubtest_allowlist.txt")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
