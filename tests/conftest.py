"""Fixtures of every test: `rng`, a generator with a fresh seed each run (the seed is
printed with the test's id, so pytest shows it on failure and the run can be replayed)."""

from __future__ import annotations

import secrets

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    seed = secrets.randbits(64)
    print(f"{request.node.nodeid}: numpy seed {seed}")
    return np.random.default_rng(seed)
