"""Fixtures for the cluster tests: a local Ray cluster (started once per module, shut down after
it); the subprocess helpers are in ``cluster_procs.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_procs import need_ray  # noqa: E402


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster of 2 CPUs on loopback for this module; shut down after it."""
    need_ray()
    from fak.cluster.raycluster import connect

    ray = connect(None, num_cpus=2)
    yield ray
    ray.shutdown()
