"""Tests of ``fak inspect`` and ``fak synth`` (through click's CliRunner and a real subprocess).

The reference numbers for the real 0.5B model were read with the ``gguf`` package's reader, an
implementation independent of fak's (630,167,424 parameters: Qwen2.5-0.5B's 494 M plus the untied
151936 × 896 output matrix; 485,452,288 bytes of tensor data).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from fak.cli import main
from fak.synth import plan_tiny_model
from gguf import GGUFReader

QWEN_05B_PARAMS = 630_167_424
QWEN_05B_TYPES = {"Q5_0": 133, "F32": 121, "Q8_0": 13, "Q6_K": 12, "Q4_K": 12}


QWEN_05B_DATA_BYTES = 485_452_288


@pytest.fixture(scope="module")
def inspect_json(model_05b: Path) -> dict:
    result = CliRunner().invoke(main, ["inspect", str(model_05b), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_inspect_json_counts_parameters_and_types_of_the_real_05b(inspect_json: dict, model_05b: Path) -> None:
    s = inspect_json
    assert s["n_params"] == QWEN_05B_PARAMS
    assert s["n_tensors"] == 291 == sum(QWEN_05B_TYPES.values())
    assert {r["dtype"]: r["n_tensors"] for r in s["by_type"]} == QWEN_05B_TYPES
    assert s["data_bytes"] == sum(r["n_bytes"] for r in s["by_type"]) == QWEN_05B_DATA_BYTES
    assert sum(r["n_elements"] for r in s["by_type"]) == QWEN_05B_PARAMS
    assert sum(t["n_bytes"] for t in s["tensors"]) == QWEN_05B_DATA_BYTES
    assert s["file_size"] == model_05b.stat().st_size == 491_400_064
    assert s["version"] == 3 and s["alignment"] == 32
    assert s["data_offset"] == 5_947_776
    meta = s["metadata"]
    assert meta["general.architecture"] == {"type": "STRING", "value": "qwen2"}
    assert meta["qwen2.block_count"] == {"type": "UINT32", "value": 24}
    assert meta["qwen2.attention.layer_norm_rms_epsilon"]["value"] == 1e-6
    tokens = meta["tokenizer.ggml.tokens"]
    assert tokens["type"] == "ARRAY[STRING]" and tokens["length"] == 151936
    assert tokens["head"] == ["!", '"', "#", "$", "%"]
    assert meta["tokenizer.chat_template"]["length"] > 1000
    first = s["tensors"][0]
    assert first["name"] == "output.weight" and first["shape"] == [151936, 896] and first["dtype"] == "Q8_0"
    assert 6.1 < s["bits_per_weight"] < 6.2  # 485,452,288 data bytes * 8 / 630,167,424


def test_inspect_tables_show_counts_and_types(model_05b: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(model_05b)], terminal_width=160)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"{QWEN_05B_PARAMS:,}" in out
    for dtype in QWEN_05B_TYPES:
        assert dtype in out
    for text in ("general.architecture", "qwen2.block_count", "[151,936 items]", "blk.23.ffn_down.weight",
                 "151936 × 896", "491,400,064 bytes", "bytes by type"):
        assert text in out, text
    short = CliRunner().invoke(main, ["inspect", str(model_05b), "--no-tensors"], terminal_width=160)
    assert short.exit_code == 0
    assert "blk.23.ffn_down.weight" not in short.output and f"{QWEN_05B_PARAMS:,}" in short.output


def test_inspect_of_a_synthetic_model_and_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "tiny.gguf"
    result = runner.invoke(main, ["synth", str(out), "--tiny", "llama", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert out.exists()
    s = json.loads(runner.invoke(main, ["inspect", str(out), "--json", "--no-tensors"]).output)
    plan = plan_tiny_model("llama", seed=3)
    assert s["n_params"] == plan.n_params()
    assert s["file_size"] == plan.file_nbytes()
    assert "tensors" not in s
    assert "seed 3" in s["metadata"]["fak.synthetic"]["value"]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x07\x00\x00\x00" + b"\x00" * 64)
    result = runner.invoke(main, ["inspect", str(bad)])
    assert result.exit_code == 1 and "cannot read" in result.output
    assert runner.invoke(main, ["inspect", str(tmp_path / "missing.gguf")]).exit_code == 2


def test_synth_command_options(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["synth", str(tmp_path / "x.gguf")]).exit_code == 2
    assert runner.invoke(main, ["synth", str(tmp_path / "x.gguf"), "--tiny", "qwen2", "--preset",
                                "qwen2.5-7b-q4_k_m"]).exit_code == 2
    assert runner.invoke(main, ["synth", str(tmp_path / "x.gguf"), "--preset", "nope"]).exit_code == 2
    result = runner.invoke(main, ["synth", str(tmp_path / "q.gguf"), "--tiny", "qwen2", "--weight-type", "q4_k"])
    assert result.exit_code == 0, result.output
    types = {t.tensor_type.name for t in GGUFReader(tmp_path / "q.gguf").tensors}
    assert types == {"F32", "Q5_0"}  # 64-wide rows: Q4_K falls back to Q5_0 as in llama.cpp
    tiny = tmp_path / "q.gguf"
    twin = tmp_path / "twin.gguf"
    result = runner.invoke(main, ["synth", str(twin), "--like", str(tiny), "--seed", "9"])
    assert result.exit_code == 0, result.output
    a, b = GGUFReader(tiny), GGUFReader(twin)
    assert [(t.name, t.shape.tolist(), t.tensor_type.name) for t in a.tensors] == \
           [(t.name, t.shape.tolist(), t.tensor_type.name) for t in b.tensors]


def test_fak_entry_point_runs_as_a_process(tmp_path: Path) -> None:
    out = tmp_path / "p.gguf"
    proc = subprocess.run([sys.executable, "-m", "fak.cli", "synth", str(out), "--tiny", "qwen2"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == str(out)
    proc = subprocess.run([sys.executable, "-m", "fak.cli", "inspect", str(out), "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["metadata"]["general.architecture"]["value"] == "qwen2"
    assert "synth" in subprocess.run([sys.executable, "-m", "fak.cli", "--help"], capture_output=True,
                                     text=True, check=True).stdout


def test_example_script_runs(tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    CliRunner().invoke(main, ["synth", str(model), "--tiny", "qwen2"])
    example = Path(__file__).resolve().parents[1] / "examples" / "inspect_model.py"
    proc = subprocess.run([sys.executable, str(example), str(model)], capture_output=True, text=True, check=True)
    assert "qwen2.block_count = 2" in proc.stdout
    assert "blk.0.attn_q.weight: Q8_0" in proc.stdout and "finite True" in proc.stdout
