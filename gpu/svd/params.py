"""Parameters of the SVD job, validated once, and the test matrices of the job spec.

`SvdParams` says what to compute (values only, thin or full vectors) and how: "lapack"
is numpy.linalg.svd, "golub_reinsch" the blocked Householder bidiagonalization plus
implicitly shifted QR of Lahabar & Narayanan (2009), "auto" the fastest on the backend.
`make_matrix` builds the three kinds of inputs the accuracy tests and benchmarks use.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

METHODS = ("auto", "golub_reinsch", "lapack")
BLOCK_SIZE_MIN, BLOCK_SIZE_MAX = 1, 512  # columns per panel of the blocked bidiagonalization
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
MATRIX_KINDS = ("gaussian", "ill_conditioned", "low_rank")


class SvdParamError(ValueError):
    """A parameter has the wrong type, is out of range or not one of its choices."""

    def __init__(self, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.name = name


def _check_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SvdParamError(name, f"expected an integer, got {value!r}")
    if value < minimum:
        raise SvdParamError(name, f"must be >= {minimum}; got {value}")
    if maximum is not None and value > maximum:
        raise SvdParamError(name, f"must be <= {maximum}; got {value}")


@dataclass(frozen=True)
class SvdParams:
    """One SVD request; validated on construction (raises SvdParamError).

    compute_uv: also return U and V^T (else the singular values only).
    full_matrices: U is m x m and V^T n x n (else m x k and k x n, k = min(m, n)).
    method: one of METHODS. block_size: columns per panel of the bidiagonalization.
    """

    compute_uv: bool = True
    full_matrices: bool = False
    method: str = "auto"
    block_size: int = 32

    def __post_init__(self) -> None:
        for name in ("compute_uv", "full_matrices"):
            if not isinstance(getattr(self, name), bool):
                raise SvdParamError(name, f"expected true or false, got {getattr(self, name)!r}")
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise SvdParamError("method", f"must be one of {', '.join(METHODS)}; got {self.method!r}")
        _check_int("block_size", self.block_size, BLOCK_SIZE_MIN, BLOCK_SIZE_MAX)


def make_matrix(m: int, n: int, dtype, seed, kind: str, cond: float = 1e6, rank: int | None = None) -> np.ndarray:
    """An (m, n) test matrix of `dtype` (float32 or float64), the same for the same seed.

    gaussian: i.i.d. standard normal entries.
    ill_conditioned: U diag(s) V^T with U, V random orthonormal (QR of Gaussians) and the
    min(m, n) singular values logspaced from 1 down to 1 / cond.
    low_rank: the product of (m, r) and (r, n) Gaussians, r = rank or max(1, min(m, n) // 4).
    Drawn in float64 and rounded once to `dtype`.
    """
    _check_int("m", m, 1)
    _check_int("n", n, 1)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise SvdParamError("dtype", f"must be float32 or float64; got {dtype!r}") from None
    if dtype not in DTYPES:
        raise SvdParamError("dtype", f"must be float32 or float64; got {dtype}")
    if kind not in MATRIX_KINDS:
        raise SvdParamError("kind", f"must be one of {', '.join(MATRIX_KINDS)}; got {kind!r}")
    rng = np.random.default_rng(seed)
    k = min(m, n)
    if kind == "gaussian":
        a = rng.standard_normal((m, n))
    elif kind == "ill_conditioned":
        if isinstance(cond, bool) or not isinstance(cond, numbers.Real) or not math.isfinite(cond) or cond < 1:
            raise SvdParamError("cond", f"must be a finite number >= 1; got {cond!r}")
        u, _ = np.linalg.qr(rng.standard_normal((m, k)))
        v, _ = np.linalg.qr(rng.standard_normal((n, k)))
        s = np.logspace(0.0, -math.log10(cond), k)
        a = (u * s) @ v.T
    else:
        r = max(1, k // 4) if rank is None else rank
        _check_int("rank", r, 1, k)
        a = rng.standard_normal((m, r)) @ rng.standard_normal((r, n))
    return np.ascontiguousarray(a, dtype=dtype)
