"""Fixtures of the CS256 tests: a freshly seeded RNG (the seed is printed, shown on failure)."""

from __future__ import annotations

import secrets

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    seed = secrets.randbits(64)
    print(f"{request.node.nodeid}: numpy seed {seed}")
    return np.random.default_rng(seed)
