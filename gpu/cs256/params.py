"""Parameters of the CS256 job, validated once, and its generated inputs.

`Cs256Params` says how to build the CS256 matrix (magnitude pruning to `sparsity`, or the
matrix's own zeros when sparsity is None), the vector width `vec`, how many vectors to
multiply and how often to time each product. `make_matrix` and `make_x` draw the random
inputs of a job spec: the same (m, n, dtype, seed) gives the same matrix on every backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from pydantic import Field

from gpu.cs256.format import DEFAULT_VEC, CS256Error, as_storage, check_dtype, from_float, to_float32
from gpu.errors import ParamError
from gpu.jobs import npy_bytes
from gpu.spec import InputFile, JobSpec, MatrixShape, Result, spec

MAX_VECTORS = 16
REPEATS_MAX = 1000
Vec = Literal[4, 8, 16]
Save = Literal["npz", "safetensors", "both", "none"]
Variant = Literal["group", "split4"]
Dtype = Literal["float16", "bfloat16", "float32"]
SAVE_CHOICES: tuple[str, ...] = get_args(Save)
VARIANTS: tuple[str, ...] = get_args(Variant)
MATRIX_FILE, X_FILE = "matrix.npy", "x.npy"


@spec
class Cs256Params:
    """How to build the CS256 matrix and what to measure; validated on construction."""

    sparsity: float | None = Field(
        default=0.5,
        ge=0.0,
        lt=1.0,
        allow_inf_nan=False,
        description=(
            "target fraction of zero weights after magnitude pruning (each tile keeps a multiple of "
            "vec); null: keep the matrix's own zeros"
        ),
    )
    vec: Vec = Field(
        default=DEFAULT_VEC,
        description="4, 8 or 16: every tile stores a multiple of vec entries (vector loads of that width)",
    )
    vectors: int = Field(
        default=1, ge=1, le=MAX_VECTORS, description="random vectors x to multiply (1: SpMV; 2..16: SpMM)"
    )
    repeats: int = Field(
        default=20,
        ge=1,
        le=REPEATS_MAX,
        description="timed runs of each product; the median is reported (each starts with a cold L2)",
    )
    save: Save = Field(
        default="npz", description="files of the CS256 matrix to write: cs256.npz, cs256.safetensors, both or none"
    )
    variant: Variant = Field(
        default="group",
        description=(
            "CUDA kernel: group (coalesced, any number of vectors) or split4 (the paper's appendix layout, one vector)"
        ),
    )

    def __post_init__(self) -> None:
        if self.variant == "split4" and self.vectors not in (None, 1):  # None: Cs256Options' "as many as x has"
            raise ParamError("variant", "split4 multiplies one vector; use group for several")


@spec
class WeightSpec(MatrixShape):
    """A random weight matrix: i.i.d. standard normal, the same for the same spec."""

    dtype: Dtype = Field(default="float16", description="the values' dtype")
    seed: int = Field(
        default=0, ge=0, description="random seed: the same spec gives the same matrix (and the same random x)"
    )

    def build(self) -> np.ndarray:
        """The (m, n) matrix (drawn in float32, rounded once to `dtype`), in the storage of
        `dtype` (bfloat16: uint16 bit patterns)."""
        rng = np.random.default_rng(self.seed)
        return from_float(rng.standard_normal((self.m, self.n), dtype=np.float32), check_dtype(self.dtype))


def make_matrix(m: int, n: int, dtype: str, seed: int) -> np.ndarray:
    """`WeightSpec(m, n, dtype, seed).build()`."""
    return WeightSpec(m=m, n=n, dtype=dtype, seed=seed).build()  # type: ignore[arg-type]


def make_x(n: int, vectors: int, dtype: str, seed: int) -> np.ndarray:
    """Random x for a job: (n,) for one vector, (n, vectors) otherwise; standard normal,
    in the storage of `dtype`, drawn from a stream of `seed` apart from the matrix's."""
    rng = np.random.default_rng([seed, 1])
    shape = (n,) if vectors == 1 else (n, vectors)
    return from_float(rng.standard_normal(shape, dtype=np.float32), check_dtype(dtype))


# --------------------------------------------------------------------- the job --


def storage_matrix(matrix: np.ndarray, dtype: str, bfloat16_bits: bool = False) -> np.ndarray:
    """An uploaded matrix checked (non-empty, finite, within the dtype's range) and in the
    storage of `dtype`. `bfloat16_bits`: `matrix` holds bfloat16 bit patterns (uint16)."""
    if matrix.size == 0:
        raise ParamError("matrix", f"the matrix is empty (shape {matrix.shape})", "invalid_matrix")
    native = matrix.astype(matrix.dtype.newbyteorder("="), copy=False)
    values = to_float32(native, "bfloat16") if bfloat16_bits else native
    finite = np.isfinite(values)
    if not finite.all():
        nans = int(np.count_nonzero(np.isnan(values)))
        bad = values.size - int(np.count_nonzero(finite))
        raise ParamError(
            "matrix", f"the matrix has {bad} non-finite entries ({nans} NaN, {bad - nans} infinite)", "invalid_matrix"
        )
    try:
        if bfloat16_bits:
            stored = np.ascontiguousarray(native) if dtype == "bfloat16" else as_storage(values, dtype)[0]
        else:
            stored = as_storage(native, dtype)[0]
    except CS256Error as exc:
        raise ParamError("dtype", str(exc), "unsupported_dtype") from None
    if not np.isfinite(to_float32(stored, dtype)).all():
        raise ParamError(
            "matrix",
            f"the matrix overflows {dtype} (largest magnitude {float(np.max(np.abs(values))):.4g})",
            "invalid_matrix",
        )
    return stored


def storage_vectors(x: np.ndarray, n: int, dtype: str) -> np.ndarray:
    """x checked ((n,) or (n, k), 1 <= k <= MAX_VECTORS, finite) and rounded to the
    storage of `dtype`."""
    if x.dtype.kind != "f":
        raise ParamError("x", f"x holds {x.dtype}; send floating-point numbers", "invalid_x")
    if x.ndim not in (1, 2) or x.shape[0] != n or (x.ndim == 2 and not 1 <= x.shape[1] <= MAX_VECTORS):
        raise ParamError(
            "x", f"x has shape {x.shape}; expected ({n},) or ({n}, k) with 1 <= k <= {MAX_VECTORS}", "invalid_x"
        )
    if not np.isfinite(x).all():
        raise ParamError("x", "x has NaN or infinite entries", "invalid_x")
    stored, _ = as_storage(x.astype(x.dtype.newbyteorder("="), copy=False), dtype)
    if not np.isfinite(to_float32(stored, dtype)).all():
        raise ParamError("x", f"x overflows {dtype}", "invalid_x")
    return stored


@dataclass(frozen=True)
class Cs256Job:
    """One CS256 job: the weight matrix (an upload in the storage of `dtype`, or a random
    (m, n) one of `seed`), x (given, or `params.vectors` random vectors of `seed`) and what
    to do (`params`). `source` records where an upload came from: {"file": "npy"} or
    {"file": "safetensors", "tensor": name}. Build with `generated` or `uploaded`."""

    params: Cs256Params
    m: int
    n: int
    dtype: str
    seed: int = 0
    matrix: np.ndarray | None = field(default=None, repr=False)
    x: np.ndarray | None = field(default=None, repr=False)
    source: Mapping[str, Any] | None = None

    @classmethod
    def generated(
        cls, params: Cs256Params, m: int, n: int, dtype: str, seed: int = 0, x: np.ndarray | None = None
    ) -> Cs256Job:
        WeightSpec(m=m, n=n, dtype=dtype, seed=seed)  # type: ignore[arg-type]
        return cls(params, m, n, dtype, seed, x=None if x is None else storage_vectors(x, n, dtype))

    @classmethod
    def uploaded(
        cls,
        params: Cs256Params,
        matrix: np.ndarray,
        dtype: str,
        source: Mapping[str, Any],
        seed: int = 0,
        x: np.ndarray | None = None,
    ) -> Cs256Job:
        """`matrix` as uploaded (bfloat16 as uint16 bit patterns when source["code"] is BF16),
        rounded to `dtype`."""
        stored = storage_matrix(matrix, dtype, bfloat16_bits=source.get("code") == "BF16")
        m, n = stored.shape
        x_stored = None if x is None else storage_vectors(x, n, dtype)
        return cls(
            params,
            m,
            n,
            dtype,
            seed,
            matrix=stored,
            x=x_stored,
            source={"file": source["file"], "tensor": source.get("tensor")},
        )

    @classmethod
    def from_request(cls, request: Cs256Request, max_elements: int) -> Cs256Job:
        """The job of a JSON request: a random matrix within `max_elements`, x given or random."""
        from gpu.cs256.uploads import check_size

        check_size(request.spec.m, request.spec.n, max_elements)
        x = None
        if request.x is not None:
            try:
                x = np.asarray(request.x, dtype=np.float64)
            except ValueError:
                raise ParamError(
                    "x", "x must be n numbers or n rows of k numbers (rows of equal length)", "invalid_x"
                ) from None
        spec = request.spec
        return cls.generated(request.params(x), spec.m, spec.n, spec.dtype, spec.seed, x)

    @classmethod
    def from_upload(cls, options: Cs256UploadOptions, files: Mapping[str, bytes], max_elements: int) -> Cs256Job:
        """The job of an upload: files["matrix"] (.npy or .safetensors) and optionally files["x"]."""
        from gpu.cs256 import uploads

        matrix, source = uploads.read_matrix(files["matrix"], options.tensor, max_elements)
        x = uploads.read_npy(files["x"], "x") if "x" in files else None
        dtype = options.dtype or uploads.default_dtype(matrix, source)
        return cls.uploaded(options.params(x), matrix, dtype, source, options.seed, x)

    def inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """(A, x) in the storage of `dtype`: the uploaded or the generated ones."""
        a = self.matrix if self.matrix is not None else make_matrix(self.m, self.n, self.dtype, self.seed)
        x = self.x if self.x is not None else make_x(self.n, self.params.vectors, self.dtype, self.seed)
        return a, x

    def to_json(self) -> dict[str, Any]:
        p = self.params
        options = {"sparsity": p.sparsity, "vec": p.vec, "repeats": p.repeats, "save": p.save, "variant": p.variant}
        common = {
            "m": self.m,
            "n": self.n,
            "dtype": self.dtype,
            "seed": self.seed,
            "x": "given" if self.x is not None else "random",
            "vectors": p.vectors,
        }
        if self.matrix is None:
            return {
                "source": "spec",
                "spec": {"m": self.m, "n": self.n, "dtype": self.dtype, "seed": self.seed},
                **common,
                **options,
            }
        source = self.source or {}
        return {"source": "upload", "file": source.get("file"), "tensor": source.get("tensor"), **common, **options}

    def input_files(self) -> dict[str, bytes]:
        files = {}
        if self.matrix is not None:
            files[MATRIX_FILE] = npy_bytes(self.matrix)
        if self.x is not None:
            files[X_FILE] = npy_bytes(self.x)
        return files

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], files: Mapping[str, Path]) -> Cs256Job:
        params = Cs256Params(
            sparsity=stored["sparsity"],
            vec=stored["vec"],
            vectors=stored["vectors"],
            repeats=stored["repeats"],
            save=stored["save"],
            variant=stored.get("variant", "group"),
        )
        x = np.load(files[X_FILE], allow_pickle=False) if stored["x"] == "given" else None
        matrix = np.load(files[MATRIX_FILE], allow_pickle=False) if stored["source"] == "upload" else None
        source = {"file": stored.get("file"), "tensor": stored.get("tensor")} if matrix is not None else None
        return cls(params, stored["m"], stored["n"], stored["dtype"], stored["seed"], matrix=matrix, x=x, source=source)


# ----------------------------------------------------------------- the job's contract --


@spec
class Cs256Options(Cs256Params):
    """The options of a request: as Cs256Params, with `vectors` left out when x is sent."""

    vectors: int | None = Field(  # type: ignore[assignment]
        default=None,
        ge=1,
        le=MAX_VECTORS,
        description="random vectors x to multiply when no x is sent (default 1: SpMV; 2..16: SpMM)",
    )

    def params(self, x: np.ndarray | None) -> Cs256Params:
        """The job's parameters; the number of vectors comes from x when one is sent."""
        k = None
        if x is not None and x.ndim in (1, 2):
            k = 1 if x.ndim == 1 else x.shape[1]
            if not 1 <= k <= MAX_VECTORS:
                raise ParamError(
                    "x", f"x has shape {x.shape}; expected (n,) or (n, k) with 1 <= k <= {MAX_VECTORS}", "invalid_x"
                )
        if k is not None and self.vectors is not None and self.vectors != k:
            raise ParamError("vectors", f"{self.vectors} asked for, but x holds {k}")
        return Cs256Params(
            sparsity=self.sparsity,
            vec=self.vec,
            vectors=k or self.vectors or 1,
            repeats=self.repeats,
            save=self.save,
            variant=self.variant,
        )


@spec
class Cs256Request(Cs256Options):
    """A JSON request: the options, a random matrix and optionally x."""

    _: KW_ONLY
    spec: WeightSpec = Field(description="the random matrix (upload one as a form instead)")
    x: list[float] | list[list[float]] | None = Field(
        default=None,
        description=(
            "x as n numbers (one vector) or n rows of k numbers (k vectors, 1..16); default random "
            "(seeded by spec.seed)"
        ),
    )


@spec
class Cs256UploadOptions(Cs256Options):
    """The `params` JSON of an upload: the options, the dtype to round to, the tensor of a
    .safetensors file and the seed of a random x."""

    dtype: Dtype | None = Field(
        default=None,
        description=(
            "the CS256 values' dtype, rounding the upload to it (needed for float64 uploads); default the upload's"
        ),
    )
    tensor: str | None = Field(
        default=None, description="the tensor's name in a .safetensors file (optional when it holds one tensor)"
    )
    seed: int = Field(default=0, ge=0, description="seed of the random x")


class Cs256Accuracy(Result):
    max_relative_error: float = Field(description="of y against the float64 dense product")
    tolerance: float
    within_tolerance: bool
    outputs_out_of_range: int = Field(description="entries of y past the dtype's range")


class Cs256Result(Result):
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


CS256_SPEC = JobSpec(
    name="cs256",
    summary=(
        "Prune a weight matrix to CS256 compressed sparse tiles; memory and SpMV/SpMM speed "
        "against dense cuBLAS and cuSPARSE CSR"
    ),
    body=Cs256Request,
    options=Cs256UploadOptions,
    files=(
        InputFile(
            "matrix",
            (
                "the weight matrix: a 2-D .npy (float16, float32; float64 with dtype) or a .safetensors file "
                "(F16, BF16, F32; F64 with dtype), no NaN or Inf"
            ),
        ),
        InputFile(
            "x", "optional .npy of shape (n,) or (n, k), k <= 16, finite floats (rounded to the matrix's dtype)", False
        ),
    ),
    result=Cs256Result,
    example={"spec": {"m": 4096, "n": 4096, "dtype": "float16", "seed": 1}, "sparsity": 0.66, "vec": 8, "repeats": 20},
    result_files="y.npy, cs256.npz / cs256.safetensors",
    form_example='curl -F matrix=@w.safetensors -F params=\'{"tensor": "NAME", "sparsity": 0.5}\'',
)
