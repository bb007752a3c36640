"""The CS256 kernels (gpu/cs256/cuda.py, cs256.cu) against the float64 dense product, the
device conversions against the NumPy ones, and the GPU anchors (gpu/cs256/anchors.py).

CUDA only (marker `gpu`; skipped without a device). Fresh random data every run (the seed
is printed), outputs filled with NaN patterns before every launch, odd shapes (m = 1, n
not a multiple of 256, a last tile narrower than vec), every dtype, vec, chunk width,
lanes per row, number of vectors, both x layouts in shared memory (whole, sliced) and
grids smaller than the rows (several passes per block).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpu.backend import cuda_devices
from gpu.cs256 import format as fmt
from gpu.cs256 import reference as ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]

SHAPES = [(1, 1), (1, 300), (3, 7), (65, 255), (64, 256), (33, 257), (1000, 1000), (7, 4099), (257, 2048)]
DENSITIES = [1.0, 0.5, 0.1, 0.001]


@pytest.fixture(scope="module")
def cuda(poison):
    from gpu.cs256 import cuda

    return cuda


@pytest.fixture(scope="module")
def cupy():
    import cupy

    return cupy


def sparse_matrix(rng, shape, density, dtype: str) -> np.ndarray:
    a = rng.standard_normal(shape).astype(np.float32)
    a[rng.random(shape) >= density] = 0
    return fmt.from_float(a, dtype)


def vectors(rng, n: int, k: int, dtype: str) -> np.ndarray:
    return fmt.from_float(rng.standard_normal((n,) if k == 1 else (n, k)).astype(np.float32), dtype)


def poisoned(cupy, shape, dtype: str):
    out = cupy.empty(shape, fmt.STORAGE[dtype])
    out.view(cupy.uint8).fill(0xFF)  # NaN in every dtype
    return out


def check_product(cuda, cupy, dense: np.ndarray, cs_host, x: np.ndarray, context: str, **plan_options) -> None:
    cs = cs_host.to_device()
    dtype = cs.dtype
    k = 1 if x.ndim == 1 else x.shape[1]
    out = poisoned(cupy, (cs.m,) if k == 1 else (cs.m, k), dtype)
    plan = cuda.make_plan(cs, k, **plan_options)
    result = cuda.spmm(cs, cupy.asarray(x), plan, out=out)
    assert result is out
    y = out.get()
    agrees, error = ref.agrees_with_dense(y, dense, x, dtype)
    assert agrees, f"{context} {plan}: relative error {error:.3g}"
    assert not np.isnan(fmt.to_float32(y, dtype)).any(), f"{context} {plan}: rows left unwritten"


@pytest.mark.parametrize("dtype", fmt.DTYPES)
@pytest.mark.parametrize("vec", fmt.VECS)
def test_spmv_equals_the_dense_product(cuda, cupy, rng, dtype, vec):
    for shape, density in itertools.product(SHAPES, DENSITIES):
        dense = sparse_matrix(rng, shape, density, dtype)
        cs = fmt.from_dense(dense, vec, dtype)
        x = vectors(rng, shape[1], 1, dtype)
        for variant in ("group", "split4"):
            check_product(cuda, cupy, dense, cs, x, f"{shape} density {density} {variant}", variant=variant)


@pytest.mark.parametrize("dtype", fmt.DTYPES)
def test_spmm_equals_the_dense_product_for_2_to_16_vectors(cuda, cupy, rng, dtype):
    for shape, k, vec in itertools.product([(1, 300), (65, 1000), (300, 4099)], [2, 3, 4, 5, 8, 11, 16], (4, 16)):
        dense = sparse_matrix(rng, shape, 0.4, dtype)
        check_product(
            cuda,
            cupy,
            dense,
            fmt.from_dense(dense, vec, dtype),
            vectors(rng, shape[1], k, dtype),
            f"{shape} k={k} vec={vec}",
        )


@pytest.mark.parametrize("dtype", fmt.DTYPES)
def test_every_lane_count_chunk_width_and_x_slicing(cuda, cupy, rng, dtype):
    shape = (130, 4099)  # 17 tiles: slices of 4 leave a partial one
    dense = sparse_matrix(rng, shape, 0.3, dtype)
    dense[5] = 0  # an empty row
    dense[7, :512] = fmt.from_float(np.ones(512, np.float32), dtype)  # full tiles
    cs = fmt.from_dense(dense, 16, dtype)
    for lanes, chunk, k in itertools.product(cuda.LANES, cuda.CHUNKS, (1, 4)):
        x = vectors(rng, shape[1], k, dtype)
        for slice_tiles in (None, 4, 8, 17, 64):
            check_product(
                cuda,
                cupy,
                dense,
                cs,
                x,
                f"lanes {lanes} chunk {chunk} k {k} slices {slice_tiles}",
                lanes=lanes,
                chunk=chunk,
                slice_tiles=slice_tiles,
            )
    for blocks_per_sm in (1, 3):
        check_product(
            cuda, cupy, dense, cs, vectors(rng, shape[1], 1, dtype), "few blocks", blocks_per_sm=blocks_per_sm
        )


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_grid_smaller_than_the_rows_strides_over_them(cuda, cupy, rng, dtype):
    """Few blocks, many rows: every block takes several passes (row_ptr loaded one row
    ahead, x staged once and waited for in the first pass only, or re-staged per slice),
    the last pass with groups past m; rows shorter and longer than a lane's ring."""
    import dataclasses

    dense = sparse_matrix(rng, (1500, 1300), 0.2, dtype)
    dense[rng.random(1500) < 0.05] = 0  # empty rows
    dense[rng.integers(0, 1500, 10), :] = fmt.from_float(
        rng.standard_normal((10, 1300)).astype(np.float32), dtype
    )  # full rows
    cs_host = fmt.from_dense(dense, 8, dtype)
    cs = cs_host.to_device()
    for lanes, k, slice_tiles, grid in itertools.product((1, 8, 32), (1, 4), (None, 4), (1, 3, 7)):
        x = vectors(rng, 1300, k, dtype)
        plan = dataclasses.replace(cuda.make_plan(cs, k, lanes=lanes, slice_tiles=slice_tiles), grid=grid)
        out = poisoned(cupy, (cs.m,) if k == 1 else (cs.m, k), dtype)
        cuda.spmm(cs, cupy.asarray(x), plan, out=out)
        y = out.get()
        error = ref.relative_error(y, ref.dense_product(dense, x, dtype), dtype)
        assert error <= ref.TOLERANCE[dtype], f"{plan}: relative error {error:.3g}"
        assert not np.isnan(fmt.to_float32(y, dtype)).any(), f"{plan}: rows left unwritten"


def test_default_lanes_fill_the_device_and_keep_rings_full(cuda):
    """The default plan's lanes per row: one pass of the grid over many rows, 32 lanes for
    few long rows, fewer when an average row gives a lane fewer chunks than its ring holds."""
    from types import SimpleNamespace

    threads = 132 * 2 * 512  # an H100/H200 with two 512-thread blocks per SM
    tall = SimpleNamespace(m=14336, stored=14336 * 2048)  # 14336 x 4096 at 50 %: 256 chunks of 8 per row
    wide = SimpleNamespace(m=4096, stored=4096 * 4800)
    short = SimpleNamespace(m=4096, stored=4096 * 64)
    assert cuda.default_lanes(tall, 8, threads) == 16
    assert tall.m * 16 >= cuda.FILL * threads > tall.m * 8
    assert cuda.default_lanes(wide, 8, threads) == 32
    assert cuda.default_lanes(short, 8, threads) == 4  # 8 chunks per row: 4 lanes of RING = 2
    assert cuda.default_lanes(tall, 8, threads // 16) == 1


def test_pruned_llm_shapes(cuda, cupy, rng):
    for (m, n), sparsity in itertools.product([(4096, 4096), (1024, 14336)], (0.5, 0.66, 0.75)):
        dense = rng.standard_normal((m, n)).astype(np.float16)
        cs = fmt.prune(dense, sparsity, 8)
        x = vectors(rng, n, 1, "float16")
        for variant in ("group", "split4"):
            check_product(cuda, cupy, cs.to_dense(), cs, x, f"{m}x{n} at {sparsity} {variant}", variant=variant)


def test_all_zero_matrix_gives_exact_zeros(cuda, cupy, rng):
    cs = fmt.from_dense(np.zeros((77, 600), np.float32)).to_device()
    for variant in ("group", "split4"):
        y = cuda.spmv(cs, cupy.asarray(vectors(rng, 600, 1, "float32")), variant=variant)
        assert (y.get() == 0).all()


def test_device_conversions_equal_the_host_ones(cupy, rng):
    for dtype, vec in itertools.product(fmt.DTYPES, fmt.VECS):
        dense = sparse_matrix(rng, (97, 1300), 0.3, dtype)
        dense[3, :300] = dense[3, 0]  # ties for the pruning
        host = fmt.from_dense(dense, vec, dtype)
        device = fmt.from_dense(cupy.asarray(dense), vec, dtype)
        assert device.xp is cupy
        device.validate()
        for name in ("values", "indices", "row_ptr", "block_increments"):
            np.testing.assert_array_equal(
                getattr(device, name).get().view(np.uint8), getattr(host, name).view(np.uint8), err_msg=name
            )
        np.testing.assert_array_equal(device.to_dense().get().view(np.uint8), dense.view(np.uint8))
        for sparsity in (0.5, 0.9):
            on_host = fmt.prune(dense, sparsity, vec, dtype)
            on_device = fmt.prune(cupy.asarray(dense), sparsity, vec, dtype).to_host()
            for name in ("values", "indices", "row_ptr", "block_increments"):
                np.testing.assert_array_equal(
                    getattr(on_device, name).view(np.uint8),
                    getattr(on_host, name).view(np.uint8),
                    err_msg=f"prune {sparsity} {name}",
                )


def test_from_cupy_csr(cupy, rng):
    import cupyx.scipy.sparse

    dense = sparse_matrix(rng, (50, 700), 0.2, "float32")
    cs = fmt.from_csr(cupyx.scipy.sparse.csr_matrix(cupy.asarray(dense)), 8)
    assert cs.xp is cupy
    np.testing.assert_array_equal(cs.to_dense().get(), dense)
    back = fmt.to_csr(cs)
    np.testing.assert_array_equal(back.toarray().get(), dense)


@pytest.mark.parametrize("dtype", fmt.DTYPES)
def test_anchors_compute_the_same_product(cupy, rng, dtype):
    from gpu.cs256 import anchors

    dense = sparse_matrix(rng, (300, 1000), 0.4, dtype)
    for k in (1, 3):
        x = vectors(rng, 1000, k, dtype)
        exact = ref.dense_product(dense, x, dtype)
        y = anchors.dense_matmul(cupy.asarray(dense), cupy.asarray(x), dtype).get()
        assert y.dtype == fmt.STORAGE[dtype] and y.shape == exact.shape
        assert ref.relative_error(y, exact, dtype) <= ref.TOLERANCE[dtype]
        csr = anchors.CsrAnchor(cupy.asarray(dense), dtype)
        assert csr.nnz == np.count_nonzero(fmt.to_float32(dense, dtype))
        y = csr(cupy.asarray(x)).get()
        assert ref.relative_error(y, exact, csr.dtype if k == 1 else "float32") <= ref.TOLERANCE[dtype]
    d_dense, d_x = cupy.asarray(dense), cupy.asarray(x)
    times = anchors.ColdTimer().times_ms(lambda: anchors.dense_matmul(d_dense, d_x, dtype), 3)
    assert len(times) == 3 and all(
        0 < t < anchors.SPIN_US / 1000 for t in times
    )  # the spin before each run is not timed
    assert anchors.copy_bandwidth(1 << 26, 2) > 1e10 and anchors.read_bandwidth(1 << 26, 2) > 1e10


@pytest.mark.parametrize("dtype, vec", [("float16", 4), ("float32", 16), ("bfloat16", 8)])
def test_read_floor_reads_every_byte_once(cupy, rng, dtype, vec):
    """The benchmark's read floor (cs256_read_rows) covers the values, indices and tile
    counts exactly: the XOR of what it read equals the host's, with spans that start and end
    off 16-byte boundaries (vec 4, uint8 indices) and blocks of one and of several rows."""
    from gpu.cs256 import anchors

    for shape in [(1000, 1000), (7, 4099), (1, 300)]:
        host = fmt.from_dense(sparse_matrix(rng, shape, 0.3, dtype), vec, dtype)
        cs, expected = host.to_device(), ref.read_checksum(host)
        for blocks_per_sm in (1, 8):
            assert anchors.ReadFloor(cs, blocks_per_sm).checksum() == expected, (
                f"{shape} vec {vec}, {blocks_per_sm} blocks/SM"
            )


def test_plans_refuse_what_the_kernels_cannot_do(cuda, cupy):
    cs = fmt.from_dense(np.ones((4, 300), np.float16), vec=4).to_device()
    for options in (
        {"variant": "nope"},
        {"chunk": 8},
        {"lanes": 3},
        {"slice_tiles": 1},
        {"k": 17},
        {"k": 2, "variant": "split4"},
    ):
        with pytest.raises(fmt.CS256Error):
            cuda.make_plan(cs, **options)
    with pytest.raises(fmt.CS256Error, match="host"):
        cuda.spmv(cs.to_host(), cupy.ones(300, cupy.float16))
    with pytest.raises(fmt.CS256Error, match="x must be"):
        cuda.spmv(cs, cupy.ones(300, cupy.float32))
