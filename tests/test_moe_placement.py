"""``n_cpu_moe`` (``fak serve --cpu-moe`` / ``--n-cpu-moe N``) on the CPU-only build: every weight is in
host memory already, so keeping the experts there changes nothing — the same logits, bit for bit,
and the same greedy tokens as without it; the config reports no host-expert layers (the CUDA side,
where it moves the experts of N layers to the CPU, is tests/cuda/test_moe_cuda.py)."""

from __future__ import annotations

import numpy as np
import pytest
from fak import _native


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fak.synth import write_tiny_model

    return str(write_tiny_model(tmp_path_factory.mktemp("moe") / "moe.gguf", "qwen3moe", weight_type="Q4_K_M",
                                n_embd=256, n_ff=512, seed=5))


def _greedy(model: _native.EngineCore, prompt: list[int], n: int) -> list[int]:
    model.add_sequence(1, prompt, {"temperature": 0.0, "max_tokens": n})
    toks: list[int] = []
    while model.n_running or model.n_waiting:
        toks += [t for (_, t, _, _, _) in model.step()]
    return toks


@pytest.mark.parametrize("n_cpu_moe", [1, 1 << 30])
def test_cpu_moe_on_the_cpu_build_changes_nothing(tiny_moe: str, n_cpu_moe: int) -> None:
    plain = _native.EngineCore(tiny_moe, backend="cpu", n_ctx=256)
    placed = _native.EngineCore(tiny_moe, backend="cpu", n_ctx=256, n_cpu_moe=n_cpu_moe)
    assert placed.config["host_expert_layers"] == 0 and placed.config["n_expert"] > 0
    prompt = [int(t) for t in np.random.default_rng(1).integers(10, plain.n_vocab - 10, size=40)]
    assert np.array_equal(plain.logits(prompt), placed.logits(prompt))
    assert _greedy(plain, prompt, 10) == _greedy(placed, prompt, 10)


def test_cpu_moe_and_n_cpu_moe_are_exclusive() -> None:
    import click
    from fak.rope_options import ALL_LAYERS, rope_kwargs

    assert rope_kwargs(cpu_moe=True) == {"n_cpu_moe": ALL_LAYERS}
    assert rope_kwargs(n_cpu_moe=3) == {"n_cpu_moe": 3}
    assert rope_kwargs() == {}
    with pytest.raises(click.UsageError, match="not both"):
        rope_kwargs(cpu_moe=True, n_cpu_moe=2)


def test_inspect_reports_what_goes_where(tiny_moe: str) -> None:
    """`fak inspect` of a MoE model: the weights on the GPU and in host memory for several
    --n-cpu-moe values (the experts of the first N layers move to the host)."""
    from fak.inspect_model import summarize

    s = summarize(tiny_moe)
    places = s.placements()
    n_layer = s.n_layer()
    assert [p["n_cpu_moe"] for p in places][0] == 0 and places[-1]["n_cpu_moe"] == n_layer
    assert places[0]["host_bytes"] == 0 and places[0]["device_bytes"] == s.data_bytes
    experts = sum(t.n_bytes for t in s.tensors if "_exps." in t.name)
    assert places[-1]["host_bytes"] == experts and places[-1]["device_bytes"] == s.data_bytes - experts
    assert all(p["device_bytes"] + p["host_bytes"] == s.data_bytes for p in places)
    assert s.to_json(tensors=False)["placements"] == places
