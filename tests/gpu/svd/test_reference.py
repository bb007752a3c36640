"""The NumPy Golub-Reinsch SVD (gpu/svd/reference.py) against float64 LAPACK where only the
reference is tested (the tests run on both backends are in test_backends.py), its
parameters, its steps and its input checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpu.svd import reference as ref
from gpu.svd.params import MATRIX_KINDS, ParamError, SvdInputError, SvdParams, check_matrix, make_matrix
from tests.gpu.svd import accuracy
from tests.gpu.svd.checks import DTYPES, MAX_RATIO, NUMPY, check_svd

GOLUB_REINSCH = SvdParams(method="golub_reinsch")


def _orthonormal(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((rows, cols)))
    return q


# ------------------------------------------------------------------ against LAPACK --


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 5), (5, 8), (5, 5)])
def test_repeated_singular_values(dtype, shape, rng, seed):
    values = np.array([3.0, 3.0, 3.0, 1.0, 1.0])
    m, n = shape
    a = (_orthonormal(rng, m, 5) * values) @ _orthonormal(rng, n, 5).T
    _, s, _ = check_svd(NUMPY, a.astype(dtype), GOLUB_REINSCH, f"{shape} seed {seed}")
    np.testing.assert_allclose(s, values, atol=50 * np.finfo(dtype).eps * max(m, n) * 3, err_msg=f"seed {seed}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rank_deficient_zero_row_and_column(dtype, rng, seed):
    a = rng.standard_normal((12, 9)).astype(dtype)
    a[3, :] = 0
    a[:, 5] = 0
    a[:, 7] = a[:, 2]  # and two equal columns: two zero singular values in all
    _, s, _ = check_svd(NUMPY, a, GOLUB_REINSCH, f"seed {seed}")
    assert np.all(s[-2:] <= 50 * np.finfo(dtype).eps * 12 * s[0]), f"seed {seed}: {s}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_low_rank_gives_zero_singular_values(dtype, seed):
    a = make_matrix(16, 12, dtype, seed, "low_rank", rank=3)
    _, s, _ = check_svd(NUMPY, a, GOLUB_REINSCH, f"seed {seed}")
    assert np.all(s[3:] <= 50 * np.finfo(dtype).eps * 16 * s[0]), f"seed {seed}: {s}"


def test_float64_resolves_an_ill_conditioned_matrix_to_many_digits(seed):
    """Beyond test_backends.py's smallest value: in float64 every value of a matrix of
    condition 1e6 to 1e-8, the smallest 1e-6 itself."""
    a = make_matrix(30, 20, np.float64, seed, "ill_conditioned", cond=1e6)
    _, s, _ = ref.svd(a, GOLUB_REINSCH)
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), rtol=1e-8, err_msg=f"seed {seed}")
    assert s[-1] == pytest.approx(1e-6, rel=1e-8), f"seed {seed}"


@pytest.mark.parametrize("method", ["golub_reinsch", "lapack"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_only_are_the_values_with_vectors(method, dtype, seed):
    a = make_matrix(11, 7, dtype, seed, "gaussian")
    _, s, _ = ref.svd(a, SvdParams(method=method, compute_uv=False))
    _, s_with_vectors, _ = ref.svd(a, SvdParams(method=method))
    np.testing.assert_allclose(s, s_with_vectors, rtol=0, atol=20 * np.finfo(dtype).eps * s[0], err_msg=f"seed {seed}")


def test_float32_matrices_keep_the_accuracy_of_their_bidiagonal(seed):
    """The bidiagonal QR runs in float64 for float32 input: the singular values are those
    of the float32 bidiagonal to float32 rounding, on a graded and clustered matrix (a
    float32 chase lost 6x that: 2.3e-6 of s_max against 3.6e-7 at 1500 x 1200)."""
    a = make_matrix(160, 120, np.float32, seed, "clustered", cond=1e6)
    _, d, e, _ = ref.bidiagonalize(a, 32, "none")
    bidiagonal = np.diag(d.astype(np.float64)) + np.diag(e.astype(np.float64), 1)
    of_bidiagonal = np.linalg.svd(bidiagonal, compute_uv=False)
    _, s, _ = ref.svd(a, SvdParams(method="golub_reinsch", compute_uv=False))
    error = accuracy.largest_error(s, of_bidiagonal)
    assert error <= np.finfo(np.float32).eps, f"seed {seed}: {error:.2e} of s_max from the bidiagonal's values"


def test_auto_picks_the_method_measured_faster():
    """bench/svd.py on an H100: ours with vectors from 512 columns (the smaller side), in
    both dtypes; values only, ours for float32 from 1024 columns; cuSOLVER elsewhere."""
    from gpu.svd.params import auto_gpu_method

    assert auto_gpu_method(512, 512, np.float32) == "golub_reinsch"
    assert auto_gpu_method(8192, 512, np.float64, compute_uv=True) == "golub_reinsch"
    assert auto_gpu_method(16384, 1024, np.float32) == "golub_reinsch"
    assert auto_gpu_method(511, 4096, np.float32) == "cusolver"  # the smaller side decides
    assert auto_gpu_method(4096, 4096, np.float32, compute_uv=False) == "golub_reinsch"
    assert auto_gpu_method(8192, 512, np.float32, compute_uv=False) == "cusolver"
    assert auto_gpu_method(4096, 4096, np.float64, compute_uv=False) == "cusolver"
    assert auto_gpu_method(20_000, 15_000, np.float32) == "cusolver"  # past the chase's shared memory


def test_singular_vectors_match_lapack_up_to_sign(seed):
    a = make_matrix(15, 10, np.float64, seed, "gaussian")
    u, _, vt = ref.svd(a, GOLUB_REINSCH)
    u_ref, s_ref, vt_ref = np.linalg.svd(a, full_matrices=False)
    gaps = np.min(np.abs(np.diff(s_ref))) / s_ref[0]
    tolerance = 1e-12 / gaps  # a singular vector moves by ~ perturbation / gap
    signs = np.sign(np.sum(u * u_ref, axis=0))
    np.testing.assert_allclose(u * signs, u_ref, atol=tolerance, err_msg=f"seed {seed}")
    np.testing.assert_allclose(vt * signs[:, None], vt_ref, atol=tolerance, err_msg=f"seed {seed}")


# ---------------------------------------------------------------------- parameters --


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(40, 23), (23, 40)])
def test_block_sizes_agree(dtype, shape, seed):
    # Not entry by entry in B, Q, P: the later reflectors of a bidiagonalization are
    # sensitive to rounding (block sizes 1 and 32 differ by ~400 ulp in d, even in float64),
    # while the singular values and the product U S V^T are well conditioned.
    a = make_matrix(*shape, dtype, seed, "gaussian")
    tolerance = 50 * np.finfo(dtype).eps * max(shape)
    u1, s1, vt1 = ref.svd(a, SvdParams(method="golub_reinsch", block_size=1))
    for block_size in (3, 32):
        context = f"block {block_size} seed {seed}"
        u, s, vt = ref.svd(a, SvdParams(method="golub_reinsch", block_size=block_size))
        np.testing.assert_allclose(s, s1, atol=tolerance * s1[0], err_msg=context)
        np.testing.assert_allclose((u * s) @ vt, (u1 * s1) @ vt1, atol=tolerance * s1[0], err_msg=context)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vectors", ["thin", "full"])
@pytest.mark.parametrize("block_size", [1, 3, 5, 32])
def test_bidiagonalize_is_q_b_pt(dtype, vectors, block_size, seed):
    a = make_matrix(19, 12, dtype, seed, "gaussian")
    q, d, e, pt = ref.bidiagonalize(a, block_size=block_size, vectors=vectors)
    assert q.shape == ((19, 12) if vectors == "thin" else (19, 19)) and pt.shape == (12, 12)
    assert q.dtype == d.dtype == e.dtype == pt.dtype == dtype
    eps = np.finfo(dtype).eps
    b = np.diag(d) + np.diag(e, 1)
    np.testing.assert_allclose(q[:, :12] @ b @ pt, a, atol=100 * eps * np.abs(a).max(), err_msg=f"seed {seed}")
    np.testing.assert_allclose(q.T @ q, np.eye(q.shape[1]), atol=100 * eps, err_msg=f"seed {seed}")
    np.testing.assert_allclose(pt @ pt.T, np.eye(12), atol=100 * eps, err_msg=f"seed {seed}")
    _, d_only, e_only, _ = ref.bidiagonalize(a, block_size=block_size, vectors="none")
    np.testing.assert_array_equal(d_only, d)
    np.testing.assert_array_equal(e_only, e)


def test_lapack_and_auto_are_numpy(seed):
    a = make_matrix(9, 7, np.float32, seed, "gaussian")
    u_ref, s_ref, vt_ref = np.linalg.svd(a, full_matrices=False)
    for method in ("lapack", "auto"):
        u, s, vt = ref.svd(a, SvdParams(method=method))
        np.testing.assert_array_equal(s, s_ref)
        np.testing.assert_array_equal(u, u_ref)
        np.testing.assert_array_equal(vt, vt_ref)


def test_params_defaults_and_validation():
    params = SvdParams()
    assert (params.compute_uv, params.full_matrices, params.method, params.block_size) == (True, False, "auto", 32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.method = "lapack"
    SvdParams(block_size=1)
    SvdParams(block_size=512)
    for kwargs, name in [
        ({"method": "jacobi"}, "method"),
        ({"method": None}, "method"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": 513}, "block_size"),
        ({"block_size": 1.5}, "block_size"),
        ({"block_size": True}, "block_size"),
        ({"compute_uv": "yes"}, "compute_uv"),
        ({"full_matrices": 1}, "full_matrices"),
    ]:
        with pytest.raises(ParamError) as error:
            SvdParams(**kwargs)
        assert error.value.field == name and isinstance(error.value, ValueError)


# --------------------------------------------------------------- the diagonalization --


@pytest.mark.parametrize("dtype", DTYPES)
def test_bidiagonal_with_zero_diagonal_entries(dtype, rng, seed):
    d = rng.standard_normal(9)
    e = rng.standard_normal(8)
    d[[0, 4, 8]] = 0  # three zero singular values' worth of trouble: top, middle, bottom
    d, e = d.astype(dtype), e.astype(dtype)
    b = np.diag(d) + np.diag(e, 1)
    s, u, vt = ref.bidiagonal_svd(d, e, np.eye(9, dtype=dtype), np.eye(9, dtype=dtype))
    expected = np.linalg.svd(b.astype(np.float64), compute_uv=False)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(s, expected, atol=50 * eps * 9 * expected[0], err_msg=f"seed {seed}")
    assert max(ref.accuracy(b, u, s, vt).values()) <= MAX_RATIO, f"seed {seed}"


def test_bidiagonal_signs_order_and_1x1():
    s, u, vt = ref.bidiagonal_svd(np.array([-2.0]), np.array([]), np.eye(1), np.eye(1))
    assert s.tolist() == [2.0] and u.tolist() == [[1.0]] and vt.tolist() == [[-1.0]]
    d = np.array([1.0, -5.0, 3.0])
    s, u, vt = ref.bidiagonal_svd(d, np.zeros(2), np.eye(3), np.eye(3))
    assert s.tolist() == [5.0, 3.0, 1.0]
    np.testing.assert_array_equal((u * s) @ vt, np.diag(d))
    s, u, vt = ref.bidiagonal_svd(d, np.zeros(2))
    assert s.tolist() == [5.0, 3.0, 1.0] and u is None and vt is None


def test_bidiagonal_gives_up_after_max_sweeps(rng):
    d, e = rng.uniform(1, 2, 6), rng.uniform(1, 2, 5)
    with pytest.raises(np.linalg.LinAlgError, match="did not converge"):
        ref.bidiagonal_svd(d, e, max_sweeps=0)


# ------------------------------------------------------------------------ accuracy --


def test_accuracy_ratios_flag_a_bad_factorization(seed):
    a = make_matrix(10, 6, np.float64, seed, "gaussian")
    u, s, vt = np.linalg.svd(a, full_matrices=False)
    assert max(ref.accuracy(a, u, s, vt).values()) <= MAX_RATIO
    bad = ref.accuracy(a, u * 1.001, s, vt)
    assert bad["orth_u"] > 1e6 and bad["resid"] > 1e6 and bad["orth_v"] <= MAX_RATIO


# ------------------------------------------------------------------- test matrices --


@pytest.mark.parametrize("kind", MATRIX_KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_make_matrix_is_deterministic(kind, dtype, seed):
    a = make_matrix(13, 8, dtype, seed, kind)
    assert a.shape == (13, 8) and a.dtype == dtype and a.flags.c_contiguous
    np.testing.assert_array_equal(a, make_matrix(13, 8, dtype, seed, kind))
    assert not np.array_equal(a, make_matrix(13, 8, dtype, seed + 1, kind))
    assert np.all(np.isfinite(a)) and np.any(a != 0)


@pytest.mark.parametrize("shape", [(20, 12), (12, 20)])
@pytest.mark.parametrize("cond", [1e3, 1e6])
def test_make_matrix_condition_and_rank(shape, cond, seed):
    a = make_matrix(*shape, np.float64, seed, "ill_conditioned", cond=cond)
    s = np.linalg.svd(a, compute_uv=False)
    assert s[0] == pytest.approx(1.0, rel=1e-12) and s[0] / s[-1] == pytest.approx(cond, rel=1e-8), f"seed {seed}"
    np.testing.assert_allclose(s, np.logspace(0, -np.log10(cond), 12), rtol=1e-8, err_msg=f"seed {seed}")
    assert np.linalg.matrix_rank(make_matrix(*shape, np.float64, seed, "low_rank")) == 3  # min(m, n) // 4
    assert np.linalg.matrix_rank(make_matrix(*shape, np.float64, seed, "low_rank", rank=5)) == 5
    assert np.linalg.matrix_rank(make_matrix(*shape, np.float64, seed, "gaussian")) == 12


def test_make_matrix_validation():
    for args, kwargs, name in [
        ((0, 3, np.float64, 1, "gaussian"), {}, "m"),
        ((3, 0, np.float64, 1, "gaussian"), {}, "n"),
        ((3, 3, np.int32, 1, "gaussian"), {}, "dtype"),
        ((3, 3, np.float16, 1, "gaussian"), {}, "dtype"),
        ((3, 3, np.float64, 1, "hilbert"), {}, "kind"),
        ((3, 3, np.float64, 1, "ill_conditioned"), {"cond": 0.5}, "cond"),
        ((3, 3, np.float64, 1, "ill_conditioned"), {"cond": float("inf")}, "cond"),
        ((3, 3, np.float64, 1, "low_rank"), {"rank": 4}, "rank"),
        ((3, 3, np.float64, 1, "low_rank"), {"rank": 0}, "rank"),
    ]:
        with pytest.raises(ParamError) as error:
            make_matrix(*args, **kwargs)
        assert error.value.field == name


# ------------------------------------------------------------------ input checks --


def test_check_matrix_accepts_and_makes_contiguous(rng):
    a = rng.standard_normal((5, 7)).astype(np.float32)
    checked = check_matrix(a.T, max_elements=35)
    assert checked.dtype == np.float32 and checked.flags.c_contiguous
    np.testing.assert_array_equal(checked, a.T)


@pytest.mark.parametrize(
    ("value", "max_elements", "message"),
    [
        (np.ones(4), None, "2-D"),
        (np.ones((2, 2, 2)), None, "2-D"),
        (np.ones((0, 3)), None, "empty"),
        (np.ones((3, 4)), 11, "more than the limit of 11"),
        (np.ones((3, 4), dtype=np.int64), None, "dtype int64"),
        (np.ones((3, 4), dtype=np.complex128), None, "dtype complex128"),
        (np.array([[1.0, np.nan], [np.nan, 2.0]]), None, "2 non-finite entries (2 NaN, 0 infinite)"),
        (
            np.array([[1.0, np.inf], [np.nan, -np.inf]], dtype=np.float32),
            None,
            "3 non-finite entries (1 NaN, 2 infinite)",
        ),
    ],
)
def test_check_matrix_errors(value, max_elements, message):
    with pytest.raises(SvdInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_matrix(value, max_elements)
    with pytest.raises(ValueError):  # what the HTTP layer catches
        ref.svd(value) if max_elements is None else check_matrix(value, max_elements)


def test_accuracy_by_column_blocks_is_the_whole_matrixs(monkeypatch):
    """accuracy converts A a few columns at a time: the ratios equal the whole matrix's
    (to the products' rounding), and values off by 1 % read as far past O(1)."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((120, 90)).astype(np.float32)
    u, s, vt = (x.astype(np.float32) for x in np.linalg.svd(a.astype(np.float64), full_matrices=False))
    whole = ref.accuracy(a, u, s, vt)
    monkeypatch.setattr(ref, "ACCURACY_BLOCK_BYTES", 8 * 120 * 7)  # 7 columns a block: 13 blocks
    blocked = ref.accuracy(a, u, s, vt)
    assert blocked.keys() == whole.keys()
    for key in whole:
        assert blocked[key] == pytest.approx(whole[key], rel=1e-9), f"seed {seed}: {key}"
    assert max(whole.values()) < 10, f"seed {seed}: {whole}"
    assert ref.accuracy(a, u, s * 1.01, vt)["resid"] > 100, f"seed {seed}"  # 1e-2 / (120 ulp): ~700
