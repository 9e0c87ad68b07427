"""Shared test fixtures: the real model files and small helpers.

Real models are fetched by ``../shared/models/fetch-model`` (``.ci/run`` does this first). A test
that needs one asks for the ``model_05b`` / ``model_15b`` fixture, which returns the path or
*fails* (never skips) with the command to run, because a missing real model is a set-up error.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FETCH_MODEL = Path(os.environ.get("FAK_FETCH_MODEL", REPO.parent / "shared" / "models" / "fetch-model"))
MODELS_DIR = Path(os.environ.get("FAK_MODELS", Path.home() / ".cache" / "fak" / "models"))

MODEL_05B = "qwen2.5-coder-0.5b-instruct-mixed"
MODEL_15B = "qwen2.5-coder-1.5b-instruct-q4_k_m"


def real_model(name: str) -> Path:
    """Path of the real GGUF ``name``, fetching it with the shared script if it is not cached."""
    path = MODELS_DIR / f"{name}.gguf"
    if path.exists():
        return path
    if not FETCH_MODEL.exists():
        pytest.fail(f"real model {name} not in {MODELS_DIR} and no fetch script at {FETCH_MODEL}; "
                    f"run: ../shared/models/fetch-model {name}")
    out = subprocess.run([str(FETCH_MODEL), name, "--dir", str(MODELS_DIR)], check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(out)


@pytest.fixture(scope="session")
def model_05b() -> Path:
    """The real Qwen2.5-Coder-0.5B-Instruct GGUF (mixed Q5_0/Q8_0/Q6_K/Q4_K, 491 MB)."""
    return real_model(MODEL_05B)


@pytest.fixture(scope="session")
def model_15b() -> Path:
    """The real Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (1.1 GB)."""
    return real_model(MODEL_15B)


@pytest.fixture()
def scripted():
    """Factory: ``scripted(script) -> ScriptedServer`` (the scripted OpenAI-compatible model of
    ``fak.agent.scripted``, started; stopped after the test). Used by tests/agent and tests/swebench."""
    from fak.agent.scripted import ScriptedServer

    servers: list[ScriptedServer] = []

    def start(script: dict) -> ScriptedServer:
        server = ScriptedServer(script).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()
