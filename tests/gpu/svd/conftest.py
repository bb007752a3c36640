"""Fixtures of the SVD tests: `seed`, a fresh one each test (printed, so a failure can be
replayed) and `rng` drawn from it; `lease`, one bare Lease on device 0 for the module (no
pool; unlike tests/gpu/conftest.py's it is not made current: cuda.svd enters its device
and streams itself). CuPy is imported only where a test uses `lease`."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture()
def seed() -> int:
    value = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {value}")  # shown on failure, to replay it
    return value


@pytest.fixture()
def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def lease():
    import cupy

    from gpu.pool import Lease

    return Lease(
        device=0, slot=0, stream=cupy.cuda.Stream(non_blocking=True), side_stream=cupy.cuda.Stream(non_blocking=True)
    )
