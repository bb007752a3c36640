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
from collections.abc import Mapping
from dataclasses import KW_ONLY, asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

import numpy as np
from pydantic import Field

from gpu.errors import InputError, ParamError
from gpu.jobs import npy_bytes
from gpu.npy import load_npy
from gpu.spec import InputFile, JobSpec, MatrixShape, Result, spec

Method = Literal["auto", "golub_reinsch", "cusolver", "lapack"]
MatrixKind = Literal["gaussian", "ill_conditioned", "clustered", "low_rank"]
Dtype = Literal["float32", "float64"]
METHODS: tuple[str, ...] = get_args(Method)
MATRIX_KINDS: tuple[str, ...] = get_args(MatrixKind)
GPU_METHODS = ("golub_reinsch", "cusolver")
# Without a GPU the Golub-Reinsch method runs the readable NumPy definition, whose bulge
# chase is a Python loop (about 10 s at 512 columns, a minute at 1024): larger matrices
# are refused there rather than left to hold a job stream for an hour.
GOLUB_REINSCH_CPU_MAX_SIDE = 512
# the GPU's bulge chase keeps the bidiagonal, (2 n + 1) float64, in one block's shared memory:
# 227 KiB on an H100 or H200
GOLUB_REINSCH_GPU_MAX_SIDE = 14_527
# `auto` on a GPU runs ours where bench/svd.py measured it faster than cuSOLVER
# (BENCHMARKS.md, "SVD `auto`"): with vectors from min(m, n) = 512, values only for float32
# from 1024 columns (float64 values only: never).
AUTO_GOLUB_REINSCH_MIN_SIDE = 512  # with vectors
AUTO_VALUES_ONLY_MIN_SIDE = 1024  # float32, values only
MATRIX_FILE = "matrix.npy"
BLOCK_SIZE_MIN, BLOCK_SIZE_MAX = 1, 512  # columns per panel of the blocked bidiagonalization
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
CLUSTER_FRACTION = 6  # a clustered matrix's clusters each hold min(m, n) // 6 equal singular values


@spec
class SvdParams:
    """What to compute and how: the options of one SVD (validated on construction)."""

    compute_uv: bool = Field(default=True, description="also compute U and V^T")
    full_matrices: bool = Field(default=False, description="U m x m and V^T n x n instead of the thin m x k, k x n")
    method: Method = Field(
        default="auto",
        description=(
            "golub_reinsch (Lahabar & Narayanan 2009), cusolver (CUDA backend only), lapack (NumPy); auto: on a "
            f"GPU the faster method measured for the shape and dtype (ours for matrices with vectors from "
            f"min(m, n) = {AUTO_GOLUB_REINSCH_MIN_SIDE}, and for float32 values only from "
            f"{AUTO_VALUES_ONLY_MIN_SIDE}; else cuSOLVER), LAPACK on the CPU"
        ),
    )
    block_size: int = Field(
        default=32,
        ge=BLOCK_SIZE_MIN,
        le=BLOCK_SIZE_MAX,
        description="golub_reinsch: columns per panel of the blocked bidiagonalization (the answer is the same)",
    )


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
    m: int, n: int, dtype: Any, seed: int, kind: str, cond: float = 1e6, rank: int | None = None, xp: Any = np
) -> Any:
    """An (m, n) test matrix of `dtype` (float32 or float64), the same for the same seed:
    `MatrixSpec(...).build(xp)`, with `dtype` given as anything numpy.dtype reads."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise ParamError("dtype", f"must be float32 or float64; got {dtype!r}") from None
    return MatrixSpec(m=m, n=n, dtype=name, seed=seed, kind=kind, cond=cond, rank=rank).build(xp)  # type: ignore[arg-type]


def auto_gpu_method(m: int, n: int, dtype: Any, compute_uv: bool = True) -> str:
    """The GPU method `auto` runs for an (m, n) matrix of `dtype`: the faster one measured."""
    side = min(m, n)
    if side > GOLUB_REINSCH_GPU_MAX_SIDE:
        ours = False
    elif compute_uv:
        ours = side >= AUTO_GOLUB_REINSCH_MIN_SIDE
    else:
        ours = np.dtype(dtype) == np.float32 and side >= AUTO_VALUES_ONLY_MIN_SIDE
    return "golub_reinsch" if ours else "cusolver"


def resolve_method(params: SvdParams, shape: tuple[int, int], dtype: Any, on_gpu: bool) -> Method:
    """The method that runs: `auto` becomes the faster GPU method, or LAPACK on the CPU."""
    if params.method != "auto":
        return params.method
    return cast(Method, auto_gpu_method(*shape, dtype, params.compute_uv)) if on_gpu else "lapack"


@spec
class MatrixSpec(MatrixShape):
    """A generated test matrix (see `build`); validated on construction."""

    dtype: Dtype = "float32"
    seed: int = Field(
        default=0,
        ge=0,
        description=(
            "random seed: the same spec gives the same matrix (to rounding between a CPU and a GPU run, "
            "where it is built on the device)"
        ),
    )
    kind: MatrixKind = Field(
        default="gaussian",
        description=(
            "gaussian; ill_conditioned (singular values log-spaced from 1 to 1/cond); clustered (the same "
            "with min(m, n) // 6 values equal to 1 and as many equal to 1/cond); low_rank"
        ),
    )
    cond: float = Field(
        default=1e6, ge=1.0, allow_inf_nan=False, description="condition number of an ill_conditioned matrix"
    )
    rank: int | None = Field(default=None, ge=1, description="rank of a low_rank matrix (default min(m, n) / 4)")

    def __post_init__(self) -> None:
        if self.rank is not None and self.rank > min(self.m, self.n):
            raise ParamError("rank", f"must be <= min(m, n) = {min(self.m, self.n)}; got {self.rank}")

    def build(self, xp: Any = np) -> Any:
        """The (m, n) matrix of `dtype`, the same for the same spec.

        gaussian: i.i.d. standard normal entries.
        ill_conditioned: U diag(s) V^T with U, V random orthonormal (QR of Gaussians) and the
        min(m, n) singular values logspaced from 1 down to 1 / cond.
        clustered: the same with clusters of min(m, n) // 6 equal values at both ends
        (`singular_values`): graded and clustered, the hard case of a bidiagonal QR.
        low_rank: the product of (m, r) and (r, n) Gaussians, r = rank or max(1, min(m, n) // 4).
        Drawn in float64 by NumPy and rounded once to `dtype`. xp: the array module that does
        the products and QR factorizations and holds the result (numpy, or cupy: the same
        matrix to rounding, on the current device; a spec's O(n^3) products then run there).
        """
        m, n, k = self.m, self.n, min(self.m, self.n)
        rng = np.random.default_rng(self.seed)
        if self.kind == "gaussian":
            a = xp.asarray(rng.standard_normal((m, n)))
        elif self.kind in ("ill_conditioned", "clustered"):
            u, _ = xp.linalg.qr(xp.asarray(rng.standard_normal((m, k))))
            v, _ = xp.linalg.qr(xp.asarray(rng.standard_normal((n, k))))
            a = (u * xp.asarray(singular_values(self.kind, k, self.cond))) @ v.T
        else:
            r = max(1, k // 4) if self.rank is None else self.rank
            a = xp.asarray(rng.standard_normal((m, r))) @ xp.asarray(rng.standard_normal((r, n)))
        return xp.ascontiguousarray(a, dtype=self.dtype)


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

    def resolve_method(self, on_gpu: bool) -> Method:
        """The method that runs this job (see `resolve_method`)."""
        return resolve_method(self.params, self.shape, self.dtype, on_gpu)

    def load(self, xp: Any = np) -> Any:
        """The matrix to decompose, in xp's memory (numpy, or cupy: on the current device;
        a spec's O(n^3) products then run there too)."""
        if self.spec is not None:
            return self.spec.build(xp)
        return xp.asarray(self.matrix)

    def to_json(self) -> dict[str, Any]:
        """What the job store keeps (the matrix itself goes to `input_files`)."""
        options = asdict(self.params)
        if self.spec is not None:
            return {"source": "spec", "spec": asdict(self.spec), **options}
        m, n = self.shape
        return {"source": "upload", "m": m, "n": n, "dtype": self.dtype, **options}

    def input_files(self) -> dict[str, bytes]:
        return {} if self.matrix is None else {MATRIX_FILE: npy_bytes(self.matrix)}

    @classmethod
    def from_request(cls, request: SvdRequest, max_elements: int) -> SvdJob:
        """The job of a JSON request: a generated matrix within `max_elements`."""
        check_size(request.spec.m, request.spec.n, max_elements)
        options = {key: value for key, value in asdict(request).items() if key != "spec"}
        return cls(SvdParams(**options), spec=request.spec)

    @classmethod
    def from_upload(cls, params: SvdParams, files: Mapping[str, bytes], max_elements: int) -> SvdJob:
        """The job of an uploaded .npy matrix, files["matrix"] (its header checked before the
        data is read)."""

        def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
            if len(shape) != 2:
                raise ParamError("matrix", f"the array has shape {shape}; an SVD needs a 2-D matrix", "not_a_matrix")
            check_size(shape[0], shape[1], max_elements)
            if dtype.kind != "f" or dtype.itemsize not in (4, 8):
                raise ParamError("matrix", f"the matrix is {dtype}; send float32 or float64", "unsupported_dtype")

        return cls(params, matrix=load_npy(files["matrix"], "matrix", check))

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], files: Mapping[str, Path]) -> SvdJob:
        """The job `to_json` and `input_files` stored (files: input file name -> path)."""
        params = SvdParams(
            compute_uv=stored["compute_uv"],
            full_matrices=stored["full_matrices"],
            method=stored["method"],
            block_size=stored.get("block_size", 32),  # jobs stored before it was an option ran with 32
        )
        if stored["source"] == "spec":
            return cls(params, spec=MatrixSpec(**stored["spec"]))
        return cls(params, matrix=np.load(files[MATRIX_FILE], allow_pickle=False))


def check_size(m: int, n: int, max_elements: int) -> None:
    """InputError too_many_elements for an m x n matrix over the service's limit."""
    if m * n > max_elements:
        raise InputError(
            "too_many_elements",
            (
                f"a {m} x {n} matrix has {m * n:,} elements; SVD jobs take at most {max_elements:,} "
                "(PENCIL_MAX_MATRIX_ELEMENTS)"
            ),
        )


# ----------------------------------------------------------------- the job's contract --


@spec
class SvdRequest(SvdParams):
    """A JSON request: the options and a generated matrix."""

    _: KW_ONLY
    spec: MatrixSpec = Field(description="the matrix to generate (upload one as a form instead)")


class Accuracy(Result):
    resid: float = Field(
        description="||A - U S V^T||_1 / (||A||_1 max(m, n) ulp): O(1) is as accurate as the precision allows"
    )
    orth_u: float = Field(description="||I - U^T U||_1 / (m ulp)")
    orth_v: float = Field(description="||I - V^T V||_1 / (n ulp)")


class SvdResult(Result):
    m: int
    n: int
    dtype: str
    method: str = Field(description="the method that ran (auto resolved)")
    backend: str
    singular_values: list[float] = Field(description="the first 1024, descending; all of them in s.npy")
    singular_values_count: int
    condition_number: float | None
    accuracy: Accuracy | None = Field(description="LAPACK's test ratios; null without U and V")
    times_ms: dict[str, float] = Field(description="load, svd and the phases of the method")


SVD_SPEC = JobSpec(
    name="svd",
    summary="Singular value decomposition of a matrix (Golub-Reinsch, cuSOLVER or LAPACK)",
    body=SvdRequest,
    options=SvdParams,
    files=(InputFile("matrix", "a 2-D float32 or float64 .npy file (numpy.save), no NaN or Inf"),),
    result=SvdResult,
    example={
        "spec": {"m": 2048, "n": 2048, "dtype": "float32", "seed": 1, "kind": "ill_conditioned", "cond": 1e6},
        "compute_uv": True,
        "method": "auto",
    },
    result_files="s.npy, u.npy, vt.npy",
    form_example='curl -F matrix=@a.npy -F params=\'{"method": "lapack"}\'',
)
