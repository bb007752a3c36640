"""What CS256 is measured against on the GPU, and how: dense cuBLAS GEMV/GEMM and
cuSPARSE CSR SpMV through CuPy, L2-cold timing with CUDA events, and the device's copy
bandwidth. Used by the /jobs/cs256 job and bench/cs256.py. Importing this module needs CuPy.

- Dense: `cupy.matmul` (cuBLAS GEMM/GEMV) for float16 and float32; CuPy has no bfloat16,
  so bfloat16 calls cublasGemmEx directly (CUDA_R_16BF data, float32 compute), which is
  what cupy.matmul does for float16.
- CSR: cuSPARSE's generic SpMV (cusparseSpMV, int32 indices, float32 compute) with the
  matrix's own dtype for one vector; CuPy's csr_matrix takes only float32/float64, so when
  the low-level call is refused, and for several vectors, its float32 product is the
  anchor (`dtype` says which ran).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cupy
import numpy as np

from gpu import kernels
from gpu.cs256.format import STORAGE, to_float32
from gpu.cs256.reference import XOR

log = logging.getLogger("pencil.cs256")

CUDA_TYPES = {
    "float16": cupy.cuda.runtime.CUDA_R_16F,
    "bfloat16": cupy.cuda.runtime.CUDA_R_16BF,
    "float32": cupy.cuda.runtime.CUDA_R_32F,
}


# ------------------------------------------------------------------ dense --


def dense_matmul(a: cupy.ndarray, x: cupy.ndarray, dtype: str) -> cupy.ndarray:
    """A x by cuBLAS on the current stream: a (m, n) and x (n,) or (n, k) in the storage of
    `dtype`; y in that storage, (m,) or (m, k)."""
    if dtype != "bfloat16":
        return cupy.matmul(a, x)
    return _gemm_ex(a, x, dtype)


def _gemm_ex(a: cupy.ndarray, x: cupy.ndarray, dtype: str) -> cupy.ndarray:
    """cublasGemmEx in column-major terms: C (m x k) = A^T (A: n x m, our row-major a)
    times B (n x k, our x^T rows); C's columns are y's columns."""
    from cupy_backends.cuda.libs import cublas

    m, n = a.shape
    k = 1 if x.ndim == 1 else x.shape[1]
    a = cupy.ascontiguousarray(a)
    xt = cupy.ascontiguousarray(x.reshape(n, k).T)  # (k, n): column j is x[:, j]
    yt = cupy.empty((k, m), STORAGE[dtype])
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        code = CUDA_TYPES[dtype]
        cublas.gemmEx(
            handle,
            cublas.CUBLAS_OP_T,
            cublas.CUBLAS_OP_N,
            m,
            k,
            n,
            one.ctypes.data,
            a.data.ptr,
            code,
            n,
            xt.data.ptr,
            code,
            n,
            zero.ctypes.data,
            yt.data.ptr,
            code,
            m,
            cublas.CUBLAS_COMPUTE_32F,
            cublas.CUBLAS_GEMM_DEFAULT,
        )
    finally:
        cublas.setPointerMode(handle, mode)
    return yt[0] if x.ndim == 1 else cupy.ascontiguousarray(yt.T)


# ------------------------------------------------------------------ CSR --


class CsrAnchor:
    """cuSPARSE CSR (int32 indices) of a dense device matrix (storage of `dtype`), without
    its zeros. Call with x (storage dtype, (n,) or (n, k)); `dtype` is the value type that
    ran: the matrix's own for one vector when cuSPARSE takes it, else float32."""

    def __init__(self, a: cupy.ndarray, dtype: str):
        import cupyx.scipy.sparse

        self.shape = a.shape
        self.source_dtype = dtype
        self.csr32 = cupyx.scipy.sparse.csr_matrix(to_float32(a, dtype))
        self.csr32.sum_duplicates()
        self.nnz = int(self.csr32.nnz)
        self.native: Any = None  # the values in the native dtype, where cuSPARSE takes them
        self.dtype = "float32"
        if dtype != "float32" and self.nnz:
            values = self.csr32.data.astype(np.float16) if dtype == "float16" else _bf16(self.csr32.data)
            self.native = values
            try:  # one trial product: cuSPARSE versions differ in the types SpMV takes
                self._native_spmv(cupy.zeros(a.shape[1], STORAGE[dtype]))
                cupy.cuda.get_current_stream().synchronize()
                self.dtype = dtype
            except (
                RuntimeError,
                AttributeError,
                TypeError,
                ValueError,
            ) as exc:  # CuSparseError (NOT_SUPPORTED) is a RuntimeError; a missing binding an AttributeError
                log.info("cuSPARSE SpMV refused %s values (%s); the CSR anchor runs in float32", dtype, exc)
                self.native = None

    @property
    def nbytes(self) -> int:
        """Bytes of the matrix as it runs: values, int32 column indices and row pointers."""
        item = STORAGE[self.dtype].itemsize
        return self.nnz * (item + 4) + 4 * (self.shape[0] + 1)

    def __call__(self, x: cupy.ndarray) -> cupy.ndarray:
        if self.native is not None and x.ndim == 1:
            return self._native_spmv(x)
        return self.csr32 @ to_float32(x, self.source_dtype)

    def _native_spmv(self, x: cupy.ndarray) -> cupy.ndarray:
        from cupy_backends.cuda.libs import cusparse

        m, n = self.shape
        code = CUDA_TYPES[self.source_dtype]
        y = cupy.empty(m, STORAGE[self.source_dtype])
        handle = cupy.cuda.device.get_cusparse_handle()
        cusparse.setStream(handle, cupy.cuda.get_current_stream().ptr)
        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        matrix = cusparse.createCsr(
            m,
            n,
            self.nnz,
            self.csr32.indptr.data.ptr,
            self.csr32.indices.data.ptr,
            self.native.data.ptr,
            cusparse.CUSPARSE_INDEX_32I,
            cusparse.CUSPARSE_INDEX_32I,
            cusparse.CUSPARSE_INDEX_BASE_ZERO,
            code,
        )
        vx = cusparse.createDnVec(n, x.data.ptr, code)
        vy = cusparse.createDnVec(m, y.data.ptr, code)
        try:
            op, alg = cusparse.CUSPARSE_OPERATION_NON_TRANSPOSE, cusparse.CUSPARSE_SPMV_ALG_DEFAULT
            size = cusparse.spMV_bufferSize(
                handle, op, one.ctypes.data, matrix, vx, zero.ctypes.data, vy, cupy.cuda.runtime.CUDA_R_32F, alg
            )
            workspace = cupy.empty(max(int(size), 1), cupy.uint8)
            cusparse.spMV(
                handle,
                op,
                one.ctypes.data,
                matrix,
                vx,
                zero.ctypes.data,
                vy,
                cupy.cuda.runtime.CUDA_R_32F,
                alg,
                workspace.data.ptr,
            )
        finally:
            cusparse.destroyDnVec(vy)
            cusparse.destroyDnVec(vx)
            cusparse.destroySpMat(matrix)
        return y


def _bf16(values: cupy.ndarray) -> cupy.ndarray:
    from gpu.cs256.format import float32_to_bf16_bits

    return float32_to_bf16_bits(values)


# ------------------------------------------------------------------ timing --

SPIN_US = 300  # host time allowed to queue one timed launch (its Python, descriptors, allocations)
SOURCE = Path(__file__).with_name("cs256.cu")
READ_FLOOR_BLOCK = 512  # threads per block of cs256_read_rows


def l2_bytes() -> int:
    """The current device's L2 cache size in bytes."""
    return int(kernels.device_attribute("L2CacheSize"))


class ColdTimer:
    """GPU time of one call at a time, with the L2 cold: before each timed call the stream
    spins for SPIN_US (so the start event, the call's launches and the stop event are all
    queued before the GPU reaches them: the events time the GPU, not Python), then reads a
    buffer twice the L2 size (clean lines, so the timed call pays no write-backs)."""

    def __init__(self):
        self.units = 2 * l2_bytes() // 16
        self.scratch = cupy.zeros(self.units * 16, cupy.uint8)
        self.sink = cupy.zeros(1, cupy.uint32)
        self.spin = kernels.kernel(SOURCE, "cs256_spin")
        self.flush = kernels.kernel(SOURCE, "cs256_read_flush")
        try:
            clock_khz = kernels.device_attribute("ClockRate")
        except KeyError:  # the attribute was retired in newer CUDA: assume 2 GHz
            clock_khz = 2_000_000
        self.cycles = np.int64(SPIN_US * clock_khz // 1000)
        self.blocks = 4 * kernels.device_attribute("MultiProcessorCount")

    def times_ms(self, fn: Callable[[], object], repeats: int) -> list[float]:
        """`repeats` GPU times of fn() (work queued on the current stream) in ms, after one
        untimed warm-up call (compilation, library workspaces)."""
        stream = cupy.cuda.get_current_stream()
        fn()
        events = []
        for _ in range(repeats):
            self.spin((1,), (1,), (self.cycles,))
            self.flush((self.blocks,), (256,), (self.scratch, np.int64(self.units), self.sink))
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            fn()
            stop.record(stream)
            events.append((start, stop))
        events[-1][1].synchronize()
        return [cupy.cuda.get_elapsed_time(start, stop) for start, stop in events]

    def median_ms(self, fn: Callable[[], object], repeats: int) -> float:
        return statistics.median(self.times_ms(fn, repeats))


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting the bytes read and written
    (2 nbytes per copy): the memory system's practical ceiling for a streaming kernel."""
    source = cupy.empty(nbytes, cupy.uint8)
    source.fill(1)
    target = cupy.empty_like(source)
    stream = cupy.cuda.get_current_stream()

    def copy():
        cupy.cuda.runtime.memcpyAsync(
            target.data.ptr, source.data.ptr, nbytes, cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr
        )

    copy()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(repeats):
        copy()
    stop.record(stream)
    stop.synchronize()
    seconds = cupy.cuda.get_elapsed_time(start, stop) / 1000 / repeats
    return 2 * nbytes / seconds


class ReadFloor:
    """The read floor of a product with `cs` (CuPy arrays): one launch of cs256_read_rows,
    in which each block (blocks_per_sm per SM, as the group kernel's grid) reads the
    values, indices and tile counts of a run of rows as contiguous spans and computes
    nothing. A CS256 kernel reads the same bytes (and x, the row pointers and y, which are
    small), so its time over this one says what its own access pattern and arithmetic
    cost. Calling it queues the launch alone (what the benchmark times); `checksum` runs it
    and returns the XOR of the 32-bit words read (cs256.cu cs256_read_rows), for a
    test that every byte was read once."""

    def __init__(self, cs, blocks_per_sm: int = 2):
        self.cs = cs
        blocks = max(1, blocks_per_sm * kernels.device_attribute("MultiProcessorCount"))
        self.rows_per_block = -(-cs.m // blocks)
        self.grid = -(-cs.m // self.rows_per_block)
        self.kernel = kernels.kernel(SOURCE, "cs256_read_rows")
        self.partials = cupy.zeros(self.grid * (READ_FLOOR_BLOCK // 32), cupy.uint32)  # per warp

    def __call__(self) -> None:
        cs = self.cs
        self.kernel(
            (self.grid,),
            (READ_FLOOR_BLOCK,),
            (
                cs.values,
                cs.indices,
                cs.row_ptr,
                cs.block_increments,
                np.int32(cs.m),
                np.int32(cs.padded_tiles),
                np.int32(cs.itemsize),
                np.int32(self.rows_per_block),
                self.partials,
            ),
        )

    def checksum(self) -> int:
        self()
        return int(XOR.reduce(self.partials.get()))


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bandwidth of a read-only streaming kernel (cs256_read_flush over nbytes) in bytes/s."""
    data = cupy.ones(nbytes // 16 * 16, cupy.uint8)
    sink = cupy.zeros(1, cupy.uint32)
    flush = kernels.kernel(SOURCE, "cs256_read_flush")
    blocks = 4 * kernels.device_attribute("MultiProcessorCount")
    stream = cupy.cuda.get_current_stream()

    def read():
        flush((blocks,), (256,), (data, np.int64(data.size // 16), sink))

    read()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    for _ in range(repeats):
        read()
    stop.record(stream)
    stop.synchronize()
    return data.size / (cupy.cuda.get_elapsed_time(start, stop) / 1000 / repeats)


# ----------------------------------------------------------- the job on the GPU --

EXACT_ROWS = 4096  # rows per block of the float64 reference product


def measure(params, a: np.ndarray, x: np.ndarray, dtype: str, times: dict[str, float], lease, progress) -> dict:
    """The GPU run of a job (params: Cs256Params) on the lease: convert on the device,
    multiply with the CS256 kernel, check against the float64 dense product, and time it
    L2-cold against dense cuBLAS and cuSPARSE CSR. Adds ms to `times`; returns the same
    keys as reference.measure, with host arrays."""
    from gpu.cs256 import cuda, reference
    from gpu.cs256.pruning import convert, pruning_report

    with cupy.cuda.Device(lease.device), lease.stream:
        stream = cupy.cuda.get_current_stream()
        d_a, d_x = cupy.asarray(a), cupy.asarray(x)
        start = time.perf_counter()
        cs = convert(params, d_a, dtype)
        stream.synchronize()
        times["convert"] = (time.perf_counter() - start) * 1000
        progress(0.3)
        k = 1 if x.ndim == 1 else x.shape[1]
        plan = cuda.make_plan(cs, k, variant=params.variant)
        y = cuda.spmm(cs, d_x, plan)
        dense = cs.to_dense()
        x64 = to_float32(d_x, dtype).astype(cupy.float64)
        exact = cupy.concatenate(
            [
                to_float32(dense[r : r + EXACT_ROWS], dtype).astype(cupy.float64) @ x64
                for r in range(0, cs.m, EXACT_ROWS)
            ]
        )
        error = reference.relative_error(y.get(), exact.get(), dtype)
        progress(0.4)
        timer = ColdTimer()
        times["cs256"] = timer.median_ms(lambda: cuda.spmm(cs, d_x, plan), params.repeats)
        times["dense"] = timer.median_ms(lambda: dense_matmul(dense, d_x, dtype), params.repeats)
        progress(0.6)
        csr = CsrAnchor(dense, dtype)
        times["csr"] = timer.median_ms(lambda: csr(d_x), params.repeats)
        progress(0.8)
        pruning = pruning_report(params, d_a, dense, d_x, cupy, dtype)
        used = {
            "dense": f"cuBLAS ({'cublasGemmEx' if dtype == 'bfloat16' else 'cupy.matmul'}) {dtype}",
            "csr": f"cuSPARSE CSR int32 {csr.dtype}"
            + ("" if csr.dtype == dtype else f" (cuSPARSE through CuPy takes no {dtype} here)"),
        }
        return {
            "cs": cs.to_host(),
            "y": y.get(),
            "error": error,
            "pruning": pruning,
            "kernel": plan.describe(),
            "anchors": used,
            "anchor_bytes": {"dense": int(dense.nbytes), "csr": csr.nbytes},
        }
