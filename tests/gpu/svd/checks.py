"""What every SVD test checks of a decomposition, on either backend: `check_svd` runs one
through a `Backend` (the NumPy reference, or the CUDA implementation on a lease) and holds
it to float64 LAPACK."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpu.svd import reference as ref
from gpu.svd.params import SvdParams
from tests.gpu.svd import accuracy

DTYPES = (np.float32, np.float64)
MAX_RATIO = 35  # LAPACK's threshold for its SVD test ratios

Factors = tuple[np.ndarray | None, np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class Backend:
    """name: "numpy" or "cuda". svd(a, params, timings) -> (u, s, vt), filling `timings` with
    its phases' times where it measures them (None: it measures none). anchor: what the
    accuracy target compares with; anchor_error(a, exact): its largest singular-value error."""

    name: str
    svd: Callable[[np.ndarray, SvdParams, dict[str, float] | None], Factors]
    timed: bool
    anchor: str
    anchor_error: Callable[[np.ndarray, np.ndarray], float]


NUMPY = Backend(
    "numpy",
    lambda a, params, timings=None: ref.svd(a, params),
    timed=False,
    anchor="LAPACK gesvd",
    anchor_error=accuracy.lapack_error,
)


def on_the_gpu(lease) -> Backend:
    """gpu/svd/cuda.py on `lease`, cuSOLVER (cupy.linalg.svd) its anchor."""
    from gpu.svd import cuda

    def cusolver_error(a: np.ndarray, exact: np.ndarray) -> float:
        _, values, _ = cuda.cusolver_svd(a, SvdParams(method="cusolver"), lease)
        return accuracy.largest_error(values, exact)

    return Backend(
        "cuda",
        lambda a, params, timings=None: cuda.svd(a, params, lease, timings),
        timed=True,
        anchor="cuSOLVER",
        anchor_error=cusolver_error,
    )


def check_svd(backend: Backend, a: np.ndarray, params: SvdParams, context: str) -> Factors:
    """Run `backend`'s SVD of `a` and check it against float64 LAPACK: the values
    non-negative, descending and within 50 eps max(m, n) of s_max; shapes and dtypes;
    LAPACK's three ratios <= MAX_RATIO; completed bases orthonormal; the phases timed
    where the backend times them."""
    m, n = a.shape
    k = min(m, n)
    timings: dict[str, float] = {}
    u, s, vt = backend.svd(a, params, timings)
    expected = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    eps = np.finfo(a.dtype).eps
    assert s.dtype == a.dtype and s.shape == (k,), context
    assert np.all(s >= 0), f"{context}: negative singular values {s[s < 0]}"
    assert np.all(np.diff(s) <= 0), f"{context}: not descending {s}"
    error = np.max(np.abs(s.astype(np.float64) - expected)) / expected[0]
    assert error <= 50 * eps * max(m, n), f"{context}: singular values off by {error:.2e} of s_max"
    if backend.timed:
        assert {"bidiagonalization", "diagonalization"} <= timings.keys(), timings
    if params.compute_uv:
        assert u is not None and vt is not None, context
        rows, cols = (m, n) if params.full_matrices else (k, k)
        assert u.shape == (m, rows) and vt.shape == (cols, n), f"{context}: shapes {u.shape}, {vt.shape}"
        assert u.dtype == a.dtype and vt.dtype == a.dtype, context
        ratios = ref.accuracy(a, u, s, vt)
        assert max(ratios.values()) <= MAX_RATIO, f"{context}: accuracy ratios {ratios}"
        if params.full_matrices:  # the completed bases are orthonormal too
            for name, q in (("u", u), ("vt", vt)):
                error = np.abs(q.astype(np.float64).T @ q - np.eye(q.shape[0])).max()
                assert error <= 50 * eps * q.shape[0], f"{context}: full {name} not orthonormal ({error:.1e})"
    else:
        assert u is None and vt is None, context
    return u, s, vt
