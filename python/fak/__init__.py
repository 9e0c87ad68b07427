"""fak: run coding agents on your own GPU.

fak serves a GGUF model from its own forward pass (a CPU reference backend and CUDA kernels),
exposes it through an OpenAI-compatible gateway that adjudicates every tool call against a policy,
and drives its own coding agent on SWE-bench Verified.
"""

from fak._native import __version__
from fak.cuda import export_nvidia_lib_dirs as _export_nvidia_lib_dirs
from fak.errors import (
    BackendError,
    ContextLengthError,
    FakError,
    GGUFError,
    InvalidArgumentError,
    KVCacheFullError,
    ModelError,
    ShardError,
    UnsupportedError,
)

__all__ = [
    "__version__",
    "Engine",
    "FakError",
    "GGUFError",
    "UnsupportedError",
    "ModelError",
    "ContextLengthError",
    "KVCacheFullError",
    "InvalidArgumentError",
    "BackendError",
    "ShardError",
]

_export_nvidia_lib_dirs()


def __getattr__(name: str) -> object:
    # fak.Engine is imported on first use, so that `import fak` stays light.
    if name == "Engine":
        from fak.engine import Engine

        return Engine
    raise AttributeError(f"module 'fak' has no attribute {name!r}")
