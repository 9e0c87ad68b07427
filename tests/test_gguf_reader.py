"""GGUF reader tests: fak.gguf.GGUFFile against the ``gguf`` package's ``GGUFReader`` (synthetic
files with every value type, and both real models), zero-copy views, close semantics, and one
case per class of malformed input (each checks the byte offset named in the message).

To add a malformed-input case: build the bytes with ``RawGGUF`` (tests/gguf_util.py), corrupt
the field you want, and assert ``GGUFError`` with the field's offset from ``RawGGUF.at``.
"""

from __future__ import annotations

import gc
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

import fak
from fak.gguf import GGUFFile, TensorInfo
from gguf_util import RawGGUF, gstr, write_synthetic

V = gguf.GGUFValueType


def reader_type_name(field: gguf.ReaderField) -> str:
    """The type name fak uses, from a GGUFReader field (``"ARRAY[INT32]"``, ...)."""
    names = [t.name for t in field.types]
    out = names[-1]
    for _ in names[:-1]:
        out = f"ARRAY[{out}]"
    return out


def reader_value(field: gguf.ReaderField):
    """A GGUFReader field as a Python value (arrays of scalars / strings only, as it flattens)."""
    return field.contents()


def assert_matches_reader(f: GGUFFile, r: gguf.GGUFReader) -> None:
    """Every key, value, type and tensor info of ``f`` equals what ``GGUFReader`` reads."""
    fields = {k: v for k, v in r.fields.items() if not k.startswith("GGUF.")}
    meta, types = f.metadata, f.metadata_types
    assert list(meta) == list(fields)
    for key, field in fields.items():
        assert types[key] == reader_type_name(field), key
        if field.types[0] == V.ARRAY and len(field.types) > 2:
            continue  # GGUFReader flattens nested arrays; checked separately against what was written
        assert meta[key] == reader_value(field), key
    assert f.version == r.fields["GGUF.version"].contents()
    assert f.alignment == r.alignment
    assert f.data_offset == r.data_offset
    assert len(f.tensors) == len(r.tensors)
    for ours, theirs in zip(f.tensors, r.tensors):
        assert ours.name == theirs.name
        assert ours.dims == tuple(int(d) for d in theirs.shape)
        assert ours.shape == tuple(reversed(ours.dims))
        assert ours.dtype == theirs.tensor_type.name
        assert ours.offset == theirs.data_offset
        assert ours.n_bytes == theirs.n_bytes
        assert ours.n_elements == theirs.n_elements


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("gguf") / "synthetic.gguf"
    return path, write_synthetic(path)


def test_synthetic_matches_gguf_reader(synthetic: tuple[Path, dict]) -> None:
    path, written = synthetic
    with GGUFFile(path) as f:
        assert_matches_reader(f, gguf.GGUFReader(path))
        assert f.metadata == written["metadata"]
        types = f.metadata_types
        assert types["t.u8"] == "UINT8" and types["t.f64"] == "FLOAT64" and types["t.bool"] == "BOOL"
        assert types["t.nested"] == "ARRAY[ARRAY[INT32]]"
        assert types["t.arr_str"] == "ARRAY[STRING]"
        assert f.version == 3 and f.file_size == path.stat().st_size


def test_synthetic_tensors_raw_and_dequantize(synthetic: tuple[Path, dict]) -> None:
    path, written = synthetic
    with GGUFFile(path) as f:
        assert [t.name for t in f.tensors] == list(written["tensors"])
        for name, (dtype, dims, raw) in written["tensors"].items():
            info = f.tensor(name)
            assert isinstance(info, TensorInfo)
            assert info.dtype == dtype and info.dims == dims and info.shape == dims[::-1]
            view = f.raw(name)
            assert view.dtype == np.uint8 and view.shape == (info.n_bytes,)
            assert np.array_equal(view, raw)
            out = f.dequantize(name)
            assert out.dtype == np.float32 and out.shape == info.shape
            want = gguf.quants.dequantize(raw.reshape(info.shape[0], -1), gguf.GGMLQuantizationType[dtype])
            np.testing.assert_array_equal(out, np.asarray(want, dtype=np.float32).reshape(info.shape))


def test_raw_is_a_read_only_zero_copy_view_that_outlives_close(synthetic: tuple[Path, dict]) -> None:
    path, written = synthetic
    name = next(iter(written["tensors"]))
    f = GGUFFile(path)
    info = f.tensor(name)
    view = f.raw(name)
    assert not view.flags.writeable and not view.flags.owndata
    with pytest.raises(ValueError):
        view[0] = 1
    # two views of the same tensor share memory: they both point into the one map
    assert np.shares_memory(view, f.raw(name))
    with open(path, "rb") as fh:
        fh.seek(info.offset)
        expected = fh.read(info.n_bytes)
    f.close()
    assert f.closed
    del f
    gc.collect()
    assert view.tobytes() == expected  # the map is still alive through the view's base
    with pytest.raises(ValueError, match="closed"):
        g = GGUFFile(path)
        g.close()
        g.raw(name)


def test_lookup_errors(synthetic: tuple[Path, dict]) -> None:
    path, _ = synthetic
    with GGUFFile(path) as f:
        with pytest.raises(KeyError):
            f.tensor("nope")
        with pytest.raises(KeyError):
            f.raw("nope")
        assert "nope" not in f and f.tensors[0].name in f
    with pytest.raises(OSError):
        GGUFFile(path.parent / "missing.gguf")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["model_05b", "model_15b"])
def test_real_model_matches_gguf_reader(which: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(which)
    with GGUFFile(path) as f:
        assert_matches_reader(f, gguf.GGUFReader(path))
        assert f.metadata["general.architecture"] == "qwen2"
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 151936


def test_real_model_header_quick(model_15b: Path) -> None:
    with GGUFFile(model_15b) as f:
        assert f.version == 3 and f.alignment == 32 and f.data_offset == 5950528
        assert len(f.tensors) == 339
        emb = f.tensor("token_embd.weight")
        assert (emb.dtype, emb.dims, emb.shape) == ("Q4_K", (1536, 151936), (151936, 1536))
        last = max(f.tensors, key=lambda t: t.offset)
        assert last.offset + last.n_bytes <= f.file_size


# ---------------------------------------------------------------------------------------------
# Malformed input: every class raises fak.GGUFError naming the byte offset.


def parse_error(tmp_path: Path, data: bytes) -> str:
    p = tmp_path / "bad.gguf"
    p.write_bytes(data)
    with pytest.raises(fak.GGUFError) as e:
        GGUFFile(p)
    assert isinstance(e.value, fak.FakError)
    return str(e.value)


def at(offset: int) -> str:
    return f"GGUF error at byte offset {offset}:"


def good() -> RawGGUF:
    return (
        RawGGUF()
        .add_kv("general.architecture", "str", gstr("llama"))
        .add_kv("k.u32", "u32", struct.pack("<I", 7))
        .add_f32_tensor("a", [4, 2])
        .add_f32_tensor("b", [3])
    )


def test_good_raw_file_parses(tmp_path: Path) -> None:
    p = tmp_path / "ok.gguf"
    p.write_bytes(good().build())
    with GGUFFile(p) as f:
        assert f.metadata == {"general.architecture": "llama", "k.u32": 7}
        np.testing.assert_array_equal(f.dequantize("a"), np.arange(8, dtype=np.float32).reshape(2, 4))


def test_wrong_magic(tmp_path: Path) -> None:
    msg = parse_error(tmp_path, b"GGML" + good().build()[4:])
    assert msg.startswith(at(0)) and "wrong magic" in msg
    assert parse_error(tmp_path, b"").startswith(at(0))


@pytest.mark.parametrize("version,needle", [(1, "version 1"), (4, "version 4"), (0x03000000, "big-endian")])
def test_unsupported_version(tmp_path: Path, version: int, needle: str) -> None:
    g = good()
    g.version = version
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(4)) and needle in msg


def test_truncated_header(tmp_path: Path) -> None:
    g = good()
    data = g.build()
    cut = g.at["ti:b:offset"] + 3
    msg = parse_error(tmp_path, data[:cut])
    assert msg.startswith(at(g.at["ti:b:offset"])) and "truncated" in msg


def test_truncated_data_and_data_past_end(tmp_path: Path) -> None:
    g = good()
    data = g.build()
    msg = parse_error(tmp_path, data[:-1])
    assert msg.startswith(at(g.at["ti:b:offset"])) and "runs past the end of the file" in msg
    g = good()
    g.tensors[0] = ("a", [4, 2], 0, 1 << 40)
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["ti:a:offset"])) and "tensor `a`" in msg and "past the end" in msg


def test_misaligned_offset(tmp_path: Path) -> None:
    g = good()
    g.tensors[1] = ("b", [3], 0, 36)
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["ti:b:offset"])) and "not a multiple of the alignment 32" in msg


def test_unknown_tensor_type(tmp_path: Path) -> None:
    g = good()
    g.tensors[0] = ("a", [4, 2], 5, 0)
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["ti:a:type"])) and "unknown ggml tensor type id 5" in msg


def test_dimension_overflow_and_too_many_dims(tmp_path: Path) -> None:
    g = good()
    g.tensors[0] = ("a", [2**32, 2**32], 0, 0)
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["ti:a:dims"])) and "overflow" in msg
    g = good()
    g.tensors[0] = ("a", [1, 1, 1, 1, 1], 0, 0)
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["ti:a:n_dims"])) and "5 dimensions" in msg
    g = good()
    g.tensors[0] = ("a", [100, 2], 12, 0)  # Q4_K rows must be whole 256-element blocks
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["ti:a:dims"])) and "not a whole number of Q4_K blocks" in msg


def test_string_and_array_lengths_past_end(tmp_path: Path) -> None:
    g = good()
    data = bytearray(g.build())
    v = g.at["kv:general.architecture:value"]
    data[v : v + 8] = struct.pack("<Q", 2**62)
    msg = parse_error(tmp_path, bytes(data))
    assert msg.startswith(at(v)) and "string length 4611686018427387904 runs past the end" in msg

    g = RawGGUF().add_kv("arr", "arr", struct.pack("<IQ", 5, 2**61))  # ARRAY[INT32], absurd count
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["kv:arr:value"] + 4)) and f"array of {2**61} INT32 elements" in msg

    g = RawGGUF().add_kv("arr", "arr", struct.pack("<IQ", 8, 3) + gstr("a") + struct.pack("<Q", 99))
    msg = parse_error(tmp_path, g.build())
    assert "string length 99 runs past the end" in msg

    g = RawGGUF().add_kv("s", "str", gstr(b"ab\xffcd"))
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["kv:s:value"] + 8 + 2)) and "not valid UTF-8" in msg


def test_absurd_counts(tmp_path: Path) -> None:
    data = bytearray(good().build())
    data[16:24] = struct.pack("<Q", 2**63)
    msg = parse_error(tmp_path, bytes(data))
    assert msg.startswith(at(16)) and "metadata key/value count" in msg
    data = bytearray(good().build())
    data[8:16] = struct.pack("<Q", 2**40)
    msg = parse_error(tmp_path, bytes(data))
    assert msg.startswith(at(8)) and "tensor count" in msg


def test_duplicates(tmp_path: Path) -> None:
    g = good()
    g.tensors.append(("a", [1], 0, 0))
    msg = parse_error(tmp_path, g.build())
    # the record for the second "a" overwrote at["ti:a"]
    assert msg.startswith(at(g.at["ti:a"])) and "duplicate tensor name `a`" in msg
    g = good().add_kv("k.u32", "u32", struct.pack("<I", 8))
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["kv:k.u32"])) and "duplicate metadata key `k.u32`" in msg


@pytest.mark.parametrize(
    "vtype,payload,needle",
    [
        ("u32", struct.pack("<I", 0), "not a non-zero power of two"),
        ("u32", struct.pack("<I", 48), "not a non-zero power of two"),
        ("u64", struct.pack("<Q", 32), "has type UINT64, the spec requires UINT32"),
    ],
)
def test_bad_alignment(tmp_path: Path, vtype: str, payload: bytes, needle: str) -> None:
    g = RawGGUF().add_kv("general.alignment", vtype, payload)
    msg = parse_error(tmp_path, g.build())
    assert msg.startswith(at(g.at["kv:general.alignment:value"])) and needle in msg


def test_custom_alignment_and_v2(tmp_path: Path) -> None:
    g = RawGGUF(version=2, alignment=64).add_kv("general.alignment", "u32", struct.pack("<I", 64))
    g.add_f32_tensor("x", [3]).add_f32_tensor("y", [2])
    p = tmp_path / "v2.gguf"
    p.write_bytes(g.build())
    with GGUFFile(p) as f:
        assert (f.version, f.alignment, f.data_offset) == (2, 64, g.at["data"])
        assert f.tensor("y").offset == g.at["data"] + 64
        np.testing.assert_array_equal(f.dequantize("y"), [0.0, 1.0])
