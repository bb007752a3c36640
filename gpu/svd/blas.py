"""cuBLAS GEMM on sub-blocks of column-major device matrices, without copies.

CuPy's matmul copies a non-contiguous view before calling cuBLAS; the bidiagonalization
works on trailing blocks A[t:, t:] of one column-major matrix, so this wrapper takes a
base array, an element offset, the block's shape and the leading dimension, as BLAS
does. Calls go to the cuBLAS handle of the current device on the current stream, with
alpha and beta passed from the host. float32 and float64.
"""

from __future__ import annotations

import numpy as np
from cupy.cuda import device
from cupy_backends.cuda.libs import cublas

_GEMM = {np.dtype(np.float32): cublas.sgemm, np.dtype(np.float64): cublas.dgemm}
_OP = {"N": cublas.CUBLAS_OP_N, "T": cublas.CUBLAS_OP_T}


_SCALARS: dict[tuple[float, np.dtype], np.ndarray] = {}


def _scalar(value: float, dtype: np.dtype) -> np.ndarray:
    """A host scalar for alpha or beta (read by cuBLAS during the call), made once."""
    key = (value, dtype)
    found = _SCALARS.get(key)
    if found is None:
        found = _SCALARS.setdefault(key, np.array(value, dtype))
    return found


def _handle() -> int:
    handle = device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    return handle


def gemm(
    trans_a: str,
    trans_b: str,
    m: int,
    n: int,
    k: int,
    alpha: float,
    a,
    a_offset: int,
    lda: int,
    b,
    b_offset: int,
    ldb: int,
    beta: float,
    c,
    c_offset: int,
    ldc: int,
) -> None:
    """C = alpha op(A) op(B) + beta C on column-major blocks: C (m, n), op(A) (m, k), op(B) (k, n)."""
    if m <= 0 or n <= 0:
        return
    dtype = c.dtype
    item = dtype.itemsize
    alpha_host, beta_host = _scalar(alpha, dtype), _scalar(beta, dtype)
    _GEMM[dtype](
        _handle(),
        _OP[trans_a],
        _OP[trans_b],
        m,
        n,
        k,
        alpha_host.ctypes.data,
        a.data.ptr + a_offset * item,
        lda,
        b.data.ptr + b_offset * item,
        ldb,
        beta_host.ctypes.data,
        c.data.ptr + c_offset * item,
        ldc,
    )
