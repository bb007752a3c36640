"""The CS256 kernels of gpu/cs256/cs256.cu, run on the CPU: the real source compiled by
g++ with the CUDA emulation of tests/gpu/emulator/emu.h (a std::thread per CUDA thread,
barriers for __syncthreads and the shuffles), launched with the arguments
gpu/cs256/cuda.py passes, against the float64 dense product.

It checks the kernels' logic in CI: the group kernel's register ring (first loads, the
reloads R chunks ahead, rows shorter than the ring), its walk over the tile counts, x
whole or in slices, grids smaller than the rows (several passes per block, the last with
rows past m), the shuffle reduction for every lane count and 1..16 vectors; the split4
kernel for every vec. Outputs are poisoned with NaN first. On the CPU the PTX paths
(L1 hints, streaming loads) take their plain fallbacks and the cp.async staging of x lands
only at wait_copies (emu.h: a missing wait reads garbage and fails here); the arithmetic is
the GPU's (float FMAs in the same order), so this is the device's result bit for bit
except for what only the device can show (timing, memory ordering, the PTX itself):
tests/gpu/cs256/test_cuda.py runs the same products on a GPU. Skipped without g++ 11+.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from gpu.cs256 import format as fmt
from gpu.cs256 import reference as ref
from tests.gpu.emulator import library as emulator

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "emulator" / "cs256_emu.cpp"
SOURCE = HERE.parents[2] / "gpu" / "cs256" / "cs256.cu"
TAGS = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}
GROUP_BLOCK, SPLIT4_BLOCK = 512, 256  # cs256.cu
K_SIZES = (1, 2, 4, 8, 16)


@pytest.fixture(scope="module")
def library(request, tmp_path_factory):
    return emulator.load(emulator.build_in_pytest(request, tmp_path_factory, DRIVER, {"CS256_SOURCE": SOURCE}))


def sparse_matrix(rng, shape, density: float, dtype: str) -> np.ndarray:
    """Random weights at `density`, with an empty row, a full row and a full tile."""
    m, n = shape
    a = rng.standard_normal(shape).astype(np.float32)
    a[rng.random(shape) >= density] = 0
    if m > 2:
        a[int(rng.integers(0, m))] = 0
        a[int(rng.integers(0, m))] = rng.standard_normal(n)
    if m > 3 and n >= 256:
        a[int(rng.integers(0, m)), :256] = rng.standard_normal(256)
    return fmt.from_float(a, dtype)


def group_product(library, cs, x: np.ndarray, chunk: int, lanes: int, slice_tiles: int, grid: int) -> np.ndarray:
    """cs256_group_* on the emulator as cuda.spmm launches it: x (n,) or (n, k) in the
    storage dtype, padded to K vectors; returns y (m,) or (m, k) in the storage dtype."""
    k = 1 if x.ndim == 1 else x.shape[1]
    k_padded = next(size for size in K_SIZES if size >= k)
    storage = fmt.STORAGE[cs.dtype]
    x_run = np.zeros((cs.n, k_padded), storage)
    x_run[:, :k] = x.reshape(cs.n, k)
    y = (
        np.full(cs.m * k_padded * storage.itemsize, 0xFF, np.uint8).view(storage).reshape(cs.m, k_padded)
    )  # NaN in every dtype
    shared = min(slice_tiles, cs.tiles_per_row) * 256 * k_padded * storage.itemsize
    args = (
        cs.values,
        cs.indices,
        cs.row_ptr,
        cs.block_increments,
        np.int32(cs.m),
        np.int32(cs.n),
        np.int32(cs.padded_tiles),
        np.int32(int(math.log2(cs.vec // chunk))),
        x_run,
        y,
        np.int32(int(math.log2(lanes))),
        np.int32(slice_tiles),
    )
    emulator.launch(library, f"cs256_group_{TAGS[cs.dtype]}_w{chunk}_k{k_padded}", grid, GROUP_BLOCK, shared, args)
    return y[:, :k].reshape((cs.m,) if x.ndim == 1 else (cs.m, k))


def check(y: np.ndarray, dense: np.ndarray, x: np.ndarray, dtype: str, context: str) -> None:
    assert not np.isnan(fmt.to_float32(y, dtype)).any(), f"{context}: rows left unwritten"
    agrees, error = ref.agrees_with_dense(y, dense, x, dtype)
    assert agrees, f"{context}: relative error {error:.3g}"


def vectors(rng, n: int, k: int, dtype: str) -> np.ndarray:
    return fmt.from_float(rng.standard_normal((n,) if k == 1 else (n, k)).astype(np.float32), dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_group_kernel_every_lane_count_chunk_and_x_layout(library, rng, dtype):
    """1300 columns (6 tiles, the last partial): x whole, or in slices of 4 tiles (the
    block's rows step through them together); grids of one block (many passes), three,
    and one per row group."""
    m, n = 45, 1300
    dense = sparse_matrix(rng, (m, n), 0.3, dtype)
    for vec in (4, 8, 16):
        cs = fmt.from_dense(dense, vec, dtype)
        for chunk, lanes, slice_tiles in itertools.product((4, 8), (1, 4, 32), (cs.tiles_per_row, 4)):
            if vec % chunk:
                continue
            grid = int(rng.choice([1, 3, -(-m // (GROUP_BLOCK // lanes))]))
            x = vectors(rng, n, 1, dtype)
            y = group_product(library, cs, x, chunk, lanes, slice_tiles, grid)
            check(y, dense, x, dtype, f"vec {vec} chunk {chunk} lanes {lanes} slice {slice_tiles} grid {grid}")


@pytest.mark.parametrize("k", [2, 3, 8, 16])
def test_group_kernel_several_vectors(library, rng, k):
    """SpMM: k vectors (3 padded to 4), x in slices and whole, float16 and float32."""
    for dtype in ("float16", "float32"):
        dense = sparse_matrix(rng, (37, 700), 0.4, dtype)
        cs = fmt.from_dense(dense, 8, dtype)
        x = vectors(rng, 700, k, dtype)
        for lanes, slice_tiles in ((2, cs.tiles_per_row), (16, 4)):
            y = group_product(library, cs, x, 8, lanes, slice_tiles, 2)
            check(y, dense, x, dtype, f"{dtype} k {k} lanes {lanes} slice {slice_tiles}")


def test_group_kernel_odd_and_tiny_shapes(library, rng):
    """m = 1, n = 1, n below a tile, exactly one tile, one column past it; very sparse
    rows (shorter than a lane's ring) and dense ones (longer)."""
    for (m, n), density in itertools.product([(1, 1), (1, 300), (3, 7), (5, 256), (9, 257)], (1.0, 0.05)):
        dense = sparse_matrix(rng, (m, n), density, "float16")
        cs = fmt.from_dense(dense, 8, "float16")
        for lanes in (1, 8):
            x = vectors(rng, n, 1, "float16")
            check(
                group_product(library, cs, x, 8, lanes, cs.tiles_per_row, 1),
                dense,
                x,
                "float16",
                f"{m}x{n} density {density} lanes {lanes}",
            )


def test_pruned_matrix_at_llm_sparsity(library, rng):
    """Magnitude pruning at 66 % with vec 8, as the job does, then the default chunk."""
    dense = rng.standard_normal((64, 1024)).astype(np.float16)
    cs = fmt.prune(dense, 0.66, 8, "float16")
    x = vectors(rng, 1024, 1, "float16")
    check(group_product(library, cs, x, 8, 8, cs.tiles_per_row, 1), cs.to_dense(), x, "float16", "pruned 66 %")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_split4_kernel_every_vec(library, rng, dtype):
    """The appendix kernel: 4 threads per row, 64 rows a block; m not a multiple of 64,
    grids of one block (several passes) and one per 64 rows."""
    m, n = 70, 1100
    dense = sparse_matrix(rng, (m, n), 0.35, dtype)
    for vec, grid in itertools.product((4, 8, 16), (1, 2)):
        cs = fmt.from_dense(dense, vec, dtype)
        x = vectors(rng, n, 1, dtype)
        y = np.full(m * fmt.STORAGE[dtype].itemsize, 0xFF, np.uint8).view(fmt.STORAGE[dtype])
        args = (
            cs.values,
            cs.indices,
            cs.row_ptr,
            cs.block_increments,
            np.int32(m),
            np.int32(n),
            np.int32(cs.padded_tiles),
            x,
            y,
        )
        emulator.launch(library, f"cs256_split4_{TAGS[dtype]}_v{vec}", grid, SPLIT4_BLOCK, 0, args)
        check(y, dense, x, dtype, f"split4 vec {vec} grid {grid}")


def test_read_floor_reads_every_byte_once(library, rng):
    """cs256_read_rows (the benchmark's read floor): the XOR of what the blocks read equals
    the reference's checksum of the values, indices and tile counts, with spans that start
    and end off 16-byte boundaries (vec 4, uint8 indices) and blocks of one or several rows."""
    for (m, n), vec, dtype in itertools.product([(45, 1300), (1, 300), (9, 257)], (4, 16), ("float16", "float32")):
        cs = fmt.from_dense(sparse_matrix(rng, (m, n), 0.3, dtype), vec, dtype)
        for rows_per_block in (1, 4):
            grid, block = -(-m // rows_per_block), 64
            partials = np.zeros(grid * (block // 32), np.uint32)  # one per warp
            args = (
                cs.values,
                cs.indices,
                cs.row_ptr,
                cs.block_increments,
                np.int32(m),
                np.int32(cs.padded_tiles),
                np.int32(cs.itemsize),
                np.int32(rows_per_block),
                partials,
            )
            emulator.launch(library, "cs256_read_rows", grid, block, 0, args)
            assert int(np.bitwise_xor.reduce(partials)) == ref.read_checksum(cs), (
                f"{m}x{n} vec {vec} {dtype}, {rows_per_block} rows per block"
            )
