"""Fixtures of the CUDA tests, and the rule that makes them strict on the GPU machine.

Tests that need a GPU are marked ``cuda`` and get the ``cuda_runner`` / ``require_cuda``
fixtures, which skip when no GPU is usable. With ``FAK_REQUIRE_CUDA=1`` (set by
``scripts/gpu-acceptance``) every skip in this folder is reported as a failure instead, so a run
on the GPU machine cannot pass by skipping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cuda_util import cuda_reason

REQUIRE = os.environ.get("FAK_REQUIRE_CUDA", "") not in ("", "0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE and rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"FAK_REQUIRE_CUDA=1: skipped tests count as failures ({reason})"


@pytest.fixture(scope="session")
def require_cuda() -> None:
    """Skips the test (a failure under FAK_REQUIRE_CUDA=1) when no GPU is usable."""
    reason = cuda_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
