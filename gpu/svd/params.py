"""Parameters of the SVD job, validated once, and the test matrices of the job spec.

`SvdParams` says what to compute (values only, thin or full vectors) and how: "lapack"
is numpy.linalg.svd, "golub_reinsch" the blocked Householder bidiagonalization plus
implicitly shifted QR of Lahabar & Narayanan (2009), "cusolver" CuPy's cuSOLVER call
(GPU only), "auto" the fastest on the backend. `make_matrix` builds the three kinds of
inputs the accuracy tests and benchmarks use; `MatrixSpec` names one of them. `SvdJob`
is one job of the front door (gpu.svd.run): its matrix and its parameters.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu.errors import ParamError
from gpu.jobs import npy_bytes

METHODS = ("auto", "golub_reinsch", "cusolver", "lapack")
GPU_METHODS = ("golub_reinsch", "cusolver")
# Without a GPU the Golub-Reinsch method runs the readable NumPy definition, whose bulge
# chase is a Python loop (about 10 s at 512 columns, a minute at 1024): larger matrices
# are refused there rather than left to hold a job stream for an hour.
GOLUB_REINSCH_CPU_MAX_SIDE = 512
# the GPU's bulge chase keeps the bidiagonal, (2 n + 1) float64, in one block's shared memory:
# 227 KiB on an H100 or H200
GOLUB_REINSCH_GPU_MAX_SIDE = 14_527
# Where bench/svd.py measured our Golub-Reinsch faster than cuSOLVER (H100, 2026-11-26,
# after the bidiagonalization went to CUDA graphs): with vectors at every size measured,
# min(m, n) from 512 (float32 1.11-1.34x, float64 1.09-1.20x; 512x512 to 4096x4096,
# 2048x512, 8192x512, 16384x1024); values only, float32 from 1024 columns (1.20-1.45x;
# 8192x512 0.96x), float64 never (0.61-0.68x: the exact float64 chase is the slower one).
AUTO_GOLUB_REINSCH_MIN_SIDE = 512  # with vectors
AUTO_VALUES_ONLY_MIN_SIDE = 1024  # float32, values only
MATRIX_FILE = "matrix.npy"
BLOCK_SIZE_MIN, BLOCK_SIZE_MAX = 1, 512  # columns per panel of the blocked bidiagonalization
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
MATRIX_KINDS = ("gaussian", "ill_conditioned", "clustered", "low_rank")
CLUSTER_FRACTION = 6  # a clustered matrix's clusters each hold min(m, n) // 6 equal singular values


def _check_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParamError(name, f"expected an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ParamError(name, f"must be >= {minimum}; got {value}")
    if maximum is not None and value > maximum:
        raise ParamError(name, f"must be <= {maximum}; got {value}")


@dataclass(frozen=True)
class SvdParams:
    """One SVD request; validated on construction (raises ParamError).

    compute_uv: also return U and V^T (else the singular values only).
    full_matrices: U is m x m and V^T n x n (else m x k and k x n, k = min(m, n)).
    method: one of METHODS ("auto": `resolve_method`). block_size: columns per panel of
    the bidiagonalization.
    """

    compute_uv: bool = True
    full_matrices: bool = False
    method: str = "auto"
    block_size: int = 32

    def __post_init__(self) -> None:
        for name in ("compute_uv", "full_matrices"):
            if not isinstance(getattr(self, name), bool):
                raise ParamError(name, f"expected true or false, got {getattr(self, name)!r}")
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ParamError("method", f"must be one of {', '.join(METHODS)}; got {self.method!r}")
        _check_int("block_size", self.block_size, BLOCK_SIZE_MIN, BLOCK_SIZE_MAX)


class SvdInputError(ValueError):
    """The matrix cannot be decomposed: wrong shape or dtype, not finite, too large."""


def check_matrix(a, max_elements: int | None = None) -> np.ndarray:
    """The matrix to decompose as a C-contiguous float32/float64 (m, n) array, or SvdInputError.
    Integers are refused rather than converted: the caller chooses the precision."""
    a = np.asarray(a)
    if a.ndim != 2:
        raise SvdInputError(f"expected a 2-D matrix, got an array of shape {a.shape}")
    if a.size == 0:
        raise SvdInputError(f"the matrix is empty (shape {a.shape})")
    if max_elements is not None and a.size > max_elements:
        raise SvdInputError(
            f"the matrix has {a.size} elements ({a.shape[0]} x {a.shape[1]}), more than the limit of {max_elements}"
        )
    if a.dtype not in DTYPES:
        raise SvdInputError(f"dtype {a.dtype} is not supported: convert to float32 or float64")
    bad = a.size - int(np.count_nonzero(np.isfinite(a)))
    if bad:
        nans = int(np.count_nonzero(np.isnan(a)))
        raise SvdInputError(f"the matrix has {bad} non-finite entries ({nans} NaN, {bad - nans} infinite)")
    return np.ascontiguousarray(a)


def singular_values(kind: str, k: int, cond: float) -> np.ndarray:
    """The k prescribed singular values (float64, descending) of an ill_conditioned or
    clustered matrix: logspaced from 1 down to 1 / cond; for clustered, the first and the
    last k // CLUSTER_FRACTION of them equal to 1 and to 1 / cond, the rest logspaced."""
    if kind == "ill_conditioned":
        return np.logspace(0.0, -math.log10(cond), k)
    cluster = k // CLUSTER_FRACTION
    middle = np.logspace(0.0, -math.log10(cond), k - 2 * cluster)
    return np.concatenate([np.ones(cluster), middle, np.full(cluster, 1 / cond)])


def make_matrix(
    m: int, n: int, dtype, seed, kind: str, cond: float = 1e6, rank: int | None = None, xp: Any = np
) -> Any:
    """An (m, n) test matrix of `dtype` (float32 or float64), the same for the same seed.

    gaussian: i.i.d. standard normal entries.
    ill_conditioned: U diag(s) V^T with U, V random orthonormal (QR of Gaussians) and the
    min(m, n) singular values logspaced from 1 down to 1 / cond.
    clustered: the same with clusters of min(m, n) // 6 equal values at both ends
    (`singular_values`): graded and clustered, the hard case of a bidiagonal QR.
    low_rank: the product of (m, r) and (r, n) Gaussians, r = rank or max(1, min(m, n) // 4).
    Drawn in float64 by NumPy and rounded once to `dtype`. xp: the array module that does
    the products and QR factorizations and holds the result (numpy, or cupy: the same
    matrix to rounding, on the current device).
    """
    _check_int("m", m, 1)
    _check_int("n", n, 1)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ParamError("dtype", f"must be float32 or float64; got {dtype!r}") from None
    if dtype not in DTYPES:
        raise ParamError("dtype", f"must be float32 or float64; got {dtype}")
    if kind not in MATRIX_KINDS:
        raise ParamError("kind", f"must be one of {', '.join(MATRIX_KINDS)}; got {kind!r}")
    rng = np.random.default_rng(seed)
    k = min(m, n)
    if kind == "gaussian":
        a = xp.asarray(rng.standard_normal((m, n)))
    elif kind in ("ill_conditioned", "clustered"):
        if isinstance(cond, bool) or not isinstance(cond, numbers.Real) or not math.isfinite(cond) or cond < 1:
            raise ParamError("cond", f"must be a finite number >= 1; got {cond!r}")
        u, _ = xp.linalg.qr(xp.asarray(rng.standard_normal((m, k))))
        v, _ = xp.linalg.qr(xp.asarray(rng.standard_normal((n, k))))
        a = (u * xp.asarray(singular_values(kind, k, cond))) @ v.T
    else:
        r = max(1, k // 4) if rank is None else rank
        _check_int("rank", r, 1, k)
        a = xp.asarray(rng.standard_normal((m, r))) @ xp.asarray(rng.standard_normal((r, n)))
    return xp.ascontiguousarray(a, dtype=dtype)


def auto_gpu_method(m: int, n: int, dtype, compute_uv: bool = True) -> str:
    """The GPU method `auto` runs for an (m, n) matrix of `dtype`: the faster one measured."""
    side = min(m, n)
    if side > GOLUB_REINSCH_GPU_MAX_SIDE:
        ours = False
    elif compute_uv:
        ours = side >= AUTO_GOLUB_REINSCH_MIN_SIDE
    else:
        ours = np.dtype(dtype) == np.float32 and side >= AUTO_VALUES_ONLY_MIN_SIDE
    return "golub_reinsch" if ours else "cusolver"


@dataclass(frozen=True)
class MatrixSpec:
    """A generated test matrix (see `make_matrix`); validated on construction."""

    m: int
    n: int
    dtype: str = "float32"
    seed: int = 0
    kind: str = "gaussian"
    cond: float = 1e6
    rank: int | None = None

    def __post_init__(self) -> None:
        _check_int("spec.m", self.m, 1)
        _check_int("spec.n", self.n, 1)
        _check_int("spec.seed", self.seed, 0)
        if self.dtype not in ("float32", "float64"):
            raise ParamError("spec.dtype", f"must be float32 or float64; got {self.dtype!r}")
        if self.kind not in MATRIX_KINDS:
            raise ParamError("spec.kind", f"must be one of {', '.join(MATRIX_KINDS)}; got {self.kind!r}")
        if (
            isinstance(self.cond, bool)
            or not isinstance(self.cond, numbers.Real)
            or not math.isfinite(self.cond)
            or self.cond < 1
        ):
            raise ParamError("spec.cond", f"must be a finite number >= 1; got {self.cond!r}")
        if self.rank is not None:
            _check_int("spec.rank", self.rank, 1, min(self.m, self.n))

    def build(self, xp: Any = np) -> Any:
        """The (m, n) matrix, the same for the same spec (to rounding with xp = cupy)."""
        return make_matrix(self.m, self.n, self.dtype, self.seed, self.kind, cond=self.cond, rank=self.rank, xp=xp)


@dataclass(frozen=True)
class SvdJob:
    """One SVD job: the matrix (`matrix`, an uploaded (m, n) float32/float64 array, or
    `spec`, one to generate: exactly one of them) and what to compute (`params`)."""

    params: SvdParams
    spec: MatrixSpec | None = None
    matrix: np.ndarray | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if (self.spec is None) == (self.matrix is None):
            raise ParamError("matrix", "give exactly one of a matrix and a spec")
        if self.matrix is not None:
            native = (
                self.matrix.astype(self.matrix.dtype.newbyteorder("="), copy=False)
                if self.matrix.dtype.kind == "f"
                else self.matrix
            )
            try:
                object.__setattr__(self, "matrix", check_matrix(native))
            except SvdInputError as exc:
                raise ParamError("matrix", str(exc), "invalid_matrix") from None

    @property
    def shape(self) -> tuple[int, int]:
        if self.spec is not None:
            return self.spec.m, self.spec.n
        m, n = self.matrix.shape  # type: ignore[union-attr]
        return m, n

    @property
    def dtype(self) -> str:
        return self.spec.dtype if self.spec is not None else self.matrix.dtype.name  # type: ignore[union-attr]

    def check_backend(self, backend: str) -> None:
        """ParamError when the method cannot run on `backend` ("cpu" or "cuda")."""
        method = self.params.method
        if backend == "cuda":
            if method == "golub_reinsch" and min(self.shape) > GOLUB_REINSCH_GPU_MAX_SIDE:
                raise ParamError(
                    "method",
                    f"golub_reinsch on the GPU takes matrices with min(m, n) <= {GOLUB_REINSCH_GPU_MAX_SIDE} "
                    f"(its bulge chase holds the bidiagonal in shared memory; this one: {min(self.shape)}); "
                    "use auto, cusolver or lapack",
                )
            return
        if method == "cusolver":
            raise ParamError(
                "method",
                "cusolver needs the CUDA backend; this server runs on the CPU (use auto, golub_reinsch or lapack)",
            )
        if method == "golub_reinsch" and min(self.shape) > GOLUB_REINSCH_CPU_MAX_SIDE:
            raise ParamError(
                "method",
                "golub_reinsch without a GPU runs the NumPy reference, for matrices with min(m, n) <= "
                f"{GOLUB_REINSCH_CPU_MAX_SIDE} (this one: {min(self.shape)}); use auto or lapack",
            )

    def resolve_method(self, on_gpu: bool) -> str:
        """The method that runs: `auto` becomes the faster GPU method, or LAPACK on the CPU."""
        if self.params.method != "auto":
            return self.params.method
        return auto_gpu_method(*self.shape, self.dtype, self.params.compute_uv) if on_gpu else "lapack"

    def load(self, xp: Any = np) -> Any:
        """The matrix to decompose, in xp's memory (numpy, or cupy: on the current device;
        a spec's O(n^3) products then run there too)."""
        if self.spec is not None:
            return self.spec.build(xp)
        return xp.asarray(self.matrix)

    def to_json(self) -> dict[str, Any]:
        """What the job store keeps (the matrix itself goes to `input_files`)."""
        options = {
            "compute_uv": self.params.compute_uv,
            "full_matrices": self.params.full_matrices,
            "method": self.params.method,
        }
        if self.spec is not None:
            return {"source": "spec", "spec": asdict(self.spec), **options}
        m, n = self.shape
        return {"source": "upload", "m": m, "n": n, "dtype": self.dtype, **options}

    def input_files(self) -> dict[str, bytes]:
        return {} if self.matrix is None else {MATRIX_FILE: npy_bytes(self.matrix)}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], files: Mapping[str, Path]) -> SvdJob:
        """The job `to_json` and `input_files` stored (files: input file name -> path)."""
        params = SvdParams(
            compute_uv=stored["compute_uv"], full_matrices=stored["full_matrices"], method=stored["method"]
        )
        if stored["source"] == "spec":
            return cls(params, spec=MatrixSpec(**stored["spec"]))
        return cls(params, matrix=np.load(files[MATRIX_FILE], allow_pickle=False))
