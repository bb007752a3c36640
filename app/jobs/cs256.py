"""POST /jobs/cs256: a weight matrix pruned and converted to CS256 (Lasby, Zimmer, Pokutta &
Schultheis), its memory against dense, CSR, COO and a bitmask, and y = A x by the CS256
kernel timed against dense cuBLAS and cuSPARSE CSR in the same job on the same GPU
(gpu.cs256's front door; on the CPU backend the NumPy reference against NumPy and SciPy).

Input: a multipart upload (file `matrix`: a 2-D .npy, or a .safetensors with `tensor` in
the options naming the weight; optional file `x`, a .npy; the options as JSON in the
field `params`) or a JSON body with a random `spec` {m, n, dtype, seed}, the options and
an optional `x`. The result: the storage report, pruning figures, the kernel's max
relative error against the float64 dense product, times and bandwidths; files y.npy
(float32) and the CS256 matrix (cs256.npz and/or cs256.safetensors).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.config import Settings
from app.errors import ApiError
from app.jobs.kinds import JobKind, ResultModel, Submission, inline_schema
from app.jobs.requests import form_schema, is_form, is_json, json_body, unsupported, upload_form, validated
from gpu import cs256
from gpu.cs256.files import SafetensorsError, read_safetensors_header
from gpu.cs256.format import DTYPES, TILE, VECS
from gpu.cs256.params import MAX_VECTORS, REPEATS_MAX, SAVE_CHOICES, VARIANTS
from gpu.npy import load_npy

# Literal types of the choice tuples: pydantic reads the Literal at run time, mypy sees str.
if TYPE_CHECKING:
    SaveChoice = str
    VariantName = str
    DtypeName = str
else:
    SaveChoice = Literal[SAVE_CHOICES]
    VariantName = Literal[VARIANTS]
    DtypeName = Literal[DTYPES]


NPY_MAGIC = b"\x93NUMPY"
TENSORS_LISTED = 20
UPLOAD_DTYPES = {
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
}
FORM_EXAMPLE = 'curl -F matrix=@w.safetensors -F params=\'{"tensor": "NAME", "sparsity": 0.5}\''


class Cs256Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sparsity: float | None = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        allow_inf_nan=False,
        description=(
            "target fraction of zero weights after magnitude pruning (each tile keeps a multiple of "
            "vec); null: keep the matrix's own zeros"
        ),
    )
    vec: int = Field(
        8, description="4, 8 or 16: every tile stores a multiple of vec entries (vector loads of that width)"
    )
    vectors: int | None = Field(
        None,
        ge=1,
        le=MAX_VECTORS,
        description="random vectors x to multiply when no x is sent (default 1: SpMV; 2..16: SpMM)",
    )
    repeats: int = Field(
        20,
        ge=1,
        le=REPEATS_MAX,
        description="timed runs of each product; the median is reported (each starts with a cold L2)",
    )
    save: SaveChoice = Field(
        "npz", description="files of the CS256 matrix to write: cs256.npz, cs256.safetensors, both or none"
    )
    variant: VariantName = Field(
        "group",
        description=(
            "CUDA kernel: group (coalesced, any number of vectors) or split4 (the paper's appendix layout, one vector)"
        ),
    )

    @field_validator("vec")
    @classmethod
    def _vec(cls, value: int) -> int:
        if value not in VECS:
            raise ValueError(f"must be one of {', '.join(map(str, VECS))}")
        return value


class MatrixSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    m: int = Field(..., ge=1, description="rows (output features)")
    n: int = Field(..., ge=1, description="columns (input features)")
    dtype: DtypeName = Field("float16", description="the values' dtype")
    seed: int = Field(
        0, ge=0, description="random seed: the same spec gives the same matrix (i.i.d. standard normal weights)"
    )


class Cs256Request(Cs256Options):
    spec: MatrixSpec
    x: list[float] | list[list[float]] | None = Field(
        None,
        description=(
            "x as n numbers (one vector) or n rows of k numbers (k vectors, 1..16); default random "
            "(seeded by spec.seed)"
        ),
    )


class Cs256UploadOptions(Cs256Options):
    """The `params` JSON of an upload: the options, the dtype to round to, the tensor of a
    .safetensors file and the seed of a random x."""

    dtype: DtypeName | None = Field(
        None,
        description=(
            "the CS256 values' dtype, rounding the upload to it (needed for float64 uploads); default the upload's"
        ),
    )
    tensor: str | None = Field(
        None, description="the tensor's name in a .safetensors file (optional when it holds one tensor)"
    )
    seed: int = Field(0, ge=0, description="seed of the random x")


class Cs256Accuracy(ResultModel):
    max_relative_error: float = Field(description="of y against the float64 dense product")
    tolerance: float
    within_tolerance: bool
    outputs_out_of_range: int = Field(description="entries of y past the dtype's range")


class Cs256Result(ResultModel):
    m: int
    n: int
    dtype: str
    vec: int
    vectors: int
    backend: str
    source: Literal["spec", "upload"]
    pruning: dict[str, float] | None = Field(
        description="target_sparsity, removed_norm, output_change; null without pruning"
    )
    format: dict[str, Any] = Field(
        description="the storage report: nnz, padding, bytes and bits per non-zero of each format"
    )
    accuracy: Cs256Accuracy
    kernel: dict[str, Any] = Field(description="the kernel's plan (GPU) or the NumPy reference")
    anchors: dict[str, str | None] = Field(description="what each anchor is (dense, csr)")
    times_ms: dict[str, float]
    speedup: dict[str, float | None] = Field(description="vs_dense, vs_csr")
    bytes_moved: dict[str, int]
    bandwidth_gb_s: dict[str, float | None]


EXAMPLE = {"spec": {"m": 4096, "n": 4096, "dtype": "float16", "seed": 1}, "sparsity": 0.66, "vec": 8, "repeats": 20}

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": inline_schema(Cs256Request), "example": EXAMPLE},
            "multipart/form-data": {
                "schema": form_schema(
                    {
                        "matrix": (
                            "the weight matrix: a 2-D .npy (float16, float32; float64 with dtype) or a .safetensors "
                            "file (F16, BF16, F32; F64 with dtype), no NaN or Inf"
                        ),
                        "x": (
                            "optional .npy of shape (n,) or (n, k), k <= 16, finite floats (rounded to the matrix's "
                            "dtype)"
                        ),
                    },
                    ("matrix",),
                    (
                        "the options as a JSON object: sparsity (null: keep the matrix's own zeros), vec, "
                        "vectors, repeats, save, variant, dtype, tensor, seed"
                    ),
                )
            },
        },
    },
    "responses": {
        "202": {
            "description": (
                "the job, queued; poll its Location. The result: {m, n, dtype, vec, vectors, backend, "
                "pruning, format (bytes and bits per non-zero of CS256, dense, CSR, COO, bitmask), "
                "accuracy, kernel, times_ms, speedup, bandwidth_gb_s} and the files y.npy, cs256.npz / "
                "cs256.safetensors"
            )
        }
    },
}


# ------------------------------------------------------------------ parsing --


def _check_size(m: int, n: int, settings: Settings) -> None:
    """The limit counts the columns padded to whole tiles of 256 (pruning and conversion
    work on whole tiles, so a 10^6 x 1 matrix costs as much as a 10^6 x 256 one)."""
    padded = m * TILE * -(-n // TILE)
    if padded > settings.max_cs256_elements:
        size = f"{m * n:,} elements" + (
            f" ({padded:,} with its rows padded to whole tiles of {TILE} columns)" if padded != m * n else ""
        )
        raise ApiError(
            413,
            "too_many_elements",
            (
                f"a {m} x {n} matrix has {size}; CS256 jobs take at most {settings.max_cs256_elements:,} "
                "(PENCIL_MAX_CS256_ELEMENTS)"
            ),
        )


def _params(options: Cs256Options, x: np.ndarray | None) -> cs256.Cs256Params:
    """The job's parameters; the number of vectors comes from x when one is sent."""
    k = None
    if x is not None and x.ndim in (1, 2):
        k = 1 if x.ndim == 1 else x.shape[1]
        if not 1 <= k <= MAX_VECTORS:
            raise ApiError(
                422, "invalid_x", f"x has shape {x.shape}; expected (n,) or (n, k) with 1 <= k <= {MAX_VECTORS}"
            )
    if k is not None and options.vectors is not None and options.vectors != k:
        raise ApiError(422, "invalid_parameter", f"vectors: {options.vectors} asked for, but x holds {k}")
    return cs256.Cs256Params(
        sparsity=options.sparsity,
        vec=options.vec,
        vectors=k or options.vectors or 1,
        repeats=options.repeats,
        save=options.save,
        variant=options.variant,
    )


async def parse(request: Request, settings: Settings) -> Submission:
    if is_json(request):
        req = await json_body(request, Cs256Request)
        _check_size(req.spec.m, req.spec.n, settings)
        x = None
        if req.x is not None:
            try:
                x = np.asarray(req.x, dtype=np.float64)
            except ValueError:
                raise ApiError(
                    422, "invalid_x", "x must be n numbers or n rows of k numbers (rows of equal length)"
                ) from None
        job = cs256.Cs256Job.generated(_params(req, x), req.spec.m, req.spec.n, req.spec.dtype, req.spec.seed, x)
    elif is_form(request):
        form = await upload_form(request, ("matrix",), ("x",), example=FORM_EXAMPLE)
        options = validated(Cs256UploadOptions, form.params, "params.")
        matrix, source = _load_matrix(form.files["matrix"], options.tensor, settings)
        x = _load_npy(form.files["x"], "x", None) if "x" in form.files else None
        dtype = options.dtype or _default_dtype(matrix, source)
        job = await asyncio.to_thread(
            cs256.Cs256Job.uploaded, _params(options, x), matrix, dtype, source, options.seed, x
        )
    else:
        raise unsupported(
            "send a JSON body with a 'spec' (Content-Type: application/json), or the matrix as a .npy "
            "or .safetensors file in the multipart field 'matrix' and the options as JSON in the "
            f"field 'params' ({FORM_EXAMPLE})"
        )
    return Submission.of(job)


def _load_matrix(data: bytes, tensor: str | None, settings: Settings) -> tuple[np.ndarray, dict[str, Any]]:
    """The uploaded matrix (a view of `data` for safetensors) and where it came from:
    {"file": "npy"} or {"file": "safetensors", "tensor": name, "code": dtype code}."""
    if not data:
        raise ApiError(400, "empty_file", "the uploaded matrix file is empty")
    if data.startswith(NPY_MAGIC):
        if tensor is not None:
            raise ApiError(
                422, "invalid_parameter", "tensor: names a tensor of a .safetensors file; this upload is a .npy"
            )
        return _load_npy(data, "matrix", settings), {"file": "npy"}
    try:
        header, _, start = read_safetensors_header(data)
    except SafetensorsError as exc:
        if len(data) >= 9 and data[8:9] == b"{":
            raise ApiError(
                400, "malformed_safetensors", f"the 'matrix' file is not a readable .safetensors file ({exc})"
            ) from None
        raise ApiError(
            415, "unsupported_format", "the 'matrix' file is neither a .npy nor a .safetensors file"
        ) from None
    names = list(header)
    shown = ", ".join(names[:TENSORS_LISTED]) + (", ..." if len(names) > TENSORS_LISTED else "")
    if tensor is None:
        if len(names) != 1:
            raise ApiError(
                422,
                "missing_tensor",
                f'the .safetensors file holds {len(names)} tensors; name one as "tensor" in params ({shown})'
                if names
                else "the .safetensors file holds no tensor",
            )
        tensor = names[0]
    if tensor not in header:
        raise ApiError(422, "unknown_tensor", f"the .safetensors file has no tensor {tensor!r}; it holds: {shown}")
    entry = header[tensor]
    if len(entry["shape"]) != 2:
        raise ApiError(422, "not_a_matrix", f"tensor {tensor!r} has shape {entry['shape']}; CS256 stores 2-D matrices")
    m, n = entry["shape"]
    _check_size(m, n, settings)
    code = entry["dtype"]
    if code not in ("F16", "BF16", "F32", "F64"):
        raise ApiError(
            422, "unsupported_dtype", f"tensor {tensor!r} is {code}; CS256 takes F16, BF16 or F32 (F64 with dtype)"
        )
    begin, end = entry["data_offsets"]
    storage = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}[code]
    array = np.frombuffer(memoryview(data)[start + begin : start + end], dtype=storage).reshape(entry["shape"])
    return array, {"file": "safetensors", "tensor": tensor, "code": code}


def _load_npy(data: bytes, field: str, settings: Settings | None) -> np.ndarray:
    """The matrix (2-D, within the size limit: settings given) or x, from its .npy bytes."""

    def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
        if field == "matrix":
            if len(shape) != 2:
                raise ApiError(422, "not_a_matrix", f"the array has shape {shape}; CS256 stores 2-D matrices")
            if settings is not None:
                _check_size(shape[0], shape[1], settings)
        if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8):
            raise ApiError(
                422,
                "unsupported_dtype" if field == "matrix" else "invalid_x",
                f"the {field} is {dtype}; send float16, float32 or float64",
            )

    return load_npy(data, field, check)


def _default_dtype(matrix: np.ndarray, source: dict[str, Any]) -> str:
    name = UPLOAD_DTYPES.get(source.get("code") or matrix.dtype.name)
    if name not in DTYPES:
        raise ApiError(
            422,
            "unsupported_dtype",
            (
                f"the matrix is {source.get('code') or matrix.dtype}; send float16, bfloat16 (safetensors) "
                "or float32, or give dtype to round it to one of them"
            ),
        )
    return name


CS256_JOB = JobKind(
    name="cs256",
    summary=(
        "Prune a weight matrix to CS256 compressed sparse tiles; memory and SpMV/SpMM speed "
        "against dense cuBLAS and cuSPARSE CSR"
    ),
    parse=parse,
    job_type=cs256.Cs256Job,
    run=cs256.run,
    openapi=OPENAPI,
    result_model=Cs256Result,
)
