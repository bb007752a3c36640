"""Fixtures of the string-search tests, and `import search_cases` (the module beside them;
the fresh `rng` fixture is tests/conftest.py's): `lease`, one of the module pool's leases
held for a test (tests/gpu/conftest.py's `pool`; CuPy imported only where a test uses it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import search_cases`


@pytest.fixture
def lease(pool):
    """Unlike tests/gpu/conftest.py's, neither the lease's device nor its stream is made
    current: the search functions enter both themselves, as in a job."""
    with pool.lease() as held:
        yield held
        held.stream.synchronize()
