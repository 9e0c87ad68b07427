"""GGUF models from the Hugging Face hub: `fak pull`, ``hf://`` model paths, the model cache.

``pull("hf://Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M")`` downloads (resumed, digest-checked,
split parts joined) into ``$FAK_MODELS/hf/ORG/NAME/`` and returns the file's path;
``resolve_model(text)`` does that for a ``hf://`` reference and passes any other path through;
``list_cached()`` lists the cache. Details: ``fak.hub.pull``; the command: ``fak.hub.cli``.
"""

from fak.hub.pull import (SUPPORTED_ARCHITECTURES, CachedModel, ModelRef, PullError,
                          UnsupportedArchitectureError, is_hf_uri, list_cached, models_dir, parse_ref,
                          pull, resolve_model)

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "CachedModel",
    "ModelRef",
    "PullError",
    "UnsupportedArchitectureError",
    "is_hf_uri",
    "list_cached",
    "models_dir",
    "parse_ref",
    "pull",
    "resolve_model",
]
