"""Golub-Reinsch SVD on the GPU (Lahabar & Narayanan 2009), the same steps as
gpu/svd/reference.py, on a lease of the device pool:

    main stream   upload -> bidiagonalization (svd.cu, a CUDA graph a panel + GEMM) -> bulge chase, chunk by chunk
    side stream                 wait -> Q and P^T from the reflectors (GEMM) -> rotations of each chunk

1. Bidiagonalization: per column two svd.cu kernels, left_step (A^T u, a warp per column)
   and right_step (A v, a block per 32 rows), each ending with the next reflector made by
   its last block; the BLAS-2 half that moves (2/3) n^3 words is theirs. Each panel of L
   columns ends with one rank-2L cuBLAS GEMM. A panel's launches are the same for every
   panel (the kernels read the panel's first column from the device), so they are
   captured once in a CUDA graph and replayed: one host call a panel instead of six
   launches a column, whose host time (12-17 us each) set the pace below a few thousand
   columns. Nothing goes back to the host.
2. Diagonalization: one warp runs the scalar bulge chase of reference.bidiagonal_svd
   (the paper runs it on the host; here it avoids a copy per sweep), in float64 whatever
   the matrix's dtype (CHASE_DTYPE): the sweep itself is a chain of dependent operations,
   the block search and the convergence test are split over the 32 lanes. It logs each
   sweep's rotations. The log, rounded to the vectors' dtype, is applied to U and V^T on
   the side stream in batches of up to SWEEPS_PER_BATCH sweeps, each element read and
   written once per batch, while the chase goes on with the next chunk of sweeps.
3. Signs and the descending order are fixed on the host's copy of s and applied to the
   vectors by a gather on the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import cupy
import numpy as np

from gpu import kernels
from gpu.svd import blas
from gpu.svd.params import SvdParams
from gpu.svd.reference import CHASE_TOLERANCE, check_matrix

SOURCE = Path(__file__).with_name("svd.cu")
_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}

# Mirrored from svd.cu.
STATE_INTS = 10
STATE_SWEEPS, STATE_STATUS, STATE_LOGGED, STATE_CHASED, STATE_TESTED = 1, 5, 6, 8, 9
STATUS_DONE, STATUS_NO_CONVERGENCE = 2, 3
SWEEPS_PER_BATCH = {np.dtype(np.float32): 16, np.dtype(np.float64): 8}  # sweeps per pass of apply_sweeps

# The bidiagonalization's blocks (svd.cu's STEP_THREADS): left_step and right_step take 32
# columns (a warp each) or 32 rows (its warps splitting the columns) a block, which
# summarises their 32 entries of the next reflector's vector; a panel's 2 nb columns of
# [U W] must not outnumber a block's threads (params.BLOCK_SIZE_MAX: nb <= 512).
STEP_THREADS = 1024
APPLY_THREADS = 64  # columns per block when applying rotations: few columns, many SMs
SWEEPS_PER_CHUNK = 128  # sweeps the chase logs before the host hands them to the side stream
# Sweeps the chase runs at once, pipelined on the lanes of its warp, each with its own
# shift (svd.cu, "Multishift"); 1 is the classic one sweep at a time of the reference.
# Float64 matrices take 16: each sweep adds its rounding errors, and more shifts at once
# cost more sweeps (BENCHMARKS.md, "Figures behind choices in the code").
MULTISHIFT = {np.dtype(np.float32): 32, np.dtype(np.float64): 16}
# The precision of the bulge chase for both input dtypes (reference.CHASE_DTYPE; svd.cu,
# "bidiagonal QR", says what a float32 chase loses), and its kernel for each: float64
# matrices need the exact rotations (svd.cu, "givens").
CHASE_DTYPE = np.dtype(np.float64)
CHASE_KERNEL = {np.dtype(np.float32): "bidiagonal_qr_f64_fast", np.dtype(np.float64): "bidiagonal_qr_f64_exact"}


class NoConvergence(np.linalg.LinAlgError):
    """The bidiagonal QR iteration did not converge in its sweep budget."""


def _k(name: str, dtype: np.dtype) -> cupy.RawKernel:
    return kernels.kernel(SOURCE, f"{name}_{_SUFFIX[np.dtype(dtype)]}")


def _at(array: cupy.ndarray, offset: int = 0) -> np.uint64:
    """The address of element `offset` of a contiguous array, as a kernel argument."""
    return np.uint64(array.data.ptr + offset * array.dtype.itemsize)


# ---------------------------------------------------------------- bidiagonalization --


@dataclass
class Reflectors:
    """The Householder vectors of a bidiagonalization, column-major: left (m, n) holds u_c
    in rows c.. of column c (u_c[0] = 1), right (n, n) holds v_c in rows c+1.. of column c;
    tau_left, tau_right (n,). nb is the panel width they were made with."""

    left: cupy.ndarray
    tau_left: cupy.ndarray
    right: cupy.ndarray
    tau_right: cupy.ndarray
    nb: int


class _PanelSteps:
    """The launches of one panel of the bidiagonalization (svd.cu, "bidiagonalization"):
    zero [U W] and [Z V], the reflector of the panel's first column, left_step and
    right_step for each of its nb columns, then the move to the next panel. They are the
    same for every panel (the kernels read the panel's first column from the device), so
    `bidiagonalize` captures them once in a CUDA graph. Grids are sized for the first
    panel; blocks past a later panel's trailing matrix return at once."""

    def __init__(self, work: cupy.ndarray, nb: int):
        m, n = work.shape
        dtype = work.dtype
        self.nb, width, item = nb, 2 * nb, dtype.itemsize
        self.uw = cupy.zeros((m, width), dtype, order="F")  # [U | W] of the panel
        self.zv = cupy.zeros((n, width), dtype, order="F")  # [Z | V] of the panel
        self.d = cupy.zeros(n, dtype)
        self.e = cupy.zeros(max(n - 1, 1), dtype)
        self.tau_left, self.tau_right = cupy.zeros(n, dtype), cupy.zeros(n, dtype)
        self.panel_start = cupy.zeros(1, np.int32)
        if width > STEP_THREADS:
            raise ValueError(f"a panel of {nb} columns: at most {STEP_THREADS // 2}")
        row, t, s = kernels.empty(n, dtype), kernels.empty(width, dtype), kernels.empty(width, dtype)
        left_grid, right_grid = max(1, kernels.div_up(n - 1, 32)), max(1, kernels.div_up(m - 1, 32))
        blocks = max(left_grid, right_grid)
        # each block's summary of the entries of x it made (svd.cu, "reflectors from the blocks' parts")
        parts = (kernels.empty(blocks, dtype), kernels.empty(blocks, dtype), kernels.empty(blocks * width, dtype))
        left_arrivals, right_arrivals = cupy.zeros(1, np.uint32), cupy.zeros(1, np.uint32)
        i32 = np.int32
        dims = (i32(m), i32(n), i32(nb), i32(m), i32(m), i32(n), self.panel_start)  # svd.cu's PANEL_PARAMETERS
        self._first_column = _k("first_column", dtype), (work, self.uw, *dims, self.tau_left, self.d, t)
        # left_step, right_step: (kernel, grid, dynamic shared bytes, the arguments after
        # (A, UW, ZV, the panel's dims and the column i))
        self._panel = (work, self.uw, self.zv, *dims)
        self._steps = (
            (
                _k("left_step", dtype),
                (left_grid,),
                2 * width * item,
                (self.tau_left, t, row, self.tau_right, self.e, s, *parts, left_arrivals),
            ),
            (
                _k("right_step", dtype),
                (right_grid,),
                (2 * width + STEP_THREADS) * item,
                (self.tau_right, s, self.tau_left, self.d, t, *parts, right_arrivals),
            ),
        )
        self._next_panel = kernels.kernel(SOURCE, "next_panel_kernel")

    def launch(self) -> None:
        """One panel's launches on the current stream."""
        self.uw.fill(0)
        self.zv.fill(0)
        first_column, arguments = self._first_column
        first_column((1,), (STEP_THREADS,), arguments)
        for i in range(self.nb):
            for kernel, grid, shared, after in self._steps:
                kernel(grid, (STEP_THREADS,), (*self._panel, np.int32(i), *after), shared_mem=shared)
        self._next_panel((1,), (1,), (self.panel_start, np.int32(self.nb)))


def _replayable(launch, stream: cupy.cuda.Stream):
    """A function that runs `launch`'s work on `stream`: a CUDA graph of it, captured once
    (one host call replays all its launches), or `launch` itself on the legacy default
    stream, which cannot capture."""
    if stream.ptr == 0:
        return launch
    graph, _ = kernels.capture(launch, stream)
    return lambda: graph.launch(stream)


def bidiagonalize(
    a: cupy.ndarray, block_size: int = 32, vectors: bool = True
) -> tuple[cupy.ndarray, cupy.ndarray, Reflectors | None]:
    """Upper bidiagonal B = Q^T A P of a device (m, n) matrix with m >= n, on the current
    stream: (d (n,), e (max(n-1, 1),), reflectors or None). `a` is not modified."""
    m, n = a.shape
    if m < n:
        raise ValueError(f"bidiagonalize needs m >= n, got {m} x {n}: pass the transpose")
    dtype = a.dtype
    work = cupy.array(a, dtype=dtype, order="F", copy=True)
    nb = min(block_size, n)
    steps = _PanelSteps(work, nb)
    uw, zv = steps.uw, steps.zv
    left = cupy.zeros((m, n), dtype, order="F") if vectors else None
    right = cupy.zeros((n, n), dtype, order="F") if vectors else None
    one_panel = _replayable(steps.launch, cupy.cuda.get_current_stream())
    for p in range(0, n, nb):
        panel = min(nb, n - p)
        one_panel()
        t = p + panel
        # the rank-2L update of the trailing block: A[t:, t:] -= [U W][t:] [Z V][t:]^T
        blas.gemm("N", "T", m - t, n - t, 2 * nb, -1.0, uw, t, m, zv, t, n, 1.0, work, t + t * m, m)
        if left is not None and right is not None:  # with vectors
            left[:, p : p + panel] = uw[:, :panel]
            right[:, p : p + panel] = zv[:, nb : nb + panel]
    reflectors = Reflectors(left, steps.tau_left, right, steps.tau_right, nb) if vectors else None
    return steps.d, steps.e, reflectors


def _apply_reflectors(target: cupy.ndarray, vectors: cupy.ndarray, taus: cupy.ndarray, first_row: int, nb: int) -> None:
    """target <- H_0 H_1 ... target for the reflectors H_c = I - tau_c y_c y_c^T whose vectors
    are the columns of `vectors` (rows, k), column c living in rows first_row + c.. (a column-
    major target (rows, cols) is updated from its column first_row + c on, as in
    reference.bidiagonalize). Panels of nb columns, last first, each as I - Y T Y^T: three GEMMs."""
    rows, cols = target.shape
    k = vectors.shape[1]
    dtype = target.dtype
    panels = list(range(0, k, nb))
    grams = cupy.zeros((len(panels), nb, nb), dtype)  # each panel's Y^T Y, column-major
    padded_taus = cupy.zeros(len(panels) * nb, dtype)
    padded_taus[:k] = taus[:k]
    for index, p in enumerate(panels):
        panel, top = min(nb, k - p), first_row + p
        blas.gemm(
            "T",
            "N",
            panel,
            panel,
            rows - top,
            1.0,
            vectors,
            top + p * rows,
            rows,
            vectors,
            top + p * rows,
            rows,
            0.0,
            grams,
            index * nb * nb,
            nb,
        )
    factors = cupy.empty_like(grams)
    _k("wy_factor", dtype)((len(panels),), (max(32, min(nb, 1024)),), (grams, padded_taus, np.int32(nb), factors))
    scratch = cupy.empty((2, nb, cols), dtype)  # Y^T X and T Y^T X, column-major (nb, cols)
    left, right = scratch[0], scratch[1]
    for index, p in reversed(list(enumerate(panels))):
        panel, top = min(nb, k - p), first_row + p
        if top >= rows:
            continue
        span = cols - top  # the columns of the target this panel touches (as in the reference)
        if span <= 0:
            continue
        y = top + p * rows
        blas.gemm(
            "T", "N", panel, span, rows - top, 1.0, vectors, y, rows, target, top + top * rows, rows, 0.0, left, 0, nb
        )
        blas.gemm("N", "N", panel, span, panel, 1.0, factors, index * nb * nb, nb, left, 0, nb, 0.0, right, 0, nb)
        blas.gemm(
            "N", "N", rows - top, span, panel, -1.0, vectors, y, rows, right, 0, nb, 1.0, target, top + top * rows, rows
        )


def accumulate(reflectors: Reflectors, m: int, n: int, full: bool) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Q (m, n or m) and P (n, n) from the reflectors, both column-major, on the current
    stream; returned as their row-major transposes ut = Q^T and vt = P^T (views)."""
    dtype = reflectors.left.dtype
    q = cupy.zeros((m, m if full else n), dtype, order="F")
    diagonal = cupy.arange(min(q.shape))
    q[diagonal, diagonal] = 1
    _apply_reflectors(q, reflectors.left, reflectors.tau_left, 0, reflectors.nb)
    p = cupy.zeros((n, n), dtype, order="F")
    p[cupy.arange(n), cupy.arange(n)] = 1
    if n > 1:
        _apply_reflectors(p, reflectors.right, reflectors.tau_right, 1, reflectors.nb)
    return q.T, p.T


# ------------------------------------------------------------------ diagonalization --


@dataclass
class _Log:
    sweeps: cupy.ndarray  # (SWEEPS_PER_CHUNK, 4) int32: first pair, count, step, offset
    rot_vt: cupy.ndarray  # (capacity, 2) CHASE_DTYPE: (c, s) per rotation, for the rows of V^T
    rot_u: cupy.ndarray  # the same for the rows of U^T
    vt_rounded: cupy.ndarray | None  # rot_vt in the vectors' dtype (None: the same dtype)
    u_rounded: cupy.ndarray | None

    def in_dtype_of_vectors(self, headers: np.ndarray) -> tuple[cupy.ndarray, cupy.ndarray]:
        """The rotations of the logged sweeps (headers) in the vectors' dtype, on the
        current stream: (for V^T, for U^T)."""
        if self.vt_rounded is None or self.u_rounded is None:
            return self.rot_vt, self.rot_u
        used = int(np.max(headers[:, 3] + headers[:, 1]))
        self.vt_rounded[:used] = self.rot_vt[:used]
        self.u_rounded[:used] = self.rot_u[:used]
        return self.vt_rounded, self.u_rounded


def _batches(headers: np.ndarray, per_batch: int):
    """Consecutive sweeps of one direction, at most `per_batch`, whose rows overlap enough
    that one pass over their union is worth it: (start, stop, first_row, elements, step)."""

    def rows_of(h):
        first, count, step = int(h[0]), int(h[1]), int(h[2])
        return (first, first + count) if step > 0 else (first - count + 1, first + 1)

    start = 0
    while start < len(headers):
        step = int(headers[start, 2])
        low, high = rows_of(headers[start])
        widest = high - low
        stop = start + 1
        while stop < len(headers) and stop - start < per_batch and int(headers[stop, 2]) == step:
            lo, hi = rows_of(headers[stop])
            new_low, new_high = min(low, lo), max(high, hi)
            if new_high - new_low > 2 * max(widest, hi - lo) + 8:
                break
            low, high, widest = new_low, new_high, max(widest, hi - lo)
            stop += 1
        yield start, stop, low, high - low + 1, step
        start = stop


def _apply_log(log: _Log, headers: np.ndarray, ut: cupy.ndarray | None, vt: cupy.ndarray | None) -> None:
    """Apply the logged sweeps to the rows of ut and vt (row-major), on the current stream."""
    rot_vt, rot_u = log.in_dtype_of_vectors(headers)
    apply = _k("apply_sweeps", rot_vt.dtype)
    vt_width = 0 if vt is None else vt.shape[1]
    ut_width = 0 if ut is None else ut.shape[1]
    null = np.uint64(0)
    grid_x = (max(vt_width, ut_width) + APPLY_THREADS - 1) // APPLY_THREADS
    for start, stop, first_row, elements, step in _batches(headers, SWEEPS_PER_BATCH[rot_vt.dtype]):
        apply(
            (grid_x, 2),
            (APPLY_THREADS,),
            (
                null if vt is None else vt,
                np.int32(vt_width),
                null if ut is None else ut,
                np.int32(ut_width),
                np.int64(vt_width),
                np.int64(ut_width),
                np.int32(first_row),
                np.int32(elements),
                np.int32(step),
                _at(log.sweeps, 4 * start),
                np.int32(stop - start),
                rot_vt,
                rot_u,
            ),
        )


def diagonalize(
    d: cupy.ndarray,
    e: cupy.ndarray,
    ut: cupy.ndarray | None,
    vt: cupy.ndarray | None,
    side: cupy.cuda.Stream | None = None,
    max_sweeps: int | None = None,
    counts: dict[str, int] | None = None,
) -> cupy.ndarray:
    """Singular values of the upper bidiagonal (d (n,), e (n-1,)), descending and non-negative
    (device (n,), dtype of d), computed in CHASE_DTYPE. The left and right rotations go to the first n
    rows of ut = U^T and to the rows of vt = V^T (row-major, C-contiguous), in place, on
    `side` (default: the current stream), which is joined back before returning. The chase
    runs on the current stream. Raises NoConvergence after max_sweeps (default 30 n) sweeps.
    counts, if given, gets the numbers of sweeps, of rotations chased and of steps of the
    convergence tests, the GPU clock ticks the chase spent finding blocks, testing them and
    sweeping, and the milliseconds of the chase's and the rotations' kernels."""
    n = d.shape[0]
    dtype = d.dtype  # of the values returned and of the vectors
    d, e = d.astype(CHASE_DTYPE), e.astype(CHASE_DTYPE)  # copies: the chase works in place
    max_sweeps = 30 * n if max_sweeps is None else max_sweeps
    main = cupy.cuda.get_current_stream()
    side = main if side is None else side
    vectors = ut is not None or vt is not None
    shared = (2 * n + 1) * CHASE_DTYPE.itemsize  # d, e with one entry to spare, a scratch slot
    if shared > kernels.max_shared_bytes():
        raise ValueError(f"the bidiagonal of {n} columns does not fit in shared memory ({shared} bytes)")
    if n > 1:
        state = cupy.zeros(STATE_INTS, np.int32)
        thresh = cupy.zeros(1, CHASE_DTYPE)
        capacity = SWEEPS_PER_CHUNK * max(n - 1, 1)  # a sweep has at most n - 1 rotations
        rounded = dtype != CHASE_DTYPE
        logs = [
            _Log(
                cupy.empty((SWEEPS_PER_CHUNK, 4), np.int32),
                cupy.empty((capacity, 2), CHASE_DTYPE),
                cupy.empty((capacity, 2), CHASE_DTYPE),
                cupy.empty((capacity, 2), dtype) if rounded else None,
                cupy.empty((capacity, 2), dtype) if rounded else None,
            )
            for _ in range(2 if vectors else 0)
        ]
        applied: list[cupy.cuda.Event | None] = [None, None]
        chase = kernels.kernel(SOURCE, CHASE_KERNEL[dtype])
        cycles = cupy.zeros(3, np.int64) if counts is not None else None
        null = np.uint64(0)
        spans: dict[str, list[tuple[cupy.cuda.Event, cupy.cuda.Event]]] = {"chase": [], "rotations": []}  # for `counts`

        def chase_chunk(chunk: int) -> None:
            """Launch the chase's next chunk of sweeps, logging into buffer chunk % 2."""
            buffer = chunk % 2
            log = logs[buffer] if vectors else None
            if applied[buffer] is not None:
                main.wait_event(applied[buffer])  # the side stream is done with this buffer
            chase_start = main.record()
            chase(
                (1,),
                (32,),
                (
                    d,
                    e,
                    np.int32(n),
                    state,
                    thresh,
                    null if log is None else log.sweeps,
                    np.int32(SWEEPS_PER_CHUNK),
                    null if log is None else log.rot_vt,
                    null if log is None else log.rot_u,
                    np.int32(capacity),
                    np.int32(max_sweeps),
                    np.int32(MULTISHIFT[dtype]),
                    np.float64(CHASE_TOLERANCE[dtype]),
                    null if cycles is None else cycles,
                ),
                shared_mem=shared,
            )
            spans["chase"].append((chase_start, main.record()))

        chunk = 0
        chase_chunk(chunk)
        while True:
            status = state.get()  # waits for this chunk of the chase
            if status[STATE_STATUS] == STATUS_NO_CONVERGENCE:
                side.synchronize()  # the rotations in flight are done with U, V^T and the logs
                raise NoConvergence(f"bidiagonal QR did not converge in {max_sweeps} sweeps")
            log = logs[chunk % 2] if vectors else None
            logged = int(status[STATE_LOGGED])
            headers = log.sweeps[:logged].get() if log is not None and logged else None
            done = status[STATE_STATUS] == STATUS_DONE
            if not done:
                chase_chunk(chunk + 1)  # the chase goes on while the host batches this chunk's rotations
            if log is not None and headers is not None:
                chased = spans["chase"][chunk][1]
                with side:
                    side.wait_event(chased)
                    apply_start = side.record()
                    _apply_log(log, headers, ut, vt)
                    applied[chunk % 2] = side.record()
                    spans["rotations"].append((apply_start, applied[chunk % 2]))
            if done:
                break
            chunk += 1
        if counts is not None and cycles is not None:
            scan, test, chased = (int(c) for c in cycles.get())
            counts.update(
                sweeps=int(status[STATE_SWEEPS]),
                rotations=int(status[STATE_CHASED]),
                test_steps=int(status[STATE_TESTED]),
                chunks=chunk + 1,
                scan_cycles=scan,
                test_cycles=test,
                sweep_cycles=chased,
            )
        if side is not main:
            main.wait_event(side.record())
        if counts is not None:
            main.synchronize()
            for name, pairs in spans.items():  # kernel time of the chase and of the rotations, ms
                counts[f"{name}_ms"] = sum(cupy.cuda.get_elapsed_time(start, stop) for start, stop in pairs)

    # signs and order, as at the end of reference.bidiagonal_svd
    values = d.get()
    negative = values < 0
    values = np.abs(values)
    order = np.argsort(-values, kind="stable")
    if vt is not None and (negative.any() or np.any(order != np.arange(n))):
        sign = cupy.asarray(np.where(negative, -1, 1).astype(dtype)[order])
        gather = cupy.asarray(order)
        vt[:] = vt[gather] * sign[:, None]
    if ut is not None and np.any(order != np.arange(n)):
        gather = cupy.asarray(order)
        ut[:n] = ut[gather]
    return cupy.asarray(values[order].astype(dtype))


# ------------------------------------------------------------------------- the SVD --


# A matrix at least this many times taller than wide is first reduced to its n x n R
# (A = QR; the SVD of R; U = Q U_R): the bidiagonalization and the rotations then work
# on n rows instead of m (LAPACK's xGESVD switches at about 1.6; ours timed by bench/svd.py).
QR_FIRST_RATIO = 2


def svd_on_device(a: cupy.ndarray, params: SvdParams, lease, timings: dict[str, float], counts: dict[str, int]):
    """A = U diag(s) V^T of a device (m, n) float32/float64 matrix, on the lease's streams
    (the caller has entered the lease's device and main stream): device (u, s, vt) in the
    dtype of `a`, u (m, k) and vt (k, n) (k = min(m, n); m x m and n x n with
    full_matrices), u and vt None without compute_uv. `a` is not modified. timings gets
    the milliseconds of each phase (CUDA events), counts those of `diagonalize`."""
    main, side = lease.stream, lease.side_stream
    m, n = a.shape
    matrix = a.T if m < n else a  # a wide matrix: the SVD of its transpose
    rows, cols = matrix.shape
    marks = {name: cupy.cuda.Event() for name in ("start", "qr", "bidiagonalized", "diagonalized", "end")}
    marks["start"].record(main)
    q = None
    qr_first = rows >= QR_FIRST_RATIO * cols and not params.full_matrices
    if qr_first:
        if params.compute_uv:
            q, matrix = cupy.linalg.qr(matrix, mode="reduced")
        else:
            matrix = cupy.linalg.qr(matrix, mode="r")
        matrix = cupy.triu(matrix)  # R, (cols, cols)
        rows = cols
    marks["qr"].record(main)
    d, e, reflectors = bidiagonalize(matrix, params.block_size, vectors=params.compute_uv)
    marks["bidiagonalized"].record(main)
    ut = vt = None
    if reflectors is not None:
        with side:
            side.wait_event(marks["bidiagonalized"])
            ut, vt = accumulate(reflectors, rows, cols, params.full_matrices)
            accumulated = side.record()
    s = diagonalize(d, e[: cols - 1] if cols > 1 else e[:0], ut, vt, side=side, counts=counts)
    marks["diagonalized"].record(main)
    u = None
    if ut is not None and vt is not None:
        u = ut.T if q is None else q @ ut.T  # U = Q U_R
        if m < n:  # A^T = U S V^T
            u, vt = vt.T, u.T
        u, vt = cupy.ascontiguousarray(u), cupy.ascontiguousarray(vt)
    marks["end"].record(main)
    marks["end"].synchronize()
    if qr_first:
        timings["qr"] = cupy.cuda.get_elapsed_time(marks["start"], marks["qr"])
    timings["bidiagonalization"] = cupy.cuda.get_elapsed_time(marks["qr"], marks["bidiagonalized"])
    if reflectors is not None:
        timings["accumulation"] = cupy.cuda.get_elapsed_time(marks["bidiagonalized"], accumulated)
    timings["diagonalization"] = cupy.cuda.get_elapsed_time(marks["bidiagonalized"], marks["diagonalized"])
    timings["vectors"] = cupy.cuda.get_elapsed_time(marks["diagonalized"], marks["end"])
    timings["total"] = cupy.cuda.get_elapsed_time(marks["start"], marks["end"])
    return u, s, vt


def svd(
    a: np.ndarray,
    params: SvdParams,
    lease,
    timings: dict[str, float] | None = None,
    statistics: dict[str, int] | None = None,
):
    """A = U diag(s) V^T on the lease's device: (u, s, vt) as host arrays in the dtype of
    `a`, shaped as reference.svd returns them (u, vt None without compute_uv).
    timings, if given, gets the milliseconds of each phase (`svd_on_device`, and the
    upload and download); statistics the counts of the bulge chase (see `diagonalize`)."""
    a = check_matrix(a)
    timings = {} if timings is None else timings
    counts: dict[str, int] = {}
    with cupy.cuda.Device(lease.device), lease.stream:
        start = time.perf_counter()
        device_a = cupy.asarray(a)
        lease.stream.synchronize()
        timings["upload"] = (time.perf_counter() - start) * 1000
        u, s, vt = svd_on_device(device_a, params, lease, timings, counts)
        start = time.perf_counter()
        u, values, vt = (None if x is None else x.get() for x in (u, s, vt))
        timings["download"] = (time.perf_counter() - start) * 1000
    if statistics is not None:
        statistics.update(counts)
    return u, values, vt


def cusolver_on_device(a: cupy.ndarray, params: SvdParams):
    """cuSOLVER's SVD (cupy.linalg.svd, gesvd) of a device matrix on the current stream:
    device (u, s, vt) as `svd_on_device` returns them."""
    if params.compute_uv:
        return cupy.linalg.svd(a, full_matrices=params.full_matrices, compute_uv=True)
    return None, cupy.linalg.svd(a, compute_uv=False), None


def cusolver_svd(a: np.ndarray, params: SvdParams, lease):
    """The same decomposition by cuSOLVER (cupy.linalg.svd) on the lease's stream: host
    (u, s, vt) as `svd` returns them."""
    a = check_matrix(a)
    with cupy.cuda.Device(lease.device), lease.stream:
        device_a = cupy.asarray(a)
        if params.compute_uv:
            u, s, vt = cupy.linalg.svd(device_a, full_matrices=params.full_matrices, compute_uv=True)
            return u.get(), s.get(), vt.get()
        return None, cupy.linalg.svd(device_a, compute_uv=False).get(), None
