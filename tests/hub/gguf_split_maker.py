"""Split a GGUF file as llama.cpp's ``llama-gguf-split --split`` does, for the tests of joining:
``NAME-0000i-of-0000N.gguf``, each part a GGUF v3 file with a contiguous share of the tensors and
the keys ``split.no`` (u16), ``split.count`` (u16), ``split.tensors.count`` (i32); the first part
also carries all of the source's metadata."""

from __future__ import annotations

import struct
from pathlib import Path

from fak.hub.gguf_split import MAGIC, read_header


def _kv_u16(key: str, v: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IH", 2, v)


def _kv_i32(key: str, v: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<Ii", 5, v)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def split_gguf(src: Path, out_dir: Path, base: str, n_parts: int) -> list[Path]:
    """Writes ``n_parts`` parts of ``src`` into ``out_dir`` and returns their paths in order."""
    h = read_header(src)
    raw = src.read_bytes()
    per = -(-len(h.tensors) // n_parts)
    groups = [h.tensors[i * per:(i + 1) * per] for i in range(n_parts)]
    paths = []
    for i, group in enumerate(groups):
        kvs = [_kv_u16("split.no", i), _kv_u16("split.count", n_parts),
               _kv_i32("split.tensors.count", len(h.tensors))]
        if i == 0:
            kvs = [raw[s:e] for s, e in h.kv_spans.values()] + kvs
        out = bytearray(MAGIC) + struct.pack("<IQQ", 3, len(group), len(kvs))
        for kv in kvs:
            out += kv
        offset, placed = 0, []
        for t in group:
            name = t.name.encode()
            out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(t.dims))
            out += struct.pack(f"<{len(t.dims)}Q", *t.dims) + struct.pack("<IQ", t.ggml_type, offset)
            placed.append((t, offset))
            offset = _align(offset + t.nbytes, h.alignment)
        out += b"\0" * (_align(len(out), h.alignment) - len(out))
        data_start = len(out)
        for t, off in placed:
            out += b"\0" * (data_start + off - len(out))
            s = h.data_start + t.offset
            out += raw[s:s + t.nbytes]
        path = out_dir / f"{base}-{i + 1:05d}-of-{n_parts:05d}.gguf"
        path.write_bytes(bytes(out))
        paths.append(path)
    return paths
