"""The NumPy CS256 product (gpu/cs256/reference.py) against the dense float64 product of the
same matrix, for every dtype, vec, odd shapes and 1..16 vectors; its input checks; the
error measure; the job's parameters and generators (gpu/cs256/params.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpu.cs256 import format as fmt
from gpu.cs256 import reference as ref
from gpu.cs256.format import CS256Error
from gpu.cs256.params import Cs256Params, ParamError, make_matrix, make_x


@pytest.mark.parametrize("dtype", fmt.DTYPES)
def test_spmv_and_spmm_equal_the_dense_product(rng, dtype):
    for (m, n), vec, k, density in itertools.product(
        [(1, 1), (3, 257), (40, 1000), (1, 4099)], fmt.VECS, [1, 2, 3, 16], [1.0, 0.3, 0.001]
    ):
        a = rng.standard_normal((m, n)).astype(np.float32)
        a[rng.random((m, n)) >= density] = 0
        dense = fmt.from_float(a, dtype)
        cs = fmt.from_dense(dense, vec, dtype)
        x = fmt.from_float(rng.standard_normal((n,) if k == 1 else (n, k)).astype(np.float32), dtype)
        exact = ref.dense_product(dense, x, dtype)
        np.testing.assert_allclose(
            ref.product_float64(cs, x), exact, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(exact).max())
        )
        y = ref.spmv(cs, x)
        assert y.dtype == fmt.STORAGE[dtype] and y.shape == exact.shape
        # exact float64 rounded once: at most half an ulp of the output, relative to the largest |y|
        assert ref.relative_error(y, exact, dtype) <= ref.UNIT_ROUNDOFF[dtype], (m, n, vec, k, density)


def test_padding_past_n_reads_no_x():
    dense = np.zeros((1, 260), np.float32)
    dense[0, 256:260] = 1.0  # four pads sit past column 260
    cs = fmt.from_dense(dense, vec=8)
    x = np.ones(260, np.float32)
    assert ref.spmv(cs, x)[0] == 4.0


def test_vectors_are_checked():
    cs = fmt.from_dense(np.ones((3, 10), np.float32))
    for x in (
        np.ones(9, np.float32),
        np.ones((10, 17), np.float32),
        np.ones((10, 2, 2), np.float32),
        np.ones(10, np.int32),
    ):
        with pytest.raises(CS256Error):
            ref.spmv(cs, x)
    np.testing.assert_array_equal(
        ref.spmv(cs, np.ones(10)), np.full(3, 10.0, np.float32)
    )  # float64 x is rounded to float32


def test_relative_error_is_max_difference_over_max_reference():
    reference = np.array([4.0, -2.0, 0.0])
    assert ref.relative_error(np.array([4.0, -2.0, 0.5], np.float32), reference, "float32") == pytest.approx(0.125)
    assert ref.relative_error(np.zeros(3, np.float32), np.zeros(3), "float32") == 0.0
    assert ref.relative_error(np.ones(3, np.float32), np.zeros(3), "float32") == float("inf")
    assert np.isnan(ref.relative_error(np.array([np.nan, 0, 0], np.float32), reference, "float32"))
    bf16 = fmt.float32_to_bf16_bits(np.array([4.0, -2.0, 0.0], np.float32))
    assert ref.relative_error(bf16, reference, "bfloat16") == 0.0
    with pytest.raises(ValueError):
        ref.relative_error(np.zeros(2, np.float32), reference, "float32")


def test_float32_rounding_bound_holds_for_a_cancelled_float32_sum(rng):
    """A row whose sum cancels: float32 accumulation in any order stays within the strict
    bound although the relative error, scaled by that tiny sum, is far above 1e-5; the
    largest term left out is far outside it."""
    n = 300
    a = rng.standard_normal((1, n)).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    x[-1] = np.float32(-(a[0, :-1].astype(np.float64) @ x[:-1].astype(np.float64)) / a[0, -1])  # the sum cancels
    products = a[0] * x  # float32 products, rounded
    order = rng.permutation(n)
    y = np.cumsum(products[order], dtype=np.float32)[-1:]  # summed one by one in float32
    assert ref.within_float32_rounding(y, a, x, "float32")
    assert ref.relative_error(y, ref.dense_product(a, x, "float32"), "float32") > 1e-5
    largest = int(np.argmax(np.abs(products)))
    left_out = np.cumsum(np.delete(products, largest), dtype=np.float32)[-1:]
    assert not ref.within_float32_rounding(left_out, a, x, "float32")
    assert ref.agrees_with_dense(y, a, x, "float32")[0] and not ref.agrees_with_dense(left_out, a, x, "float32")[0]
    # several rows and vectors, output rounded to float16: exact values pass, a shifted one does not
    a16 = fmt.from_float(rng.standard_normal((3, 40)).astype(np.float32), "float16")
    x16 = fmt.from_float(rng.standard_normal((40, 2)).astype(np.float32), "float16")
    y16 = fmt.from_float(ref.dense_product(a16, x16, "float16"), "float16")
    assert ref.within_float32_rounding(y16, a16, x16, "float16")
    off = fmt.to_float32(y16, "float16").copy()
    off[1, 1] += 0.05 * (np.abs(fmt.to_float32(a16, "float16")) @ np.abs(fmt.to_float32(x16, "float16")))[1, 1]
    assert not ref.within_float32_rounding(fmt.from_float(off, "float16"), a16, x16, "float16")


def test_generated_inputs_are_reproducible_and_in_storage():
    for dtype in fmt.DTYPES:
        a, b = make_matrix(5, 300, dtype, 7), make_matrix(5, 300, dtype, 7)
        assert a.dtype == fmt.STORAGE[dtype] and a.shape == (5, 300)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, make_matrix(5, 300, dtype, 8))
        assert make_x(300, 1, dtype, 7).shape == (300,) and make_x(300, 4, dtype, 7).shape == (300, 4)
        assert not np.array_equal(make_x(300, 1, dtype, 7), a[0])


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({"sparsity": 1.0}, "sparsity"),
        ({"sparsity": -0.01}, "sparsity"),
        ({"sparsity": True}, "sparsity"),
        ({"sparsity": "0.5"}, "sparsity"),
        ({"vec": 2}, "vec"),
        ({"vec": True}, "vec"),
        ({"vectors": 0}, "vectors"),
        ({"vectors": 17}, "vectors"),
        ({"repeats": 0}, "repeats"),
        ({"repeats": 2.5}, "repeats"),
        ({"save": "zip"}, "save"),
    ],
)
def test_params_refuse_bad_values(changes, name):
    with pytest.raises(ParamError) as caught:
        Cs256Params(**changes)
    assert caught.value.field == name


def test_params_accept_their_ranges():
    assert Cs256Params(sparsity=None).sparsity is None
    assert Cs256Params(sparsity=0.0, vec=16, vectors=16, repeats=1000, save="both").vec == 16
    for name, value in (("m", 0), ("n", -1), ("dtype", "float64")):
        with pytest.raises(ParamError):
            make_matrix(**{"m": 2, "n": 2, "dtype": "float16", "seed": 0, name: value})
