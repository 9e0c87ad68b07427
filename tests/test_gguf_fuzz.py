"""Property-based fuzzing of the GGUF reader (hypothesis): mutated real and synthetic headers
either parse or raise ``fak.GGUFError``, never anything else and never a crash. A file that
parses is then fully exercised (metadata, tensor infos, raw views, dequantization).

Seeds: the first 16 KiB of the real 0.5B model (magic, counts, metadata strings, the start of the
tokenizer arrays), a small GGUF with the real model's metadata keys and tensor names/types (big
arrays shortened, one block per tensor, written with ``GGUFWriter``), and the synthetic file
with every value type and format (tests/gguf_util.py).

The longer coverage-guided campaign (cargo-fuzz on the Rust parser) is in ``fuzz/`` and its
results in docs/fuzzing.md.
"""

from __future__ import annotations

import re
import struct
import tempfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fak
from fak.gguf import GGUFFile
from gguf_util import random_blocks, write_synthetic

INTERESTING_U64 = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32, 33, 255, 256, 2**31, 2**32 - 1, 2**32, 2**62,
                   2**63 - 1, 2**63, 2**64 - 1]

SETTINGS = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


def real_layout_twin(real: Path, out: Path) -> None:
    """A small GGUF with ``real``'s metadata (arrays cut to 4 entries) and tensor table (same names
    and types, one row of one block each)."""
    with GGUFFile(real) as f:
        meta, types, tensors = f.metadata, f.metadata_types, f.tensors
    w = gguf.GGUFWriter(str(out), meta["general.architecture"])
    V = gguf.GGUFValueType
    for key, val in meta.items():
        if key == "general.architecture":
            continue
        t = types[key]
        if t.startswith("ARRAY["):
            w.add_key_value(key, val[:4], V.ARRAY, sub_type=V[t[6:-1]])
        else:
            w.add_key_value(key, val, V[t])
    rng = np.random.default_rng(0)
    for info in tensors[:40]:
        raw = random_blocks(info.dtype, 1, rng)
        w.add_tensor(info.name, raw.reshape(1, -1), raw_dtype=gguf.GGMLQuantizationType[info.dtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


Seed = tuple[bytes, list[tuple[int, int]]]


def regions(path: Path) -> list[tuple[int, int]]:
    """Byte ranges of a valid file's parts: fixed header, metadata, tensor infos, data."""
    r = gguf.GGUFReader(path)
    kv_start = 24
    ti_start = min((t.field.offset for t in r.tensors), default=r.data_offset)
    return [(0, kv_start), (kv_start, ti_start), (ti_start, r.data_offset), (r.data_offset, path.stat().st_size)]


@pytest.fixture(scope="module")
def seeds(model_05b: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Seed]:
    d = tmp_path_factory.mktemp("fuzz-seeds")
    real_layout_twin(model_05b, d / "twin.gguf")
    write_synthetic(d / "synthetic.gguf", seed=3)
    with open(model_05b, "rb") as fh:
        prefix = fh.read(16 * 1024)
    return {
        "real_prefix": (prefix, [(0, 24), (24, len(prefix))]),
        "real_twin": ((d / "twin.gguf").read_bytes(), regions(d / "twin.gguf")),
        "synthetic": ((d / "synthetic.gguf").read_bytes(), regions(d / "synthetic.gguf")),
    }


def test_seeds_parse(seeds: dict[str, Seed], tmp_path: Path) -> None:
    """The twin and the synthetic seed are valid; the prefix fails only for being truncated."""
    for name in ("real_twin", "synthetic"):
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(seeds[name][0])
        assert exercise(p) == "parsed"
        assert all(start < end for start, end in seeds[name][1])
    p = tmp_path / "prefix.gguf"
    p.write_bytes(seeds["real_prefix"][0])
    with pytest.raises(fak.GGUFError, match="truncated|runs past the end"):
        GGUFFile(p)


# a raw position, reduced modulo the length of the part of the file being mutated
position = st.integers(min_value=0, max_value=2**24)
mutation = st.one_of(
    st.tuples(st.just("flip"), position, st.integers(0, 7)),
    st.tuples(st.just("byte"), position, st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, 9, 13])),
    st.tuples(st.just("u64"), position, st.sampled_from(INTERESTING_U64)),
    st.tuples(st.just("u32"), position, st.sampled_from([0, 1, 4, 5, 8, 9, 12, 13, 30, 39, 2**31, 2**32 - 1])),
    st.tuples(st.just("insert"), position, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), position, st.integers(1, 64)),
    st.tuples(st.just("truncate"), position, st.just(0)),
)


def mutate(seed: Seed, ops: list[tuple], region: int) -> bytes:
    """Applies ``ops`` at positions inside part ``region`` of the seed (see ``regions``)."""
    data, parts = seed
    start, end = parts[region % len(parts)]
    b = bytearray(data)
    for kind, pos, arg in ops:
        if not b:
            break
        at = min(start + pos % max(end - start, 1), len(b) - 1)
        if kind == "flip":
            b[at] ^= 1 << arg
        elif kind == "byte":
            b[at] = arg
        elif kind == "u64":
            b[at : at + 8] = struct.pack("<Q", arg)
        elif kind == "u32":
            b[at : at + 4] = struct.pack("<I", arg)
        elif kind == "insert":
            b[at:at] = arg
        elif kind == "delete":
            del b[at : at + arg]
        else:
            del b[at:]
    return bytes(b)


def exercise(path: Path) -> str:
    """Opens ``path``; on success touches every accessor. Only GGUFError may escape the open.
    Returns ``"parsed"`` or the error's problem class (for hypothesis statistics)."""
    try:
        f = GGUFFile(path)
    except fak.GGUFError as e:
        assert "GGUF error at byte offset" in str(e)
        problem = re.sub(r"`[^`]*`|\[[^]]*\]|\d+", "_", str(e).split(": ", 1)[1])
        return "error: " + ("truncated" if "truncated" in problem else problem[:60])
    with f:
        assert isinstance(f.metadata, dict) and len(f.metadata_types) == len(f.metadata)
        for info in f.tensors:
            raw = f.raw(info.name)
            assert raw.size == info.n_bytes and info.offset + info.n_bytes <= f.file_size
            if info.n_elements <= 1 << 20:
                try:
                    out = f.dequantize(info.name)
                except fak.UnsupportedError:
                    continue
                assert out.shape == info.shape
    return "parsed"


def check(seeds: dict[str, Seed], seed: str, ops: list[tuple], region: int) -> None:
    data = mutate(seeds[seed], ops, region)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.gguf"
        p.write_bytes(data)
        event(exercise(p))


ops_strategy = st.lists(mutation, min_size=1, max_size=6)


@SETTINGS
@given(ops=ops_strategy, region=st.integers(0, 3))
def test_mutated_real_prefix(seeds: dict[str, Seed], ops: list[tuple], region: int) -> None:
    check(seeds, "real_prefix", ops, region)


@SETTINGS
@given(ops=ops_strategy, region=st.integers(0, 3))
def test_mutated_real_twin(seeds: dict[str, Seed], ops: list[tuple], region: int) -> None:
    check(seeds, "real_twin", ops, region)


@SETTINGS
@given(ops=ops_strategy, region=st.integers(0, 3))
def test_mutated_synthetic(seeds: dict[str, Seed], ops: list[tuple], region: int) -> None:
    check(seeds, "synthetic", ops, region)


@SETTINGS
@given(version=st.sampled_from([2, 3]), counts=st.tuples(st.integers(0, 3), st.integers(0, 3)),
       data=st.binary(max_size=256))
def test_random_bytes_after_header(version: int, counts: tuple[int, int], data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "r.gguf"
        p.write_bytes(b"GGUF" + struct.pack("<IQQ", version, *counts) + data)
        event(exercise(p))
