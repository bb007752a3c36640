"""Fixtures shared by the stencil tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture()
def rng() -> np.random.Generator:
    """A freshly seeded generator; the seed is printed (shown on failure, to replay it)."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)
