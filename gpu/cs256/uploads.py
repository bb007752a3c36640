"""The files of a CS256 upload, read and checked before a job is stored: the weight matrix
as a 2-D .npy or one tensor of a .safetensors file (its header read first, so that a shape
or size the job refuses is refused before the data is touched), and x as a .npy.

Errors: InputError (empty_file, malformed_npy, malformed_safetensors, unsupported_format,
too_many_elements) and ParamError (not_a_matrix, unsupported_dtype, missing_tensor,
unknown_tensor, invalid_x).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpu.cs256.files import SafetensorsError, read_safetensors_header
from gpu.cs256.format import DTYPES, TILE
from gpu.errors import InputError, ParamError
from gpu.npy import load_npy

NPY_MAGIC = b"\x93NUMPY"
TENSORS_LISTED = 20  # tensor names an error message lists
# the dtype a CS256 matrix gets from its upload (.npy dtype name, or safetensors code)
UPLOAD_DTYPES = {
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
}
STORAGE = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}  # safetensors code -> how its bytes read


def check_size(m: int, n: int, max_elements: int) -> None:
    """InputError too_many_elements past `max_elements`. The limit counts the columns padded
    to whole tiles of 256 (pruning and conversion work on whole tiles, so a 10^6 x 1 matrix
    costs as much as a 10^6 x 256 one)."""
    padded = m * TILE * -(-n // TILE)
    if padded > max_elements:
        size = f"{m * n:,} elements" + (
            f" ({padded:,} with its rows padded to whole tiles of {TILE} columns)" if padded != m * n else ""
        )
        raise InputError(
            "too_many_elements",
            f"a {m} x {n} matrix has {size}; CS256 jobs take at most {max_elements:,} (PENCIL_MAX_CS256_ELEMENTS)",
        )


def read_matrix(data: bytes, tensor: str | None, max_elements: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The uploaded matrix (a view of `data` for safetensors) and where it came from:
    {"file": "npy"} or {"file": "safetensors", "tensor": name, "code": dtype code}."""
    if not data:
        raise InputError("empty_file", "the uploaded matrix file is empty")
    if data.startswith(NPY_MAGIC):
        if tensor is not None:
            raise ParamError("tensor", "names a tensor of a .safetensors file; this upload is a .npy")
        return read_npy(data, "matrix", max_elements), {"file": "npy"}
    try:
        header, _, start = read_safetensors_header(data)
    except SafetensorsError as exc:
        if len(data) >= 9 and data[8:9] == b"{":
            raise InputError(
                "malformed_safetensors", f"the 'matrix' file is not a readable .safetensors file ({exc})"
            ) from None
        raise InputError("unsupported_format", "the 'matrix' file is neither a .npy nor a .safetensors file") from None
    names = list(header)
    shown = ", ".join(names[:TENSORS_LISTED]) + (", ..." if len(names) > TENSORS_LISTED else "")
    if tensor is None:
        if len(names) != 1:
            raise ParamError(
                "tensor",
                f'the .safetensors file holds {len(names)} tensors; name one as "tensor" in params ({shown})'
                if names
                else "the .safetensors file holds no tensor",
                "missing_tensor",
            )
        tensor = names[0]
    if tensor not in header:
        raise ParamError(
            "tensor", f"the .safetensors file has no tensor {tensor!r}; it holds: {shown}", "unknown_tensor"
        )
    entry = header[tensor]
    if len(entry["shape"]) != 2:
        raise ParamError(
            "matrix", f"tensor {tensor!r} has shape {entry['shape']}; CS256 stores 2-D matrices", "not_a_matrix"
        )
    m, n = entry["shape"]
    check_size(m, n, max_elements)
    code = entry["dtype"]
    if code not in STORAGE:
        raise ParamError(
            "matrix",
            f"tensor {tensor!r} is {code}; CS256 takes F16, BF16 or F32 (F64 with dtype)",
            "unsupported_dtype",
        )
    begin, end = entry["data_offsets"]
    array = np.frombuffer(memoryview(data)[start + begin : start + end], dtype=STORAGE[code]).reshape(entry["shape"])
    return array, {"file": "safetensors", "tensor": tensor, "code": code}


def read_npy(data: bytes, field: str, max_elements: int | None = None) -> np.ndarray:
    """The matrix (field "matrix": 2-D, within `max_elements`) or x, from its .npy bytes."""

    def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
        if field == "matrix":
            if len(shape) != 2:
                raise ParamError("matrix", f"the array has shape {shape}; CS256 stores 2-D matrices", "not_a_matrix")
            if max_elements is not None:
                check_size(shape[0], shape[1], max_elements)
        if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8):
            raise ParamError(
                field,
                f"the {field} is {dtype}; send float16, float32 or float64",
                "unsupported_dtype" if field == "matrix" else "invalid_x",
            )

    return load_npy(data, field, check)


def default_dtype(matrix: np.ndarray, source: dict[str, Any]) -> str:
    """The CS256 dtype of an upload sent without one: its own, when CS256 stores it."""
    name = UPLOAD_DTYPES.get(source.get("code") or matrix.dtype.name)
    if name not in DTYPES:
        raise ParamError(
            "dtype",
            (
                f"the matrix is {source.get('code') or matrix.dtype}; send float16, bfloat16 (safetensors) "
                "or float32, or give dtype to round it to one of them"
            ),
            "unsupported_dtype",
        )
    return name
