"""Gateway test fixtures: a fake engine, a fake policy, and a real server on a loopback port.

``start_gateway(engine=..., ...)`` builds the app with ``create_app`` and serves it with uvicorn
in a thread (``fak.gateway.server.BackgroundServer``); clients talk real HTTP to it. To add a
case, ask for ``gateway`` (a running server over ``fake_engine``) and ``client`` (the official
``openai`` client pointed at it), or call ``start_gateway`` for a custom setup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest
from fak.gateway import BackgroundServer, GatewayConfig, create_app
from gateway_fakes import SCRIPT, FakeEngine, FakePolicy


@pytest.fixture(scope="module")
def fake_engine() -> FakeEngine:
    """A fake engine with the standard script, shared by the tests of a module (like ``gateway``)."""
    return FakeEngine(script=list(SCRIPT))


@pytest.fixture
def fake_policy() -> FakePolicy:
    """Denies ``delete_file`` and bash commands with ``rm -rf``/``sudo``."""
    return FakePolicy()


@pytest.fixture
def start_gateway() -> Iterator[Callable[..., BackgroundServer]]:
    """``start_gateway(engine=..., upstream=..., policy=..., audit=..., **config)`` → running server."""
    with ExitStack() as stack:
        def start(*, engine: Any = None, upstream: Any = None, policy: Any = None, audit: Any = None,
                  **config: Any) -> BackgroundServer:
            app = create_app(GatewayConfig(**config), engine=engine, upstream=upstream, policy=policy, audit=audit)
            return stack.enter_context(BackgroundServer(app))
        yield start


@pytest.fixture(scope="module")
def gateway(fake_engine: FakeEngine) -> Iterator[BackgroundServer]:
    """A running gateway over ``fake_engine`` (no policy, no API key), one per test module."""
    with BackgroundServer(create_app(GatewayConfig(), engine=fake_engine)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(gateway: BackgroundServer) -> openai.OpenAI:
    """The official OpenAI client against ``gateway`` (no retries, so errors surface at once)."""
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def http() -> Iterator[httpx.Client]:
    """One shared httpx client (creating one per call costs ~0.1 s of TLS set-up)."""
    with httpx.Client(timeout=60) as c:
        yield c


def _real_engine_class() -> Any:
    try:
        from fak.engine import Engine
    except ImportError as exc:  # the engine lands on main from branch `pyengine`
        pytest.skip(f"fak.Engine is not available in this checkout ({exc})")
    return Engine


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real ``fak.Engine`` over a tiny synthetic Qwen2-layout model (fast on CPU)."""
    engine_cls = _real_engine_class()
    try:
        from fak.synth import write_tiny_model
    except ImportError as exc:
        pytest.skip(f"fak.synth is not available in this checkout ({exc})")
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    # F16 weights (kept from before the CPU matmul became row-invariant: then the batched Q8_0 path rounded differently from its one-row path,
    # and random weights give near-tied logits, so with Q8_0 about 1 greedy sequence in 64 differs
    # between batched and alone in the engine itself (measured with fak.Engine directly, no
    # gateway). The gateway test needs exact equality to prove nothing is lost or mixed.
    write_tiny_model(path, weight_type="F16")
    with engine_cls(str(path), backend="cpu", n_ctx=512, max_batch=64, kv_cache_tokens=64 * 512) as engine:
        yield engine


@pytest.fixture(scope="session")
def engine_05b(model_05b: Any) -> Iterator[Any]:
    """The real ``fak.Engine`` over Qwen2.5-Coder-0.5B-Instruct on CPU."""
    engine_cls = _real_engine_class()
    with engine_cls(str(model_05b), backend="cpu", n_ctx=1024, max_batch=64, kv_cache_tokens=64 * 256) as engine:
        yield engine
