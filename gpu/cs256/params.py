"""Parameters of the CS256 job, validated once, and its generated inputs.

`Cs256Params` says how to build the CS256 matrix (magnitude pruning to `sparsity`, or the
matrix's own zeros when sparsity is None), the vector width `vec`, how many vectors to
multiply and how often to time each product. `make_matrix` and `make_x` draw the random
inputs of a job spec: the same (m, n, dtype, seed) gives the same matrix on every backend.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from gpu.cs256.format import DEFAULT_VEC, DTYPES, VECS, check_dtype, from_float

MAX_VECTORS = 16
REPEATS_MAX = 1000
SAVE_CHOICES = ("npz", "safetensors", "both", "none")


class Cs256ParamError(ValueError):
    """A parameter has the wrong type, is out of range or not one of its choices."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name


@dataclass(frozen=True)
class Cs256Params:
    """One CS256 job; validated on construction (raises Cs256ParamError).

    sparsity: target fraction of zero weights after magnitude pruning, in [0, 1); None
    converts the matrix as it is (its zeros are the sparsity). vec: 4, 8 or 16 (each tile
    stores a multiple of vec entries). vectors: how many random vectors x when none are
    given (1..16). repeats: timed runs of each product (the median is reported).
    save: which files of the CS256 matrix the job writes.
    """

    sparsity: float | None = 0.5
    vec: int = DEFAULT_VEC
    vectors: int = 1
    repeats: int = 20
    save: str = "npz"

    def __post_init__(self) -> None:
        sparsity = self.sparsity
        if sparsity is not None and (isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0.0 <= float(sparsity) < 1.0):
            raise Cs256ParamError("sparsity", f"must be a number in [0, 1) (or null: no pruning); got {sparsity!r}")
        if isinstance(self.vec, bool) or self.vec not in VECS:
            raise Cs256ParamError("vec", f"must be one of {', '.join(map(str, VECS))}; got {self.vec!r}")
        for name, top in (("vectors", MAX_VECTORS), ("repeats", REPEATS_MAX)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= top:
                raise Cs256ParamError(name, f"must be an integer from 1 to {top}; got {value!r}")
        if self.save not in SAVE_CHOICES:
            raise Cs256ParamError("save", f"must be one of {', '.join(SAVE_CHOICES)}; got {self.save!r}")


def make_matrix(m: int, n: int, dtype: str, seed: int) -> np.ndarray:
    """An (m, n) matrix of i.i.d. standard normal weights (drawn in float32, rounded once to
    `dtype`), in the storage of `dtype` (bfloat16: uint16 bit patterns)."""
    for name, value in (("m", m), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise Cs256ParamError(name, f"must be a positive integer; got {value!r}")
    if dtype not in DTYPES:
        raise Cs256ParamError("dtype", f"must be one of {', '.join(DTYPES)}; got {dtype!r}")
    rng = np.random.default_rng(seed)
    return from_float(rng.standard_normal((m, n), dtype=np.float32), check_dtype(dtype))


def make_x(n: int, vectors: int, dtype: str, seed: int) -> np.ndarray:
    """Random x for a job: (n,) for one vector, (n, vectors) otherwise; standard normal,
    in the storage of `dtype`, drawn from a stream of `seed` apart from the matrix's."""
    rng = np.random.default_rng([seed, 1])
    shape = (n,) if vectors == 1 else (n, vectors)
    return from_float(rng.standard_normal(shape, dtype=np.float32), check_dtype(dtype))
