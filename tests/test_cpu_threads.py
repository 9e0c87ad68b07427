"""The CPU backend with more pool threads than this machine has cores: no deadlock.

``matmul_multi`` runs Q/K/V (and gate/up) as parallel tasks, each a parallel matmul; a pool
thread waiting inside one may steal another. The row plan's lock was once held across the
matmul, so a stolen second matmul took it again on the same thread and hung the forward pass
(seen on a 16-core GPU machine with the 1.5B twin). Run in a child process with a time limit,
since a hang in native code cannot be interrupted from Python.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = r"""
import sys
from fak import _native
from fak.synth import write_tiny_model
path = write_tiny_model(sys.argv[1], arch="qwen2", n_layer=2, n_embd=512, n_head=8, n_head_kv=2, n_ff=2048,
                        weight_type="Q4_K_M")
for threads in (1, 16):
    m = _native.EngineCore(str(path), backend="cpu", n_ctx=256, max_batch=4, threads=threads)
    first = m.logits(list(range(1, 40)))[-1]
    for i in range(4):
        m.add_sequence(i, list(range(1 + i, 30 + i)), {"temperature": 0.0})
    toks = {i: [] for i in range(4)}
    for _ in range(6):
        for seq, tok, _lp, _top, _fin in m.step():
            toks[seq].append(tok)
    print(threads, float(first[0]), float(first[1]), sorted(toks.items()))
"""


def test_more_threads_than_cores_does_not_deadlock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("fak.synth")
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "q4km.gguf")], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    one, many = r.stdout.strip().splitlines()[-2:]
    # Same numbers with 1 thread and 16: every output is one task's fixed-order sum.
    assert one.split(" ", 1)[1] == many.split(" ", 1)[1], (one, many)
