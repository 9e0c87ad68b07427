"""Read GGUF model files: metadata, tensor infos, zero-copy raw blocks, dequantized weights.

``GGUFFile`` wraps fak's Rust reader (``fak._native.GgufFile``): the file is memory-mapped and only
its header (magic, version, metadata, tensor infos) is parsed at open; tensor data is read when
``raw`` or ``dequantize`` touches it. Format: the GGUF spec (ggml ``docs/gguf.md``), versions 2 and
3, little-endian. Block formats and their dequantization: ``rust/src/quant/`` (bit-identical to
ggml's ``dequantize_row_*`` and to ``gguf.quants.dequantize``).

Example::

    with GGUFFile("model.gguf") as f:
        arch = f.metadata["general.architecture"]
        w = f.dequantize("blk.0.attn_q.weight")   # float32, shape == f.tensor(...).shape
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from fak import _native
from fak.errors import GGUFError

__all__ = ["GGUFFile", "TensorInfo", "GGUFError", "dequantize"]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a GGUF file.

    Attributes:
        name: tensor name, e.g. ``"blk.0.attn_q.weight"``.
        shape: numpy / row-major order, slowest axis first (``dims`` reversed), so
            ``GGUFFile.dequantize(name).shape == shape``; a weight of ``n_out`` rows of ``k``
            inputs has ``shape == (n_out, k)``.
        dtype: ggml type name (``"Q4_K"``, ``"F32"``, ...), the ``gguf`` package's spelling.
        offset: absolute byte offset of the data in the file.
        n_bytes: bytes of data (whole blocks).
        dims: ggml order, ``dims[0]`` fastest-varying (as stored in the file).
        n_elements: product of the dims.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    n_bytes: int
    dims: tuple[int, ...]
    n_elements: int


class GGUFFile:
    """An open GGUF file (memory-mapped, header parsed at open).

    Args:
        path: the ``.gguf`` file.

    Raises:
        fak.GGUFError: the file is not a valid GGUF v2/v3 file; the message names the problem and
            the byte offset where it was found.
        OSError: the file cannot be opened or mapped.

    ``close()`` (or leaving a ``with`` block) releases this object's reference to the map; arrays
    returned by ``raw`` keep the map alive through their numpy ``base`` until they are freed, so a
    view that outlives ``close()`` stays valid.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._native: _native.GgufFile | None = _native.GgufFile(os.fspath(path))
        self._tensors = [
            TensorInfo(name, tuple(reversed(dims)), dtype, offset, n_bytes, tuple(dims), n_elements)
            for name, dims, dtype, offset, n_bytes, n_elements in self._native.tensors()
        ]
        self._by_name = {t.name: t for t in self._tensors}
        self._metadata: dict[str, Any] | None = None
        self._metadata_types: dict[str, str] | None = None

    def _file(self) -> _native.GgufFile:
        if self._native is None:
            raise ValueError(f"GGUF file {self._path} is closed")
        return self._native

    @property
    def path(self) -> Path:
        """The path the file was opened from."""
        return self._path

    @property
    def version(self) -> int:
        """GGUF version (2 or 3)."""
        return self._file().version

    @property
    def alignment(self) -> int:
        """Alignment of tensor data in bytes (``general.alignment``, default 32)."""
        return self._file().alignment

    @property
    def data_offset(self) -> int:
        """Absolute byte offset of the data section."""
        return self._file().data_offset

    @property
    def file_size(self) -> int:
        """File size in bytes."""
        return self._file().file_size

    @property
    def metadata(self) -> dict[str, Any]:
        """Metadata in file order: key -> int, float, bool, str, or list (arrays, nested arrays as
        nested lists). Built on first access and cached; each access returns a new dict (the lists
        inside are shared: do not mutate them)."""
        native = self._file()
        if self._metadata is None:
            self._metadata = native.metadata()
        return dict(self._metadata)

    @property
    def metadata_types(self) -> dict[str, str]:
        """GGUF type of each metadata value: ``"UINT32"``, ``"STRING"``, ``"ARRAY[INT32]"``, ..."""
        native = self._file()
        if self._metadata_types is None:
            self._metadata_types = native.metadata_types()
        return dict(self._metadata_types)

    @property
    def tensors(self) -> list[TensorInfo]:
        """Tensor infos in file order."""
        return list(self._tensors)

    def tensor(self, name: str) -> TensorInfo:
        """The info of tensor ``name``. Raises ``KeyError`` when absent."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in {self._path}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def raw(self, name: str) -> np.ndarray:
        """The tensor's blocks: a read-only 1-D ``uint8`` view of ``n_bytes`` bytes of the map
        (zero copy). Raises ``KeyError`` for an unknown name."""
        self.tensor(name)
        return self._file().raw(name)

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as ``float32`` with shape ``tensor(name).shape`` (a new array; the GIL is
        released while it is computed). Raises ``KeyError`` for an unknown name and
        ``fak.UnsupportedError`` for a type fak cannot dequantize (IQ formats, integer types)."""
        info = self.tensor(name)
        return self._file().dequantize(name).reshape(info.shape)

    def close(self) -> None:
        """Drops this object's reference to the map (views from ``raw`` keep it alive)."""
        self._native = None

    @property
    def closed(self) -> bool:
        """True after ``close()``."""
        return self._native is None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._native is None else f"{len(self._tensors)} tensors"
        return f"GGUFFile({str(self._path)!r}, {state})"


def dequantize(dtype: str, raw: bytes | np.ndarray, n_elements: int, out: np.ndarray | None = None) -> np.ndarray:
    """Dequantizes whole blocks of ggml type ``dtype`` (``"Q4_K"``, ...) to ``float32`` (GIL
    released): into ``out`` (a writeable C-contiguous ``float32`` array of ``n_elements``) when
    given, else into a new 1-D array of ``n_elements`` values. Returns the array written.

    Raises ``ValueError`` for an unknown type name, a non-contiguous ``raw`` or ``out``, or a
    length that is not ``n_elements / block_size`` blocks; ``fak.UnsupportedError`` for a type
    without a dequantizer."""
    return _native.dequantize(dtype, raw, n_elements, out)
