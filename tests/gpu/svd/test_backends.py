"""The SVD against float64 LAPACK, each test written once and run on both backends: the
NumPy reference (gpu/svd/reference.py, the CPU backend) on small matrices, and the CUDA
implementation (gpu/svd/cuda.py; marker `gpu`, skipped without a device) on larger ones.
Every matrix kind and odd shapes, an ill-conditioned matrix's smallest value, repeated
values and rank deficiency, full and values-only decompositions, and the accuracy target:
at most twice the error of the backend's anchor (LAPACK's gesvd on the CPU, cuSOLVER on the
GPU). Fresh random seeds, printed so a failure can be replayed.

What only one backend has is tested beside it: test_reference.py, test_cuda.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu.backend import cuda_devices
from gpu.svd.params import MATRIX_KINDS, SvdParams, make_matrix
from tests.gpu.svd import accuracy
from tests.gpu.svd.checks import DTYPES, NUMPY, check_svd, on_the_gpu

ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]
GOLUB_REINSCH = SvdParams(method="golub_reinsch")


@pytest.fixture
def backend(request):
    """The backend named by the test's first parameter (see `per_backend`)."""
    return NUMPY if request.param == "numpy" else on_the_gpu(request.getfixturevalue("lease"))


def _id(value) -> str | None:
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    if isinstance(value, type):
        return np.dtype(value).name
    return None


def per_backend(names: str, numpy: list[tuple], cuda: list[tuple]):
    """Parametrize ("backend", *names) with each backend's own cases: the NumPy reference's
    (small: it runs the chase in Python) and the GPU's (marked `gpu`)."""
    cases = [pytest.param("numpy", *case) for case in numpy]
    cases += [pytest.param("cuda", *case, marks=ON_CUDA) for case in cuda]
    return pytest.mark.parametrize(("backend", *names.split(",")), cases, indirect=["backend"], ids=_id)


def _gpu_cond(dtype) -> float:
    return 1e6 if dtype == np.float64 else 1e3


# ------------------------------------------------------------------ against LAPACK --


@per_backend(
    "kind,shape,dtype,cond",
    numpy=[
        (kind, shape, dtype, 1e6)
        for dtype in DTYPES
        for kind in MATRIX_KINDS
        for shape in [(24, 17), (17, 24), (20, 20)]
    ],
    cuda=[
        (kind, shape, dtype, _gpu_cond(dtype))
        for dtype in DTYPES
        for kind in ("gaussian", "ill_conditioned", "low_rank")
        for shape in [(300, 300), (517, 203), (203, 517), (96, 95)]
    ],
)
def test_kinds_match_lapack(backend, kind, shape, dtype, cond, seed):
    a = make_matrix(*shape, dtype, seed, kind, cond=cond)
    check_svd(backend, a, GOLUB_REINSCH, f"{kind} {shape} {np.dtype(dtype).name} seed {seed}")


@per_backend(
    "shape,dtype",
    numpy=[
        (shape, dtype)
        for dtype in DTYPES
        for shape in [(60, 13), (13, 60), (1, 9), (9, 1), (1, 1), (2, 2), (2, 3), (3, 2)]
    ],
    cuda=[
        (shape, dtype)
        for dtype in DTYPES
        for shape in [(1, 1), (1, 37), (37, 1), (2, 2), (3, 2), (2, 5), (33, 33), (65, 64), (1000, 40)]
    ],
)
def test_shapes_match_lapack(backend, shape, dtype, seed):
    a = make_matrix(*shape, dtype, seed, "gaussian")
    check_svd(backend, a, GOLUB_REINSCH, f"{shape} {np.dtype(dtype).name} seed {seed}")


@per_backend(
    "shape,dtype,cond",
    numpy=[((30, 20), dtype, 1e6) for dtype in DTYPES],
    cuda=[((200, 150), dtype, _gpu_cond(dtype)) for dtype in DTYPES],
)
def test_ill_conditioned_keeps_its_smallest_singular_value(backend, shape, dtype, cond, seed):
    a = make_matrix(*shape, dtype, seed, "ill_conditioned", cond=cond)
    _, s, _ = check_svd(backend, a, GOLUB_REINSCH, f"ill-conditioned seed {seed}")
    expected = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    assert abs(s[-1] - expected[-1]) <= 1e-2 * expected[-1] * (1 if dtype == np.float64 else 100), f"seed {seed}"


@per_backend("dtype,k", numpy=[(dtype, 12) for dtype in DTYPES], cuda=[(dtype, 40) for dtype in DTYPES])
def test_repeated_singular_values_and_rank_deficiency(backend, dtype, k, rng, seed):
    """A (4k, 3k) matrix with three values, k times each, a third of them zero; then with
    an exact zero column and row."""
    q1, _ = np.linalg.qr(rng.standard_normal((4 * k, 3 * k)))
    q2, _ = np.linalg.qr(rng.standard_normal((3 * k, 3 * k)))
    values = np.repeat([3.0, 1.0, 0.0], k)
    a = ((q1 * values) @ q2.T).astype(dtype)
    _, s, _ = check_svd(backend, a, GOLUB_REINSCH, f"repeated seed {seed}")
    tolerance = 100 * np.finfo(dtype).eps * 3 * k
    np.testing.assert_allclose(s[:k], 3.0, rtol=tolerance)
    np.testing.assert_allclose(s[k : 2 * k], 1.0, rtol=tolerance)
    assert np.all(s[2 * k :] <= 3 * tolerance)
    a[:, 7] = 0  # and an exact zero column
    a[11, :] = 0  # and row
    check_svd(backend, a, GOLUB_REINSCH, f"zero column and row seed {seed}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", accuracy.CASES)
@per_backend("k", numpy=[(60,)], cuda=[(300,)])
def test_singular_values_at_most_twice_the_error_of_the_anchor(backend, k, case, dtype, seed):
    """The accuracy target: the largest singular-value error against float64 LAPACK of the
    same matrix at most twice the anchor's in the same precision (LAPACK's gesvd on the
    CPU, the algorithm of cuSOLVER's gesvd; cuSOLVER itself, cupy.linalg.svd with vectors,
    on the GPU), to within the resolution of the float64 reference. tall and wide take the
    QR-first path on the GPU."""
    a = accuracy.matrix(case, k, dtype, seed)
    exact = accuracy.exact_values(a)
    _, s, _ = backend.svd(a, GOLUB_REINSCH, None)
    ours, anchor = accuracy.largest_error(s, exact), backend.anchor_error(a, exact)
    noise = accuracy.resolution(a, exact)
    name = np.dtype(dtype).name
    print(f"seed {seed} {case} {name}: ours {ours:.2e}, {backend.anchor} {anchor:.2e}, resolution {noise:.1e}")
    assert ours <= 2 * anchor + noise, (
        f"seed {seed}: {case} {a.shape} {name}: largest error {ours:.2e} of s_max, "
        f"{backend.anchor} {anchor:.2e} (resolution {noise:.1e})"
    )


# ---------------------------------------------------------------------- parameters --


@per_backend(
    "method,shape,dtype",
    numpy=[(method, shape, np.float64) for method in ("golub_reinsch", "lapack", "auto") for shape in [(9, 6), (6, 9)]],
    cuda=[("golub_reinsch", shape, dtype) for dtype in DTYPES for shape in [(90, 60), (60, 90)]],
)
def test_full_matrices(backend, method, shape, dtype, seed):
    a = make_matrix(*shape, dtype, seed, "gaussian")
    u, s, vt = check_svd(backend, a, SvdParams(method=method, full_matrices=True), f"full {method} {shape} seed {seed}")
    sigma = np.zeros(shape)
    sigma[np.arange(len(s)), np.arange(len(s))] = s
    tolerance = 50 * np.finfo(dtype).eps * max(shape)  # 1e-13 at 9 x 6 in float64
    np.testing.assert_allclose(u @ sigma @ vt, a, atol=tolerance * np.abs(a).max(), err_msg=f"seed {seed}")


@per_backend(
    "method,shape,dtype",
    numpy=[(method, (11, 7), dtype) for dtype in DTYPES for method in ("golub_reinsch", "lapack")],
    cuda=[("golub_reinsch", (257, 131), dtype) for dtype in DTYPES],
)
def test_values_only(backend, method, shape, dtype, seed):
    a = make_matrix(*shape, dtype, seed, "gaussian")
    check_svd(backend, a, SvdParams(method=method, compute_uv=False), f"values only {method} seed {seed}")
