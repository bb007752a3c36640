"""POST /jobs/cs256: a weight matrix pruned and converted to CS256 (Lasby, Zimmer, Pokutta &
Schultheis), its memory against dense, CSR, COO and a bitmask, and y = A x by the CS256
kernel timed against dense cuBLAS and cuSPARSE CSR in the same job on the same GPU.

Input: a multipart upload (field `matrix`: a 2-D .npy, or a .safetensors with the form
field `tensor` naming the weight; options as form fields; optional `x` as a .npy file) or
a JSON body with a random `spec` {m, n, dtype, seed}, the options and an optional `x`.
The result: the storage report, pruning figures, the kernel's max relative error against
the float64 dense product, times and bandwidths; files y.npy (float32) and the CS256
matrix (cs256.npz and/or cs256.safetensors). On the CPU backend the product is the NumPy
reference and the anchors are NumPy (dense, float32 BLAS) and SciPy CSR when installed.
"""

from __future__ import annotations

import io
import time
from typing import Any, Literal

import numpy as np
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.datastructures import UploadFile

from app.config import Settings
from app.errors import ApiError
from app.forms import read_form
from app.jobs.kinds import JobContext, JobKind, Submission, inline_schema, validation_detail
from app.jobs.npy import load_npy
from gpu.cs256 import reference
from gpu.cs256.files import SafetensorsError, read_safetensors_header, save_npz, save_safetensors
from gpu.cs256.format import DTYPES, STORAGE, TILE, VECS, CS256Error, as_storage, from_dense, prune, storage_report, to_float32
from gpu.cs256.params import MAX_VECTORS, REPEATS_MAX, SAVE_CHOICES, Cs256Params, make_matrix, make_x

CPU_REPEATS = 3  # the NumPy timings are seconds long: fewer runs
NPY_MAGIC = b"\x93NUMPY"
TENSORS_LISTED = 20
UPLOAD_DTYPES = {"float16": "float16", "float32": "float32", "float64": "float64", "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}


class Cs256Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sparsity: float | None = Field(0.5, ge=0.0, lt=1.0, allow_inf_nan=False, description="target fraction of zero weights after magnitude pruning (each tile keeps a multiple of vec); null: keep the matrix's own zeros")
    vec: int = Field(8, description="4, 8 or 16: every tile stores a multiple of vec entries (vector loads of that width)")
    vectors: int | None = Field(None, ge=1, le=MAX_VECTORS, description="random vectors x to multiply when no x is sent (default 1: SpMV; 2..16: SpMM)")
    repeats: int = Field(20, ge=1, le=REPEATS_MAX, description="timed runs of each product; the median is reported (each starts with a cold L2)")
    save: Literal[SAVE_CHOICES] = Field("npz", description="files of the CS256 matrix to write: cs256.npz, cs256.safetensors, both or none")  # type: ignore[valid-type]
    variant: Literal["group", "split4"] = Field("group", description="CUDA kernel: group (coalesced, any number of vectors) or split4 (the paper's appendix layout, one vector)")
    dtype: Literal[DTYPES] | None = Field(None, description="uploads: the CS256 values' dtype, rounding the upload to it (needed for float64 uploads); default the upload's")  # type: ignore[valid-type]

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
    dtype: Literal[DTYPES] = Field("float16", description="the values' dtype")  # type: ignore[valid-type]
    seed: int = Field(0, ge=0, description="random seed: the same spec gives the same matrix (i.i.d. standard normal weights)")


class Cs256Request(Cs256Options):
    spec: MatrixSpec
    x: list[float] | list[list[float]] | None = Field(None, description="x as n numbers (one vector) or n rows of k numbers (k vectors, 1..16); default random (seeded by spec.seed)")


EXAMPLE = {"spec": {"m": 4096, "n": 4096, "dtype": "float16", "seed": 1}, "sparsity": 0.66, "vec": 8, "repeats": 20}

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": inline_schema(Cs256Request), "example": EXAMPLE},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["matrix"],
                    "properties": {
                        "matrix": {"type": "string", "format": "binary", "description": "the weight matrix: a 2-D .npy (float16, float32; float64 with dtype) or a .safetensors file (F16, BF16, F32; F64 with dtype), no NaN or Inf"},
                        "tensor": {"type": "string", "description": "the tensor's name in a .safetensors file (optional when it holds one tensor)"},
                        "x": {"type": "string", "format": "binary", "description": "optional .npy of shape (n,) or (n, k), k <= 16, finite floats (rounded to the matrix's dtype)"},
                        "sparsity": {"type": "string", "default": "0.5", "description": "a number in [0, 1), or 'none' to keep the matrix's own zeros"},
                        "vec": {"type": "integer", "enum": list(VECS), "default": 8},
                        "vectors": {"type": "integer", "minimum": 1, "maximum": MAX_VECTORS, "default": 1},
                        "repeats": {"type": "integer", "minimum": 1, "maximum": REPEATS_MAX, "default": 20},
                        "save": {"type": "string", "enum": list(SAVE_CHOICES), "default": "npz"},
                        "variant": {"type": "string", "enum": ["group", "split4"], "default": "group"},
                        "dtype": {"type": "string", "enum": list(DTYPES), "description": "round the upload to this dtype (default: the upload's own)"},
                        "seed": {"type": "integer", "minimum": 0, "default": 0, "description": "seed of the random x"},
                    },
                }
            },
        },
    },
    "responses": {"202": {"description": "the job, queued; poll its Location. The result: {m, n, dtype, vec, vectors, backend, pruning, format (bytes and bits per non-zero of CS256, dense, CSR, COO, bitmask), accuracy, kernel, times_ms, speedup, bandwidth_gb_s} and the files y.npy, cs256.npz / cs256.safetensors"}},
}


# ------------------------------------------------------------------ parsing --


def _invalid(exc: ValidationError) -> ApiError:
    return ApiError(422, "invalid_parameter", validation_detail(exc))


def _check_size(m: int, n: int, settings: Settings) -> None:
    """The limit counts the columns padded to whole tiles of 256 (pruning and conversion
    work on whole tiles, so a 10^6 x 1 matrix costs as much as a 10^6 x 256 one)."""
    padded = m * TILE * -(-n // TILE)
    if padded > settings.max_cs256_elements:
        size = f"{m * n:,} elements" + (f" ({padded:,} with its rows padded to whole tiles of {TILE} columns)" if padded != m * n else "")
        raise ApiError(413, "too_many_elements", f"a {m} x {n} matrix has {size}; CS256 jobs take at most {settings.max_cs256_elements:,} (PENCIL_MAX_CS256_ELEMENTS)")


def _options_checked(options: Cs256Options, k: int | None) -> int:
    """The number of vectors, after the checks that involve x."""
    if k is not None and options.vectors is not None and options.vectors != k:
        raise ApiError(422, "invalid_parameter", f"vectors: {options.vectors} asked for, but x holds {k}")
    vectors = k or options.vectors or 1
    if options.variant == "split4" and vectors != 1:
        raise ApiError(422, "invalid_parameter", "variant: split4 multiplies one vector; use group for several")
    return vectors


def _vectors_of(x: np.ndarray, n: int, dtype: str, source: str) -> np.ndarray:
    """x checked (shape, finite) and rounded to the matrix's storage."""
    if x.dtype.kind != "f":
        raise ApiError(422, "invalid_x", f"{source} holds {x.dtype}; send floating-point numbers")
    if x.ndim not in (1, 2) or x.shape[0] != n or (x.ndim == 2 and not 1 <= x.shape[1] <= MAX_VECTORS):
        raise ApiError(422, "invalid_x", f"{source} has shape {x.shape}; expected ({n},) or ({n}, k) with 1 <= k <= {MAX_VECTORS}")
    if not np.isfinite(x).all():
        raise ApiError(422, "invalid_x", f"{source} has NaN or infinite entries")
    stored, _ = as_storage(x.astype(x.dtype.newbyteorder("="), copy=False), dtype)
    if not np.isfinite(to_float32(stored, dtype)).all():
        raise ApiError(422, "invalid_x", f"{source} overflows {dtype}")
    return stored


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array))
    return buffer.getvalue()


async def parse(request: Request, settings: Settings) -> Submission:
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("application/json"):
        return await _parse_json(request, settings)
    if content_type.startswith("multipart/form-data"):
        return await _parse_form(request, settings)
    raise ApiError(415, "unsupported_media_type", "send a JSON body with a 'spec' (Content-Type: application/json), or the matrix as a .npy or .safetensors file in the multipart field 'matrix' (curl -F matrix=@w.safetensors -F tensor=NAME)")


async def _parse_json(request: Request, settings: Settings) -> Submission:
    try:
        body = await request.json()
    except ValueError as exc:
        raise ApiError(400, "bad_request", f"the body is not JSON: {exc}") from None
    try:
        req = Cs256Request.model_validate(body, strict=True)  # JSON: true is no number (forms come as text, read leniently)
    except ValidationError as exc:
        raise _invalid(exc) from None
    if req.dtype is not None:
        raise ApiError(422, "invalid_parameter", "dtype: a generated matrix takes its dtype from spec.dtype")
    spec = req.spec
    _check_size(spec.m, spec.n, settings)
    inputs = {}
    k = None
    if req.x is not None:
        try:
            x = np.asarray(req.x, dtype=np.float64)
        except ValueError:
            raise ApiError(422, "invalid_x", "x must be n numbers or n rows of k numbers (rows of equal length)") from None
        stored = _vectors_of(x, spec.n, spec.dtype, "x")
        k = 1 if stored.ndim == 1 else stored.shape[1]
        inputs["x.npy"] = _npy_bytes(stored)
    vectors = _options_checked(req, k)
    params = {"source": "spec", "spec": spec.model_dump(), "m": spec.m, "n": spec.n, "dtype": spec.dtype, "seed": spec.seed, "x": "given" if inputs else "random", "vectors": vectors,
              **req.model_dump(include={"sparsity", "vec", "repeats", "save", "variant"})}
    return Submission(params, inputs)


async def _parse_form(request: Request, settings: Settings) -> Submission:
    form = await read_form(request, max_files=2, max_fields=16, hint="The matrix must be a file part: curl -F matrix=@w.npy (or -F matrix=@model.safetensors -F tensor=NAME)")
    try:
        upload = form.get("matrix")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "missing_matrix", "the form needs a file field named 'matrix' holding a .npy or .safetensors file (curl -F matrix=@w.npy)")
        data = await upload.read()
        x_upload = form.get("x")
        if x_upload is not None and not isinstance(x_upload, UploadFile):
            raise ApiError(400, "invalid_x", "x must be a file part holding a .npy (curl -F x=@x.npy)")
        x_data = await x_upload.read() if x_upload is not None else None
        fields = {key: value for key, value in form.multi_items() if isinstance(value, str) and key not in ("matrix", "x")}
    finally:
        await form.close()
    tensor = fields.pop("tensor", None)
    seed_text = fields.pop("seed", "0")
    try:
        seed = int(seed_text)
        if seed < 0:
            raise ValueError
    except ValueError:
        raise ApiError(422, "invalid_parameter", f"seed: must be a non-negative integer; got {seed_text!r}") from None
    if "sparsity" in fields and fields["sparsity"].strip().lower() in ("", "none", "null"):
        fields["sparsity"] = None
    try:
        options = Cs256Options.model_validate(fields)
    except ValidationError as exc:
        raise _invalid(exc) from None
    matrix, source = _load_matrix(data, tensor, settings)
    dtype = options.dtype or _default_dtype(matrix, source)
    stored = _rounded_matrix(matrix, dtype, source)
    m, n = stored.shape
    inputs = {"matrix.npy": _npy_bytes(stored)}
    k = None
    if x_data is not None:
        x = _load_npy(x_data, "x", None)
        x_stored = _vectors_of(x, n, dtype, "x")
        k = 1 if x_stored.ndim == 1 else x_stored.shape[1]
        inputs["x.npy"] = _npy_bytes(x_stored)
    vectors = _options_checked(options, k)
    params = {"source": "upload", "file": source["file"], "tensor": source.get("tensor"), "m": m, "n": n, "dtype": dtype, "seed": seed, "x": "given" if "x.npy" in inputs else "random", "vectors": vectors,
              **options.model_dump(include={"sparsity", "vec", "repeats", "save", "variant"})}
    return Submission(params, inputs)


def _load_matrix(data: bytes, tensor: str | None, settings: Settings) -> tuple[np.ndarray, dict[str, Any]]:
    """The uploaded matrix (a view of `data` for safetensors) and where it came from."""
    if not data:
        raise ApiError(400, "empty_file", "the uploaded matrix file is empty")
    if data.startswith(NPY_MAGIC):
        if tensor is not None:
            raise ApiError(422, "invalid_parameter", "tensor: names a tensor of a .safetensors file; this upload is a .npy")
        return _load_npy(data, "matrix", settings), {"file": "npy"}
    try:
        header, _, start = read_safetensors_header(data)
    except SafetensorsError as exc:
        if len(data) >= 9 and data[8:9] == b"{":
            raise ApiError(400, "malformed_safetensors", f"the 'matrix' file is not a readable .safetensors file ({exc})") from None
        raise ApiError(415, "unsupported_format", "the 'matrix' file is neither a .npy nor a .safetensors file") from None
    names = list(header)
    if tensor is None:
        if len(names) != 1:
            shown = ", ".join(names[:TENSORS_LISTED]) + (", ..." if len(names) > TENSORS_LISTED else "")
            raise ApiError(422, "missing_tensor", f"the .safetensors file holds {len(names)} tensors; name one in the form field 'tensor' ({shown})" if names else "the .safetensors file holds no tensor")
        tensor = names[0]
    if tensor not in header:
        shown = ", ".join(names[:TENSORS_LISTED]) + (", ..." if len(names) > TENSORS_LISTED else "")
        raise ApiError(422, "unknown_tensor", f"the .safetensors file has no tensor {tensor!r}; it holds: {shown}")
    entry = header[tensor]
    if len(entry["shape"]) != 2:
        raise ApiError(422, "not_a_matrix", f"tensor {tensor!r} has shape {entry['shape']}; CS256 stores 2-D matrices")
    _check_size(*entry["shape"], settings)
    code = entry["dtype"]
    if code not in ("F16", "BF16", "F32", "F64"):
        raise ApiError(422, "unsupported_dtype", f"tensor {tensor!r} is {code}; CS256 takes F16, BF16 or F32 (F64 with dtype)")
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
            raise ApiError(422, "unsupported_dtype" if field == "matrix" else "invalid_x", f"the {field} is {dtype}; send float16, float32 or float64")

    return load_npy(data, field, check)


def _default_dtype(matrix: np.ndarray, source: dict[str, Any]) -> str:
    name = UPLOAD_DTYPES.get(source.get("code") or matrix.dtype.name)
    if name not in DTYPES:
        raise ApiError(422, "unsupported_dtype", f"the matrix is {source.get('code') or matrix.dtype}; send float16, bfloat16 (safetensors) or float32, or give dtype to round it to one of them")
    return name


def _rounded_matrix(matrix: np.ndarray, dtype: str, source: dict[str, Any]) -> np.ndarray:
    """The upload, checked (non-empty, finite) and in the storage of `dtype`."""
    if matrix.size == 0:
        raise ApiError(422, "invalid_matrix", f"the matrix is empty (shape {matrix.shape})")
    is_bf16 = source.get("code") == "BF16"
    native = matrix.astype(matrix.dtype.newbyteorder("="), copy=False)
    values = to_float32(native, "bfloat16") if is_bf16 else native
    finite = np.isfinite(values)
    if not finite.all():
        nans = int(np.count_nonzero(np.isnan(values)))
        bad = values.size - int(np.count_nonzero(finite))
        raise ApiError(422, "invalid_matrix", f"the matrix has {bad} non-finite entries ({nans} NaN, {bad - nans} infinite)")
    try:
        if is_bf16:
            stored = np.ascontiguousarray(native) if dtype == "bfloat16" else as_storage(values, dtype)[0]
        else:
            stored = as_storage(native, dtype)[0]
    except CS256Error as exc:
        raise ApiError(422, "unsupported_dtype", str(exc)) from None
    if not np.isfinite(to_float32(stored, dtype)).all():
        raise ApiError(422, "invalid_matrix", f"the matrix overflows {dtype} (largest magnitude {float(np.max(np.abs(values))):.4g})")
    return stored


# ------------------------------------------------------------------ running --


def _inputs(ctx: JobContext) -> tuple[np.ndarray, np.ndarray]:
    params = ctx.job.params
    dtype = params["dtype"]
    if params["source"] == "upload":
        a = np.load(ctx.inputs / "matrix.npy", allow_pickle=False)
    else:
        a = make_matrix(params["m"], params["n"], dtype, params["seed"])
    if params["x"] == "given":
        x = np.load(ctx.inputs / "x.npy", allow_pickle=False)
    else:
        x = make_x(params["n"], params["vectors"], dtype, params["seed"])
    return a, x


def run(ctx: JobContext) -> dict[str, Any]:
    params = ctx.job.params
    job = Cs256Params(sparsity=params["sparsity"], vec=params["vec"], vectors=params["vectors"], repeats=params["repeats"], save=params["save"])
    times: dict[str, float] = {}
    start = time.perf_counter()
    a, x = _inputs(ctx)
    times["load"] = (time.perf_counter() - start) * 1000
    ctx.progress(0.05)
    runner = _run_cuda if ctx.lease is not None else _run_cpu
    outcome = runner(ctx, job, a, x, times)
    cs, y = outcome.pop("cs"), outcome.pop("y")
    ctx.progress(0.9)
    dtype = params["dtype"]
    y32 = to_float32(y, dtype)
    np.save(ctx.results / "y.npy", y32)
    out_of_range = int(np.count_nonzero(~np.isfinite(y32)))  # entries of y past the dtype's range (float16: 65504)
    if job.save in ("npz", "both"):
        save_npz(cs, ctx.results / "cs256.npz")
    if job.save in ("safetensors", "both"):
        save_safetensors(cs, ctx.results / "cs256.safetensors")
    report = storage_report(cs)
    k = 1 if x.ndim == 1 else x.shape[1]
    error, anchor_bytes = outcome.pop("error"), outcome.pop("anchor_bytes")
    cs_ms, dense_ms, csr_ms = times["cs256"], times["dense"], times.get("csr")
    vectors_bytes = (cs.n + cs.m) * k * STORAGE[dtype].itemsize  # x and y (in the matrix's dtype)
    moved = {"cs256": report["formats"]["cs256"]["bytes"] + vectors_bytes, **{name: size + vectors_bytes for name, size in anchor_bytes.items() if size is not None}}
    return {
        "m": cs.m, "n": cs.n, "dtype": dtype, "vec": cs.vec, "vectors": k, "backend": ctx.backend, "source": params["source"],
        "pruning": outcome.pop("pruning"),
        "format": report,
        "accuracy": {"max_relative_error": error, "tolerance": reference.TOLERANCE[dtype], "within_tolerance": bool(error <= reference.TOLERANCE[dtype]),
                     "outputs_out_of_range": out_of_range},
        **outcome,
        "times_ms": {key: round(value, 6) for key, value in times.items()},
        "speedup": {"vs_dense": dense_ms / cs_ms if cs_ms > 0 else None, "vs_csr": csr_ms / cs_ms if csr_ms and cs_ms > 0 else None},
        "bytes_moved": moved,
        "bandwidth_gb_s": {name: moved[name] / (times[name] * 1e6) if times.get(name) else None for name in moved},
    }


def _pruning(job: Cs256Params, original: Any, pruned: Any, x: Any, xp, dtype: str) -> dict[str, Any] | None:
    """How much pruning removed: the relative Frobenius norm of the dropped weights and the
    max relative change of A x (both in float64, row blocks of about 4M entries)."""
    if job.sparsity is None:
        return None
    m, n = original.shape
    x64 = to_float32(x, dtype).astype(np.float64)
    removed = total = 0.0
    y_full, y_pruned = [], []
    step = max(1, (1 << 22) // n)
    for r in range(0, m, step):
        a64 = to_float32(original[r : r + step], dtype).astype(np.float64)
        p64 = to_float32(pruned[r : r + step], dtype).astype(np.float64)
        removed += float(((a64 - p64) ** 2).sum())
        total += float((a64**2).sum())
        y_full.append(a64 @ x64)
        y_pruned.append(p64 @ x64)
    y_full, y_pruned = xp.concatenate(y_full), xp.concatenate(y_pruned)
    scale = float(xp.abs(y_full).max())
    return {
        "target_sparsity": job.sparsity,
        "removed_norm": (removed / total) ** 0.5 if total > 0 else 0.0,
        "output_change": float(xp.abs(y_pruned - y_full).max()) / scale if scale > 0 else 0.0,
    }


def _convert(job: Cs256Params, a, dtype: str):
    if job.sparsity is None:
        return from_dense(a, job.vec, dtype)
    return prune(a, job.sparsity, job.vec, dtype)


def _run_cpu(ctx: JobContext, job: Cs256Params, a: np.ndarray, x: np.ndarray, times: dict[str, float]) -> dict[str, Any]:
    params = ctx.job.params
    dtype = params["dtype"]
    start = time.perf_counter()
    cs = _convert(job, a, dtype)
    times["convert"] = (time.perf_counter() - start) * 1000
    ctx.progress(0.3)
    dense = cs.to_dense()
    repeats = min(job.repeats, CPU_REPEATS)
    y = reference.spmv(cs, x)
    times["cs256"] = _cpu_median_ms(lambda: reference.spmv(cs, x), repeats)
    error = reference.relative_error(y, reference.dense_product(dense, x, dtype), dtype)
    ctx.progress(0.5)
    dense32, x32 = to_float32(dense, dtype), to_float32(x, dtype)
    times["dense"] = _cpu_median_ms(lambda: dense32 @ x32, repeats)
    anchors = {"dense": "NumPy float32 matmul (BLAS)", "csr": None}
    anchor_bytes = {"dense": dense32.nbytes, "csr": None}
    try:
        import scipy.sparse
    except ImportError:
        anchors["csr"] = "not measured: SciPy is not installed"
    else:
        csr = scipy.sparse.csr_array(dense32)
        times["csr"] = _cpu_median_ms(lambda: csr @ x32, repeats)
        anchors["csr"] = "SciPy CSR float32"
        anchor_bytes["csr"] = int(csr.nnz) * 8 + 4 * (cs.m + 1)
    ctx.progress(0.7)
    pruning = _pruning(job, a, dense, x, np, dtype)
    return {"cs": cs, "y": y, "error": error, "pruning": pruning, "kernel": {"variant": "numpy reference"}, "anchors": anchors, "anchor_bytes": anchor_bytes}


def _cpu_median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return float(np.median(times))


def _run_cuda(ctx: JobContext, job: Cs256Params, a: np.ndarray, x: np.ndarray, times: dict[str, float]) -> dict[str, Any]:
    import cupy

    from gpu.cs256 import anchors, cuda

    params = ctx.job.params
    dtype = params["dtype"]
    lease = ctx.lease
    with cupy.cuda.Device(lease.device), lease.stream:
        stream = cupy.cuda.get_current_stream()
        d_a, d_x = cupy.asarray(a), cupy.asarray(x)
        start = time.perf_counter()
        cs = _convert(job, d_a, dtype)
        stream.synchronize()
        times["convert"] = (time.perf_counter() - start) * 1000
        ctx.progress(0.3)
        k = 1 if x.ndim == 1 else x.shape[1]
        plan = cuda.make_plan(cs, k, variant=params["variant"])
        y = cuda.spmm(cs, d_x, plan)
        dense = cs.to_dense()
        exact = cupy.concatenate([to_float32(dense[r : r + 4096], dtype).astype(cupy.float64) @ to_float32(d_x, dtype).astype(cupy.float64) for r in range(0, cs.m, 4096)])
        error = reference.relative_error(y.get(), exact.get(), dtype)
        ctx.progress(0.4)
        timer = anchors.ColdTimer()
        times["cs256"] = timer.median_ms(lambda: cuda.spmm(cs, d_x, plan), job.repeats)
        times["dense"] = timer.median_ms(lambda: anchors.dense_matmul(dense, d_x, dtype), job.repeats)
        ctx.progress(0.6)
        csr = anchors.CsrAnchor(dense, dtype)
        times["csr"] = timer.median_ms(lambda: csr(d_x), job.repeats)
        ctx.progress(0.8)
        pruning = _pruning(job, d_a, dense, d_x, cupy, dtype)
        host = cs.to_host()
        y_host = y.get()
        used = {"dense": f"cuBLAS ({'cublasGemmEx' if dtype == 'bfloat16' else 'cupy.matmul'}) {dtype}", "csr": f"cuSPARSE CSR int32 {csr.dtype}" + ("" if csr.dtype == dtype else f" (cuSPARSE through CuPy takes no {dtype} here)")}
        return {"cs": host, "y": y_host, "error": error, "pruning": pruning, "kernel": plan.describe(), "anchors": used, "anchor_bytes": {"dense": int(dense.nbytes), "csr": csr.nbytes}}


CS256_JOB = JobKind(name="cs256", summary="Prune a weight matrix to CS256 compressed sparse tiles; memory and SpMV/SpMM speed against dense cuBLAS and cuSPARSE CSR", parse=parse, run=run, openapi=OPENAPI)
