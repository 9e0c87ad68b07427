"""The hand-written stubs ``python/fak/_native.pyi`` match the built extension (mypy.stubtest).

Bindings that another branch is still building are named in
``tests/data/native_stubtest_allowlist.txt``; an entry is allowlisted only while that name is
missing from the built module (then ``__all__`` is allowlisted too, since it cannot match yet).
Once a binding lands it is checked in full, with no edit needed here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fak._native
from fak_subprocess import fak_env

REPO = Path(__file__).resolve().parents[1]
PENDING = REPO / "tests" / "data" / "native_stubtest_allowlist.txt"


def _allowlist() -> list[str]:
    names = [line.strip() for line in PENDING.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    missing = [n for n in names if not hasattr(fak._native, n.rsplit(".", 1)[1])]
    return missing + (["fak._native.__all__"] if missing else [])


def test_stubtest(tmp_path: Path) -> None:
    allow = tmp_path / "allowlist.txt"
    allow.write_text("\n".join(_allowlist()) + "\n")
    # mypy finds the stub (.pyi) where the package is: the checkout's python/ or the installed copy
    env = fak_env()
    env.pop("MYPYPATH", None)
    if "PYTHONPATH" in env:
        env["MYPYPATH"] = env["PYTHONPATH"]
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "fak._native", "--allowlist", str(allow)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
