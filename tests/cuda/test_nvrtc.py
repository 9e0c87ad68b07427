"""The plain wheel's path: kernels compiled at start-up by NVRTC from the embedded sources, then
read back from the disk cache (``FAK_CUDA_KERNELS=nvrtc`` forces it on a per-arch wheel too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fak import _native

CHECK = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from cuda_util import random_weights, dequantized, rel_err
from fak import _native
info = _native.cuda_info()
rng = np.random.default_rng(7)
w = random_weights("Q4_K", 256, 1536, rng)
wd = dequantized("Q4_K", w, 256, 1536)
g, c = _native.OpRunner("cuda"), _native.OpRunner("cpu")
errs = {}
for rows in (1, 40):
    x = rng.standard_normal((rows, 1536)).astype(np.float32)
    y = g.matmul("Q4_K", w, 256, 1536, x.reshape(-1)).reshape(rows, 256)
    errs[f"matmul{rows}"] = rel_err(y, x.astype(np.float64) @ wd.T)
    errs[f"matmul{rows}_cpu"] = rel_err(y, c.matmul("Q4_K", w, 256, 1536, x.reshape(-1)).reshape(rows, 256).astype(np.float64))
seqs = [(300, 1)]
q = rng.standard_normal((1, 12 * 128)).astype(np.float32)
k = rng.standard_normal((301, 256)).astype(np.float32)
v = rng.standard_normal((301, 256)).astype(np.float32)
perm = np.arange(10, dtype=np.uint32)
a = g.attention(seqs, 12, 2, 128, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1))[0]
b = c.attention(seqs, 12, 2, 128, perm, q.reshape(-1), k.reshape(-1), v.reshape(-1))[0]
errs["attention"] = rel_err(a, b.astype(np.float64))
print(json.dumps({"images": info.get("kernel_images"), "error": info.get("kernel_error"), "errs": errs}))
"""


def run_forced_nvrtc(cache: Path) -> dict:
    env = dict(os.environ, FAK_CUDA_KERNELS="nvrtc", FAK_KERNEL_CACHE=str(cache))
    r = subprocess.run([sys.executable, "-c", CHECK, str(Path(__file__).parent)], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.cuda
def test_nvrtc_compiles_caches_and_runs(require_cuda: None, tmp_path: Path) -> None:
    first = run_forced_nvrtc(tmp_path)
    assert first["error"] is None, first
    assert all(o.startswith("NVRTC cubin compiled") for o in first["images"].values()), first["images"]
    errs = first["errs"]
    # Both GEMV (1 row) and the int8 GEMM (40 rows) read the CPU's 8-bit activations: error of
    # 8-bit activations against float64, and the CPU backend's result up to f32 summation order
    # (FAK_CUDA_MMQ=f16: the f16 GEMM, 2e-3 against float64).
    f16 = os.environ.get("FAK_CUDA_MMQ", "") == "f16"
    assert errs["matmul1"] <= 1.2e-2 and errs["matmul1_cpu"] <= 5e-5, first
    assert errs["matmul40"] <= (2e-3 if f16 else 1.2e-2) and (f16 or errs["matmul40_cpu"] <= 5e-5), first
    assert errs["attention"] <= 5e-3, first
    second = run_forced_nvrtc(tmp_path)
    assert all(o.startswith("NVRTC cubin from cache") for o in second["images"].values()), second["images"]
    assert second["errs"] == first["errs"]


def test_nvrtc_compiles_every_family_without_gpu() -> None:
    """NVRTC needs no GPU: where its library is installed (FAK_NVRTC_LIB or the nvidia wheels),
    every embedded source compiles for sm_90."""
    families = _native.cuda_kernel_families()
    if not families:
        pytest.skip("this build has no CUDA backend")
    try:
        _native.cuda_nvrtc_compile("quantize", 90)
    except Exception as e:  # noqa: BLE001
        if "no NVRTC library" in str(e):
            pytest.skip(f"NVRTC not installed here: {e}")
        raise
    for fam in families:
        assert len(_native.cuda_nvrtc_compile(fam, 90)) > 1000, fam
