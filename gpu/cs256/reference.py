"""The CS256 product y = A x in NumPy: the definition the CUDA kernels are checked against,
and the CPU backend of the /jobs/cs256 job.

Every stored entry contributes value * x[column] (exact float64 products of the float16 /
bfloat16 / float32 inputs), summed in float64 and rounded once to the matrix's dtype. The
kernels sum in float32 in another order; the error measure is `relative_error`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpu.cs256.format import CS256, STORAGE, TILE, CS256Error, as_storage, from_float, to_float32

MAX_VECTORS = 16
# np.bitwise_xor, untyped: NumPy 2.5's stubs reject its reduce over an array (2.4's take it).
XOR: Any = np.bitwise_xor


def check_vectors(cs_or_shape, x, dtype: str):
    """x as the matrix's storage dtype, shape (n,) or (n, k) with 1 <= k <= MAX_VECTORS;
    CS256Error when it does not fit. Float inputs of another precision are rounded."""
    n = cs_or_shape.n if isinstance(cs_or_shape, CS256) else cs_or_shape[1]
    x, _ = as_storage(x, dtype)
    if x.ndim not in (1, 2) or x.shape[0] != n:
        raise CS256Error(f"x must have shape ({n},) or ({n}, k); got {tuple(x.shape)}")
    if x.ndim == 2 and not 1 <= x.shape[1] <= MAX_VECTORS:
        raise CS256Error(f"x holds {x.shape[1]} vectors; 1 to {MAX_VECTORS} are supported")
    return x


def expand(cs: CS256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cols, values as float64) of every stored entry of a host matrix; cols run up
    to T * 256 - 1 (padding past n is zero-valued)."""
    cs = cs.to_host()
    rows, cols = cs.entry_positions()
    return rows, cols, to_float32(cs.values, cs.dtype).astype(np.float64)


def product_float64(cs: CS256, x) -> np.ndarray:
    """A x in float64 (exact products, float64 sums): (m,) for x of shape (n,), (m, k) for (n, k)."""
    cs = cs.to_host()
    x = check_vectors(cs, np.asarray(x) if not hasattr(x, "get") else x.get(), cs.dtype)
    rows, cols, vals = expand(cs)
    x64 = np.zeros((cs.tiles_per_row * TILE,) + x.shape[1:], np.float64)
    x64[: cs.n] = to_float32(x, cs.dtype)
    if x.ndim == 1:
        return np.bincount(rows, weights=vals * x64[cols], minlength=cs.m)
    return np.stack([np.bincount(rows, weights=vals * x64[cols, j], minlength=cs.m) for j in range(x.shape[1])], axis=1)


def spmv(cs: CS256, x) -> np.ndarray:
    """y = A x in the matrix's storage dtype (bfloat16 as uint16 bit patterns); x: (n,) or
    (n, k) in that dtype (or float, rounded to it). The CPU backend of the job."""
    return from_float(product_float64(cs, x), cs.dtype)


def dense_product(a, x, dtype: str) -> np.ndarray:
    """A x in float64 for a dense (m, n) matrix in the storage of `dtype`: the independent
    check of the CS256 products (no CS256 code involved)."""
    a64 = to_float32(np.asarray(a), dtype).astype(np.float64)
    return a64 @ to_float32(np.asarray(x), dtype).astype(np.float64)


def relative_error(y, reference, dtype: str) -> float:
    """max |y - reference| / max |reference| (0 when both are 0): y in the storage of `dtype`
    (or float32), reference in float64, both (m,) or (m, k)."""
    y = np.asarray(y)
    y64 = (to_float32(y, dtype) if y.dtype == STORAGE[dtype] else y.astype(np.float32)).astype(np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if y64.shape != reference.shape:
        raise ValueError(f"shapes differ: {y64.shape} and {reference.shape}")
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    worst = float(np.max(np.abs(y64 - reference))) if reference.size else 0.0
    if scale == 0.0:
        return 0.0 if worst == 0.0 else float("inf")
    return worst / scale


UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}
# The bound on relative_error against the float64 dense product: float32 sums, then
# the output rounded to the matrix's dtype (bfloat16 keeps 8 bits).
TOLERANCE = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-5}


def within_float32_rounding(y, a, x, dtype: str) -> bool:
    """Whether y (storage of `dtype`, (m,) or (m, k)) is A x summed in float32 in any order
    and rounded once to `dtype`, by the classical bound of a float32 dot product of n
    terms: |y - A x| <= g (|A| |x|) + u (|A x| + g (|A| |x|)) elementwise, g = n e / (1 - n e),
    e = 2^-24, u the unit roundoff of `dtype`. a: the dense (m, n) matrix, x: (n,) or
    (n, k), both in the storage of `dtype`. Unlike relative_error this does not depend on
    how much a row's sum cancels, so it is the check for outputs too few to have a scale
    (one row: max |A x| is then a single, possibly cancelled sum)."""
    a64 = to_float32(np.asarray(a), dtype).astype(np.float64)
    x64 = to_float32(np.asarray(x), dtype).astype(np.float64)
    exact = a64 @ x64
    magnitude = np.abs(a64) @ np.abs(x64)
    n = a64.shape[1]
    e = UNIT_ROUNDOFF["float32"]
    gamma = n * e / (1 - n * e)
    bound = gamma * magnitude + UNIT_ROUNDOFF[dtype] * (np.abs(exact) + gamma * magnitude)
    y64 = to_float32(np.asarray(y), dtype).astype(np.float64).reshape(exact.shape)
    return bool(np.all(np.abs(y64 - exact) <= bound))


def agrees_with_dense(y, a, x, dtype: str) -> tuple[bool, float]:
    """(whether y equals A x to float32 accumulation rounding, relative_error of y): the
    relative error within TOLERANCE, or, for a single row (whose only scale is its own,
    possibly cancelled, sum), within_float32_rounding. a: dense (m, n), x: (n,) or (n, k),
    y: (m,) or (m, k), all in the storage of `dtype`."""
    error = relative_error(y, dense_product(a, x, dtype), dtype)
    if error <= TOLERANCE[dtype]:
        return True, error
    return np.shape(a)[0] == 1 and within_float32_rounding(y, a, x, dtype), error


def read_checksum(cs: CS256) -> int:
    """What cs256_read_rows (the benchmark's read floor) reports having read of `cs` (host
    arrays): the XOR of the little-endian 32-bit words of its values, indices and tile
    counts, each array zero-padded to a multiple of 4 bytes. The kernel places a byte in
    its word by address mod 4, so this equals its result when each array starts 4-byte
    aligned (CuPy's and NumPy's allocations do)."""
    checksum = 0
    for array in (cs.values, cs.indices, cs.block_increments):
        data = np.ascontiguousarray(array).view(np.uint8).ravel()
        padded = np.concatenate([data, np.zeros(-data.size % 4, np.uint8)])
        checksum ^= int(XOR.reduce(padded.view(np.uint32)))  # 0 for an empty array
    return checksum


# ------------------------------------------------------------- the job on the CPU --

CPU_REPEATS = 3  # the NumPy timings are seconds long: fewer runs


def median_ms(fn, repeats: int) -> float:
    """The median wall time of `repeats` calls of fn(), in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return float(np.median(times))


def measure(params, a: np.ndarray, x: np.ndarray, dtype: str, times: dict[str, float], progress) -> dict:
    """The CPU run of a job (params: Cs256Params): convert, multiply, check against the
    float64 dense product, and time the product against NumPy dense (BLAS) and SciPy CSR
    (when installed). Adds ms to `times`; returns cs, y, error, pruning, kernel, anchors
    and anchor_bytes (bytes each anchor reads for its matrix)."""
    from gpu.cs256.pruning import convert, pruning_report

    start = time.perf_counter()
    cs = convert(params, a, dtype)
    times["convert"] = (time.perf_counter() - start) * 1000
    progress(0.3)
    dense = cs.to_dense()
    repeats = min(params.repeats, CPU_REPEATS)
    y = spmv(cs, x)
    times["cs256"] = median_ms(lambda: spmv(cs, x), repeats)
    error = relative_error(y, dense_product(dense, x, dtype), dtype)
    progress(0.5)
    dense32, x32 = to_float32(dense, dtype), to_float32(x, dtype)
    times["dense"] = median_ms(lambda: dense32 @ x32, repeats)
    anchors = {"dense": "NumPy float32 matmul (BLAS)", "csr": None}
    anchor_bytes = {"dense": dense32.nbytes, "csr": None}
    try:
        import scipy.sparse
    except ImportError:
        anchors["csr"] = "not measured: SciPy is not installed"
    else:
        csr = scipy.sparse.csr_array(dense32)
        times["csr"] = median_ms(lambda: csr @ x32, repeats)
        anchors["csr"] = "SciPy CSR float32"
        anchor_bytes["csr"] = int(csr.nnz) * 8 + 4 * (cs.m + 1)
    progress(0.7)
    pruning = pruning_report(params, a, dense, x, np, dtype)
    return {
        "cs": cs,
        "y": y,
        "error": error,
        "pruning": pruning,
        "kernel": {"variant": "numpy reference"},
        "anchors": anchors,
        "anchor_bytes": anchor_bytes,
    }
