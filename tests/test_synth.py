"""Tests of the synthetic GGUF generator (``fak.synth``).

What is checked: every file parses with the ``gguf`` package's reader; tiny models have the real
architectures' names, shapes and metadata; random blocks dequantize (with ``gguf.quants``, the
reference) to finite weights of the intended spread in every format; the tokenizer is a working
byte-level BPE in ``tokenizers``; the qwen2 chat template renders exactly as the real Qwen2.5
template; twins reproduce real layouts (``--like`` on the real 0.5B file, the 1.5B preset against
the real 1.5B file, the 7B preset against llama.cpp's Q4_K_M rule); the qwen3 / qwen3moe tiny models
have llama.cpp's names (``gguf`` ``MODEL_TENSORS``), shapes, metadata keys, Qwen3 / Qwen3-Coder
tokens and templates, and a router that routes; the Qwen3 presets have the real files' header and
tensor table (without writing 5-17 GB). The Qwen3.5/3.6 hybrids (qwen35 / qwen35moe) likewise: their
Gated DeltaNet and gated-attention layers' names, shapes and ``ssm.*`` keys in the real files'
order, llama.cpp's Q4_K_M rule for them, a stable recurrence, their tokenizer and template (thinking,
XML tool calls), the prompts of their goldens, and the Qwen3.6 27B / 35B-A3B presets. That
llama.cpp itself loads and runs the tiny files is what their goldens show
(``scripts/make_goldens.py --tiny``).

To add a format: add it to ``fak.synth.blocks.FORMATS`` and to ``FORMATS_UNDER_TEST`` below.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import jinja2.sandbox
import numpy as np
import pytest
from fak.gguf import GGUFFile
from click.testing import CliRunner
from fak.synth import (PRESETS, GGUFPlan, plan_tiny_model, plan_twin, router_tie_rows, write_plan, write_tiny_model,
                       write_twin)
from fak.synth.blocks import FORMATS, new_rng, random_blocks
from fak.synth.layout import quantize_order_key, use_more_bits
from fak.synth.vocab import bpe_merges, build_tokenizer, byte_symbols, chat_template
from fak.synth.writer import router_std
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
from gguf import quants as gguf_quants
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

FORMATS_UNDER_TEST = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]

QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
               r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# --- helpers -------------------------------------------------------------------------------------
# The gguf package's reader is the independent reference here. It is slow on a 152k-token header
# (seconds), so each file is opened once.

@lru_cache(maxsize=16)
def _reader(path: Path, mtime_ns: int) -> GGUFReader:
    return GGUFReader(path)


def reader(path: Path) -> GGUFReader:
    return _reader(Path(path), Path(path).stat().st_mtime_ns)


def fields(path: Path) -> dict[str, object]:
    """Metadata of a GGUF file as Python values (via the gguf package)."""
    r = reader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def field_types(path: Path) -> dict[str, list[str]]:
    r = reader(path)
    return {k: [t.name for t in f.types] for k, f in r.fields.items() if not k.startswith("GGUF.")}


def layout(path: Path) -> list[tuple[str, tuple[int, ...], str, int]]:
    """(name, ggml dims, type, offset from the data section) of every tensor, in file order."""
    r = reader(path)
    return [(t.name, tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.data_offset) - r.data_offset)
            for t in r.tensors]


def dequantize(t) -> np.ndarray:
    data = np.asarray(t.data)
    if t.tensor_type.name in ("F32", "F16"):
        return data.astype(np.float32).ravel()
    return np.asarray(gguf_quants.dequantize(data, t.tensor_type), dtype=np.float32).ravel()


def tokenizer_from_gguf(path: Path) -> Tokenizer:
    """A ``tokenizers`` BPE built from a GGUF's gpt2-style tokenizer metadata (tokens, merges,
    control/user-defined tokens as special added tokens)."""
    meta = fields(path)
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tok


# --- tiny models ---------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_has_the_architecture_layout(tmp_path: Path, arch: str) -> None:
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, n_layer=3, n_embd=64, n_head=4, n_head_kv=2,
                            n_ff=128, ctx=1024)
    meta, types = fields(path), field_types(path)
    assert meta["general.architecture"] == arch
    expect = {f"{arch}.block_count": 3, f"{arch}.context_length": 1024, f"{arch}.embedding_length": 64,
              f"{arch}.feed_forward_length": 128, f"{arch}.attention.head_count": 4,
              f"{arch}.attention.head_count_kv": 2}
    for key, value in expect.items():
        assert meta[key] == value, key
        assert types[key] == ["UINT32"], key
    assert types[f"{arch}.rope.freq_base"] == ["FLOAT32"]
    assert types[f"{arch}.attention.layer_norm_rms_epsilon"] == ["FLOAT32"]
    assert meta[f"{arch}.rope.freq_base"] == (1e6 if arch == "qwen2" else 5e5)
    assert types["tokenizer.ggml.tokens"] == ["ARRAY", "STRING"]
    assert types["tokenizer.ggml.token_type"] == ["ARRAY", "INT32"]
    assert types["tokenizer.ggml.bos_token_id"] == ["UINT32"]
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.pre"] == ("qwen2" if arch == "qwen2" else "llama-bpe")
    assert meta["tokenizer.ggml.add_bos_token"] is (arch == "llama")
    assert "fak.synthetic" in meta

    with GGUFFile(path) as f:  # fak's reader sees the same file
        assert f.metadata == meta
        assert [(t.name, t.dims, t.dtype) for t in f.tensors] == [(n, d, ty) for n, d, ty, _ in layout(path)]
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    kv = 2 * 16
    names = {name: (dims, ty) for name, dims, ty, _ in layout(path)}
    assert names["token_embd.weight"][0] == (64, n_vocab)
    assert names["output_norm.weight"] == ((64,), "F32")
    for i in range(3):
        b = f"blk.{i}."
        assert names[b + "attn_q.weight"][0] == (64, 64)
        assert names[b + "attn_k.weight"][0] == (64, kv)
        assert names[b + "attn_v.weight"][0] == (64, kv)
        assert names[b + "attn_output.weight"][0] == (64, 64)
        assert names[b + "ffn_gate.weight"][0] == (64, 128)
        assert names[b + "ffn_up.weight"][0] == (64, 128)
        assert names[b + "ffn_down.weight"][0] == (128, 64)
        assert names[b + "attn_norm.weight"] == ((64,), "F32")
        assert names[b + "ffn_norm.weight"] == ((64,), "F32")
        if arch == "qwen2":
            assert names[b + "attn_q.bias"] == ((64,), "F32")
            assert names[b + "attn_k.bias"] == ((kv,), "F32")
            assert names[b + "attn_v.bias"] == ((kv,), "F32")
        else:
            assert not any(n.startswith(b) and n.endswith(".bias") for n in names)
    if arch == "qwen2":
        assert names["output.weight"] == ((64, n_vocab), "Q8_0")
        assert len(names) == 2 + 1 + 12 * 3
    else:
        assert "output.weight" not in names  # tied embeddings, as Llama 3.2
        assert len(names) == 1 + 1 + 9 * 3
        assert meta["llama.rope.dimension_count"] == 16
        assert meta["llama.vocab_size"] == n_vocab


def test_tiny_model_options(tmp_path: Path) -> None:
    tied = write_tiny_model(tmp_path / "tied.gguf", "qwen2", tied_embeddings=True, n_vocab=1024)
    names = [n for n, *_ in layout(tied)]
    assert "output.weight" not in names
    assert len(fields(tied)["tokenizer.ggml.tokens"]) == 1024
    custom = write_tiny_model(tmp_path / "custom.gguf", "llama", tensor_types={"token_embd.weight": "F16"})
    assert {n: ty for n, _, ty, _ in layout(custom)}["token_embd.weight"] == "F16"
    with pytest.raises(ValueError, match="n_head"):
        write_tiny_model(tmp_path / "bad.gguf", "qwen2", n_head=5)
    with pytest.raises(ValueError, match="IQ2_XXS"):
        write_tiny_model(tmp_path / "bad.gguf", "qwen2", weight_type="IQ2_XXS")
    with pytest.raises(ValueError, match="smaller than"):
        write_tiny_model(tmp_path / "bad.gguf", "qwen2", n_vocab=300)
    assert not (tmp_path / "bad.gguf").exists()


def test_file_matches_its_plan_and_is_deterministic(tmp_path: Path) -> None:
    plan = plan_tiny_model("qwen2", weight_type="Q4_K_M", n_embd=256, n_ff=512, n_head=4, n_head_kv=1)
    a = write_plan(tmp_path / "a.gguf", plan, seed=7)
    b = write_plan(tmp_path / "b.gguf", plan, seed=7)
    c = write_plan(tmp_path / "c.gguf", plan, seed=8)
    assert a.stat().st_size == plan.file_nbytes()
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes()[:plan.header_nbytes()] == c.read_bytes()[:plan.header_nbytes()]
    assert a.read_bytes() != c.read_bytes()
    got = layout(a)
    assert [o for *_, o in got] == plan.data_offsets()
    assert [(n, ty) for n, _, ty, _ in got] == [(t.name, t.dtype) for t in plan.tensors]
    assert GGUFReader(a).data_offset == plan.header_nbytes()
    assert all(o % 32 == 0 for o in plan.data_offsets())


@pytest.mark.parametrize("fmt", FORMATS_UNDER_TEST)
def test_dequantized_weights_are_finite_with_sane_spread(tmp_path: Path, fmt: str) -> None:
    # n_embd 256 / n_ff 512: rows fit every block size, so each 2-D weight really is `fmt`
    path = write_tiny_model(tmp_path / f"{fmt}.gguf", "qwen2", n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                            weight_type=fmt, seed=3)
    seen = set()
    ours = GGUFFile(path)
    for t in GGUFReader(path).tensors:
        w = dequantize(t)
        assert np.isfinite(w).all(), t.name
        np.testing.assert_array_equal(ours.dequantize(t.name).ravel(), w, err_msg=t.name)  # fak.gguf reads it too
        if t.name.endswith("norm.weight"):
            assert t.tensor_type.name == "F32"
            assert abs(w.mean() - 1.0) < 0.05 and 0.02 < w.std() < 0.1, t.name
        elif t.name.endswith(".bias"):
            assert abs(w.mean()) < 0.02 and 0.005 < w.std() < 0.05, t.name
        else:
            seen.add(t.tensor_type.name)
            assert 0.014 < w.std() < 0.026, (t.name, w.std())
            assert abs(w.mean()) < 0.005, (t.name, w.mean())
    assert seen == {fmt}


@pytest.mark.parametrize("fmt", [f for f in FORMATS_UNDER_TEST if f not in ("F32", "F16", "BF16")])
def test_block_scales_are_finite_and_realistic(fmt: str) -> None:
    spec = FORMATS[fmt]
    blocks = random_blocks(fmt, spec.block_size * 4096, new_rng(1)).reshape(-1, spec.type_size)
    for off in spec.scale_offsets:
        d = blocks[:, off:off + 2].copy().view("<f2").astype(np.float32).ravel()
        assert np.isfinite(d).all() and (d > 0).all()
        assert 1e-6 < float(np.median(d)) < 1e-2  # real files: Q6_K ~1e-5, Q4_K ~1e-4, Q8_0 ~3e-4
    for off in spec.min_offsets:
        m = blocks[:, off:off + 2].copy().view("<f2").astype(np.float32).ravel()
        assert np.isfinite(m).all() and (m != 0).all()


def test_k_quant_rows_fall_back_like_llama_cpp(tmp_path: Path) -> None:
    # rows of 64 and 128 are not whole 256-blocks: llama.cpp's tensor_type_fallback
    for fmt, fallback in [("Q4_K", "Q5_0"), ("Q5_K", "Q5_1"), ("Q6_K", "Q8_0"), ("Q2_K", "Q4_0"), ("Q3_K", "Q4_0")]:
        plan = plan_tiny_model("llama", weight_type=fmt)
        assert {t.dtype for t in plan.tensors if len(t.shape) == 2} == {fallback}, fmt
    plan = plan_tiny_model("llama", weight_type="Q4_K", n_embd=256, n_ff=320)
    types = {t.name: t.dtype for t in plan.tensors}
    assert types["blk.0.ffn_down.weight"] == "Q5_0"   # row n_ff = 320
    assert types["blk.0.ffn_up.weight"] == "Q4_K"     # row n_embd = 256


def test_q4_k_m_mix_on_a_tiny_model() -> None:
    plan = plan_tiny_model("qwen2", weight_type="Q4_K_M", n_layer=8, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    types = {t.name: t.dtype for t in plan.tensors}
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    # file order of layers: 0, 1, 2, ... 7 (no two-digit layers); use_more_bits(i, 8): i < 1, i >= 7, (i-1)%3 == 2
    more = {i for i in range(8) if use_more_bits(i, 8)}
    assert more == {0, 3, 6, 7}
    for i in range(8):
        want = "Q6_K" if i in more else "Q4_K"
        assert types[f"blk.{i}.attn_v.weight"] == want
        assert types[f"blk.{i}.ffn_down.weight"] == want
        assert types[f"blk.{i}.attn_q.weight"] == "Q4_K"
    tied = plan_tiny_model("llama", weight_type="Q4_K_M", n_embd=256, n_ff=512)
    assert {t.name: t.dtype for t in tied.tensors}["token_embd.weight"] == "Q6_K"  # tied: output's rule


# --- tokenizer and chat template -----------------------------------------------------------------

def test_bpe_merges_are_a_valid_byte_level_bpe() -> None:
    symbols = byte_symbols()
    assert len(symbols) == 256 and len(set(symbols)) == 256
    merges = bpe_merges()
    assert 300 <= len(merges) <= 1000
    known = set(symbols)
    for rank, merge in enumerate(merges):
        left, right = merge.split(" ")
        assert left in known and right in known, (rank, merge)
        assert left + right not in known, (rank, merge)
        known.add(left + right)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_tokenizer_loads_and_works_in_tokenizers(tmp_path: Path, arch: str) -> None:
    path = write_tiny_model(tmp_path / "t.gguf", arch)
    meta = fields(path)
    tok = tokenizer_from_gguf(path)
    tokens = meta["tokenizer.ggml.tokens"]
    assert tok.get_vocab_size() == len(tokens)
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n# the end ✓"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
    assert len(ids) < 0.6 * len(text.encode())  # merges apply: well under one token per byte
    assert "Ġreturn" in tokens or "return" in tokens
    types = meta["tokenizer.ggml.token_type"]
    if arch == "qwen2":
        im_start, im_end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
        assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[0] == im_start
        assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[-1] == im_end
        assert meta["tokenizer.ggml.eos_token_id"] == im_end
        assert meta["tokenizer.ggml.bos_token_id"] == tokens.index("<|endoftext|>")
        assert meta["tokenizer.ggml.padding_token_id"] == tokens.index("<|endoftext|>")
        assert types[im_end] == 3 and types[tokens.index("<tool_call>")] == 4
        assert "tokenizer.ggml.eot_token_id" not in meta  # as the real Qwen2.5 files
    else:
        eot = tokens.index("<|eot_id|>")
        assert meta["tokenizer.ggml.eos_token_id"] == eot == meta["tokenizer.ggml.eot_token_id"]
        assert meta["tokenizer.ggml.bos_token_id"] == tokens.index("<|begin_of_text|>")
        assert tok.encode("<|start_header_id|>user<|end_header_id|>").ids[0] == tokens.index("<|start_header_id|>")
        assert types[eot] == 3
    assert all(ty == 1 for ty in types[:256 + len(bpe_merges())])


def test_twin_vocab_puts_specials_at_qwen_ids() -> None:
    spec = build_tokenizer("qwen2", 152064, special_base=151643)
    assert spec.n_vocab == 152064
    assert spec.tokens[151643] == "<|endoftext|>" and spec.tokens[151645] == "<|im_end|>"
    assert spec.special_ids["eos_token_id"] == 151645
    assert spec.token_type[1000] == 5 and spec.tokens[1000] == "[PAD1000]"


def _render(template: str, **ctx) -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(**ctx)


TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
    [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Open a.py"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.py"}}},
         {"type": "function", "function": {"name": "read_file", "arguments": {"path": "b.py"}}}]},
     {"role": "tool", "content": "print(1)"}, {"role": "tool", "content": "print(2)"},
     {"role": "assistant", "content": "Done."}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "Calling.",
                                        "tool_calls": [{"name": "read_file", "arguments": {"path": "c"}}]},
     {"role": "tool", "content": "ok"}, {"role": "system", "content": "late system"}],
]


@pytest.fixture(scope="module")
def real_qwen_template(model_15b: Path) -> str:
    with GGUFFile(model_15b) as f:
        return f.metadata["tokenizer.chat_template"]


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("gen", [True, False])
def test_qwen2_template_renders_as_the_real_qwen25_template(real_qwen_template: str, case: int, tools,
                                                            gen: bool) -> None:
    ctx = {"messages": CONVERSATIONS[case], "tools": tools, "add_generation_prompt": gen,
           "bos_token": "", "eos_token": "<|im_end|>"}
    assert _render(chat_template("qwen2"), **ctx) == _render(real_qwen_template, **ctx)


def test_llama_template_renders_llama3_turns() -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Read a.py"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": "a.py"}}}]},
            {"role": "tool", "content": "print(1)"}]
    out = _render(chat_template("llama"), messages=msgs, tools=TOOLS, add_generation_prompt=True,
                  bos_token="<|begin_of_text|>")
    assert out.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n\n")
    assert '"name": "read_file"' in out and out.count("<|eot_id|>") == 4
    assert "<|start_header_id|>user<|end_header_id|>\n\nRead a.py<|eot_id|>" in out
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "read_file", "parameters": {"path": "a.py"}}'
            '<|eot_id|>') in out
    assert "<|start_header_id|>ipython<|end_header_id|>\n\nprint(1)<|eot_id|>" in out
    assert out.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    plain = _render(chat_template("llama"), messages=[{"role": "user", "content": " hi "}], tools=None,
                    add_generation_prompt=False, bos_token="<|begin_of_text|>")
    assert plain == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"


# --- twins ---------------------------------------------------------------------------------------

def meta_with_types(path: Path) -> dict[str, tuple[str, object]]:
    """key -> (GGUF type, value) in file order, read with fak.gguf (fast on 152k-token headers)."""
    with GGUFFile(path) as f:
        types = f.metadata_types
        return {k: (types[k], v) for k, v in f.metadata.items()}


def fak_layout(path: Path) -> list[tuple[str, tuple[int, ...], str, int]]:
    """``layout`` read with fak.gguf."""
    with GGUFFile(path) as f:
        return [(t.name, t.dims, t.dtype, t.offset - f.data_offset) for t in f.tensors]


def test_like_twin_copies_the_real_header_and_layout(tmp_path: Path, model_05b: Path) -> None:
    twin = write_twin(tmp_path / "twin.gguf", like=model_05b, seed=1)
    real_meta, twin_meta = meta_with_types(model_05b), meta_with_types(twin)
    assert list(twin_meta) == list(real_meta) + ["fak.synthetic"]
    for key, (vtype, value) in real_meta.items():
        assert twin_meta[key] == (vtype, value), key
    assert fak_layout(twin) == fak_layout(model_05b)
    # the twin also parses with the gguf package's reader, with the same layout
    r_twin = reader(twin)
    assert layout(twin) == fak_layout(model_05b)
    with GGUFFile(model_05b) as real:
        assert r_twin.alignment == real.alignment
        extra = r_twin.data_offset - real.data_offset   # only the fak.synthetic entry (and padding)
        assert 0 < extra <= 32 + 8 + len("fak.synthetic") + 4 + 8 + len(twin_meta["fak.synthetic"][1].encode())
        assert twin.stat().st_size - r_twin.data_offset == real.file_size - real.data_offset
    by_name = {t.name: t for t in r_twin.tensors}
    for name in ["token_embd.weight", "output.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
                 "blk.3.ffn_up.weight", "blk.0.attn_q.bias", "output_norm.weight"]:
        w = dequantize(by_name[name])
        assert np.isfinite(w).all(), name
        if name.endswith("norm.weight"):
            assert abs(w.mean() - 1) < 0.05
        elif not name.endswith(".bias"):
            assert 0.014 < w.std() < 0.026, name


def test_preset_15b_equals_the_real_15b_layout(model_15b: Path) -> None:
    plan = plan_twin(preset="qwen2.5-coder-1.5b-q4_k_m", tokenizer_from=model_15b)
    real = fak_layout(model_15b)
    planned = [(t.name, tuple(reversed(t.shape)), t.dtype, off) for t, off in zip(plan.tensors, plan.data_offsets())]
    assert planned == real
    real_meta = meta_with_types(model_15b)
    assert [e.key for e in plan.metadata] == list(real_meta) + ["fak.synthetic"]
    for e in plan.metadata[:-1]:
        vtype, value = real_meta[e.key]
        assert e.type == vtype, e.key
        if e.key.startswith("general.") and e.type == "STRING":
            continue  # names say "fak synthetic twin"
        if e.type == "FLOAT32":
            assert np.float32(e.value) == np.float32(value), e.key
        else:
            assert e.value == value, e.key


def test_preset_15b_with_synthetic_tokenizer_keeps_the_layout(model_15b: Path) -> None:
    plan = plan_twin(preset="qwen2.5-coder-1.5b-q4_k_m")
    assert [(t.name, t.dtype) for t in plan.tensors] == [(n, ty) for n, _, ty, _ in fak_layout(model_15b)]
    assert len(plan.meta("tokenizer.ggml.tokens")) == 151936
    assert plan.meta("tokenizer.ggml.eos_token_id") == 151645


# The "more bits" layers of a 28-layer Q4_K_M file: llama.cpp counts attn_v / ffn_down tensors in
# file order (layers 0, 1, 10..19, 2, 20..27, 3..9), and use_more_bits holds for counts
# {0,1,2,5,8,11,14,17,20,23,24,25,26,27} -> layers:
MORE_BITS_LAYERS_28 = {0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27}


def test_preset_7b_q4_k_m_layout() -> None:
    plan = plan_twin(preset="qwen2.5-7b-q4_k_m")
    cfg = PRESETS["qwen2.5-7b-q4_k_m"].config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.n_ff, cfg.n_vocab) == (28, 3584, 28, 4, 18944, 152064)
    assert plan.meta("qwen2.rope.freq_base") == 1e6 and plan.meta("qwen2.context_length") == 32768
    assert plan.meta("general.file_type") == 15
    types = {t.name: t.dtype for t in plan.tensors}
    shapes = {t.name: t.shape for t in plan.tensors}
    assert len(plan.tensors) == 339 == 3 + 28 * 12
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert shapes["token_embd.weight"] == (152064, 3584) and shapes["blk.0.attn_k.weight"] == (512, 3584)
    assert shapes["blk.0.ffn_down.weight"] == (3584, 18944)
    for i in range(28):
        want = "Q6_K" if i in MORE_BITS_LAYERS_28 else "Q4_K"
        assert types[f"blk.{i}.attn_v.weight"] == want, i
        assert types[f"blk.{i}.ffn_down.weight"] == want, i
        for w in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            assert types[f"blk.{i}.{w}.weight"] == "Q4_K"
        for v in ("attn_norm.weight", "ffn_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias"):
            assert types[f"blk.{i}.{v}"] == "F32"
    counts = {ty: list(types.values()).count(ty) for ty in set(types.values())}
    assert counts == {"Q4_K": 169, "Q6_K": 29, "F32": 141}
    assert plan.data_nbytes() == 4_677_120_000          # sum of the padded tensor sizes
    assert abs(plan.file_nbytes() - 4.68e9) < 0.01e9    # Qwen2.5-7B-Instruct Q4_K_M: 4.68 GB
    assert plan.n_params() == 7_615_616_512             # Qwen2.5-7B: 7.61 B parameters


def test_twin_arguments_are_checked(tmp_path: Path, model_05b: Path) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        plan_twin()
    with pytest.raises(ValueError, match="exactly one"):
        plan_twin(like=model_05b, preset="qwen2.5-7b-q4_k_m")
    with pytest.raises(ValueError, match="unknown preset"):
        plan_twin(preset="nope")
    tiny = write_tiny_model(tmp_path / "tiny.gguf", "qwen2")
    with pytest.raises(ValueError, match="more than the model"):
        plan_twin(like=tiny, tokenizer_from=model_05b)


def test_like_twin_of_a_tiny_model_and_tokenizer_swap(tmp_path: Path) -> None:
    tiny = write_tiny_model(tmp_path / "tiny.gguf", "llama", weight_type="Q6_K", n_embd=256, n_ff=512)
    twin = write_twin(tmp_path / "twin.gguf", like=tiny, seed=5)
    assert layout(twin) == layout(tiny)
    assert reader(twin).tensors[0].data.tobytes() != reader(tiny).tensors[0].data.tobytes()
    qwen = write_tiny_model(tmp_path / "qwen.gguf", "qwen2")
    swapped = write_twin(tmp_path / "swapped.gguf", like=tiny, tokenizer_from=qwen)
    meta, tiny_meta, qwen_meta = fields(swapped), fields(tiny), fields(qwen)
    assert meta["general.architecture"] == "llama" and meta["llama.vocab_size"] == tiny_meta["llama.vocab_size"]
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"):
        assert meta[key] == qwen_meta[key], key
    assert "tokenizer.ggml.eot_token_id" not in meta  # the llama tokenizer's keys are all replaced
    assert layout(swapped) == layout(tiny)


# Runs `fak synth` in a child process that reports its own peak RSS: VmHWM of /proc/self/status,
# the high-water mark of the child's own address space. (getrusage's ru_maxrss would not do: Linux
# carries the forking parent's RSS across fork + exec into it, and the pytest process is large.)
_PEAK_RSS_CHILD = """
import sys
from fak.cli import main
main(sys.argv[1:], standalone_mode=False)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("peak_rss_bytes", int(hwm.split()[1]) * 1024, file=sys.stderr)
"""


@pytest.mark.slow
def test_7b_twin_streams_to_disk(tmp_path: Path) -> None:
    """Writes the whole 4.68 GB twin through the CLI; checks size, layout and peak memory."""
    out = tmp_path / "qwen2.5-7b-q4_k_m.gguf"
    try:
        proc = subprocess.run([sys.executable, "-c", _PEAK_RSS_CHILD, "synth", str(out), "--preset",
                               "qwen2.5-7b-q4_k_m"], check=True, capture_output=True, text=True)
        peak_rss = int(proc.stderr.rsplit("peak_rss_bytes", 1)[1].split()[0])
        assert peak_rss < 500_000_000, f"writing the 7B twin peaked at {peak_rss / 1e6:.0f} MB RSS"
        plan = plan_twin(preset="qwen2.5-7b-q4_k_m")
        assert out.stat().st_size == plan.file_nbytes()
        with GGUFFile(out) as f:
            assert [(t.name, t.dtype) for t in f.tensors] == [(t.name, t.dtype) for t in plan.tensors]
            for name in ("output.weight", "blk.27.ffn_down.weight", "blk.13.attn_v.weight", "token_embd.weight"):
                t = f.tensor(name)
                rows = f.raw(name)[: 64 * t.n_bytes // t.shape[0]]
                w = np.asarray(gguf_quants.dequantize(rows.reshape(64, -1), GGMLQuantizationType[t.dtype]))
                assert np.isfinite(w).all() and 0.014 < w.std() < 0.026, name
    finally:
        out.unlink(missing_ok=True)


def test_plan_header_size_arithmetic_matches_gguf_writer(tmp_path: Path) -> None:
    plan = GGUFPlan("qwen2", [], [])
    for i, (t, v) in enumerate([("UINT8", 1), ("INT16", -2), ("UINT64", 3), ("FLOAT64", 0.5), ("BOOL", True),
                                ("STRING", "héllo"), ("ARRAY[STRING]", ["a", "bc", ""]), ("ARRAY[FLOAT32]", [1.0, 2.0])]):
        plan.set_meta(f"k.{i}", t, v)
    plan.set_meta("general.architecture", "STRING", "qwen2")
    path = write_plan(tmp_path / "meta.gguf", plan)
    assert path.stat().st_size == plan.file_nbytes()
    meta = fields(path)
    assert meta["k.5"] == "héllo" and meta["k.6"] == ["a", "bc", ""] and meta["k.4"] is True
    assert json.dumps(meta["k.7"]) == "[1.0, 2.0]"
    assert GGUFReader(path).fields["k.1"].types == [GGUFValueType.INT16]


def test_like_twin_keeps_a_custom_alignment(tmp_path: Path) -> None:
    plan = plan_tiny_model("qwen2")
    plan.set_meta("general.alignment", "UINT32", 64)
    plan.alignment = 64
    src = write_plan(tmp_path / "a64.gguf", plan)
    twin = write_twin(tmp_path / "twin.gguf", like=src, seed=2)
    r = reader(twin)
    assert r.alignment == 64 and r.data_offset % 64 == 0
    assert all((int(t.data_offset) - r.data_offset) % 64 == 0 for t in r.tensors)
    assert layout(twin) == layout(src)
    assert fields(twin)["general.alignment"] == 64


# --- qwen3 and qwen3moe (issue 27) ---------------------------------------------------------------

def _llama_cpp_names(arch: str) -> set[str]:
    """Tensor name templates llama.cpp knows for ``arch`` (gguf-py's MODEL_TENSORS)."""
    return {TENSOR_NAMES[t] for t in MODEL_TENSORS[MODEL_ARCH[arch.upper()]]}


def _template_of(name: str) -> str:
    parts = name.removesuffix(".weight").removesuffix(".bias").split(".")
    return ".".join(["blk", "{bid}", *parts[2:]]) if parts[0] == "blk" else ".".join(parts)


@pytest.mark.parametrize("tied", [False, True])
def test_tiny_qwen3_has_llama_cpp_layout(tmp_path: Path, tied: bool) -> None:
    path = write_tiny_model(tmp_path / "q3.gguf", "qwen3", n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
                            tied_embeddings=tied, ctx=1024)
    meta, types = fields(path), field_types(path)
    assert meta["general.architecture"] == "qwen3"
    head_dim = 32  # default 2 * n_embd / n_head: n_head * head_dim = 128 != n_embd = 64
    expect = {"qwen3.block_count": 3, "qwen3.context_length": 1024, "qwen3.embedding_length": 64,
              "qwen3.feed_forward_length": 128, "qwen3.attention.head_count": 4, "qwen3.attention.head_count_kv": 2,
              "qwen3.attention.key_length": head_dim, "qwen3.attention.value_length": head_dim}
    for key, value in expect.items():
        assert meta[key] == value and types[key] == ["UINT32"], key
    assert meta["qwen3.rope.freq_base"] == 1e6 and types["qwen3.rope.freq_base"] == ["FLOAT32"]
    assert types["qwen3.attention.layer_norm_rms_epsilon"] == ["FLOAT32"]
    assert not any(k.startswith("qwen3.expert") for k in meta)
    names = {n: (dims, ty) for n, dims, ty, _ in layout(path)}
    assert {_template_of(n) for n in names} <= _llama_cpp_names("qwen3")
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    assert ("output.weight" in names) is not tied
    assert names["token_embd.weight"][0] == (64, n_vocab)
    for i in range(3):
        b = f"blk.{i}."
        assert names[b + "attn_q.weight"][0] == (64, 4 * head_dim)       # ggml order: [n_embd, n_head * head_dim]
        assert names[b + "attn_k.weight"][0] == (64, 2 * head_dim)
        assert names[b + "attn_v.weight"][0] == (64, 2 * head_dim)
        assert names[b + "attn_output.weight"][0] == (4 * head_dim, 64)
        assert names[b + "attn_q_norm.weight"] == ((head_dim,), "F32")
        assert names[b + "attn_k_norm.weight"] == ((head_dim,), "F32")
        assert names[b + "ffn_down.weight"][0] == (128, 64)
        assert not any(n.startswith(b) and n.endswith(".bias") for n in names)
    assert len(names) == (1 if tied else 2) + 1 + 11 * 3
    # llama-quantize's order: the non-layer tensors by name, then layer by layer, names sorted
    order = [n for n, *_ in layout(path)]
    assert order == sorted(order, key=quantize_order_key)
    assert order[:3] == (["output_norm.weight", "token_embd.weight", "blk.0.attn_k.weight"] if tied
                         else ["output.weight", "output_norm.weight", "token_embd.weight"])


def test_tiny_qwen3moe_has_llama_cpp_layout(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "moe.gguf", "qwen3moe", n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
                            n_expert=16, n_expert_used=4, n_ff_exp=96)
    meta, types = fields(path), field_types(path)
    expect = {"qwen3moe.expert_count": 16, "qwen3moe.expert_used_count": 4, "qwen3moe.expert_feed_forward_length": 96,
              "qwen3moe.expert_shared_feed_forward_length": 0, "qwen3moe.attention.key_length": 32}
    for key, value in expect.items():
        assert meta[key] == value and types[key] == ["UINT32"], key
    assert meta["qwen3moe.rope.freq_base"] == 1e7  # Qwen3-Coder's
    assert "qwen3moe.expert_weights_norm" not in meta  # llama.cpp's qwen3moe always renormalises; real files lack it
    keys = list(meta)
    assert keys.index("qwen3moe.expert_used_count") < keys.index("qwen3moe.attention.key_length") \
        < keys.index("qwen3moe.expert_count") < keys.index("tokenizer.ggml.model")
    assert keys[-2:] == ["general.file_type", "fak.synthetic"]
    names = {n: (dims, ty) for n, dims, ty, _ in layout(path)}
    assert {_template_of(n) for n in names} <= _llama_cpp_names("qwen3moe")
    for i in range(2):
        b = f"blk.{i}."
        assert names[b + "ffn_gate_inp.weight"] == ((64, 16), "F32")    # [n_embd, n_expert]
        assert names[b + "ffn_gate_exps.weight"][0] == (64, 96, 16)     # [n_embd, n_ff_exp, n_expert]
        assert names[b + "ffn_up_exps.weight"][0] == (64, 96, 16)
        assert names[b + "ffn_down_exps.weight"][0] == (96, 64, 16)     # [n_ff_exp, n_embd, n_expert]
        assert not any(n.startswith(b + "ffn_" + w + ".") for w in ("gate", "up", "down") for n in names)
    with GGUFFile(path) as f:  # fak's reader sees the 3-D tensors as the gguf package does
        assert [(t.name, t.dims, t.dtype) for t in f.tensors] == [(n, d, ty) for n, d, ty, _ in layout(path)]
        gate = f.dequantize("blk.0.ffn_gate_exps.weight")
        assert gate.shape == (16, 96, 64) and np.isfinite(gate).all() and 0.014 < gate.std() < 0.026


def test_moe_quant_mix_follows_llama_cpp(tmp_path: Path) -> None:
    # K-quant rows: n_embd 256, n_ff_exp 256; 8 layers so use_more_bits picks layers {0, 3, 6, 7}
    plan = plan_tiny_model("qwen3moe", n_layer=8, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=4,
                           n_expert_used=2, n_ff_exp=256, weight_type="Q4_K_M")
    types = {t.name: t.dtype for t in plan.tensors}
    more = {i for i in range(8) if use_more_bits(i, 8)}
    for i in range(8):
        want = "Q6_K" if i in more else "Q4_K"
        assert types[f"blk.{i}.ffn_down_exps.weight"] == want          # from the layer in the name
        assert types[f"blk.{i}.attn_v.weight"] == want                 # the count, in layer order here
        assert types[f"blk.{i}.ffn_gate_exps.weight"] == types[f"blk.{i}.ffn_up_exps.weight"] == "Q4_K"
        assert types[f"blk.{i}.ffn_gate_inp.weight"] == "F32"           # llama.cpp never quantizes routers
        assert types[f"blk.{i}.attn_q_norm.weight"] == "F32"
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    # exactly 8 experts: Mixtral's rule (attn_v / attn_k Q8_0, attn_output Q5_K)
    eight = plan_tiny_model("qwen3moe", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8,
                            n_expert_used=2, n_ff_exp=256, weight_type="Q4_K_M")
    t8 = {t.name: t.dtype for t in eight.tensors}
    assert t8["blk.0.attn_v.weight"] == t8["blk.0.attn_k.weight"] == "Q8_0" and t8["blk.0.attn_output.weight"] == "Q5_K"
    pure = plan_tiny_model("qwen3moe", weight_type="Q8_0")
    assert {t.dtype for t in pure.tensors if t.name.endswith("ffn_gate_inp.weight")} == {"F32"}


def test_tiny_arch_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="qwen3moe"):
        plan_tiny_model("qwen3", n_expert=4)
    with pytest.raises(ValueError, match="head_dim applies"):
        plan_tiny_model("qwen2", head_dim=32)
    with pytest.raises(ValueError, match="n_expert_used"):
        plan_tiny_model("qwen3moe", n_expert=4, n_expert_used=5)
    with pytest.raises(ValueError, match="router_ties"):
        plan_tiny_model("qwen3moe", router_ties=1)
    with pytest.raises(ValueError, match="F32 routers"):
        plan_tiny_model("qwen3moe", router_ties=2, tensor_types={"blk.0.ffn_gate_inp.weight": "F16"})


def _routing(router: np.ndarray, k: int, n_tokens: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Top-k experts and top-1 probability of ``router`` [n_expert, n_embd] on random unit-RMS inputs
    (the RMS-normalized hidden state the router sees)."""
    x = new_rng(99).standard_normal((n_tokens, router.shape[1]))
    logits = x @ router.T.astype(np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return np.argsort(-p, axis=1)[:, :k], p.max(axis=1)


def test_router_routes_like_a_trained_one(tmp_path: Path) -> None:
    n_expert, k = 32, 4
    path = write_tiny_model(tmp_path / "moe.gguf", "qwen3moe", n_embd=64, n_expert=n_expert, n_expert_used=k, seed=5)
    with GGUFFile(path) as f:
        router = f.dequantize("blk.0.ffn_gate_inp.weight")
    assert router.shape == (n_expert, 64)
    assert abs(router.std() - router_std(64)) < 0.1 * router_std(64)
    chosen, top1 = _routing(router, k)
    counts = np.bincount(chosen.ravel(), minlength=n_expert)
    assert (counts > 0).all()                        # every expert is chosen by some token
    assert counts.max() < 0.5 * len(chosen)          # no expert by every token
    assert len({tuple(sorted(c)) for c in chosen}) > 0.5 * len(chosen)  # token-dependent sets
    assert 3 / n_expert < np.median(top1) < 0.9      # peaked, not uniform, not one-hot


def test_router_ties_are_exact_and_near(tmp_path: Path) -> None:
    rows = router_tie_rows(12, 64, 3, new_rng(1))
    assert rows.dtype == np.float32 and rows.shape == (12, 64)
    for g in range(4):
        a, b, c = rows[3 * g:3 * g + 3]
        assert np.array_equal(a, b)                                   # exact tie
        assert np.array_equal(c, np.nextafter(a, np.float32(np.inf)))  # one ulp away: a near tie
    path = write_tiny_model(tmp_path / "ties.gguf", "qwen3moe", n_expert=12, n_expert_used=4, router_ties=3, seed=2)
    with GGUFFile(path) as f:
        written = f.dequantize("blk.1.ffn_gate_inp.weight")
    assert np.array_equal(written[0], written[1]) and not np.array_equal(written[0], written[3])
    again = write_tiny_model(tmp_path / "ties2.gguf", "qwen3moe", n_expert=12, n_expert_used=4, router_ties=3, seed=2)
    assert path.read_bytes() == again.read_bytes()
    assert "router rows tied in groups of 3" in fields(path)["fak.synthetic"]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_qwen3_tokenizers(tmp_path: Path, arch: str) -> None:
    path = write_tiny_model(tmp_path / "t.gguf", arch)
    meta = fields(path)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]
    assert len(specials) == 26  # llama.cpp: "special tokens cache size = 26", as the real Qwen3 files
    for text in ("<tool_response>", "</tool_response>", "<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert types[tokens.index(text)] == 4, text  # user-defined
    for text in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|fim_prefix|>"):
        assert types[tokens.index(text)] == 3, text  # control
    assert meta["tokenizer.ggml.pre"] == "qwen2" and meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>")
    assert meta["tokenizer.ggml.padding_token_id"] == tokens.index("<|endoftext|>")
    # Qwen3-Coder's config.json has no bos_token_id, so its GGUF has no bos key (llama.cpp then uses 11)
    assert ("tokenizer.ggml.bos_token_id" in meta) is (arch == "qwen3")
    tok = tokenizer_from_gguf(path)
    text = "<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>\n<function=bash>\n"
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tokens.index("<think>") in ids and tokens.index("<tool_call>") in ids


def test_twin_vocab_puts_qwen3_specials_at_their_ids() -> None:
    spec = build_tokenizer("qwen3", 151936, special_base=151643)
    assert spec.tokens[151645] == "<|im_end|>" and spec.tokens[151657] == "<tool_call>"
    assert spec.tokens[151665:151669] == ["<tool_response>", "</tool_response>", "<think>", "</think>"]
    assert spec.token_type[151669] == 5 and spec.n_vocab == 151936


QWEN3_TOOL_CONVERSATION = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Open a.py"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "read_file", "arguments": {"path": "a.py"}}}]},
    {"role": "tool", "content": "print(1)"},
    {"role": "assistant", "content": "<think>\nIt prints.\n</think>\n\nIt prints 1."},
]


def test_qwen3_template_renders_hermes_calls_and_thinking() -> None:
    out = _render(chat_template("qwen3"), messages=QWEN3_TOOL_CONVERSATION, tools=TOOLS, add_generation_prompt=False)
    assert out == (
        "<|im_start|>system\nYou fix bugs.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(TOOLS[0], sort_keys=True) + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nOpen a.py<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}'
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nprint(1)\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nIt prints.\n</think>\n\nIt prints 1.<|im_end|>\n")
    # earlier turns drop their reasoning; thinking switched off by an empty think block
    later = QWEN3_TOOL_CONVERSATION + [{"role": "user", "content": "Thanks"}]
    out = _render(chat_template("qwen3"), messages=later, tools=None, add_generation_prompt=True,
                  enable_thinking=False)
    assert out.startswith("<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nOpen a.py<|im_end|>\n")
    assert "<|im_start|>assistant\nIt prints 1.<|im_end|>\n" in out and "It prints.\n" not in out
    assert out.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert _render(chat_template("qwen3"), messages=[{"role": "user", "content": "Hi"}], tools=None,
                   add_generation_prompt=True) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_qwen3_coder_template_renders_xml_calls() -> None:
    template = chat_template("qwen3moe")
    assert "<function=" in template and "<parameter=" in template  # how toolcalls/ tells the XML form
    tools = [{"type": "function", "function": {
        "name": "edit", "description": " Replace text. ",
        "parameters": {"type": "object", "required": ["path"], "properties": {
            "path": {"type": "string", "description": "file"}, "mode": {"type": "string", "enum": ["a", "b"]},
            "count": {"type": "integer", "minimum": 1}}}}}]
    msgs = [{"role": "user", "content": "Fix it"},
            {"role": "assistant", "content": "Editing now.", "tool_calls": [
                {"function": {"name": "edit", "arguments": {"path": "a.py", "count": 2, "spec": {"x": [1]}}}},
                {"function": {"name": "edit", "arguments": {"path": "b.py"}}}]},
            {"role": "tool", "content": "ok"}, {"role": "tool", "content": "ok too"}]
    out = _render(template, messages=msgs, tools=tools, add_generation_prompt=True)
    assert out == (
        "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to solve tasks."
        "\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>edit</name>\n"
        "<description>Replace text.</description>\n<parameters>\n<parameter>\n<name>path</name>\n<type>string</type>\n"
        "<description>file</description>\n</parameter>\n<parameter>\n<name>mode</name>\n<type>string</type>\n"
        "<enum>[`a`, `b`]</enum>\n</parameter>\n<parameter>\n<name>count</name>\n<type>integer</type>\n"
        "<minimum>1</minimum>\n</parameter>\n<required>[`path`]</required>\n</parameters>\n</function>\n</tools>"
        "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
        "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
        "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
        "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the "
        "specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> "
        "XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function "
        "call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, "
        "answer the question like normal with your current knowledge and do not tell the user about function calls\n"
        "</IMPORTANT><|im_end|>\n"
        "<|im_start|>user\nFix it<|im_end|>\n"
        "<|im_start|>assistant\nEditing now.\n"
        "\n<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n<parameter=count>\n2\n</parameter>\n"
        '<parameter=spec>\n{"x": [1]}\n</parameter>\n</function>\n</tool_call>'
        "\n<tool_call>\n<function=edit>\n<parameter=path>\nb.py\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\nok too\n</tool_response>\n"
        "<|im_end|>\n<|im_start|>assistant\n")
    plain = _render(template, messages=[{"role": "user", "content": "Hi"}], tools=None, add_generation_prompt=False)
    assert plain == "<|im_start|>user\nHi<|im_end|>\n"


def test_qwen3_templates_render_through_fak_chat(tmp_path: Path) -> None:
    from fak.chat import ChatTemplate

    for arch in ("qwen3", "qwen3moe"):
        path = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
        template = fields(path)["tokenizer.chat_template"]
        assert template == chat_template(arch)
        msgs = [{"role": "user", "content": "Read a.py"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "x = 1"}]
        out = ChatTemplate(template, bos_token="", eos_token="<|im_end|>").render(msgs, tools=TOOLS,
                                                                                 add_generation_prompt=True)
        if arch == "qwen3":
            assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>' in out
        else:
            assert "<tool_call>\n<function=read_file>\n<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>" in out
        assert out.endswith("<tool_response>\nx = 1\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                            if arch == "qwen3" else
                            "<tool_response>\nx = 1\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n")


# The Qwen3 presets: the real files' header and tensor table, planned (nothing written).

def test_preset_qwen3_coder_30b_a3b_q4_k_m_layout() -> None:
    plan = plan_twin(preset="qwen3-coder-30b-a3b-q4_k_m")
    a = "qwen3moe"
    expect = {"general.architecture": a, f"{a}.block_count": 48, f"{a}.context_length": 262144,
              f"{a}.embedding_length": 2048, f"{a}.feed_forward_length": 5472, f"{a}.attention.head_count": 32,
              f"{a}.attention.head_count_kv": 4, f"{a}.rope.freq_base": 1e7, f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
              f"{a}.expert_used_count": 8, f"{a}.attention.key_length": 128, f"{a}.attention.value_length": 128,
              f"{a}.expert_count": 128, f"{a}.expert_feed_forward_length": 768,
              f"{a}.expert_shared_feed_forward_length": 0, "general.file_type": 15, "tokenizer.ggml.eos_token_id": 151645,
              "general.size_label": "30B-A3B", "general.basename": "Qwen3-Coder"}
    for key, value in expect.items():
        got = plan.meta(key)
        assert (np.float32(got) == np.float32(value)) if isinstance(value, float) else got == value, key
    assert len(plan.meta("tokenizer.ggml.tokens")) == 151936
    types = {t.name: t.dtype for t in plan.tensors}
    shapes = {t.name: t.shape for t in plan.tensors}
    assert len(plan.tensors) == 579 == 3 + 48 * 12
    counts = {ty: list(types.values()).count(ty) for ty in set(types.values())}
    assert counts == {"F32": 241, "Q4_K": 289, "Q6_K": 49}   # the published Q4_K_M's "type" lines
    assert [t.name for t in plan.tensors[:4]] == ["output.weight", "output_norm.weight", "token_embd.weight",
                                                  "blk.0.attn_k.weight"]
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert shapes["blk.0.attn_q.weight"] == (4096, 2048) and shapes["blk.0.attn_output.weight"] == (2048, 4096)
    assert shapes["blk.0.attn_k.weight"] == (512, 2048) and shapes["blk.0.attn_q_norm.weight"] == (128,)
    assert shapes["blk.0.ffn_gate_inp.weight"] == (128, 2048) and types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert shapes["blk.0.ffn_gate_exps.weight"] == (128, 768, 2048) == shapes["blk.47.ffn_up_exps.weight"]
    assert shapes["blk.0.ffn_down_exps.weight"] == (128, 2048, 768)
    more = {i for i in range(48) if use_more_bits(i, 48)}
    assert more == set(range(6)) | set(range(8, 42, 3)) | set(range(42, 48)) and len(more) == 24
    for i in range(48):
        want = "Q6_K" if i in more else "Q4_K"
        assert types[f"blk.{i}.attn_v.weight"] == types[f"blk.{i}.ffn_down_exps.weight"] == want, i
        for w in ("attn_q", "attn_k", "attn_output", "ffn_gate_exps", "ffn_up_exps"):
            assert types[f"blk.{i}.{w}.weight"] == "Q4_K"
    assert plan.n_params() == 30_532_122_624                   # llama.cpp: "model params = 30.53 B"
    assert abs(plan.file_nbytes() / 2**30 - 17.28) < 0.005    # "file size = 17.28 GiB"
    data = plan.data_nbytes()
    experts = sum(plan.tensor_nbytes(t) for t in plan.tensors if "_exps" in t.name)
    assert 0.9 < experts / data < 0.95                         # the bytes a decode step mostly skips


def test_preset_qwen3_8b_q4_k_m_layout() -> None:
    plan = plan_twin(preset="qwen3-8b-q4_k_m")
    assert plan.meta("qwen3.embedding_length") == 4096 and plan.meta("qwen3.attention.key_length") == 128
    assert plan.meta("qwen3.block_count") == 36 and plan.meta("qwen3.feed_forward_length") == 12288
    assert plan.meta("qwen3.context_length") == 40960 and plan.meta("general.file_type") == 15
    keys = [e.key for e in plan.metadata]
    assert "general.finetune" not in keys and not any(k.startswith("qwen3.expert") for k in keys)
    types = {t.name: t.dtype for t in plan.tensors}
    assert len(plan.tensors) == 399 == 3 + 36 * 11
    counts = {ty: list(types.values()).count(ty) for ty in set(types.values())}
    assert counts == {"F32": 145, "Q4_K": 217, "Q6_K": 37}
    for i in range(36):
        want = "Q6_K" if use_more_bits(i, 36) else "Q4_K"
        assert types[f"blk.{i}.attn_v.weight"] == types[f"blk.{i}.ffn_down.weight"] == want, i
    assert plan.n_params() == 8_190_735_360                    # Qwen3-8B: 8.2 B parameters
    assert abs(plan.file_nbytes() - 5.03e9) < 0.01e9           # Qwen3-8B-Q4_K_M.gguf: 5.03 GB


def test_synth_cli_writes_qwen3moe(tmp_path: Path) -> None:
    from fak.cli import main

    out = tmp_path / "m.gguf"
    res = CliRunner().invoke(main, ["synth", str(out), "--tiny", "qwen3moe", "--n-expert", "12", "--n-expert-used", "3",
                                    "--tied", "--weight-type", "Q4_K_M"])
    assert res.exit_code == 0, res.output
    meta = fields(out)
    assert meta["qwen3moe.expert_count"] == 12 and meta["qwen3moe.expert_used_count"] == 3
    assert "output.weight" not in {n for n, *_ in layout(out)}
    res = CliRunner().invoke(main, ["synth", str(tmp_path / "x.gguf"), "--tiny", "qwen3", "--n-expert", "4"])
    assert res.exit_code != 0 and "qwen3moe" in res.output


def test_inspect_reports_experts(tmp_path: Path) -> None:
    from fak.inspect_model import ModelSummary, TensorRow, summarize

    path = write_tiny_model(tmp_path / "moe.gguf", "qwen3moe", n_embd=64, n_expert=16, n_expert_used=4, n_ff_exp=64)
    moe = summarize(path).moe
    assert moe is not None and (moe["n_expert"], moe["n_expert_used"]) == (16, 4)
    assert moe["expert_params"] == 2 * 3 * 16 * 64 * 64
    assert summarize(write_tiny_model(tmp_path / "dense.gguf", "qwen3")).moe is None
    # the 30B-A3B preset's header: "3.3B activated" (model card), ~2 GB of weights per decode step (issue 27)
    plan = plan_twin(preset="qwen3-coder-30b-a3b-q4_k_m")
    meta = {e.key: {"type": e.type, "value": e.value} for e in plan.metadata if not e.is_array}
    rows = [TensorRow(t.name, list(t.shape), t.dtype, int(np.prod(t.shape)), plan.tensor_nbytes(t), 0)
            for t in plan.tensors]
    moe = ModelSummary("twin", plan.file_nbytes(), 3, 32, 0, meta, rows).moe
    assert moe is not None and abs(moe["active_params"] / 1e9 - 3.35) < 0.01
    assert 1.8e9 < moe["decode_read_bytes"] < 2.0e9


# --- the Qwen3.5/3.6 hybrids qwen35 / qwen35moe (issue 30) ---------------------------------------

HYBRID_KEYS_DENSE = ["block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                     "attention.head_count_kv", "rope.dimension_sections", "rope.freq_base",
                     "attention.layer_norm_rms_epsilon", "attention.key_length", "attention.value_length",
                     "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
                     "full_attention_interval", "rope.dimension_count"]
HYBRID_KEYS_MOE = ["block_count", "context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
                   "rope.dimension_sections", "rope.freq_base", "attention.layer_norm_rms_epsilon", "expert_count",
                   "expert_used_count", "attention.key_length", "attention.value_length", "expert_feed_forward_length",
                   "expert_shared_feed_forward_length", "ssm.conv_kernel", "ssm.state_size", "ssm.group_count",
                   "ssm.time_step_rank", "ssm.inner_size", "full_attention_interval", "rope.dimension_count"]


def _arch_keys(keys: list[str], arch: str) -> list[str]:
    return [k.removeprefix(arch + ".") for k in keys if k.startswith(arch + ".")]


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_tiny_hybrid_has_llama_cpp_layout(tmp_path: Path, arch: str) -> None:
    moe = arch == "qwen35moe"
    extra = {"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 48, "n_ff_shexp": 80} if moe else {}
    path = write_tiny_model(tmp_path / "h.gguf", arch, n_layer=6, n_embd=64, n_head=4, n_head_kv=2, n_ff=96,
                            ssm_state_size=32, ssm_group_count=2, ssm_time_step_rank=6, **extra)
    meta, types = fields(path), field_types(path)
    assert meta["general.architecture"] == arch
    # the keys llama.cpp's qwen35 / qwen35moe loaders read, in the real files' order, with their types
    assert _arch_keys(list(meta), arch) == (HYBRID_KEYS_MOE if moe else HYBRID_KEYS_DENSE)
    hd = 32                                                  # default 2 * n_embd / n_head, as qwen3
    expect = {"block_count": 6, "embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 2,
              "attention.key_length": hd, "attention.value_length": hd, "ssm.conv_kernel": 4, "ssm.state_size": 32,
              "ssm.group_count": 2, "ssm.time_step_rank": 6, "ssm.inner_size": 6 * 32, "full_attention_interval": 4,
              "rope.dimension_count": 8}                     # a quarter of the head rotates, as Qwen3.5's
    expect.update({"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 48,
                   "expert_shared_feed_forward_length": 80} if moe else {"feed_forward_length": 96})
    for key, value in expect.items():
        assert meta[f"{arch}.{key}"] == value and types[f"{arch}.{key}"] == ["UINT32"], key
    assert meta[f"{arch}.rope.dimension_sections"] == [2, 1, 1, 0]
    assert types[f"{arch}.rope.dimension_sections"] == ["ARRAY", "INT32"]
    assert meta[f"{arch}.rope.freq_base"] == 1e7 and types[f"{arch}.rope.freq_base"] == ["FLOAT32"]
    assert list(meta)[-3:] == ["general.quantization_version", "general.file_type", "fak.synthetic"]
    names = {n: (dims, ty) for n, dims, ty, _ in layout(path)}
    assert {_template_of(n) for n in names} <= _llama_cpp_names(arch)
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    assert names["token_embd.weight"][0] == (64, n_vocab) and names["output.weight"][0] == (64, n_vocab)
    kd, vd = 2 * 32, 6 * 32                                  # key_dim, value_dim (ssm.inner_size)
    per_layer = set()
    for i in range(6):
        b = f"blk.{i}."
        mine = {n.removeprefix(b) for n in names if n.startswith(b)}
        assert {"attn_norm.weight", "post_attention_norm.weight"} <= mine
        if (i + 1) % 4:                                      # Gated DeltaNet
            assert names[b + "attn_qkv.weight"][0] == (64, 2 * kd + vd)
            assert names[b + "attn_gate.weight"][0] == (64, vd)
            assert names[b + "ssm_conv1d.weight"] == ((4, 2 * kd + vd), "F32")
            assert names[b + "ssm_dt.bias"] == ((6,), "F32") and names[b + "ssm_a"] == ((6,), "F32")
            assert names[b + "ssm_beta.weight"][0] == names[b + "ssm_alpha.weight"][0] == (64, 6)
            assert names[b + "ssm_norm.weight"] == ((32,), "F32")
            assert names[b + "ssm_out.weight"][0] == (vd, 64)
            assert not mine & {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q_norm.weight"}
        else:                                                # gated full attention
            assert names[b + "attn_q.weight"][0] == (64, 2 * 4 * hd)  # query and gate rows, per head
            assert names[b + "attn_k.weight"][0] == names[b + "attn_v.weight"][0] == (64, 2 * hd)
            assert names[b + "attn_output.weight"][0] == (4 * hd, 64)
            assert names[b + "attn_q_norm.weight"] == names[b + "attn_k_norm.weight"] == ((hd,), "F32")
            assert not any(n.startswith("ssm_") or n.startswith("attn_qkv") for n in mine)
        if moe:
            assert names[b + "ffn_gate_inp.weight"] == ((64, 8), "F32")
            assert names[b + "ffn_gate_exps.weight"][0] == names[b + "ffn_up_exps.weight"][0] == (64, 48, 8)
            assert names[b + "ffn_down_exps.weight"][0] == (48, 64, 8)
            assert names[b + "ffn_gate_inp_shexp.weight"] == ((64,), "F32")
            assert names[b + "ffn_gate_shexp.weight"][0] == names[b + "ffn_up_shexp.weight"][0] == (64, 80)
            assert names[b + "ffn_down_shexp.weight"][0] == (80, 64)
        else:
            assert names[b + "ffn_gate.weight"][0] == names[b + "ffn_up.weight"][0] == (64, 96)
            assert names[b + "ffn_down.weight"][0] == (96, 64)
        per_layer.add(len(mine))
    assert len(per_layer) == 2                               # two kinds of layer
    order = [n for n, *_ in layout(path)]
    assert order == sorted(order, key=quantize_order_key)
    with GGUFFile(path) as f:                                # fak's reader agrees with the gguf package
        assert [(t.name, t.dims, t.dtype) for t in f.tensors] == [(n, d, ty) for n, d, ty, _ in layout(path)]


def test_tiny_hybrid_values_make_a_stable_recurrence(tmp_path: Path) -> None:
    """ssm_a = -exp(A_log) < 0 (a decay below 1), dt biases spread so that some heads keep their
    state for hundreds of tokens and others forget at once, conv taps of a trained conv's size,
    norms about 1, the shared-expert gate a small projection."""
    path = write_tiny_model(tmp_path / "h.gguf", "qwen35moe", n_layer=8, n_embd=64, ssm_time_step_rank=16,
                            ssm_group_count=4, weight_type="Q8_0", seed=3)
    with GGUFFile(path) as f:
        a = np.concatenate([f.dequantize(f"blk.{i}.ssm_a") for i in (0, 1, 2, 4, 5, 6)])
        dt = np.concatenate([f.dequantize(f"blk.{i}.ssm_dt.bias") for i in (0, 1, 2, 4, 5, 6)])
        conv = f.dequantize("blk.0.ssm_conv1d.weight")
        norm = f.dequantize("blk.0.ssm_norm.weight")
        shgate = f.dequantize("blk.0.ffn_gate_inp_shexp.weight")
    assert (a < 0).all() and -8 <= a.min() and a.max() <= -0.5
    assert -4 <= dt.min() and dt.max() <= 0
    decay = np.exp(a * np.log1p(np.exp(dt)))                # exp(g) at alpha = 0
    assert decay.min() < 0.2 and decay.max() > 0.95          # forgetful heads and long memories
    assert 0.25 < conv.std() < 0.35 and abs(norm.mean() - 1) < 0.05 and shgate.std() < 0.03


def test_hybrid_quant_mix_follows_llama_cpp() -> None:
    """llama.cpp's Q4_K_M on the hybrids: a recurrent layer's attn_qkv is attention-v-like
    (category_is_attn_v: the attn_v rule and counter), ffn_down_shexp follows ffn_down (layer from
    the name), ssm_conv1d and every 1-D tensor (ssm_a, ssm_dt.bias, ffn_gate_inp_shexp) stay F32,
    the router F32, ssm_alpha / ssm_beta the base type."""
    plan = plan_tiny_model("qwen35moe", n_layer=8, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=4,
                           n_expert_used=2, n_ff_exp=256, n_ff_shexp=256, ssm_state_size=64, weight_type="Q4_K_M")
    types = {t.name: t.dtype for t in plan.tensors}
    for i in range(8):
        want = "Q6_K" if use_more_bits(i, 8) else "Q4_K"
        v_like = f"blk.{i}.attn_qkv.weight" if (i + 1) % 4 else f"blk.{i}.attn_v.weight"
        assert types[v_like] == want, v_like
        assert types[f"blk.{i}.ffn_down_exps.weight"] == types[f"blk.{i}.ffn_down_shexp.weight"] == want
        assert types[f"blk.{i}.ffn_gate_inp.weight"] == types[f"blk.{i}.ffn_gate_inp_shexp.weight"] == "F32"
        assert types[f"blk.{i}.ffn_gate_shexp.weight"] == types[f"blk.{i}.ffn_up_shexp.weight"] == "Q4_K"
        if (i + 1) % 4:
            assert types[f"blk.{i}.ssm_conv1d.weight"] == types[f"blk.{i}.ssm_a"] == "F32"
            assert types[f"blk.{i}.ssm_dt.bias"] == types[f"blk.{i}.ssm_norm.weight"] == "F32"
            for w in ("attn_gate", "ssm_alpha", "ssm_beta", "ssm_out"):
                assert types[f"blk.{i}.{w}.weight"] == "Q4_K", w
        else:
            for w in ("attn_q", "attn_k", "attn_output"):
                assert types[f"blk.{i}.{w}.weight"] == "Q4_K", w
    pure = plan_tiny_model("qwen35", weight_type="Q8_0")
    assert {t.dtype for t in pure.tensors if "ssm_conv1d" in t.name} == {"F32"}


def test_tiny_hybrid_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="apply to qwen35"):
        plan_tiny_model("qwen3", ssm_state_size=64)
    with pytest.raises(ValueError, match="n_ff_shexp"):
        plan_tiny_model("qwen35", n_ff_shexp=64)
    with pytest.raises(ValueError, match="multiple of"):
        plan_tiny_model("qwen35", ssm_group_count=3, ssm_time_step_rank=4)
    with pytest.raises(ValueError, match="n_rot"):
        plan_tiny_model("qwen35", n_rot=7)
    with pytest.raises(ValueError, match="rope_sections"):
        plan_tiny_model("qwen35", rope_sections=[1, 1, 1])
    with pytest.raises(ValueError, match="qwen3moe / qwen35moe"):
        plan_tiny_model("qwen35", n_expert=4)
    plan = plan_tiny_model("qwen35", full_attention_interval=2, n_layer=4)
    assert {t.name.split(".")[1] for t in plan.tensors if t.name.endswith("attn_q.weight")} == {"1", "3"}
    assert plan.meta("qwen35.block_count") == 4 and plan_tiny_model("qwen35moe").meta("qwen35moe.block_count") == 4


def test_qwen35_tokenizer(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "q35.gguf", "qwen35")
    meta = fields(path)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len([t for t in types if t in (3, 4)]) == 33     # llama.cpp: "special tokens cache size = 33"
    assert meta["tokenizer.ggml.pre"] == "qwen35" and meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["tokenizer.ggml.eos_token_id"] == tokens.index("<|im_end|>")
    assert meta["tokenizer.ggml.padding_token_id"] == tokens.index("<|vision_pad|>")
    assert meta["tokenizer.ggml.bos_token_id"] == tokens.index("<|endoftext|>")
    keys = [k for k in meta if k.startswith("tokenizer.ggml.") and k.endswith("_id")]
    assert keys == ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.bos_token_id"]
    for text in ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert types[tokens.index(text)] == 4, text
    spec = build_tokenizer("qwen35", 248320, special_base=248044)   # the real ids (llama.cpp's EOG list)
    assert [spec.tokens[i] for i in (248044, 248046, 248055, 248063, 248064, 248065, 248068)] == [
        "<|endoftext|>", "<|im_end|>", "<|vision_pad|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<think>"]
    assert spec.token_type[248077] == 5 and spec.n_vocab == 248320


QWEN35_TOOLS = [{"type": "function", "function": {"name": "edit", "description": "Replace text.",
                 "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def _chat(template: str, msgs: list[dict], **kw) -> str:
    from fak.chat import ChatTemplate
    return ChatTemplate(template, bos_token="", eos_token="<|im_end|>").render(msgs, **kw)


def test_qwen35_template_renders_thinking_and_xml_calls() -> None:
    from fak.toolcalls.formats import ToolCallFormat, detect_tool_call_format

    template = chat_template("qwen35")
    assert chat_template("qwen35moe") == template
    assert detect_tool_call_format(template) is ToolCallFormat.QWEN3_XML   # from <function= / <parameter=
    msgs = [{"role": "system", "content": " You fix bugs. "}, {"role": "user", "content": "Fix a.py"},
            {"role": "assistant", "content": "Editing.", "reasoning_content": "a.py is wrong",
             "tool_calls": [{"function": {"name": "edit", "arguments": {"path": "a.py", "n": [1, 2]}}},
                            {"function": {"name": "edit", "arguments": '{"path": "b.py"}'}}]},
            {"role": "tool", "content": "ok\n"}, {"role": "tool", "content": "ok too"}]
    out = _chat(template, msgs, tools=QWEN35_TOOLS, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
                          + json.dumps(QWEN35_TOOLS[0], ensure_ascii=False) + "\n</tools>\n\nIf you choose to call")
    assert "</IMPORTANT>\n\nYou fix bugs.<|im_end|>\n<|im_start|>user\nFix a.py<|im_end|>\n" in out
    assert out.endswith(
        "<|im_start|>assistant\n<think>\na.py is wrong\n</think>\n\nEditing.\n\n<tool_call>\n<function=edit>\n"
        "<parameter=path>\na.py\n</parameter>\n<parameter=n>\n[1, 2]\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=edit>\n<parameter=path>\nb.py\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<tool_response>\nok too\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n")                  # thinking on by default
    # a new user query: the earlier turn loses its reasoning unless preserve_thinking; thinking off
    later = msgs + [{"role": "assistant", "content": "<think>\nchecked\n</think>\n\nDone."},
                    {"role": "user", "content": "Thanks"}]
    off = _chat(template, later, tools=None, add_generation_prompt=True, enable_thinking=False)
    assert off.startswith("<|im_start|>system\nYou fix bugs.<|im_end|>\n")
    assert "<|im_start|>assistant\nEditing.\n\n<tool_call>" in off and "checked" not in off
    assert "<|im_start|>assistant\nDone.<|im_end|>\n" in off
    assert off.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    kept = _chat(template, later, tools=None, add_generation_prompt=False, preserve_thinking=True)
    assert "<think>\na.py is wrong\n</think>\n\nEditing." in kept and "<think>\nchecked\n</think>\n\nDone." in kept
    # a tool message first opens a user turn (the official template would not)
    first = _chat(template, [{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}], tools=None,
                  add_generation_prompt=False)
    assert first == "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>user\ny<|im_end|>\n"


def test_tiny_prompts_render_from_their_messages() -> None:
    """tests/data/tiny_prompts.json holds conversations rendered with the qwen35 template: the text
    of each is what the template renders today (else its goldens are stale), and the agent turns
    extend each other as an agent's conversation grows."""
    data = json.loads((Path(__file__).parent / "data" / "tiny_prompts.json").read_text())
    template = chat_template("qwen35")
    previous = None
    for p in data["prompts"]:
        tools = data["tools"] if p["tools"] else None
        assert _chat(template, p["messages"], tools=tools, add_generation_prompt=True,
                     **p["template_kwargs"]) == p["text"], p["id"]
        if p["id"].startswith("agent-turn"):
            if previous is not None:
                assert p["text"].startswith(previous) and len(p["text"]) > len(previous), p["id"]
            previous = p["text"]


def test_preset_qwen3_6_27b_q4_k_m_layout() -> None:
    plan = plan_twin(preset="qwen3.6-27b-q4_k_m")
    a = "qwen35"
    assert _arch_keys([e.key for e in plan.metadata], a) == HYBRID_KEYS_DENSE
    expect = {"general.architecture": a, f"{a}.block_count": 64, f"{a}.context_length": 262144,
              f"{a}.embedding_length": 5120, f"{a}.feed_forward_length": 17408, f"{a}.attention.head_count": 24,
              f"{a}.attention.head_count_kv": 4, f"{a}.rope.dimension_sections": [11, 11, 10, 0],
              f"{a}.rope.freq_base": 1e7, f"{a}.attention.key_length": 256, f"{a}.attention.value_length": 256,
              f"{a}.ssm.conv_kernel": 4, f"{a}.ssm.state_size": 128, f"{a}.ssm.group_count": 16,
              f"{a}.ssm.time_step_rank": 48, f"{a}.ssm.inner_size": 6144, f"{a}.full_attention_interval": 4,
              f"{a}.rope.dimension_count": 64, "general.file_type": 15, "tokenizer.ggml.eos_token_id": 248046,
              "tokenizer.ggml.padding_token_id": 248055, "tokenizer.ggml.bos_token_id": 248044,
              "tokenizer.ggml.pre": "qwen35", "general.basename": "Qwen3.6", "general.size_label": "27B"}
    for key, value in expect.items():
        got = plan.meta(key)
        assert (np.float32(got) == np.float32(value)) if isinstance(value, float) else got == value, key
    assert len(plan.meta("tokenizer.ggml.tokens")) == 248320
    types = {t.name: t.dtype for t in plan.tensors}
    shapes = {t.name: t.shape for t in plan.tensors}
    assert len(plan.tensors) == 851 == 3 + 48 * 14 + 16 * 11
    counts = {ty: list(types.values()).count(ty) for ty in set(types.values())}
    assert counts == {"F32": 353, "Q4_K": 433, "Q6_K": 65}
    assert shapes["blk.0.attn_qkv.weight"] == (10240, 5120) and shapes["blk.0.attn_gate.weight"] == (6144, 5120)
    assert shapes["blk.0.ssm_conv1d.weight"] == (10240, 4) and shapes["blk.0.ssm_out.weight"] == (5120, 6144)
    assert shapes["blk.0.ssm_a"] == shapes["blk.0.ssm_dt.bias"] == (48,) and shapes["blk.0.ssm_norm.weight"] == (128,)
    assert shapes["blk.3.attn_q.weight"] == (12288, 5120) and shapes["blk.3.attn_output.weight"] == (5120, 6144)
    assert shapes["blk.3.attn_k.weight"] == (1024, 5120) and shapes["blk.63.ffn_down.weight"] == (5120, 17408)
    for i in range(64):
        want = "Q6_K" if use_more_bits(i, 64) else "Q4_K"
        v_like = f"blk.{i}.attn_qkv.weight" if (i + 1) % 4 else f"blk.{i}.attn_v.weight"
        assert types[v_like] == types[f"blk.{i}.ffn_down.weight"] == want, i
    assert plan.n_params() == 26_895_998_464                    # the text model without the MTP block
    assert abs(plan.file_nbytes() / 1e9 - 16.54) < 0.01       # published Q4_K_M (with MTP): 16.5 GB


def test_preset_qwen3_6_35b_a3b_q4_k_m_layout() -> None:
    plan = plan_twin(preset="qwen3.6-35b-a3b-q4_k_m")
    a = "qwen35moe"
    assert _arch_keys([e.key for e in plan.metadata], a) == HYBRID_KEYS_MOE
    expect = {f"{a}.block_count": 40, f"{a}.embedding_length": 2048, f"{a}.attention.head_count": 16,
              f"{a}.attention.head_count_kv": 2, f"{a}.expert_count": 256, f"{a}.expert_used_count": 8,
              f"{a}.expert_feed_forward_length": 512, f"{a}.expert_shared_feed_forward_length": 512,
              f"{a}.ssm.group_count": 16, f"{a}.ssm.time_step_rank": 32, f"{a}.ssm.inner_size": 4096,
              f"{a}.rope.dimension_count": 64, "general.size_label": "35B-A3B"}
    for key, value in expect.items():
        assert plan.meta(key) == value, key
    types = {t.name: t.dtype for t in plan.tensors}
    shapes = {t.name: t.shape for t in plan.tensors}
    assert len(plan.tensors) == 733 == 3 + 30 * 19 + 10 * 16  # llama.cpp: "733 tensors" in the real files
    counts = {ty: list(types.values()).count(ty) for ty in set(types.values())}
    assert counts == {"F32": 301, "Q4_K": 371, "Q6_K": 61}     # the real files' "type f32: 301 tensors"
    assert shapes["blk.0.attn_qkv.weight"] == (8192, 2048) and shapes["blk.0.ssm_beta.weight"] == (32, 2048)
    assert shapes["blk.0.ffn_gate_exps.weight"] == (256, 512, 2048) and shapes["blk.0.ffn_down_exps.weight"] == (256, 2048, 512)
    assert shapes["blk.0.ffn_gate_inp.weight"] == (256, 2048) and shapes["blk.0.ffn_gate_inp_shexp.weight"] == (2048,)
    assert shapes["blk.0.ffn_down_shexp.weight"] == (2048, 512) and shapes["blk.3.attn_q.weight"] == (8192, 2048)
    more = {i for i in range(40) if use_more_bits(i, 40)}
    assert len(more) == 20
    for i in range(40):
        want = "Q6_K" if i in more else "Q4_K"
        assert types[f"blk.{i}.ffn_down_exps.weight"] == types[f"blk.{i}.ffn_down_shexp.weight"] == want, i
    assert plan.n_params() == 34_660_610_688                    # text weights (the card's 35B counts vision too)
    assert abs(plan.file_nbytes() / 1e9 - 21.16) < 0.01
    experts = sum(plan.tensor_nbytes(t) for t in plan.tensors if "_exps" in t.name)
    assert 0.85 < experts / plan.data_nbytes() < 0.95          # what a decode step mostly skips


def test_synth_cli_writes_hybrids(tmp_path: Path) -> None:
    from fak.cli import main

    out = tmp_path / "m.gguf"
    res = CliRunner().invoke(main, ["synth", str(out), "--tiny", "qwen35moe", "--n-expert", "12", "--n-expert-used", "3"])
    assert res.exit_code == 0, res.output
    meta = fields(out)
    assert meta["qwen35moe.expert_count"] == 12 and meta["qwen35moe.block_count"] == 4
    res = CliRunner().invoke(main, ["synth", str(tmp_path / "d.gguf"), "--tiny", "qwen35", "--n-layer", "8"])
    assert res.exit_code == 0 and fields(tmp_path / "d.gguf")["qwen35.block_count"] == 8


def test_like_twin_of_a_hybrid_keeps_the_recurrence_stable(tmp_path: Path) -> None:
    """A twin (--like) of a hybrid file gets negative ssm_a and realistic dt biases and conv taps
    from the tensor names, so a speed run on it does not blow up its recurrent state."""
    src = write_tiny_model(tmp_path / "src.gguf", "qwen35", seed=5)
    twin = write_twin(tmp_path / "twin.gguf", like=src, seed=6)
    with GGUFFile(twin) as f:
        assert (f.dequantize("blk.0.ssm_a") < 0).all() and (f.dequantize("blk.0.ssm_dt.bias") <= 0).all()
        assert f.dequantize("blk.0.ssm_conv1d.weight").std() > 0.2
