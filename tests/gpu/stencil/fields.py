"""Random starting fields of the stencil tests (the fresh `rng` is tests/conftest.py's)."""

from __future__ import annotations

import numpy as np


def random_fields(rng: np.random.Generator, shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(p^0, p^-1): standard normal in the interior, 0 on the 2-cell border."""
    fields = []
    for _ in range(2):
        p = np.zeros(shape, np.float32)
        p[2:-2, 2:-2, 2:-2] = rng.standard_normal(tuple(n - 4 for n in shape))
        fields.append(p)
    return fields[0], fields[1]
