"""CS256 matrices on disk (.npz and .safetensors), and the safetensors format itself,
written and read with NumPy alone (no `safetensors` package).

safetensors (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
unsigned header length N, N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets":
[begin, end]}, optional "__metadata__": {str: str}} (padded with spaces), then the byte
buffer; offsets are relative to the buffer, little-endian row-major data, the tensors cover
the buffer without holes or overlaps. bfloat16 ("BF16") travels as uint16 bit patterns.

A CS256 matrix in either file: the arrays `values`, `indices`, `row_ptr`,
`block_increments` (2-D, (m, P)) and the scalars format="cs256", version=1, m, n, vec and
dtype (float16 | bfloat16 | float32); in .safetensors the scalars are the string metadata.
Loading validates the whole structure (CS256.validate), so a loaded matrix is safe to give
to the kernels.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from gpu.cs256.format import CS256, CS256Error, check_dtype, check_vec

FORMAT_NAME = "cs256"
FORMAT_VERSION = 1
ARRAYS = ("values", "indices", "row_ptr", "block_increments")
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the limit the safetensors reference implementation sets

# safetensors dtype code -> NumPy dtype (little-endian); BF16 as its bit patterns.
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# Codes the format knows that NumPy cannot read as numbers: sizes only, to check offsets.
OTHER_ITEMSIZES = {"F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
CODE_OF = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}


class SafetensorsError(ValueError):
    """The bytes are not a well-formed safetensors file."""


@dataclass(frozen=True)
class Tensor:
    """One tensor of a safetensors file: its dtype code, shape and (read-only) data, or
    data None for a dtype NumPy cannot hold (F8_*, C64)."""

    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray | None


# ------------------------------------------------------------------ safetensors --


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a name given twice (json.loads would keep the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsError(f"the header names {key!r} twice")
        out[key] = value
    return out


def read_safetensors_header(data: bytes | memoryview) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    """(tensor entries, metadata, start of the byte buffer) of a safetensors file, every
    entry checked against the buffer; SafetensorsError for anything malformed."""
    view = memoryview(data)
    if len(view) < 8:
        raise SafetensorsError("shorter than the 8-byte header length")
    header_len = int.from_bytes(view[:8], "little")
    if header_len > len(view) - 8:
        raise SafetensorsError(f"the header length {header_len} runs past the end of the {len(view)}-byte file")
    if header_len > MAX_HEADER_BYTES:
        raise SafetensorsError(f"the header is {header_len} bytes; at most {MAX_HEADER_BYTES} are read")
    raw = bytes(view[8 : 8 + header_len])
    if not raw.startswith(b"{"):
        raise SafetensorsError("the header is not a JSON object")
    try:
        header = json.loads(raw.decode("utf-8").rstrip(" "), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsError(f"the header is not valid UTF-8 JSON ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError("the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorsError("__metadata__ must map strings to strings")
    start = 8 + header_len
    buffer_len = len(view) - start
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"tensor {name!r}: an entry needs exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            raise SafetensorsError(f"tensor {name!r}: dtype must be a string")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise SafetensorsError(f"tensor {name!r}: shape must be a list of non-negative integers")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= buffer_len
        ):
            raise SafetensorsError(
                f"tensor {name!r}: data_offsets must be [begin, end] inside the {buffer_len}-byte buffer"
            )
        itemsize = SAFETENSORS_DTYPES[dtype].itemsize if dtype in SAFETENSORS_DTYPES else OTHER_ITEMSIZES.get(dtype)
        if itemsize is None:
            raise SafetensorsError(f"tensor {name!r}: unknown dtype {dtype!r}")
        if offsets[1] - offsets[0] != math.prod(shape) * itemsize:
            raise SafetensorsError(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape} of {dtype}")
        spans.append((offsets[0], offsets[1], name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise SafetensorsError(
                f"tensor {name!r}: the tensors overlap or leave a hole at byte {position} of the buffer"
            )
        position = end
    if position != buffer_len:
        raise SafetensorsError(f"the tensors end at byte {position} of a {buffer_len}-byte buffer")
    return header, metadata, start


def read_safetensors(data: bytes | memoryview, names=None) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file held in memory; the arrays are read-only
    views of `data`. names: read only these (all by default; a missing one is skipped)."""
    header, metadata, start = read_safetensors_header(data)
    view = memoryview(data)
    tensors = {}
    for name, entry in header.items():
        if names is not None and name not in names:
            continue
        begin, end = entry["data_offsets"]
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        array = None
        if dtype is not None:
            array = np.frombuffer(view[start + begin : start + end], dtype=dtype).reshape(entry["shape"])
        tensors[name] = Tensor(entry["dtype"], tuple(entry["shape"]), array)
    return tensors, metadata


def write_safetensors(tensors: dict[str, tuple[str, np.ndarray]], metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file of {name: (dtype code, array)} (arrays converted to the code's
    little-endian dtype; BF16 from uint16 bit patterns), in the given order."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, offset = [], 0
    for name, (code, array) in tensors.items():
        if code not in SAFETENSORS_DTYPES:
            raise SafetensorsError(f"cannot write dtype {code!r}")
        blob = np.ascontiguousarray(array, dtype=SAFETENSORS_DTYPES[code]).tobytes()
        header[name] = {
            "dtype": code,
            "shape": [int(d) for d in np.shape(array)],
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # the byte buffer starts 8-byte aligned
    return len(raw).to_bytes(8, "little") + raw + b"".join(blobs)


# ------------------------------------------------------------------ CS256 files --


def save_npz(cs: CS256, file: str | os.PathLike | IO[bytes]) -> None:
    """Write `cs` as an uncompressed .npz (numpy.savez)."""
    cs = cs.to_host()
    np.savez(
        file,
        format=np.array(FORMAT_NAME),
        version=np.int32(FORMAT_VERSION),
        m=np.int64(cs.m),
        n=np.int64(cs.n),
        vec=np.int32(cs.vec),
        dtype=np.array(cs.dtype),
        **{name: getattr(cs, name) for name in ARRAYS},
    )


def load_npz(file: str | os.PathLike | IO[bytes] | bytes) -> CS256:
    """A validated CS256 (NumPy arrays) from a .npz of save_npz; CS256Error otherwise."""
    if isinstance(file, (bytes, bytearray, memoryview)):
        file = io.BytesIO(bytes(file))
    try:
        with np.load(file, allow_pickle=False) as archive:
            missing = {"format", "version", "m", "n", "vec", "dtype", *ARRAYS} - set(archive.files)
            if missing:
                raise CS256Error(f"not a CS256 .npz: missing {', '.join(sorted(missing))}")
            if str(archive["format"]) != FORMAT_NAME or int(archive["version"]) != FORMAT_VERSION:
                raise CS256Error(
                    f"not a CS256 version {FORMAT_VERSION} .npz (format {str(archive['format'])!r}, version "
                    f"{archive['version']})"
                )
            scalars = {name: archive[name] for name in ("m", "n", "vec", "dtype")}
            if any(value.shape != () for value in scalars.values()):
                raise CS256Error("m, n, vec and dtype must be scalars")
            arrays = {name: archive[name] for name in ARRAYS}
    except CS256Error:
        raise
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CS256Error(f"not a readable .npz file ({exc})") from None
    return _assemble(int(scalars["m"]), int(scalars["n"]), str(scalars["dtype"]), int(scalars["vec"]), arrays)


def save_safetensors(cs: CS256, file: str | os.PathLike | IO[bytes] | None = None) -> bytes | None:
    """Write `cs` as .safetensors to `file` (a path or binary file), or return the bytes."""
    cs = cs.to_host()
    metadata = {
        "format": FORMAT_NAME,
        "version": str(FORMAT_VERSION),
        "m": str(cs.m),
        "n": str(cs.n),
        "vec": str(cs.vec),
        "dtype": cs.dtype,
    }
    data = write_safetensors(
        {
            "values": (CODE_OF[cs.dtype], cs.values),
            "indices": ("U8", cs.indices),
            "row_ptr": ("I32", cs.row_ptr),
            "block_increments": ("U8", cs.block_increments),
        },
        metadata,
    )
    if file is None:
        return data
    if hasattr(file, "write"):
        file.write(data)
    else:
        with open(file, "wb") as out:
            out.write(data)
    return None


def load_safetensors(file: str | os.PathLike | IO[bytes] | bytes) -> CS256:
    """A validated CS256 (NumPy arrays) from a .safetensors of save_safetensors."""
    if isinstance(file, (bytes, bytearray, memoryview)):
        data = bytes(file)
    elif hasattr(file, "read"):
        data = file.read()
    else:
        with open(file, "rb") as source:
            data = source.read()
    try:
        tensors, metadata = read_safetensors(data)
    except SafetensorsError as exc:
        raise CS256Error(f"not a readable .safetensors file ({exc})") from None
    if metadata.get("format") != FORMAT_NAME or metadata.get("version") != str(FORMAT_VERSION):
        raise CS256Error(
            f"not a CS256 version {FORMAT_VERSION} .safetensors (metadata format {metadata.get('format')!r}, "
            f"version {metadata.get('version')!r})"
        )
    missing = set(ARRAYS) - set(tensors)
    if missing:
        raise CS256Error(f"not a CS256 .safetensors: missing {', '.join(sorted(missing))}")
    try:
        m, n, vec = int(metadata["m"]), int(metadata["n"]), int(metadata["vec"])
        dtype = check_dtype(metadata["dtype"])
    except (KeyError, ValueError) as exc:
        raise CS256Error(f"the metadata needs integer m, n, vec and a dtype ({exc})") from None
    codes = {"values": CODE_OF[dtype], "indices": "U8", "row_ptr": "I32", "block_increments": "U8"}
    for name, code in codes.items():
        if tensors[name].dtype != code:
            raise CS256Error(f"{name} is {tensors[name].dtype}; a {dtype} CS256 matrix stores it as {code}")
    return _assemble(m, n, dtype, vec, {name: np.array(tensors[name].data) for name in ARRAYS})


def _assemble(m: int, n: int, dtype: str, vec: int, arrays: dict[str, np.ndarray]) -> CS256:
    dtype = check_dtype(dtype)
    vec = check_vec(vec)
    native = {name: np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")) for name, array in arrays.items()}
    return CS256(m, n, dtype, vec, **native).validate()
