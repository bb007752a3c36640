"""Parameters of the CS256 job, validated once, and its generated inputs.

`Cs256Params` says how to build the CS256 matrix (magnitude pruning to `sparsity`, or the
matrix's own zeros when sparsity is None), the vector width `vec`, how many vectors to
multiply and how often to time each product. `make_matrix` and `make_x` draw the random
inputs of a job spec: the same (m, n, dtype, seed) gives the same matrix on every backend.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu.cs256.format import DEFAULT_VEC, DTYPES, VECS, CS256Error, as_storage, check_dtype, from_float, to_float32
from gpu.errors import ParamError
from gpu.jobs import npy_bytes

MAX_VECTORS = 16
REPEATS_MAX = 1000
SAVE_CHOICES = ("npz", "safetensors", "both", "none")
VARIANTS = ("group", "split4")
MATRIX_FILE, X_FILE = "matrix.npy", "x.npy"


@dataclass(frozen=True)
class Cs256Params:
    """One CS256 job; validated on construction (raises ParamError).

    sparsity: target fraction of zero weights after magnitude pruning, in [0, 1); None
    converts the matrix as it is (its zeros are the sparsity). vec: 4, 8 or 16 (each tile
    stores a multiple of vec entries). vectors: how many random vectors x when none are
    given (1..16). repeats: timed runs of each product (the median is reported).
    save: which files of the CS256 matrix the job writes. variant: the CUDA kernel, group
    (coalesced, any number of vectors) or split4 (the paper's appendix layout, one vector).
    """

    sparsity: float | None = 0.5
    vec: int = DEFAULT_VEC
    vectors: int = 1
    repeats: int = 20
    save: str = "npz"
    variant: str = "group"

    def __post_init__(self) -> None:
        sparsity = self.sparsity
        if sparsity is not None and (
            isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real) or not 0.0 <= float(sparsity) < 1.0
        ):
            raise ParamError("sparsity", f"must be a number in [0, 1) (or null: no pruning); got {sparsity!r}")
        if isinstance(self.vec, bool) or self.vec not in VECS:
            raise ParamError("vec", f"must be one of {', '.join(map(str, VECS))}; got {self.vec!r}")
        for name, top in (("vectors", MAX_VECTORS), ("repeats", REPEATS_MAX)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= int(value) <= top:
                raise ParamError(name, f"must be an integer from 1 to {top}; got {value!r}")
        if self.save not in SAVE_CHOICES:
            raise ParamError("save", f"must be one of {', '.join(SAVE_CHOICES)}; got {self.save!r}")
        if self.variant not in VARIANTS:
            raise ParamError("variant", f"must be one of {', '.join(VARIANTS)}; got {self.variant!r}")
        if self.variant == "split4" and self.vectors != 1:
            raise ParamError("variant", "split4 multiplies one vector; use group for several")


def make_matrix(m: int, n: int, dtype: str, seed: int) -> np.ndarray:
    """An (m, n) matrix of i.i.d. standard normal weights (drawn in float32, rounded once to
    `dtype`), in the storage of `dtype` (bfloat16: uint16 bit patterns)."""
    for name, value in (("m", m), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ParamError(name, f"must be a positive integer; got {value!r}")
    if dtype not in DTYPES:
        raise ParamError("dtype", f"must be one of {', '.join(DTYPES)}; got {dtype!r}")
    rng = np.random.default_rng(seed)
    return from_float(rng.standard_normal((m, n), dtype=np.float32), check_dtype(dtype))


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
        for name, value, least in (("spec.m", m, 1), ("spec.n", n, 1), ("spec.seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
                raise ParamError(name, f"must be an integer >= {least}; got {value!r}")
        if dtype not in DTYPES:
            raise ParamError("spec.dtype", f"must be one of {', '.join(DTYPES)}; got {dtype!r}")
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
