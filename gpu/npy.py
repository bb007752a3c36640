"""Uploaded .npy files, read safely for every job kind: the header first, so that a shape,
dtype or size the job refuses is refused before any array is allocated, and a header that
declares more data than the file holds is malformed (not a huge allocation).

    array = load_npy(data, "matrix", check=lambda shape, dtype: ...)   # check raises

Errors: InputError empty_file and malformed_npy (unreadable, truncated, lying, pickled
objects); whatever `check` raises for a shape or dtype the job does not take.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import numpy as np

from gpu.errors import InputError

# Header readers by format version. 3.0 differs from 2.0 only in the header's text
# encoding (UTF-8 for structured field names, which no job takes): its ASCII headers read
# the same way, others are malformed.
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
    (3, 0): np.lib.format.read_array_header_2_0,
}


def read_header(data: bytes, field: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a .npy file's bytes, checked against the file's length."""
    if not data:
        raise InputError("empty_file", f"the uploaded {field} file is empty")
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise ValueError(f"format version {version[0]}.{version[1]} is not one of 1.0, 2.0, 3.0")
        shape, _, dtype = reader(stream)
    except (ValueError, OSError, SyntaxError, EOFError, UnicodeDecodeError) as exc:
        raise InputError("malformed_npy", f"the '{field}' file is not a readable .npy file ({exc})") from None
    offset = stream.tell()
    if dtype.hasobject:
        raise InputError("malformed_npy", f"the '{field}' file holds Python objects; send a numeric array")
    declared = math.prod(shape) * dtype.itemsize
    if declared > len(data) - offset:
        raise InputError(
            "malformed_npy",
            (
                f"the '{field}' file is truncated: its header declares shape {shape} of {dtype} "
                f"({declared:,} bytes) but it holds {len(data) - offset:,}"
            ),
        )
    return shape, dtype


def load_npy(data: bytes, field: str, check: Callable[[tuple[int, ...], np.dtype], None] | None = None) -> np.ndarray:
    """The array of a .npy upload. `check(shape, dtype)` runs on the header, before the data
    is read, and raises the job's own error for what it does not take."""
    shape, dtype = read_header(data, field)
    if check is not None:
        check(shape, dtype)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError("malformed_npy", f"the '{field}' file is truncated or corrupt ({exc})") from None
    return array  # an ndarray: read_header checked the .npy magic, so np.load returns no archive
