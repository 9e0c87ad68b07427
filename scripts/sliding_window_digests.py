#!/usr/bin/env python3
"""Record what a model that declares no sliding window computes, for
``tests/test_sliding_window.py::test_unset_is_bit_identical_to_before``.

For each case (a tiny seeded ``fak.synth`` qwen2 model with real K-quants, and the real
Qwen2.5-Coder-0.5B), it runs ``logits()`` over a fixed token list and a 16-step greedy
continuation through ``step()``, and records SHA-256 digests of the float32 logits and of the
steps' ``(token, logprob, top_logprobs)``, once per matmul SIMD level this machine runs
(``FAK_CPU_SIMD=avx512|avx2|scalar``, each in its own process). Run it with the build whose
numbers are the reference (the one before sliding windows) first on ``PYTHONPATH``:

    PYTHONPATH=/path/to/that/checkout/python scripts/sliding_window_digests.py \\
        --model-05b ~/.cache/fak/models/qwen2.5-coder-0.5b-instruct-mixed.gguf \\
        --out tests/data/sliding-window-unset.json

The test imports ``cases`` and ``digests`` from here and runs them with the build under test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

LEVELS = ["avx512", "avx2", "scalar"]
TINY = "tiny-qwen2"
REAL = "qwen2.5-coder-0.5b"


def tokens(n: int, seed: int, n_vocab: int = 700) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, n_vocab, size=n)]


def cases(tmp: Path, model_05b: Path | None) -> dict[str, tuple[Path, list[int]]]:
    """name → (model path, token list). The tiny model is written into ``tmp``."""
    from fak.synth import write_tiny_model

    tiny = write_tiny_model(tmp / "unset-tiny.gguf", "qwen2", n_layer=2, n_embd=256, n_ff=512,
                            weight_type="Q4_K_M", seed=5)
    out = {TINY: (tiny, tokens(300, 7))}
    if model_05b is not None:
        out[REAL] = (Path(model_05b), tokens(160, 8, 151000))
    return out


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def digests(cs: dict[str, tuple[Path, list[int]]], threads: int = 2) -> dict[str, dict[str, str]]:
    """Per case: ``logits`` (SHA-256 of the float32 ``logits()`` of every position) and ``steps``
    (of the repr of the 16 greedy steps after the first 100 tokens, logprobs and top-2)."""
    from fak import _native

    out = {}
    for name, (path, toks) in cs.items():
        m = _native.EngineCore(str(path), n_ctx=1024, threads=threads)
        lg = np.ascontiguousarray(m.logits(toks), dtype=np.float32)
        m.add_sequence(1, toks[:100], {"temperature": 0.0, "n_logprobs": 2})
        steps = []
        for _ in range(16):
            steps += [(t, lp, top) for _, t, lp, top, _ in m.step()]
        out[name] = {"logits": hashlib.sha256(lg.tobytes()).hexdigest(),
                     "steps": hashlib.sha256(repr(steps).encode()).hexdigest()}
    return out


def _child(model_05b: str | None) -> None:
    from fak import _native

    with tempfile.TemporaryDirectory() as tmp:
        cs = cases(Path(tmp), Path(model_05b) if model_05b else None)
        result = {"level": _native.simd_level(), "digests": digests(cs),
                  "tiny_file": file_digest(cs[TINY][0])}
    print(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-05b", default=None, help="the real 0.5B GGUF (omit: tiny model only)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file to write (default: stdout)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.model_05b)
        return
    levels, tiny_file = {}, None
    for level in LEVELS:
        env = dict(os.environ, FAK_CPU_SIMD=level)
        cmd = [sys.executable, __file__, "--child"] + (["--model-05b", a.model_05b] if a.model_05b else [])
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        res = json.loads(r.stdout.strip().splitlines()[-1])
        if res["level"] != level:
            print(f"{level}: not available here (ran {res['level']}); skipped", file=sys.stderr)
            continue
        levels[level] = res["digests"]
        tiny_file = res["tiny_file"]
        print(f"{level}: {res['digests']}", file=sys.stderr)
    import fak

    doc = {
        "about": "tests/test_sliding_window.py::test_unset_is_bit_identical_to_before: digests of a "
                 "model without a sliding window, written by scripts/sliding_window_digests.py",
        "build": os.environ.get("FAK_DIGEST_BUILD", str(Path(fak.__file__).resolve().parent)),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "written": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "tiny_file_sha256": tiny_file,
        "levels": levels,
    }
    text = json.dumps(doc, indent=1) + "\n"
    if a.out:
        a.out.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
