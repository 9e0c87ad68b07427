"""Device sampling on the GPU through the whole engine (``tests/test_device_sampling.py`` runs the
same batch on the CPU, where the two paths agree bit for bit): on the CUDA backend, the batch of
every kind of setting sampled on the device (``FAK_DEVICE_SAMPLING=1``, the CUDA default) gives the
host sampler's tokens (``=0``: every logits row copied and sampled on the host) and its
log-probabilities within the GPU's summation noise."""

from __future__ import annotations

import pytest

from test_device_sampling import SETTINGS, run
from fak import synth

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(synth.write_tiny_model(tmp_path_factory.mktemp("devsample_cuda") / "qwen2.gguf", "qwen2", n_vocab=4096))


def test_device_sampling_equals_host_on_cuda(require_cuda: None, tiny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    host, host_stats = run(tiny, "0", monkeypatch, backend="cuda")
    dev, stats = run(tiny, "1", monkeypatch, backend="cuda")
    assert host_stats["device_sampled_rows"] == 0
    assert 0 < stats["device_sampled_host_rows"] < stats["device_sampled_rows"] / 2, stats
    for sid, want in host.items():
        got = dev[sid]
        assert [t for t, _, _ in got] == [t for t, _, _ in want], f"sequence {sid} ({SETTINGS[sid]})"
        for (_, lp, top), (_, lp_h, top_h) in zip(got, want):
            assert abs(lp - lp_h) <= 2e-5, (sid, lp, lp_h)
            assert (top is None) == (top_h is None)
            if top is not None:
                assert [t for t, _ in top] == [t for t, _ in top_h]
                assert max(abs(a - b) for (_, a), (_, b) in zip(top, top_h)) <= 2e-5
