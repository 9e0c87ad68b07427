"""Device sampling (issue 13: "sampling for the whole batch on the GPU ... so a step copies back
token ids, not logits"): the engine samples from the backend's top candidates, in-place penalties
and whole-row draws (``rust/src/engine/device_sample.rs``) instead of copying every logits row to
the host. On the CPU backend those ops are the host sampler's own, so a batch of sequences with
every kind of setting gives the host path's tokens, log-probabilities and top log-probabilities
bit for bit (``FAK_DEVICE_SAMPLING=1`` against ``=0``), on a real (tiny, generated) model whose
vocabulary is wider than the device's candidates. The same test runs on CUDA on the GPU machine
(``tests/cuda/test_device_sampling_cuda.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from fak import _native, synth

# One sequence per setting, in one batch: every branch of the sampler, and rows that the
# candidates cannot decide (wide nucleus, low min-p, top-k past the candidates, prefix choices),
# which fall back to the host sampler.
SETTINGS: list[dict[str, Any]] = [
    {"temperature": 0.0},
    {"temperature": 0.0, "n_logprobs": 5},
    {"temperature": 0.0, "repeat_penalty": 1.3, "repeat_last_n": -1},
    {"temperature": 0.8},
    {"temperature": 1.3, "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.3, "n_logprobs": 3},
    {"temperature": 0.7, "top_k": 20},
    {"temperature": 0.9, "top_k": 50, "top_p": 0.8, "n_logprobs": 2},
    {"temperature": 1.0, "top_p": 0.02},
    {"temperature": 1.0, "top_p": 0.97},
    {"temperature": 0.6, "min_p": 0.5},
    {"temperature": 0.6, "min_p": 0.0001},
    {"temperature": 0.8, "top_k": 300},
    {"temperature": 0.8, "frequency_penalty": -1.5, "top_k": 10, "repeat_penalty": 0.7},
    {"temperature": 0.5, "prefix_choices": [[40, 41, 42], [40, 43], [44]]},
    {"temperature": 2.0, "top_k": -1, "top_p": 1.0, "repeat_penalty": 1.1, "repeat_last_n": 8},
]
PROMPT = [5, 9, 2, 7, 11, 3, 30, 31]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(synth.write_tiny_model(tmp_path_factory.mktemp("devsample") / "qwen2.gguf", "qwen2", n_vocab=4096))


def run(path: str, device: str, monkeypatch: pytest.MonkeyPatch, backend: str = "cpu",
        steps: int = 24) -> tuple[dict[int, list[tuple[int, float, Any]]], dict[str, Any]]:
    monkeypatch.setenv("FAK_DEVICE_SAMPLING", device)
    m = _native.EngineCore(path, backend=backend, n_ctx=256, threads=1, max_batch=32)
    for i, s in enumerate(SETTINGS):
        m.add_sequence(i, PROMPT + [i], {**s, "seed": 1000 + i})
    out: dict[int, list[tuple[int, float, Any]]] = {}
    for _ in range(steps):
        for sid, tok, lp, top, _fin in m.step():
            out.setdefault(sid, []).append((tok, lp, top))
    return out, m.stats()


def test_device_sampling_equals_the_host_sampler(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    host, host_stats = run(tiny, "0", monkeypatch)
    dev, stats = run(tiny, "1", monkeypatch)
    assert host_stats["device_sampled_rows"] == 0
    assert sorted(dev) == sorted(host) == list(range(len(SETTINGS)))
    for sid in host:
        assert dev[sid] == host[sid], f"sequence {sid} ({SETTINGS[sid]}) differs"
    rows = stats["device_sampled_rows"]
    assert rows == sum(len(v) for v in dev.values())
    # Both paths ran: most rows were decided from the device's candidates, some went to the host.
    assert 0 < stats["device_sampled_host_rows"] < rows / 2, stats


def test_draws_are_reproducible_and_seeded(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = run(tiny, "1", monkeypatch, steps=8)
    b, _ = run(tiny, "1", monkeypatch, steps=8)
    assert a == b
    sampled = [sid for sid, s in enumerate(SETTINGS) if s["temperature"] > 0 and "prefix_choices" not in s]
    # Different seeds, different streams (the sampled ones are not all the same).
    assert len({tuple(t for t, _, _ in a[sid]) for sid in sampled}) > len(sampled) // 2


def test_prefix_choices_are_kept_on_the_device_path(tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dev, _ = run(tiny, "1", monkeypatch, steps=4)
    sid = next(i for i, s in enumerate(SETTINGS) if "prefix_choices" in s)
    toks = [t for t, _, _ in dev[sid]]
    assert toks[:3] == [40, 41, 42] or toks[:2] == [40, 43] or toks[:1] == [44], toks
