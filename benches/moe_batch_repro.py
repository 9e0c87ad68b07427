"""A batched-decode check of a MoE model on CUDA: N sequences of short prompts decoded together for a few
steps (the expert-sorted grouped path once N > 16), reporting whether every step returns a token for
every sequence. Used to chase a fault on the device; run under compute-sanitizer for the kernel name.

    python benches/moe_batch_repro.py MODEL.gguf N [STEPS]
"""

from __future__ import annotations

import sys

import numpy as np
from fak import _native


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    m = _native.EngineCore(path, backend="cuda", n_ctx=256, max_batch=max(n, 1), kv_cache_tokens=256 * max(n, 1))
    rng = np.random.default_rng(0)
    for i in range(n):
        m.add_sequence(i, rng.integers(10, m.n_vocab - 10, 8).tolist(), {"temperature": 0.0, "max_tokens": steps + 1})
    got = 0
    for s in range(steps + 1):
        out = m.step()
        got += len(out)
        print(f"step {s}: {len(out)} tokens", flush=True)
    print(f"OK {n} sequences, {got} tokens")


if __name__ == "__main__":
    main()
