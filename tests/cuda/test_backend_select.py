"""Backend selection without a GPU (runs in CI): ``backend="cuda"`` fails loudly with
fak.BackendError, never falling back to the CPU; ``backend="auto"`` runs on the CPU; the CUDA
probes answer without raising."""

from __future__ import annotations

from pathlib import Path

import pytest

import fak
from fak import _native


def test_probes_never_raise() -> None:
    info = _native.cuda_info(load_kernels=False)
    assert isinstance(_native.cuda_available(), bool)
    assert info["available"] == _native.cuda_available()
    if not info["available"]:
        assert info["reason"]
    if info["built_with_cuda"]:
        assert "mmvq" in info["kernel_families"] and info["ops"]


def test_without_gpu_cuda_raises_and_auto_is_cpu(model_05b: Path) -> None:
    if _native.cuda_available():
        pytest.skip("a GPU is usable here: the no-GPU path is checked on machines without one")
    with pytest.raises(fak.BackendError, match="cuda"):
        _native.EngineCore(str(model_05b), backend="cuda", n_ctx=64)
    m = _native.EngineCore(str(model_05b), backend="auto", n_ctx=64)
    assert m.backend == "cpu"
    with pytest.raises(ValueError, match="backend"):
        _native.EngineCore(str(model_05b), backend="gpu", n_ctx=64)
