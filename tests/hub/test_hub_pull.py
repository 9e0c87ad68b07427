"""`fak pull` against a local stand-in of the hub's file API (tests/hub/hub_fake_server.py, on
loopback through HF_ENDPOINT): download, resume after a cut connection, checksum mismatch, 404,
401, an architecture fak does not run, quantization choice, split files joined, the cache, the CLI.

Add a case: put files in the ``hub`` fixture with ``hub.add(REPO, PATH, BYTES)`` (and faults with
``hub.cut`` / ``hub.corrupt``), pull with ``pull(..., root=tmp_path)``, and look at
``hub.requests`` for what went over the wire.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf_split_maker import split_gguf
from hub_fake_server import FakeHub

from fak.cli import main
from fak.gguf import GGUFFile
from fak.hub import (SUPPORTED_ARCHITECTURES, PullError, UnsupportedArchitectureError, list_cached,
                     parse_ref, pull)
from fak.hub.gguf_split import architecture_from_prefix
from fak.synth import write_tiny_model
from fak.synth.edit import copy_gguf

REPO = "fak-test/Tiny-Qwen2-GGUF"
FILE = "tiny-qwen2-q8_0.gguf"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 GGUF (~200 KB)."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "qwen2")


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny: Path):
    """The fake hub with REPO/FILE (the tiny model) and a README, as HF_ENDPOINT."""
    h = FakeHub()
    h.add(REPO, FILE, tiny.read_bytes())
    h.add(REPO, "README.md", b"# tiny\n", lfs=False)
    h.start()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("FAK_MODELS", raising=False)
    yield h
    h.stop()


def _whole_gets(hub: FakeHub, path: str) -> int:
    return sum(1 for r in hub.gets(path) if r is None)


def test_download_then_cache_hit(hub: FakeHub, tiny: Path, tmp_path: Path) -> None:
    out = pull(REPO, root=tmp_path / "m")
    assert out == tmp_path / "m" / "hf" / REPO / FILE
    assert out.read_bytes() == tiny.read_bytes()
    with GGUFFile(out) as f:
        assert f.metadata["general.architecture"] == "qwen2"
    side = json.loads((out.parent / ".fak-pull.json").read_text())["files"][FILE]
    assert side["sha256"][FILE] == hub.repos[REPO].files[FILE].sha256
    assert side["architecture"] == "qwen2"
    n = len(hub.requests)
    again = pull(f"hf://{REPO}/{FILE}", root=tmp_path / "m")
    assert again == out and len(hub.requests) == n, "a verified cached file needs no network"
    assert pull(f"hf://{REPO}:q8_0", root=tmp_path / "m") == out
    pull(REPO, FILE, root=tmp_path / "m", refresh=True)
    assert len(hub.requests) > n


def test_resume_after_cut_connection(hub: FakeHub, tiny: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub writes (and resumes from) whole chunks of 10 MB; 16 KB chunks let a 200 KB
    # file show the resume: the connection is cut after 60,000 bytes, the retry asks for the rest.
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16384)
    hub.cut(FILE, after=60_000)
    out = pull(REPO, FILE, root=tmp_path)
    assert out.read_bytes() == tiny.read_bytes()
    gets = [g for g in hub.gets(FILE) if g != "bytes=0-1048575"]  # less the header peek
    assert gets[0] is None and len(gets) == 2, gets
    assert re.fullmatch(r"bytes=(\d+)-", gets[1]) and 0 < int(gets[1][6:-1]) <= 60_000, gets


def test_checksum_mismatch_removes_the_file(hub: FakeHub, tiny: Path, tmp_path: Path) -> None:
    hub.corrupt(FILE)
    with pytest.raises(PullError, match="checksum mismatch") as e:
        pull(REPO, FILE, root=tmp_path)
    assert hub.repos[REPO].files[FILE].sha256 in str(e.value)
    assert not (tmp_path / "hf" / REPO / FILE).exists()
    assert list_cached(tmp_path) == []
    hub.corrupted.clear()
    assert pull(REPO, FILE, root=tmp_path).read_bytes() == tiny.read_bytes()


def test_git_blob_digest_checked_for_small_files(hub: FakeHub, tiny: Path, tmp_path: Path) -> None:
    hub.add("fak-test/plain", "m.gguf", tiny.read_bytes(), lfs=False)
    assert pull("fak-test/plain", root=tmp_path).read_bytes() == tiny.read_bytes()
    hub.add("fak-test/plain2", "m.gguf", tiny.read_bytes(), lfs=False)
    hub.corrupt("m.gguf")
    with pytest.raises(PullError, match="checksum mismatch"):
        pull("fak-test/plain2", root=tmp_path)


def test_404_repository_and_file(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(PullError, match=r"no repository fak-test/nope .*HTTP 404"):
        pull("fak-test/nope", root=tmp_path)
    with pytest.raises(PullError, match=rf"has no file other.gguf; its GGUF files: {FILE}"):
        pull(REPO, "other.gguf", root=tmp_path)
    with pytest.raises(PullError, match="no GGUF file of quantization Q4_K_M"):
        pull(REPO, "Q4_K_M", root=tmp_path)
    with pytest.raises(PullError, match="no revision 'v9'"):
        pull(REPO, FILE, revision="v9", root=tmp_path)
    assert list_cached(tmp_path) == []


def test_401_gated_repository_needs_hf_token(hub: FakeHub, tiny: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add("fak-test/gated", FILE, tiny.read_bytes(), token="hf_good")
    with pytest.raises(PullError, match=r"HTTP 401.*gated or private; set HF_TOKEN"):
        pull("fak-test/gated", root=tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(PullError, match="HTTP 401"):
        pull("fak-test/gated", root=tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert pull("fak-test/gated", root=tmp_path).read_bytes() == tiny.read_bytes()


def test_unsupported_architecture_refused_before_download(hub: FakeHub, tiny: Path,
                                                          tmp_path: Path) -> None:
    other = copy_gguf(tiny, tmp_path / "gptoss.gguf",
                      kv={"general.architecture": ("gpt-oss", gguf.GGUFValueType.STRING)})
    assert architecture_from_prefix(other.read_bytes()[:4096]) == "gpt-oss"
    hub.add("fak-test/oss-GGUF", "oss.gguf", other.read_bytes())
    with pytest.raises(UnsupportedArchitectureError, match="'gpt-oss' model.*fak runs qwen2") as e:
        pull("fak-test/oss-GGUF", root=tmp_path / "m")
    assert e.value.architecture == "gpt-oss"
    assert _whole_gets(hub, "oss.gguf") == 0, "refused from the header, before the download"
    assert list_cached(tmp_path / "m") == []


def test_quantization_choice(hub: FakeHub, tiny: Path, tmp_path: Path) -> None:
    data = tiny.read_bytes()
    for name in ("m-Q4_K_M.gguf", "m-Q4_K.gguf", "m-Q8_0.gguf", "mmproj-m-f16.gguf"):
        hub.add("fak-test/multi", name, data)
    assert pull("fak-test/multi", root=tmp_path).name == "m-Q4_K_M.gguf"
    assert pull("hf://fak-test/multi:Q4_K", root=tmp_path).name == "m-Q4_K.gguf"
    assert pull("fak-test/multi", "q8_0", root=tmp_path).name == "m-Q8_0.gguf"
    with pytest.raises(PullError, match="no GGUF file of quantization Q5_K_M; it holds: m-Q4_K.gguf"):
        pull("fak-test/multi", "Q5_K_M", root=tmp_path)
    hub.add("fak-test/two", "a-Q8_0.gguf", data)
    hub.add("fak-test/two", "b-Q8_0.gguf", data)
    with pytest.raises(PullError, match="2 GGUF models; name one"):
        pull("fak-test/two", root=tmp_path)
    with pytest.raises(PullError, match="2 GGUF files of quantization Q8_0"):
        pull("fak-test/two", "Q8_0", root=tmp_path)


def test_split_gguf_joined(hub: FakeHub, tiny: Path, tmp_path: Path) -> None:
    parts = split_gguf(tiny, tmp_path, "tiny-Q8_0", 3)
    for p in parts:
        hub.add("fak-test/split", f"Q8_0/{p.name}", p.read_bytes())
    hub.cut(f"Q8_0/{parts[1].name}", after=1000)
    out = pull("hf://fak-test/split:Q8_0", root=tmp_path / "m")
    assert out == tmp_path / "m" / "hf" / "fak-test" / "split" / "Q8_0" / "tiny-Q8_0.gguf"
    assert not any(out.parent.glob("*-of-*.gguf")), "the parts are removed once joined"
    with GGUFFile(tiny) as a, GGUFFile(out) as b:
        assert not any(k.startswith("split.") for k in b.metadata)
        assert {k: v for k, v in b.metadata.items()} == a.metadata
        assert [t.name for t in b.tensors] == [t.name for t in a.tensors]
        for t in a.tensors:
            assert np.array_equal(a.raw(t.name), b.raw(t.name)), t.name
    assert pull("fak-test/split", f"Q8_0/{parts[2].name}", root=tmp_path / "m") == out
    hub.add("fak-test/split-missing", parts[0].name, parts[0].read_bytes())
    with pytest.raises(PullError, match="not the other parts of its split set"):
        pull("fak-test/split-missing", parts[0].name, root=tmp_path / "m")


def test_engine_runs_a_pulled_model(hub: FakeHub, tmp_path: Path) -> None:
    from fak.engine import Engine

    out = pull(f"hf://{REPO}/{FILE}", root=tmp_path)
    with Engine(out, backend="cpu", n_ctx=64) as eng:
        assert len(eng.generate("hello", max_tokens=3, temperature=0).text) >= 0


def test_parse_ref() -> None:
    r = parse_ref("hf://Org/Name-GGUF/sub/file-Q4_K_M.gguf")
    assert (r.repo, r.file, r.quant) == ("Org/Name-GGUF", "sub/file-Q4_K_M.gguf", None)
    r = parse_ref("Org/Name.v2@dev:Q8_0")
    assert (r.repo, r.revision, r.quant, r.file) == ("Org/Name.v2", "dev", "Q8_0", None)
    assert parse_ref("Org/N", "x.gguf").file == "x.gguf"
    assert parse_ref("Org/N", "Q4_K_M").quant == "Q4_K_M"
    assert parse_ref("Org/N:Q4_K_M").uri() == "hf://Org/N:Q4_K_M"
    for bad in ("justname", "hf://Org/N/readme.md"):
        with pytest.raises(ValueError):
            parse_ref(bad)
    with pytest.raises(ValueError, match="already names"):
        parse_ref("Org/N:Q4_K_M", "Q8_0")


def test_cli_pull_list_and_hf_paths(hub: FakeHub, tiny: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAK_MODELS", str(tmp_path / "models"))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "fetched.gguf").write_bytes(tiny.read_bytes())
    runner = CliRunner()
    r = runner.invoke(main, ["pull", REPO, "Q8_0", "--no-live"])
    assert r.exit_code == 0, r.output
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.read_bytes() == tiny.read_bytes()
    r = runner.invoke(main, ["pull", "--list", "--json"])
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["name"], x["architecture"], x["runs"]) for x in rows] == [
        ("fetched.gguf", "qwen2", True), (f"hf://{REPO}/{FILE}", "qwen2", True)]
    r = runner.invoke(main, ["pull", "--list"])
    assert r.exit_code == 0 and "fetched.gguf" in r.output and "qwen2" in r.output
    r = runner.invoke(main, ["pull", "fak-test/nope"])
    assert r.exit_code == 1 and "no repository fak-test/nope" in r.output
    r = runner.invoke(main, ["inspect", f"hf://{REPO}/{FILE}"])
    assert r.exit_code == 0 and "qwen2" in r.output, r.output
    r = runner.invoke(main, ["inspect", "hf://fak-test/nope/x.gguf"])
    assert r.exit_code == 2 and "no repository" in r.output


def test_supported_architectures_are_the_engines() -> None:
    """fak pull never lets through an architecture the engine refuses (rust/src/model/config.rs
    ``Arch::from_name``). One the engine learns is added to ``SUPPORTED_ARCHITECTURES`` by hand;
    until then pull refuses it with a clear message, which fails safe."""
    src = (Path(__file__).resolve().parents[2] / "rust/src/model/config.rs").read_text()
    body = src[src.index("pub fn from_name"):]
    body = body[:body.index("other =>")]
    engine = re.findall(r'"(\w+)" => Ok\(Arch::', body)
    assert engine[:6] == ["qwen2", "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe"]
    assert set(SUPPORTED_ARCHITECTURES) <= set(engine)
