"""The bidiagonalization kernels of gpu/svd/svd.cu, run on the CPU: the real source
compiled by g++ with the CUDA emulation of tests/gpu/emulator/emu.h (a std::thread per
CUDA thread, barriers for __syncthreads and the shuffles), launched panel by panel as
gpu/svd/cuda.py's _PanelSteps launches them (the rank-2L update between panels, a cuBLAS
GEMM there, is NumPy's here), against reference.bidiagonalize.

It checks in CI what the GPU tests check on a device: the panel's first column read from
the device, the grids sized for the first panel with the blocks past a later panel's
trailing matrix returning at once, each step's last block (the arrival counter, and its
reset for the next launch) making the next reflector, partial last panels, and m > n.
The scratch vectors row, t and s and the blocks' parts start as NaN, so a step that reads an entry before it is
written fails here. Skipped without g++ 11+.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu.svd import reference as ref
from gpu.svd.params import make_matrix
from tests.gpu.emulator import library as emulator

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "emulator" / "svd_emu.cpp"
SOURCE = HERE.parents[2] / "gpu" / "svd" / "svd.cu"
STEP_THREADS = 1024  # gpu/svd/cuda.py
SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


@pytest.fixture(scope="module")
def library(request, tmp_path_factory):
    work = tmp_path_factory.mktemp("svd-source")
    source = emulator.with_dynamic_shared(SOURCE, work)
    return emulator.load(emulator.build_in_pytest(request, tmp_path_factory, DRIVER, {"SVD_SOURCE": source}))


@pytest.fixture()
def seed() -> int:
    value = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {value}")  # shown on failure, to replay it
    return value


def bidiagonalize_on_emulator(library, a: np.ndarray, nb: int):
    """cuda.bidiagonalize's launches on the emulator: (d, e, left, tau_left, right,
    tau_right), the reflectors as Reflectors holds them."""
    m, n = a.shape
    dtype = a.dtype
    suffix, item, width = SUFFIX[dtype], dtype.itemsize, 2 * nb
    work = np.asfortranarray(a.copy())
    uw, zv = np.zeros((m, width), dtype, order="F"), np.zeros((n, width), dtype, order="F")
    d, e = np.zeros(n, dtype), np.zeros(max(n - 1, 1), dtype)
    tau_left, tau_right = np.zeros(n, dtype), np.zeros(n, dtype)
    row, t, s = np.full(n, np.nan, dtype), np.full(width, np.nan, dtype), np.full(width, np.nan, dtype)
    panel_start = np.zeros(1, np.int32)
    left_grid, right_grid = max(1, -(-(n - 1) // 32)), max(1, -(-(m - 1) // 32))
    blocks = max(left_grid, right_grid)
    parts = (np.full(blocks, np.nan, dtype), np.full(blocks, np.nan, dtype), np.full(blocks * width, np.nan, dtype))
    left_arrivals, right_arrivals = np.zeros(1, np.uint32), np.zeros(1, np.uint32)
    left, right = np.zeros((m, n), dtype, order="F"), np.zeros((n, n), dtype, order="F")
    i32 = np.int32
    dims = (i32(m), i32(n), i32(nb), i32(m), i32(m), i32(n), panel_start)
    panel = (work, uw, zv, *dims)
    for p in range(0, n, nb):
        assert panel_start[0] == p
        uw[:] = 0
        zv[:] = 0
        emulator.launch(library, f"first_column_{suffix}", 1, STEP_THREADS, 0, (work, uw, *dims, tau_left, d, t))
        for i in range(nb):
            emulator.launch(
                library,
                f"left_step_{suffix}",
                left_grid,
                STEP_THREADS,
                2 * width * item,
                (*panel, i32(i), tau_left, t, row, tau_right, e, s, *parts, left_arrivals),
            )
            emulator.launch(
                library,
                f"right_step_{suffix}",
                right_grid,
                STEP_THREADS,
                (2 * width + STEP_THREADS) * item,
                (*panel, i32(i), tau_right, s, tau_left, d, t, *parts, right_arrivals),
            )
            assert left_arrivals[0] == 0 and right_arrivals[0] == 0, "the last block resets the arrival counter"
        emulator.launch(library, "next_panel_kernel", 1, 1, 0, (panel_start, i32(nb)))
        size = min(nb, n - p)
        end = p + size
        work[end:, end:] -= uw[end:] @ zv[end:].T
        left[:, p:end] = uw[:, :size]
        right[:, p:end] = zv[:, nb : nb + size]
    return d, e[: n - 1], left, tau_left, right, tau_right


@pytest.mark.parametrize(
    ("m", "n", "nb", "dtype"),
    [
        (70, 50, 8, np.float64),  # m > n, a partial last panel (50 = 6 x 8 + 2), 3 row blocks
        (33, 17, 4, np.float32),  # 32 rows after the first: one full row block, then fewer
        (9, 9, 9, np.float32),  # one square panel: the last column's reflector from the last step
        (20, 20, 7, np.float64),  # 2 nb = 14 columns of [U W]: the parts summed in groups of 73
    ],
)
def test_bidiagonalization_matches_the_reference(library, m, n, nb, dtype, seed):
    """float64: d and e as the reference's to rounding. Both dtypes: B has A's singular
    values, and the reflectors rebuild A as Q B P^T, to the dtype's rounding (float32
    entries of B may differ from the float32 reference's by more: each is a chain of
    rounded reflections, and the two sum in different orders; B's singular values do not)."""
    a = make_matrix(m, n, dtype, seed, "gaussian")
    d, e, left, tau_left, right, tau_right = bidiagonalize_on_emulator(library, a, nb)
    tolerance = 1e-12 if dtype == np.float64 else 1e-5  # of the largest singular value
    exact = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    scale = tolerance * exact[0]
    if dtype == np.float64:
        _, d_ref, e_ref, _ = ref.bidiagonalize(a, nb, "none")
        np.testing.assert_allclose(d, d_ref, atol=scale, err_msg=f"d, seed {seed}")
        np.testing.assert_allclose(e, e_ref, atol=scale, err_msg=f"e, seed {seed}")
    b = np.diag(d.astype(np.float64)) + np.diag(e.astype(np.float64), 1)
    np.testing.assert_allclose(np.linalg.svd(b, compute_uv=False), exact, atol=scale, err_msg=f"values, seed {seed}")

    # The reflectors rebuild A: Q B P^T with Q = H_0 ... H_{n-1}, P = G_0 ... G_{n-2}.
    q, p_mat = np.eye(m, dtype=np.float64), np.eye(n, dtype=np.float64)
    for c in range(n):
        u = np.zeros(m)
        u[c:] = left[c:, c]
        q = q @ (np.eye(m) - tau_left[c] * np.outer(u, u))
        if c < n - 1:
            v = np.zeros(n)
            v[c + 1 :] = right[c + 1 :, c]
            p_mat = p_mat @ (np.eye(n) - tau_right[c] * np.outer(v, v))
    rebuilt = q[:, :n] @ b @ p_mat.T
    np.testing.assert_allclose(rebuilt, a, atol=scale * np.sqrt(m * n), err_msg=f"Q B P^T, seed {seed}")


def test_the_last_block_to_arrive_may_be_any_block(library, seed, monkeypatch):
    """The emulator runs a grid's blocks in order, so the last to arrive is the highest;
    here the first, block 0 (which holds x_0 = alpha), finishes each step instead."""
    monkeypatch.setenv("EMU_BLOCK_ORDER", "reverse")
    a = make_matrix(70, 50, np.float64, seed, "gaussian")
    d, e, *_ = bidiagonalize_on_emulator(library, a, 8)
    _, d_ref, e_ref, _ = ref.bidiagonalize(a, 8, "none")
    scale = 1e-12 * float(np.abs(a).max())
    np.testing.assert_allclose(d, d_ref, atol=scale, err_msg=f"d, seed {seed}")
    np.testing.assert_allclose(e, e_ref, atol=scale, err_msg=f"e, seed {seed}")


def test_exactly_zero_trailing_columns_leave_identity_reflectors(library, seed):
    """Past a matrix's first three columns, the rest exactly zero: each later reflector is
    made from an exactly zero vector (the norm's rest == 0 branch of the blocks' parts),
    tau 0, and d, e vanish there, as in the reference."""
    rng = np.random.default_rng(seed)
    a = np.zeros((40, 12))
    a[:, :3] = rng.standard_normal((40, 3))
    d, e, _, tau_left, _, tau_right = bidiagonalize_on_emulator(library, a, 5)
    _, d_ref, e_ref, _ = ref.bidiagonalize(a, 5, "none")
    scale = float(np.abs(a).max()) * 1e-12
    np.testing.assert_allclose(d, d_ref, atol=scale, err_msg=f"seed {seed}")
    np.testing.assert_allclose(e, e_ref, atol=scale, err_msg=f"seed {seed}")
    assert np.all(d[3:] == 0) and np.all(e[3:] == 0) and np.all(tau_left[3:] == 0) and np.all(tau_right[3:11] == 0), (
        f"seed {seed}"
    )
