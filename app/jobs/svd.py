"""POST /jobs/svd: the singular value decomposition of an uploaded matrix (multipart file
`matrix`, a .npy file, and the options as JSON in the field `params`) or of a generated one
(JSON body with a `spec`). The decomposition itself is gpu.svd's front door.

Methods: `golub_reinsch` (Lahabar & Narayanan 2009), `cusolver` (CUDA backend only),
`lapack` (NumPy), `auto` (on a GPU the faster of the two GPU methods as measured by
bench/svd.py, LAPACK on the CPU).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Literal

import numpy as np
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from app.config import Settings
from app.errors import ApiError
from app.jobs.kinds import JobKind, ResultModel, Submission, inline_schema
from app.jobs.npy import load_npy
from app.jobs.requests import form_schema, is_form, is_json, json_body, unsupported, upload_form, validated
from gpu import svd
from gpu.svd.params import MATRIX_KINDS

# Literal types of the choice tuples: pydantic reads the Literal at run time, mypy sees str.
if TYPE_CHECKING:
    MethodName = str
    MatrixKind = str
else:
    MethodName = Literal[svd.METHODS]
    MatrixKind = Literal[MATRIX_KINDS]


class SvdOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    compute_uv: bool = Field(True, description="also compute U and V^T")
    full_matrices: bool = Field(False, description="U m x m and V^T n x n instead of the thin m x k, k x n")
    method: MethodName = Field(
        "auto",
        description=(
            "auto: on a GPU the faster method measured for the shape and dtype (ours for float32 with "
            "vectors from 4096 columns, else cuSOLVER), LAPACK on the CPU"
        ),
    )


class MatrixSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    m: int = Field(..., ge=1, description="rows")
    n: int = Field(..., ge=1, description="columns")
    dtype: Literal["float32", "float64"] = "float32"
    seed: int = Field(
        0,
        ge=0,
        description=(
            "random seed: the same spec gives the same matrix (to rounding between a CPU and a GPU run, "
            "where it is built on the device)"
        ),
    )
    kind: MatrixKind = Field(
        "gaussian",
        description=(
            "gaussian; ill_conditioned (singular values log-spaced from 1 to 1/cond); clustered (the same "
            "with min(m, n) // 6 values equal to 1 and as many equal to 1/cond); low_rank"
        ),
    )
    cond: float = Field(1e6, ge=1.0, allow_inf_nan=False, description="condition number of an ill_conditioned matrix")
    rank: int | None = Field(None, ge=1, description="rank of a low_rank matrix (default min(m, n) / 4)")


class SvdRequest(SvdOptions):
    spec: MatrixSpec


class Accuracy(ResultModel):
    resid: float = Field(
        description="||A - U S V^T||_1 / (||A||_1 max(m, n) ulp): O(1) is as accurate as the precision allows"
    )
    orth_u: float = Field(description="||I - U^T U||_1 / (m ulp)")
    orth_v: float = Field(description="||I - V^T V||_1 / (n ulp)")


class SvdResult(ResultModel):
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


EXAMPLE = {
    "spec": {"m": 2048, "n": 2048, "dtype": "float32", "seed": 1, "kind": "ill_conditioned", "cond": 1e6},
    "compute_uv": True,
    "method": "auto",
}
FORM_EXAMPLE = 'curl -F matrix=@a.npy -F params=\'{"method": "lapack"}\''

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": inline_schema(SvdRequest), "example": EXAMPLE},
            "multipart/form-data": {
                "schema": form_schema(
                    {"matrix": "a 2-D float32 or float64 .npy file (numpy.save), no NaN or Inf"},
                    ("matrix",),
                    (
                        "the options as a JSON object: compute_uv, full_matrices, method (as in the JSON body, "
                        "without spec)"
                    ),
                )
            },
        },
    },
    "responses": {
        "202": {
            "description": (
                "the job, queued; poll its Location. The result: {m, n, dtype, method, backend, "
                "singular_values, singular_values_count, condition_number, accuracy: {resid, orth_u, "
                "orth_v}, times_ms} and the files s.npy, u.npy, vt.npy"
            )
        }
    },
}


def _params(options: SvdOptions) -> svd.SvdParams:
    return svd.SvdParams(compute_uv=options.compute_uv, full_matrices=options.full_matrices, method=options.method)


def _check_size(m: int, n: int, settings: Settings) -> None:
    if m * n > settings.max_matrix_elements:
        raise ApiError(
            413,
            "too_many_elements",
            (
                f"a {m} x {n} matrix has {m * n:,} elements; SVD jobs take at most "
                f"{settings.max_matrix_elements:,} (PENCIL_MAX_MATRIX_ELEMENTS)"
            ),
        )


def _load_matrix(data: bytes, settings: Settings) -> np.ndarray:
    def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
        if len(shape) != 2:
            raise ApiError(422, "not_a_matrix", f"the array has shape {shape}; an SVD needs a 2-D matrix")
        _check_size(shape[0], shape[1], settings)
        if dtype.kind != "f" or dtype.itemsize not in (4, 8):
            raise ApiError(422, "unsupported_dtype", f"the matrix is {dtype}; send float32 or float64")

    return load_npy(data, "matrix", check)


async def parse(request: Request, settings: Settings) -> Submission:
    if is_json(request):
        body = await json_body(request, SvdRequest)
        _check_size(body.spec.m, body.spec.n, settings)
        job = svd.SvdJob(_params(body), spec=svd.MatrixSpec(**body.spec.model_dump()))
    elif is_form(request):
        form = await upload_form(request, ("matrix",), example=FORM_EXAMPLE)
        options = validated(SvdOptions, form.params, "params.")
        matrix = _load_matrix(form.files["matrix"], settings)
        job = await asyncio.to_thread(svd.SvdJob, _params(options), matrix=matrix)
    else:
        raise unsupported(
            "send a JSON body with a 'spec' (Content-Type: application/json), or the matrix as a .npy "
            "file in the multipart field 'matrix' and the options as JSON in the field 'params' "
            f"({FORM_EXAMPLE})"
        )
    job.check_backend(request.app.state.backend.name)
    return Submission.of(job)


SVD = JobKind(
    name="svd",
    summary="Singular value decomposition of a matrix (Golub-Reinsch, cuSOLVER or LAPACK)",
    parse=parse,
    job_type=svd.SvdJob,
    run=svd.run,
    openapi=OPENAPI,
    result_model=SvdResult,
)
