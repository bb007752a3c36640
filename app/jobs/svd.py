"""POST /jobs/svd: the singular value decomposition of an uploaded matrix (multipart field
`matrix`, a .npy file) or of a generated one (JSON body with a `spec`).

Methods: `golub_reinsch` (Lahabar & Narayanan 2009: Householder bidiagonalization, then
implicitly shifted QR; gpu/svd/cuda.py on the job's GPU lease, gpu/svd/reference.py on the
CPU), `cusolver` (CuPy's cupy.linalg.svd on the lease; CUDA backend only), `lapack`
(NumPy), `auto` (on a GPU the faster of the two GPU methods as measured by bench/svd.py:
golub_reinsch for float32 from 4096 columns on, else cuSOLVER; LAPACK on the CPU). The result: singular values (JSON and s.npy), U and V^T
files when asked, LAPACK's accuracy ratios and the time of each phase.
"""

from __future__ import annotations

import io
import time
from typing import Any, Literal

import numpy as np
from fastapi import Request
from pydantic import BaseModel, Field, ValidationError, model_validator
from starlette.datastructures import UploadFile

from app.config import Settings
from app.errors import ApiError
from app.forms import read_form
from app.jobs.kinds import JobContext, JobKind, Submission, inline_schema, validation_detail
from app.jobs.npy import load_npy
from gpu.svd import reference
from gpu.svd.params import MATRIX_KINDS, SvdParams, make_matrix

METHODS = ("auto", "golub_reinsch", "cusolver", "lapack")
VALUES_IN_JSON = 1024  # singular values listed in the JSON result; all of them are in s.npy


class SvdOptions(BaseModel):
    compute_uv: bool = Field(True, description="also compute U and V^T")
    full_matrices: bool = Field(False, description="U m x m and V^T n x n instead of the thin m x k, k x n")
    method: Literal["auto", "golub_reinsch", "cusolver", "lapack"] = Field("auto", description="auto: on a GPU the faster method measured for the shape and dtype (ours for float32 from 4096 columns, else cuSOLVER), LAPACK on the CPU")


class MatrixSpec(BaseModel):
    m: int = Field(..., ge=1, description="rows")
    n: int = Field(..., ge=1, description="columns")
    dtype: Literal["float32", "float64"] = "float32"
    seed: int = Field(0, ge=0, description="random seed: the same spec gives the same matrix")
    kind: Literal[MATRIX_KINDS] = Field("gaussian", description="gaussian; ill_conditioned (singular values log-spaced from 1 to 1/cond); low_rank")  # type: ignore[valid-type]
    cond: float = Field(1e6, ge=1.0, allow_inf_nan=False, description="condition number of an ill_conditioned matrix")
    rank: int | None = Field(None, ge=1, description="rank of a low_rank matrix (default min(m, n) / 4)")

    @model_validator(mode="after")
    def _rank_fits(self) -> MatrixSpec:
        if self.rank is not None and self.rank > min(self.m, self.n):
            raise ValueError(f"rank {self.rank} is more than min(m, n) = {min(self.m, self.n)}")
        return self


class SvdRequest(SvdOptions):
    spec: MatrixSpec




EXAMPLE = {"spec": {"m": 2048, "n": 2048, "dtype": "float32", "seed": 1, "kind": "ill_conditioned", "cond": 1e6}, "compute_uv": True, "method": "auto"}

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": inline_schema(SvdRequest), "example": EXAMPLE},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["matrix"],
                    "properties": {
                        "matrix": {"type": "string", "format": "binary", "description": "a 2-D float32 or float64 .npy file (numpy.save), no NaN or Inf"},
                        "compute_uv": {"type": "boolean", "default": True},
                        "full_matrices": {"type": "boolean", "default": False},
                        "method": {"type": "string", "enum": list(METHODS), "default": "auto"},
                    },
                }
            },
        },
    },
    "responses": {"202": {"description": "the job, queued; poll its Location. The result: {m, n, dtype, method, singular_values, accuracy: {resid, orth_u, orth_v}, times_ms} and the files s.npy, u.npy, vt.npy"}},
}


# Without a GPU the Golub-Reinsch method runs the readable NumPy definition, whose bulge
# chase is a Python loop (about 10 s at 512 columns, a minute at 1024): larger matrices
# are refused there rather than left to hold a job stream for an hour.
GOLUB_REINSCH_MAX_SIDE = 512


# Where bench/svd.py measured our Golub-Reinsch faster than cuSOLVER on the H200
# (BENCHMARKS.md, 2026-11-22): float32 from 4096 columns (the smaller side) on, with
# vectors (1.12x) and without (1.06x); cuSOLVER elsewhere (float64: 0.93-0.98x; 2048:
# 0.79x with vectors, a tie without). Both pass LAPACK's accuracy ratios.
AUTO_GOLUB_REINSCH_MIN_SIDE = 4096


def auto_gpu_method(m: int, n: int, dtype: np.dtype) -> str:
    """The GPU method `auto` runs for an (m, n) matrix of `dtype`: the faster one measured."""
    return "golub_reinsch" if np.dtype(dtype) == np.float32 and min(m, n) >= AUTO_GOLUB_REINSCH_MIN_SIDE else "cusolver"


def _options(raw: dict[str, Any], backend: str, m: int, n: int) -> SvdOptions:
    try:
        options = SvdOptions.model_validate(raw)
    except ValidationError as exc:
        raise ApiError(422, "invalid_parameter", validation_detail(exc)) from None
    if options.method == "cusolver" and backend != "cuda":
        raise ApiError(422, "invalid_parameter", "method: cusolver needs the CUDA backend; this server runs on the CPU (use auto, golub_reinsch or lapack)")
    if options.method == "golub_reinsch" and backend != "cuda" and min(m, n) > GOLUB_REINSCH_MAX_SIDE:
        raise ApiError(422, "invalid_parameter", f"method: golub_reinsch without a GPU runs the NumPy reference, for matrices with min(m, n) <= {GOLUB_REINSCH_MAX_SIDE} (this one: {min(m, n)}); use auto or lapack")
    return options




def _check_size(m: int, n: int, settings: Settings) -> None:
    if m * n > settings.max_matrix_elements:
        raise ApiError(413, "too_many_elements", f"a {m} x {n} matrix has {m * n:,} elements; SVD jobs take at most {settings.max_matrix_elements:,} (PENCIL_MAX_MATRIX_ELEMENTS)")


async def parse(request: Request, settings: Settings) -> Submission:
    backend = request.app.state.backend.name
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("application/json"):
        try:
            body = await request.json()
            spec_request = SvdRequest.model_validate(body, strict=True)  # JSON: true is no number (forms are text, read leniently)
        except ValueError as exc:  # ValidationError is a ValueError; so is malformed JSON
            detail = validation_detail(exc) if isinstance(exc, ValidationError) else f"the body is not JSON: {exc}"
            raise ApiError(422 if isinstance(exc, ValidationError) else 400, "invalid_parameter" if isinstance(exc, ValidationError) else "bad_request", detail) from None
        _check_size(spec_request.spec.m, spec_request.spec.n, settings)
        options = _options(spec_request.model_dump(exclude={"spec"}), backend, spec_request.spec.m, spec_request.spec.n)
        return Submission({"source": "spec", "spec": spec_request.spec.model_dump(), **options.model_dump()})
    if content_type.startswith("multipart/form-data"):
        data, fields = await _read_form(request)
        matrix = _load_npy(data, settings)
        m, n = matrix.shape
        options = _options(fields, backend, m, n)
        if not matrix.dtype.isnative:  # store what the job will read: native byte order
            buffer = io.BytesIO()
            np.save(buffer, matrix.astype(matrix.dtype.newbyteorder("=")))
            data = buffer.getvalue()
        return Submission({"source": "upload", "m": m, "n": n, "dtype": matrix.dtype.newbyteorder("=").name, **options.model_dump()}, {"matrix.npy": data})
    raise ApiError(415, "unsupported_media_type", "send a JSON body with a 'spec' (Content-Type: application/json), or the matrix as a .npy file in the multipart field 'matrix' (curl -F matrix=@a.npy)")


async def _read_form(request: Request) -> tuple[bytes, dict[str, str]]:
    form = await read_form(request, max_files=1, max_fields=8, hint="The matrix must be a file part: curl -F matrix=@a.npy")
    try:
        upload = form.get("matrix")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "missing_matrix", "the form needs a file field named 'matrix' holding a .npy file (curl -F matrix=@a.npy)")
        data = await upload.read()
        fields = {key: value for key, value in form.multi_items() if key in SvdOptions.model_fields and isinstance(value, str)}
        return data, fields
    finally:
        await form.close()


def _load_npy(data: bytes, settings: Settings) -> np.ndarray:
    def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
        if len(shape) != 2:
            raise ApiError(422, "not_a_matrix", f"the array has shape {shape}; an SVD needs a 2-D matrix")
        _check_size(shape[0], shape[1], settings)
        if dtype.kind != "f" or dtype.itemsize not in (4, 8):
            raise ApiError(422, "unsupported_dtype", f"the matrix is {dtype}; send float32 or float64")

    matrix = load_npy(data, "matrix", check)
    native = matrix.astype(matrix.dtype.newbyteorder("="), copy=False) if matrix.dtype.kind == "f" else matrix
    try:
        reference.check_matrix(native, settings.max_matrix_elements)
        return matrix
    except reference.SvdInputError as exc:
        raise ApiError(422, "invalid_matrix", str(exc)) from None


# --------------------------------------------------------------------- running --


def _matrix(ctx: JobContext) -> np.ndarray:
    params = ctx.job.params
    if params["source"] == "upload":
        return np.load(ctx.inputs / "matrix.npy", allow_pickle=False)
    spec = params["spec"]
    return make_matrix(spec["m"], spec["n"], np.dtype(spec["dtype"]), spec["seed"], spec["kind"], cond=spec["cond"], rank=spec["rank"])


def run(ctx: JobContext) -> dict[str, Any]:
    params = ctx.job.params
    times: dict[str, float] = {}
    start = time.perf_counter()
    a = _matrix(ctx)
    times["load"] = (time.perf_counter() - start) * 1000
    method = params["method"]
    if method == "auto":
        method = auto_gpu_method(*a.shape, a.dtype) if ctx.lease is not None else "lapack"
    ctx.progress(0.05)
    start = time.perf_counter()
    if method == "cusolver":
        u, s, vt = _cusolver(a, params, ctx.lease)
    elif method == "golub_reinsch" and ctx.lease is not None:
        from gpu.svd import cuda

        svd_params = SvdParams(compute_uv=params["compute_uv"], full_matrices=params["full_matrices"], method=method)
        u, s, vt = cuda.svd(a, svd_params, ctx.lease, timings=times)
    else:
        svd_params = SvdParams(compute_uv=params["compute_uv"], full_matrices=params["full_matrices"], method=method)
        u, s, vt = reference.svd(a, svd_params, timings=times)
    times["svd"] = (time.perf_counter() - start) * 1000
    ctx.progress(0.9)
    np.save(ctx.results / "s.npy", s)
    accuracy = None
    if params["compute_uv"]:
        np.save(ctx.results / "u.npy", u)
        np.save(ctx.results / "vt.npy", vt)
        k = min(a.shape)
        accuracy = reference.accuracy(a, u[:, :k], s, vt[:k, :])
    m, n = a.shape
    return {
        "m": m, "n": n, "dtype": str(a.dtype), "method": method, "backend": ctx.backend,
        "singular_values": s[:VALUES_IN_JSON].astype(float).tolist(), "singular_values_count": int(s.size),
        "condition_number": float(s[0] / s[-1]) if s.size and s[-1] > 0 else None,
        "accuracy": accuracy, "times_ms": {key: round(value, 3) for key, value in times.items()},
    }


def _cusolver(a: np.ndarray, params: dict[str, Any], lease) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
    import cupy

    with cupy.cuda.Device(lease.device), lease.stream:
        d_a = cupy.asarray(a)
        if params["compute_uv"]:
            u, s, vt = cupy.linalg.svd(d_a, full_matrices=params["full_matrices"], compute_uv=True)
            return u.get(), s.get(), vt.get()
        return None, cupy.linalg.svd(d_a, compute_uv=False).get(), None


SVD = JobKind(name="svd", summary="Singular value decomposition of a matrix (Golub-Reinsch, cuSOLVER or LAPACK)", parse=parse, run=run, openapi=OPENAPI)
