"""``fak swebench run --gguf``'s managed server without a model: the command line it runs, the
policy it loads by default, a server that fails to start, and the CLI's choice between --gguf and
--gateway. The real start-run-stop with the 0.5B model is ``test_real_serve.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tiny import run_fak

from fak.swebench.serve import (
    DEFAULT_POLICY,
    GatewayStartError,
    ManagedGateway,
    default_policy_path,
    free_port,
)

REPO = Path(__file__).resolve().parents[2]


def test_packaged_policy_is_the_example():
    example = REPO / "examples" / "swebench-coding-agent-policy.json"
    assert json.loads(DEFAULT_POLICY.read_text()) == json.loads(example.read_text())
    # a checkout run (PYTHONPATH=python) uses its own examples/ file; an installed package its copy
    import fak

    installed = REPO / "python" not in Path(fak.__file__).resolve().parents
    assert default_policy_path() == (DEFAULT_POLICY if installed else example)


def test_argv(tmp_path):
    gw = ManagedGateway(Path("m.gguf"), tmp_path, backend="cpu", n_ctx=8192,
                        kv_cache_tokens=16384, threads=2)
    argv = gw.argv(1234)
    assert argv[:4] == [sys.executable, "-m", "fak.cli", "serve"]
    opts = dict(zip(argv[4::2], argv[5::2]))
    assert opts == {"--gguf": "m.gguf", "--backend": "cpu", "--n-ctx": "8192",
                    "--addr": "127.0.0.1:1234", "--policy": str(default_policy_path()),
                    "--audit-log": str(tmp_path / "audit.jsonl"), "--max-concurrency": "64",
                    "--log-level": "warning", "--kv-cache-tokens": "16384", "--threads": "2"}
    assert gw.stop() is None  # never started: nothing to stop


def test_start_failure_quotes_the_log(tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not a GGUF file")
    gw = ManagedGateway(bad, tmp_path / "out", start_timeout_s=120)
    with pytest.raises(GatewayStartError, match="exited with status 1") as info:
        gw.start()
    assert "wrong magic" in str(info.value)  # the server's own message, from serve.log
    assert gw.returncode == 1 and gw.stop() == 1
    assert free_port() > 0


def test_cli_needs_exactly_one_model_source(tiny, tmp_path):
    common = ["swebench", "run", "--dataset", str(tiny["dataset"]), "--output", str(tmp_path / "o")]
    proc = run_fak(*common)
    assert proc.returncode == 2 and "exactly one of --gguf MODEL" in proc.stderr
    proc = run_fak(*common, "--gateway", "127.0.0.1:9", "--gguf", str(tiny["dataset"]))
    assert proc.returncode == 2 and "exactly one of --gguf MODEL" in proc.stderr
    proc = run_fak(*common, "--gateway", "127.0.0.1:9", "--policy", str(tiny["specs"]))
    assert proc.returncode == 2 and "apply with --gguf" in proc.stderr


def test_cli_asks_the_gateway_for_its_model(tiny, scripted, tmp_path):
    """Without --model the fleet sends the id the gateway lists (``GET /v1/models``)."""
    server = scripted({"*": []})
    out = tmp_path / "o"
    proc = run_fak("swebench", "run", "--gateway", server.url, "--dataset", str(tiny["dataset"]),
                   "--filter", "fak-test__calc-1", "--repos", str(tiny["repos"]), "--output",
                   str(out), "--no-live")
    assert proc.returncode == 0, proc.stderr
    preds = json.loads((out / "predictions.json").read_text())
    assert preds[0]["model_name_or_path"] == "scripted"
    assert json.loads((out / "summary.json").read_text())["server"] == {
        "managed": False, "addr": server.url}
