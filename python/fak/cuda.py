"""CUDA helpers on the Python side: where NVIDIA's pip-installed libraries live.

fak loads the CUDA driver (``libcuda.so``) and, for the plain wheel, NVRTC (``libnvrtc.so``) at
run time through its Rust core. NVRTC from PyPI (``nvidia-cuda-nvrtc``) sits in
``site-packages/nvidia/<cu13|cuda_nvrtc>/lib``, outside the loader's search path; this module tells
the core where to look (environment variable ``FAK_NVIDIA_LIB_DIRS``, read when a CUDA backend
starts). Importing ``fak`` calls :func:`export_nvidia_lib_dirs` once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["nvidia_lib_dirs", "export_nvidia_lib_dirs"]


def nvidia_lib_dirs() -> list[str]:
    """``lib`` folders of the ``nvidia.*`` wheels importable from ``sys.path`` (may be empty)."""
    dirs: list[str] = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if not base.is_dir():
            continue
        for lib in sorted(base.glob("*/lib")):
            if lib.is_dir() and str(lib) not in dirs:
                dirs.append(str(lib))
    return dirs


def export_nvidia_lib_dirs() -> None:
    """Sets ``FAK_NVIDIA_LIB_DIRS`` (unless already set) to :func:`nvidia_lib_dirs`."""
    if "FAK_NVIDIA_LIB_DIRS" not in os.environ:
        dirs = nvidia_lib_dirs()
        if dirs:
            os.environ["FAK_NVIDIA_LIB_DIRS"] = os.pathsep.join(dirs)
