"""Helpers of the cluster tests: ``fak`` servers started as subprocesses, and the Ray check."""

from __future__ import annotations

import pytest

from fak_subprocess import fak_process  # noqa: F401 - re-exported for the cluster tests


def need_ray():
    """The ``ray`` module, or a failure naming the install command (the test extra has it)."""
    try:
        import ray
    except ImportError:
        pytest.fail("Ray is not installed: pip install 'fak[ray]' (the test extra includes it)")
    return ray
