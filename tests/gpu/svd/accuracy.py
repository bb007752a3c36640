"""The singular-value accuracy measure of the SVD tests: the largest error against float64
LAPACK of the same matrix, in units of the largest singular value, and the resolution of
that measure (float64 LAPACK is itself only accurate to a few ulp of float64)."""

from __future__ import annotations

import numpy as np
import scipy.linalg

from gpu.svd.params import make_matrix

# The test matrices of the accuracy targets: (kind of make_matrix, shape). "tall" and
# "wide" are gaussian; "clustered" is graded from 1 to 1/cond with clusters of equal
# values at both ends; "low_rank" is rank-deficient (a quarter of the columns).
CASES = ("gaussian", "clustered", "low_rank", "ill_conditioned", "tall", "wide")


def matrix(case: str, k: int, dtype, seed: int) -> np.ndarray:
    """The test matrix of `case` with k = min(m, n) columns (or rows, for wide)."""
    kind = case if case in ("gaussian", "clustered", "low_rank", "ill_conditioned") else "gaussian"
    m, n = {"tall": (8 * k, k), "wide": (k, 4 * k)}.get(case, (k * 4 // 3, k))
    return make_matrix(m, n, dtype, seed, kind, cond=1e6)


def exact_values(a: np.ndarray) -> np.ndarray:
    """Float64 LAPACK's singular values of `a` (gesdd), descending."""
    return np.linalg.svd(a.astype(np.float64), compute_uv=False)


def largest_error(values: np.ndarray, exact: np.ndarray) -> float:
    """max_i |values_i - exact_i| / exact_0 (0 for a zero matrix)."""
    error = float(np.max(np.abs(values.astype(np.float64) - exact)))
    return error / exact[0] if exact[0] > 0 else error


def resolution(a: np.ndarray, exact: np.ndarray) -> float:
    """How far two float64 LAPACK methods (gesdd, and the Jacobi SVD gejsv) disagree on
    `a`, in units of the largest singular value: errors below it cannot be told apart."""
    a64 = np.asarray(a, np.float64)
    if a64.shape[0] < a64.shape[1]:
        a64 = a64.T
    sva, _, _, work, _, info = scipy.linalg.lapack.dgejsv(a64, joba=0, jobu=3, jobv=3)
    assert info == 0, f"dgejsv failed: info {info}"
    jacobi = np.sort(sva * (work[0] / work[1]))[::-1]
    return largest_error(jacobi, exact)


def lapack_error(a: np.ndarray, exact: np.ndarray) -> float:
    """The largest error of LAPACK's gesvd with vectors in a's own precision (the
    algorithm cuSOLVER's gesvd follows): the CPU anchor."""
    values = scipy.linalg.svd(a, lapack_driver="gesvd", compute_uv=True)[1]
    return largest_error(values, exact)
