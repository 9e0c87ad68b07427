"""GGUF headers read in Python without the native reader: the architecture from the first bytes
of a file (so `fak pull` can refuse a model before downloading gigabytes of it), and split GGUF
files (llama.cpp's ``gguf-split``: ``NAME-00001-of-00003.gguf``, each part a GGUF of its own
with a share of the tensors and ``split.no`` / ``split.count`` / ``split.tensors.count`` keys,
the first part holding all the metadata) joined into one file.

Layout (GGUF v2/v3, ggml's ``docs/gguf.md``): magic ``GGUF``, u32 version, u64 tensor count, u64
key count; keys (u64-length string, u32 value type, value); tensor infos (name, u32 n_dims, u64
dims, u32 ggml type, u64 offset into the data section); padding to ``general.alignment``
(default 32); the data section. All little-endian.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF value types (ggml's gguf_type): fixed sizes in bytes; 8 = string, 9 = array.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_UINT = {0: "<B", 2: "<H", 4: "<I", 10: "<Q", 1: "<b", 3: "<h", 5: "<i", 11: "<q"}
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
_SPLIT_NAME = re.compile(r"^(?P<base>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class GGUFHeaderError(ValueError):
    """Not a GGUF header, or one that breaks the format (the message says where)."""


class _Truncated(Exception):
    """The buffer ends before the header does (a prefix of a file)."""


def split_name(filename: str) -> tuple[str, int, int] | None:
    """``(base, part number, part count)`` of a split GGUF file name
    (``"m-00002-of-00003.gguf"`` → ``("m", 2, 3)``), or None for a file that is not a part."""
    m = _SPLIT_NAME.match(filename)
    if m is None:
        return None
    return m["base"], int(m["no"]), int(m["count"])


def split_part_names(filename: str) -> list[str]:
    """Every part's name of the split set ``filename`` belongs to (in order), or ``[filename]``."""
    s = split_name(filename)
    if s is None:
        return [filename]
    base, _, count = s
    return [f"{base}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


@dataclass
class TensorInfo:
    """One tensor info of a GGUF header: ``dims`` in ggml order, ``ggml_type`` id, ``offset``
    into the data section (bytes), ``nbytes`` of its blocks."""

    name: str
    dims: list[int]
    ggml_type: int
    offset: int
    nbytes: int


@dataclass
class Header:
    """A parsed GGUF header. ``kv_spans`` maps each key to the ``(start, end)`` byte span of its
    whole entry (key, type, value) in the file, so entries can be copied as they are."""

    version: int
    n_tensors: int
    kv: dict[str, object] = field(default_factory=dict)
    kv_spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    data_start: int = 0


class _Cursor:
    def __init__(self, buf: bytes | mmap.mmap | memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Truncated
        out = bytes(self.buf[self.pos:end])
        self.pos = end
        return out

    def unpack(self, fmt: str) -> int:
        return int(struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0])

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 30:
            raise GGUFHeaderError(f"string of {n} bytes at offset {self.pos - 8}")
        return self.take(n).decode("utf-8", errors="replace")

    def skip_value(self, vtype: int, keep: bool) -> object:
        """Reads (``keep``) or skips one value of ``vtype``; scalars and strings are returned."""
        if vtype in _FIXED:
            raw = self.take(_FIXED[vtype])
            if not keep:
                return None
            if vtype in _UINT:
                return struct.unpack(_UINT[vtype], raw)[0]
            if vtype == 6:
                return struct.unpack("<f", raw)[0]
            if vtype == 12:
                return struct.unpack("<d", raw)[0]
            return bool(raw[0])
        if vtype == _STRING:
            if keep:
                return self.string()
            self.take(self.unpack("<Q"))
            return None
        if vtype == _ARRAY:
            itype = self.unpack("<I")
            n = self.unpack("<Q")
            if itype in _FIXED:
                self.take(n * _FIXED[itype])
            else:
                for _ in range(n):
                    self.skip_value(itype, False)
            return None
        raise GGUFHeaderError(f"unknown GGUF value type {vtype} at offset {self.pos - 4}")


def _tensor_nbytes(dims: list[int], ggml_type: int) -> int:
    import gguf

    block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    n = 1
    for d in dims:
        n *= d
    return n // block * type_size


def _parse(buf: bytes | mmap.mmap | memoryview, *, tensors: bool,
           stop_at: str | None = None) -> Header:
    c = _Cursor(buf)
    if c.take(4) != MAGIC:
        raise GGUFHeaderError("not a GGUF file (no GGUF magic in its first 4 bytes)")
    version = c.unpack("<I")
    if version not in (2, 3):
        raise GGUFHeaderError(f"GGUF version {version}; fak reads versions 2 and 3")
    n_tensors = c.unpack("<Q")
    n_kv = c.unpack("<Q")
    h = Header(version=version, n_tensors=n_tensors)
    for _ in range(n_kv):
        start = c.pos
        key = c.string()
        vtype = c.unpack("<I")
        keep = vtype != _ARRAY
        h.kv[key] = c.skip_value(vtype, keep)
        h.kv_spans[key] = (start, c.pos)
        if stop_at is not None and key == stop_at:
            return h
    align = h.kv.get("general.alignment")
    h.alignment = int(align) if isinstance(align, int) and align > 0 else DEFAULT_ALIGNMENT
    if not tensors:
        return h
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.unpack("<I")
        dims = [c.unpack("<Q") for _ in range(n_dims)]
        ggml_type = c.unpack("<I")
        offset = c.unpack("<Q")
        h.tensors.append(TensorInfo(name, dims, ggml_type, offset, _tensor_nbytes(dims, ggml_type)))
    h.data_start = _align(c.pos, h.alignment)
    return h


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def architecture_from_prefix(prefix: bytes) -> str | None:
    """``general.architecture`` from the first bytes of a GGUF file (llama.cpp's converters write
    it first), or None when ``prefix`` ends before the key is reached.

    Raises:
        GGUFHeaderError: ``prefix`` is not the start of a GGUF v2/v3 file."""
    try:
        h = _parse(prefix, tensors=False, stop_at="general.architecture")
    except _Truncated:
        return None
    arch = h.kv.get("general.architecture")
    return arch if isinstance(arch, str) else None


def read_header(path: str | Path) -> Header:
    """The whole header of the GGUF file at ``path`` (metadata scalars, key spans, tensor infos,
    data offset).

    Raises:
        GGUFHeaderError: not GGUF v2/v3, or the file ends inside its header.
        OSError: the file cannot be read."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        try:
            return _parse(m, tensors=True)
        except _Truncated:
            raise GGUFHeaderError(f"{path}: the file ends inside its GGUF header") from None


def _write_string(out: bytearray, s: str) -> None:
    b = s.encode()
    out += struct.pack("<Q", len(b)) + b


def merge_split(parts: list[Path], dst: Path, *,
                on_bytes: Callable[[int], None] | None = None) -> Path:
    """Join the parts of a split GGUF (in order) into one GGUF v3 file at ``dst``: the first
    part's metadata without the ``split.*`` keys, every part's tensors in order, each tensor's
    blocks copied as they are at the first part's alignment (what ``llama-gguf-split --merge``
    writes). ``on_bytes(n)`` is called as tensor data is copied (for a progress bar). The file is
    written beside ``dst`` and renamed into place when whole.

    Raises:
        GGUFHeaderError: a part is not GGUF, its ``split.no`` / ``split.count`` disagree with its
            place, or the parts do not hold ``split.tensors.count`` tensors.
        OSError: reading or writing failed."""
    headers = [read_header(p) for p in parts]
    first = headers[0]
    n_parts = len(parts)
    for i, (p, h) in enumerate(zip(parts, headers)):
        no, count = h.kv.get("split.no"), h.kv.get("split.count")
        if no is not None and (no != i or count != n_parts):
            raise GGUFHeaderError(f"{p.name}: split.no {no} of split.count {count}, expected part "
                                  f"{i} of {n_parts}")
    tensors = [(i, t) for i, h in enumerate(headers) for t in h.tensors]
    want = first.kv.get("split.tensors.count")
    if isinstance(want, int) and want != len(tensors):
        raise GGUFHeaderError(f"the {n_parts} parts hold {len(tensors)} tensors; split.tensors.count "
                              f"says {want}")
    align = first.alignment
    out = bytearray(MAGIC)
    keys = [k for k in first.kv_spans if k not in SPLIT_KEYS]
    out += struct.pack("<IQQ", 3, len(tensors), len(keys))
    with open(parts[0], "rb") as f0:
        for k in keys:
            s, e = first.kv_spans[k]
            f0.seek(s)
            out += f0.read(e - s)
    offset = 0
    placed = []
    for i, t in tensors:
        _write_string(out, t.name)
        out += struct.pack("<I", len(t.dims))
        out += struct.pack(f"<{len(t.dims)}Q", *t.dims)
        out += struct.pack("<IQ", t.ggml_type, offset)
        placed.append((i, t, offset))
        offset = _align(offset + t.nbytes, align)
    out += b"\0" * (_align(len(out), align) - len(out))
    tmp = dst.with_name(dst.name + ".merging")
    try:
        with open(tmp, "wb") as w:
            w.write(out)
            files = [open(p, "rb") for p in parts]
            try:
                pos = 0
                for i, t, off in placed:
                    w.write(b"\0" * (off - pos))
                    src = files[i]
                    src.seek(headers[i].data_start + t.offset)
                    left = t.nbytes
                    while left:
                        chunk = src.read(min(left, 1 << 24))
                        if not chunk:
                            raise GGUFHeaderError(f"{parts[i].name}: tensor {t.name} runs past the "
                                                  "end of the file")
                        w.write(chunk)
                        left -= len(chunk)
                        if on_bytes is not None:
                            on_bytes(len(chunk))
                    pos = off + t.nbytes
            finally:
                for f in files:
                    f.close()
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst
