"""The default context window of ``fak serve`` (``fak.gateway.context_window``): the model's
trained context capped by the KV-memory budget, printed at start and readable by clients from
``/v1/models`` and ``/health``.

Cases use GGUF metadata dicts (the real 0.5B's keys) and memory probes given as numbers; one
test starts a real ``fak serve`` on the tiny synthetic model without ``--n-ctx``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fak.cli import main
from fak.gateway.context_window import (
    GIB,
    ContextPlanError,
    kv_bytes_per_token,
    memory_budget,
    parse_size,
    plan_context,
    state_bytes_per_slot,
    trained_context,
)
from fak.swebench.serve import free_port
from fak_subprocess import fak_argv, fak_env, stop_process

#: Qwen2.5-Coder-0.5B-Instruct's GGUF keys (24 layers, 14 heads, 2 KV heads, 896 wide).
QWEN05 = {"general.architecture": "qwen2", "qwen2.block_count": 24, "qwen2.context_length": 32768,
          "qwen2.embedding_length": 896, "qwen2.attention.head_count": 14, "qwen2.attention.head_count_kv": 2}
#: 12 KiB per token: 2 (K, V) x 24 layers x 2 KV heads x 64 x 2 bytes.
PER_TOKEN = 2 * 24 * 2 * 64 * 2


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    """A stand-in model file of 1 MiB (its size is the weights the budget leaves out)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"\0" * (1 << 20))
    return path


@pytest.mark.parametrize("text,n", [("8GiB", 8 * GIB), ("8G", 8 * GIB), ("512MiB", 512 << 20), ("1.5g", 3 * GIB // 2),
                                    ("4096", 4096), ("2 kb", 2048), ("1T", 1 << 40)])
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "GiB", "-1G", "8 parsecs", "1e9"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token(QWEN05) == PER_TOKEN
    # explicit key/value lengths (Qwen3: 128-wide heads over a 4096 embedding of 32 heads) and a
    # per-layer KV head count
    meta = {"general.architecture": "qwen3", "qwen3.block_count": 2, "qwen3.embedding_length": 64,
            "qwen3.attention.head_count": 4, "qwen3.attention.head_count_kv": [2, 1],
            "qwen3.attention.key_length": 32, "qwen3.attention.value_length": 16}
    assert kv_bytes_per_token(meta) == (2 + 1) * (32 + 16) * 2
    assert kv_bytes_per_token({"general.architecture": "x"}) is None


def test_trained_context_and_rope_scaling() -> None:
    assert trained_context(QWEN05) == 32768
    assert trained_context(QWEN05, rope_scaling="yarn", rope_scale=4) == 131072
    assert trained_context(QWEN05, rope_scaling="yarn", rope_scale=4, yarn_orig_ctx=16384) == 65536
    assert trained_context(QWEN05, rope_scaling="none", rope_scale=4) == 32768
    assert trained_context({"general.architecture": "qwen2"}) is None


def test_memory_budget() -> None:
    assert memory_budget("cpu", 1 * GIB, mem_available=21 * GIB) == (10 * GIB, "MemAvailable")
    assert memory_budget("cuda", 2 * GIB, gpu_total=80 * GIB) == (int(80 * GIB * 0.9) - 3 * GIB, "GPU memory")
    assert memory_budget("cpu", 4 * GIB, mem_available=2 * GIB) == (0, "MemAvailable")


def test_trained_context_when_the_budget_holds_it(weights: Path) -> None:
    plan = plan_context(weights, meta=QWEN05, backend="cpu", max_concurrency=64, mem_available=21 * GIB)
    assert (plan.n_ctx, plan.source, plan.trained_ctx) == (32768, "trained", 32768)
    assert plan.kv_cache_tokens == 32768 * 8  # the engine's sharing, within the budget
    assert plan.kv_bytes_per_token == PER_TOKEN
    text = plan.describe()
    assert "context window 32768 tokens (the model's trained context" in text and "3.0 GiB" in text
    # fewer slots, fewer windows in the cache
    assert plan_context(weights, meta=QWEN05, backend="cpu", max_concurrency=2,
                        mem_available=21 * GIB).kv_cache_tokens == 32768 * 2


def test_the_budget_caps_the_window(weights: Path) -> None:
    plan = plan_context(weights, meta=QWEN05, backend="cpu", max_concurrency=8, kv_memory=100 << 20)
    budget_tokens = (100 << 20) // PER_TOKEN // 32 * 32  # 8512
    assert (plan.n_ctx, plan.kv_cache_tokens, plan.source) == (budget_tokens, budget_tokens, "kv-memory")
    assert "the KV-memory budget; the model was trained on 32768" in plan.describe()
    assert plan.n_ctx % 32 == 0
    # the budget in tokens
    plan = plan_context(weights, meta=QWEN05, backend="cpu", max_concurrency=8, kv_cache_tokens=20010)
    assert (plan.n_ctx, plan.kv_cache_tokens, plan.budget_from) == (20000, 20010, "--kv-cache-tokens")
    # a GPU's memory, shared by two replicas
    plan = plan_context(weights, meta=QWEN05, backend="cuda", max_concurrency=64, gpu_total=3 * GIB // 2, replicas=2)
    assert plan.source == "kv-memory" and plan.budget_from == "GPU memory / 2 replicas"
    assert plan.n_ctx == plan.kv_cache_tokens == (int(3 * GIB // 2 * 0.9) - (1 << 20) - GIB) // 2 // PER_TOKEN // 32 * 32


#: Qwen3.6-35B-A3B's hybrid keys (40 layers, every 4th full attention; Gated DeltaNet 16 q/k and 32
#: v heads of 128, 4 taps; attention 2 KV heads of 256).
QWEN36_A3B = {"general.architecture": "qwen35moe", "qwen35moe.block_count": 40, "qwen35moe.context_length": 262144,
              "qwen35moe.embedding_length": 2048, "qwen35moe.attention.head_count": 16,
              "qwen35moe.attention.head_count_kv": 2, "qwen35moe.attention.key_length": 256,
              "qwen35moe.attention.value_length": 256, "qwen35moe.full_attention_interval": 4,
              "qwen35moe.ssm.conv_kernel": 4, "qwen35moe.ssm.state_size": 128, "qwen35moe.ssm.group_count": 16,
              "qwen35moe.ssm.time_step_rank": 32, "qwen35moe.ssm.inner_size": 4096}


def test_a_hybrids_state_slots_come_off_the_budget(weights: Path) -> None:
    # 30 Gated DeltaNet layers x (3 x 8192 conv inputs + 32 x 128 x 128) f32: 62.8 MiB
    slot = state_bytes_per_slot(QWEN36_A3B)
    assert slot == 30 * (3 * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128) * 4
    assert state_bytes_per_slot(QWEN05) == 0
    per_token = kv_bytes_per_token(QWEN36_A3B)
    budget = 8 * GIB
    plan = plan_context(weights, meta=QWEN36_A3B, backend="cpu", max_concurrency=4, kv_memory=budget, state_checkpoints=16)
    assert (plan.state_slots, plan.state_checkpoints, plan.state_slot_bytes) == (4 + 1 + 16, 16, slot)
    assert plan.kv_cache_tokens == (budget - 21 * slot) // per_token // 32 * 32
    assert "recurrent state 21 slots (16 prefix-cache checkpoints) × 62.8 MiB = 1.3 GiB" in plan.describe()
    default = plan_context(weights, meta=QWEN36_A3B, backend="cpu", max_concurrency=4, kv_memory=budget)
    assert default.state_checkpoints == 8


def test_state_bytes_per_slot_is_the_engines(tmp_path: Path) -> None:
    from fak import _native
    from fak.synth import write_tiny_model
    from fak.tokenizer import read_gguf_metadata

    path = write_tiny_model(tmp_path / "h.gguf", "qwen35", n_layer=8, full_attention_interval=3)
    m = _native.EngineCore(str(path), n_ctx=256, max_batch=2)
    assert state_bytes_per_slot(read_gguf_metadata(path)) == m.config["state_slot_bytes"] > 0


def test_a_given_window_is_kept(weights: Path) -> None:
    plan = plan_context(weights, meta=QWEN05, backend="cpu", max_concurrency=8, n_ctx=4096, kv_memory=1)
    assert (plan.n_ctx, plan.kv_cache_tokens, plan.source) == (4096, None, "--n-ctx")
    assert plan.describe().startswith("context window 4096 tokens (--n-ctx")


def test_a_budget_too_small_names_the_flags(weights: Path) -> None:
    with pytest.raises(ContextPlanError, match="--kv-memory or --kv-cache-tokens"):
        plan_context(weights, meta=QWEN05, backend="cpu", max_concurrency=8, kv_memory=1 << 20)


def test_no_trained_context_and_no_memory_probe(weights: Path) -> None:
    meta = {k: v for k, v in QWEN05.items() if not k.endswith("context_length")}
    plan = plan_context(weights, meta=meta, backend="cpu", max_concurrency=8, mem_available=21 * GIB)
    assert (plan.n_ctx, plan.source) == (4096, "trained")


def test_kv_memory_flag_errors() -> None:
    result = CliRunner().invoke(main, ["serve", "--base-url", "http://x/v1", "--kv-memory", "lots"])
    assert result.exit_code == 2 and "not a size" in result.output
    result = CliRunner().invoke(main, ["serve", "--base-url", "http://x/v1", "--kv-memory", "1G"])
    assert result.exit_code == 2 and "--kv-memory sizes the engine" in result.output


def test_fak_serve_state_checkpoints_reach_the_engine_and_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--state-checkpoints N`` goes to the engine and to the KV-memory plan it prints; a
    negative count is refused by the flag."""
    import click
    from fak.gateway import cli
    from fak.synth import write_tiny_model

    path = write_tiny_model(tmp_path / "h.gguf", "qwen35")
    seen: dict = {}

    def load(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise click.ClickException("stopped before serving")

    monkeypatch.setattr(cli, "_load_engine", load)
    result = CliRunner().invoke(main, ["serve", "--gguf", str(path), "--addr", "127.0.0.1:0", "--n-ctx", "256",
                                       "--state-checkpoints", "3"])
    assert "stopped before serving" in result.output and seen["state_checkpoints"] == 3
    assert "recurrent state" in result.output and "(3 prefix-cache checkpoints)" in result.output
    result = CliRunner().invoke(main, ["serve", "--gguf", str(path), "--state-checkpoints", "-1"])
    assert result.exit_code == 2 and "--state-checkpoints" in result.output


def test_fak_serve_default_window_is_printed_and_served(tmp_path: Path) -> None:
    """``fak serve`` without ``--n-ctx`` on the tiny model: the window is the model's trained
    context (the KV memory here holds it), printed at start, and ``/v1/models`` and ``/health``
    say it."""
    synth = pytest.importorskip("fak.synth")
    from fak.tokenizer import read_gguf_metadata

    path = tmp_path / "tiny.gguf"
    synth.write_tiny_model(path)
    trained = trained_context(read_gguf_metadata(path))
    assert trained
    log = tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(fak_argv("serve", "--gguf", str(path), "--backend", "cpu", "--model-name", "tiny",
                                         "--max-concurrency", "2", "--addr", f"127.0.0.1:{port}"),
                                env=fak_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
        health = httpx.get(url + "/health", timeout=30).json()
    finally:
        stop_process(proc)
    assert card["max_model_len"] == card["context_length"] == trained
    assert health["context_window"] == trained and health["kv_cache_tokens"] >= 2 * trained
    assert f"context window {trained} tokens (the model's trained context" in log.read_text()
