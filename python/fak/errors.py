"""fak's exception tree (defined in the Rust core, mirrored here).

``FakError`` is the base of everything fak raises on purpose:

- ``GGUFError``: a malformed or unsupported GGUF file; the message names the problem and the byte offset.
- ``UnsupportedError``: a tensor type, architecture or feature fak does not implement.
- ``ModelError``: a readable but inconsistent model file.
- ``ContextLengthError``: a prompt that does not fit in the context window (both numbers in the message).
- ``KVCacheFullError``: no room left in the KV cache.
- ``BackendError``: a compute backend failed (e.g. ``backend="cuda"`` with no usable GPU).
- ``ShardError`` (an ``UnsupportedError``): a model cannot be split into the requested
  tensor-parallel shards (a tensor would be cut inside a quantization block, or a shard would get
  no head or FFN column); the message names the tensor, its format and the shard count.

Invalid arguments (bad sampling values and the like) raise the built-in ``ValueError``.
"""

from fak._native import (
    BackendError,
    ContextLengthError,
    FakError,
    GGUFError,
    KVCacheFullError,
    ModelError,
    ShardError,
    UnsupportedError,
)

__all__ = [
    "FakError",
    "GGUFError",
    "UnsupportedError",
    "ModelError",
    "ContextLengthError",
    "KVCacheFullError",
    "BackendError",
    "ShardError",
]
