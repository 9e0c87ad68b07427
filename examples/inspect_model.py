"""Open a GGUF model with fak.gguf: hyper-parameters, the largest tensors, one dequantized weight.

Usage: python examples/inspect_model.py MODEL.gguf
       (e.g. MODEL.gguf = "$(../shared/models/fetch-model qwen2.5-coder-0.5b-instruct-mixed)",
        or a synthetic one: fak synth tiny.gguf --tiny qwen2)
"""

from __future__ import annotations

import sys

import numpy as np
from fak.gguf import GGUFFile


def main(path: str) -> None:
    with GGUFFile(path) as f:
        meta = f.metadata
        arch = meta["general.architecture"]
        print(f"{path}: GGUF v{f.version}, {arch}, {len(f.tensors)} tensors, {f.file_size:,} bytes")
        for key in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                    "attention.head_count_kv", "context_length", "rope.freq_base"):
            print(f"  {arch}.{key} = {meta.get(f'{arch}.{key}')}")
        print(f"  vocabulary: {len(meta['tokenizer.ggml.tokens']):,} tokens ({meta['tokenizer.ggml.pre']})")

        n_params = sum(t.n_elements for t in f.tensors)
        print(f"  parameters: {n_params:,}, {8 * sum(t.n_bytes for t in f.tensors) / n_params:.2f} bits per weight")
        for t in sorted(f.tensors, key=lambda t: -t.n_bytes)[:3]:
            print(f"  {t.name:<24} {' x '.join(map(str, t.shape)):>14} {t.dtype:<5} {t.n_bytes:>12,} bytes")

        name = "blk.0.attn_q.weight"
        w = f.dequantize(name)            # float32, shape (n_out, n_in) = (rows, columns)
        raw = f.raw(name)                 # the blocks, zero-copy uint8 view of the file
        print(f"  {name}: {f.tensor(name).dtype} {raw.nbytes:,} bytes -> float32 {w.shape}, "
              f"mean {w.mean():+.5f}, std {w.std():.5f}, finite {bool(np.isfinite(w).all())}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
