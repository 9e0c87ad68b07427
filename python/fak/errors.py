"""fak's exception tree (defined in the Rust core, mirrored here).

``FakError`` is the base of everything fak raises on purpose:

- ``GGUFError``: a malformed or unsupported GGUF file; the message names the problem and the byte offset.
- ``UnsupportedError``: a tensor type, architecture or feature fak does not implement.
- ``ModelError``: a readable but inconsistent model file.
- ``ContextLengthError``: a request that does not fit in the context window. Attributes: ``param``
  (the argument at fault: ``"prompt_ids"``, the prompt alone leaves no token to generate;
  ``"max_tokens"``, the prompt fits but not with ``max_tokens`` more; ``"token_ids"``, a
  ``logits`` call), ``n_prompt``, ``max_tokens`` (None unless at fault), ``n_tokens``
  (``n_prompt + max_tokens``), ``n_ctx`` (tokens).
- ``KVCacheFullError``: no room left in the KV cache. Attributes: ``needed``, ``free`` (KV blocks).
- ``InvalidArgumentError`` (also a ``ValueError``): an argument out of range or of the wrong kind
  (sampling values, token ids, stop strings). Attribute: ``param``, the argument as the engine
  names it (``"temperature"``, ``"prompt_ids"``, ``"stop"``, ``"stop[1]"``, ...).
- ``BackendError``: a compute backend failed (e.g. ``backend="cuda"`` with no usable GPU).
- ``ShardError`` (an ``UnsupportedError``): a model cannot be split into the requested
  tensor-parallel shards (a tensor would be cut inside a quantization block, or a shard would get
  no head or FFN column); the message names the tensor, its format and the shard count.

The attributes are None on an error raised without them. Python code that raises one of these
(``fak.sampling``'s checks, test fakes of the engine) builds it with ``invalid_argument`` or
``context_length_error``, so that it carries what the core's would.
"""

from fak._native import (
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
    "FakError",
    "GGUFError",
    "UnsupportedError",
    "ModelError",
    "ContextLengthError",
    "KVCacheFullError",
    "InvalidArgumentError",
    "BackendError",
    "ShardError",
    "invalid_argument",
    "context_length_error",
]


def invalid_argument(param: str, message: str) -> InvalidArgumentError:
    """An ``InvalidArgumentError(message)`` naming ``param``, as the engine core raises it."""
    err = InvalidArgumentError(message)
    err.param = param
    return err


def context_length_error(message: str, *, n_prompt: int, n_ctx: int, max_tokens: int | None = None,
                         param: str | None = None) -> ContextLengthError:
    """A ``ContextLengthError(message)`` with the core's attributes: a prompt of ``n_prompt``
    tokens (and ``max_tokens`` more, when the prompt alone fits) in a window of ``n_ctx``;
    ``param`` (default ``"prompt_ids"``, or ``"max_tokens"`` with ``max_tokens``) the argument
    at fault (``"token_ids"`` for a ``logits`` call)."""
    err = ContextLengthError(message)
    err.param = param if param is not None else "prompt_ids" if max_tokens is None else "max_tokens"
    err.n_prompt = n_prompt
    err.max_tokens = max_tokens
    err.n_tokens = n_prompt + (max_tokens or 0)
    err.n_ctx = n_ctx
    return err
