"""A copy of a GGUF file with metadata set or tensors added (gguf-py's reader and writer; the
tensors' blocks copied as they are, so the copy computes the same model apart from the edits).

Used where two engines must read the same settings from the same file: llama.cpp's goldens and
benches with RoPE scaling (``scripts/make_rope_goldens.py``, ``benches/bench_cuda.py --yarn``),
whose tools take no scaling flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def copy_gguf(src: str | Path, dst: str | Path, kv: dict[str, tuple[Any, Any]] | None = None,
              tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Writes a copy of the GGUF ``src`` at ``dst`` with metadata ``kv`` (name → (value,
    ``gguf.GGUFValueType``)) set, replacing a key the file has, and ``tensors`` (any shape,
    stored as f32) added before the file's own; every other key and tensor is copied as it is
    (GGUF v3, the layout of gguf-py's writer). Returns ``dst``. Raises what gguf-py's reader
    raises for a file it cannot read (``ValueError`` for one that is not GGUF), and ``OSError``."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = gguf.GGUFWriter(str(dst), arch=arch)
    kv = dict(kv or {})
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in kv:
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            vals = [field.parts[i] for i in field.data]
            vals = [bytes(v).decode() if sub == gguf.GGUFValueType.STRING else v.item() for v in vals]
            w.add_key_value(name, vals, vtype, sub_type=sub)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(field.parts[field.data[0]]).decode(), vtype)
        else:
            w.add_key_value(name, field.parts[field.data[0]].item(), vtype)
    for name, (value, vtype) in kv.items():
        w.add_key_value(name, value, vtype)
    for name, t in (tensors or {}).items():
        w.add_tensor(name, t.astype(np.float32))
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def with_yarn(src: str | Path, dst: str | Path, factor: float, orig_ctx: int) -> Path:
    """A copy of ``src`` that declares YaRN RoPE scaling (``{arch}.rope.scaling.type`` ``yarn``,
    ``.factor``, ``.original_context_length``), as Qwen2.5's model cards give it for 128k
    (factor 4 over 32768): fak and llama.cpp both read these keys (llama.cpp's ``llama-arch.cpp``
    names; ``rust/src/model/rope_scaling.rs``). ``factor``: context extension (dimensionless);
    ``orig_ctx``: tokens the model was trained on. Errors as :func:`copy_gguf`."""
    import gguf

    from fak.gguf import GGUFFile

    with GGUFFile(src) as f:
        arch = f.metadata["general.architecture"]
    t = gguf.GGUFValueType
    return copy_gguf(src, dst, kv={
        f"{arch}.rope.scaling.type": ("yarn", t.STRING),
        f"{arch}.rope.scaling.factor": (float(factor), t.FLOAT32),
        f"{arch}.rope.scaling.original_context_length": (int(orig_ctx), t.UINT32),
    })
