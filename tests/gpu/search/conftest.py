"""Fixtures of the string-search tests: a freshly seeded RNG (the seed is printed, shown on
failure) and `search_cases` importable from the tests beside it."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import search_cases`


@pytest.fixture
def rng(request) -> np.random.Generator:
    seed = secrets.randbits(64)
    print(f"{request.node.nodeid}: numpy seed {seed}")
    return np.random.default_rng(seed)
