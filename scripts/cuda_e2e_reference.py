#!/usr/bin/env python3
"""The CPU backend's reference for ``tests/cuda/test_e2e.py``, at one SIMD level, saved to a file.

The end-to-end test compares the CUDA backend with the CPU backend: greedy continuations of the
prompt set ``tests/data/golden_prompts.json`` and next-token logits. Computing that reference on
the GPU machine costs minutes of device time; the CPU backend's results depend only on its code
and SIMD level (every output is one task's fixed-order sum, so thread count does not matter), so
it can be computed here, with the same commit, and carried there (``FAK_E2E_REFERENCE``).

fak's CPU backend at different SIMD levels (``FAK_CPU_SIMD=scalar|avx2|avx512``) computes the same
integer sums and differs only in f32 summation order (and exp's last bits); on these models that
alone moves the next-token logits by 1 − cosine up to ~1e-3 (measured: ``docs/cuda-notes.md``).
The test uses the spread between levels as the noise floor of "equal to the CPU".

Usage: ``FAK_CPU_SIMD=avx2 python scripts/cuda_e2e_reference.py MODEL.gguf OUT.npz``
Writes: ``tokens/<prompt>`` (int32, the greedy continuation), ``logits/<prompt>`` (float32, the
next-token logits after the prompt, prompts of ≤ 600 tokens) and ``meta`` (JSON: level, commit).

``python scripts/cuda_e2e_reference.py --noise DIR MODEL_NAME`` reads every
``DIR/MODEL_NAME_<level>.npz`` and writes ``DIR/MODEL_NAME_noise.json``: the levels' disagreement
(``noise_from_levels`` in the test), so that the GPU machine needs only one level's file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "cuda"))


def write_noise(ref_dir: Path, model_name: str) -> None:
    from test_e2e import noise_from_levels  # noqa: E402

    files = sorted(ref_dir.glob(f"{model_name}_*.npz"))
    levels = {f.stem.removeprefix(model_name + "_"): dict(np.load(f)) for f in files}
    if len(levels) < 2:
        sys.exit(f"need ≥ 2 levels' files {model_name}_<level>.npz in {ref_dir}, found {list(levels)}")
    noise = noise_from_levels(levels)
    out = ref_dir / f"{model_name}_noise.json"
    out.write_text(json.dumps(noise, indent=1))
    print(f"{out}: levels {noise['levels']}, max 1-cos {max(noise['spread'].values()):.2e}, margin shift {noise['margin_shift']:.4f}, greedy differs on {len(noise['greedy_differ'])}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--noise":
        write_noise(Path(sys.argv[2]), sys.argv[3])
        return
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    from test_e2e import LOGITS_MAX_TOKENS, N_CTX, greedy, prompts  # noqa: E402

    from fak import _native

    path, out = Path(sys.argv[1]), Path(sys.argv[2])
    name = path.name.removesuffix(".gguf")
    items = prompts(name)
    t0 = time.time()
    m = _native.EngineCore(str(path), backend="cpu", n_ctx=N_CTX, max_batch=len(items))
    toks = greedy(m, items)
    arrays = {f"tokens/{k}": np.asarray(v, dtype=np.int32) for k, v in toks.items()}
    for pname, ids in items:
        if len(ids) <= LOGITS_MAX_TOKENS:
            arrays[f"logits/{pname}"] = np.asarray(m.logits(ids)[-1], dtype=np.float32)
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    meta = {"model": name, "simd": _native.simd_level(),
            "commit": commit, "seconds": round(time.time() - t0, 1)}
    np.savez_compressed(out, meta=np.asarray(json.dumps(meta)), **arrays)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
