"""CS256 files (gpu/cs256/files.py): .npz and .safetensors round trips for every dtype, the
safetensors layout checked byte by byte against its specification (and against the
`safetensors` package when it is installed), malformed files refused, and tampered
structures caught by validation on load."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest

from gpu.cs256 import files
from gpu.cs256 import format as fmt
from gpu.cs256.files import SafetensorsError
from gpu.cs256.format import CS256Error


def matrix(rng, dtype: str, shape=(37, 700), vec=8) -> fmt.CS256:
    a = rng.standard_normal(shape).astype(np.float32)
    a[rng.random(shape) < 0.6] = 0
    return fmt.from_dense(fmt.from_float(a, dtype), vec, dtype)


def same(a: fmt.CS256, b: fmt.CS256) -> None:
    assert (a.m, a.n, a.dtype, a.vec) == (b.m, b.n, b.dtype, b.vec)
    for name in files.ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=name)


def handmade_safetensors(tensors: dict[str, tuple[str, np.ndarray]], metadata=None, pad: int = 0) -> bytes:
    """An independent writer, straight from the specification."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (code, array) in tensors.items():
        blob = array.tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


@pytest.mark.parametrize("dtype", fmt.DTYPES)
def test_npz_round_trip(rng, dtype, tmp_path):
    cs = matrix(rng, dtype)
    path = tmp_path / "w.npz"
    files.save_npz(cs, path)
    same(files.load_npz(path), cs)
    buffer = io.BytesIO()
    files.save_npz(cs, buffer)
    same(files.load_npz(buffer.getvalue()), cs)
    with np.load(path, allow_pickle=False) as archive:
        assert str(archive["format"]) == "cs256" and str(archive["dtype"]) == dtype and int(archive["vec"]) == cs.vec


@pytest.mark.parametrize("dtype", fmt.DTYPES)
def test_safetensors_round_trip_and_layout(rng, dtype, tmp_path):
    cs = matrix(rng, dtype, shape=(5, 1300), vec=16)
    path = tmp_path / "w.safetensors"
    files.save_safetensors(cs, path)
    data = path.read_bytes()
    same(files.load_safetensors(path), cs)
    same(files.load_safetensors(data), cs)
    header_len = struct.unpack("<Q", data[:8])[0]
    assert (8 + header_len) % 8 == 0  # the buffer starts aligned
    header = json.loads(data[8 : 8 + header_len])
    assert header["__metadata__"] == {
        "format": "cs256",
        "version": "1",
        "m": "5",
        "n": "1300",
        "vec": "16",
        "dtype": dtype,
    }
    codes = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
    assert header["values"]["dtype"] == codes[dtype] and header["indices"]["dtype"] == "U8"
    assert header["row_ptr"] == {"dtype": "I32", "shape": [6], "data_offsets": header["row_ptr"]["data_offsets"]}
    assert header["block_increments"]["shape"] == [5, 8]
    start = 8 + header_len
    begin, end = header["values"]["data_offsets"]
    np.testing.assert_array_equal(
        np.frombuffer(data[start + begin : start + end], fmt.STORAGE[dtype].newbyteorder("<")).view(np.uint8),
        cs.values.view(np.uint8),
    )


def test_reading_a_handmade_file_with_metadata_and_padding(rng):
    tensors = {
        "b": ("F32", rng.standard_normal((3, 4)).astype("<f4")),
        "a": ("BF16", rng.integers(0, 65535, (2, 2, 2)).astype("<u2")),
        "empty": ("I64", np.zeros((0, 5), "<i8")),
        "s": ("U8", np.array(7, np.uint8)),
    }
    data = handmade_safetensors(tensors, {"note": "x"}, pad=5)
    read, metadata = files.read_safetensors(data)
    assert metadata == {"note": "x"} and list(read) == ["b", "a", "empty", "s"]
    for name, (code, array) in tensors.items():
        assert read[name].dtype == code and read[name].shape == array.shape
        np.testing.assert_array_equal(read[name].data, array)
    only, _ = files.read_safetensors(data, names={"a"})
    assert list(only) == ["a"]


def test_matches_the_safetensors_package_when_installed(rng):
    numpy_io = pytest.importorskip("safetensors.numpy")
    arrays = {"w": rng.standard_normal((7, 300)).astype(np.float16), "i": np.arange(10, dtype=np.int32)}
    ours = files.write_safetensors({"w": ("F16", arrays["w"]), "i": ("I32", arrays["i"])})
    loaded = numpy_io.load(ours)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
    theirs, _ = files.read_safetensors(numpy_io.save(arrays))
    for name, array in arrays.items():
        np.testing.assert_array_equal(theirs[name].data, array)


def _good() -> dict:
    return {"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def _file(header, buffer: bytes = b"\0" * 16, declared: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if declared is None else declared) + raw + buffer


MALFORMED = [
    pytest.param(b"\x01\x02", id="shorter-than-8"),
    pytest.param(_file(_good(), declared=10**6), id="length-past-end"),
    pytest.param(_file(b"[1, 2]"), id="not-an-object"),
    pytest.param(_file(b"{not json"), id="bad-json"),
    pytest.param(_file(b'{"t": \xff}'), id="not-utf8"),
    pytest.param(_file({"t": {"dtype": "F32", "shape": [2, 2]}}), id="no-offsets"),
    pytest.param(
        _file({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, b"\0" * 12), id="size-mismatch"
    ),
    pytest.param(
        _file({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 20), id="trailing-hole"
    ),
    pytest.param(_file({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 32]}}), id="past-buffer"),
    pytest.param(
        _file(
            {
                "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "u": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]},
            },
            b"\0" * 6,
        ),
        id="overlap",
    ),
    pytest.param(_file({"t": {"dtype": "Q7", "shape": [2, 2], "data_offsets": [0, 16]}}), id="unknown-dtype"),
    pytest.param(_file({"t": {"dtype": "F32", "shape": [2, -2], "data_offsets": [0, 16]}}), id="negative-dim"),
    pytest.param(_file({"t": {"dtype": "F32", "shape": [2.0, 2], "data_offsets": [0, 16]}}), id="float-dim"),
    pytest.param(_file({"__metadata__": {"a": 1}, **_good()}), id="metadata-not-strings"),
    pytest.param(
        _file(
            b'{"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
            b'"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
            b"\0" * 8,
        ),
        id="a-name-twice",
    ),
]


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_safetensors_are_refused(data):
    with pytest.raises(SafetensorsError):
        files.read_safetensors(data)
    with pytest.raises(CS256Error):
        files.load_safetensors(data)


def test_loading_refuses_other_files_and_tampered_matrices(rng, tmp_path):
    with pytest.raises(CS256Error, match="readable"):
        files.load_npz(b"PK\x03\x04 not really a zip")
    buffer = io.BytesIO()
    np.savez(buffer, values=np.ones(3))
    with pytest.raises(CS256Error, match="missing"):
        files.load_npz(buffer.getvalue())
    cs = matrix(rng, "float16")
    tampered = cs.indices.copy()
    tampered[0], tampered[1] = tampered[1], tampered[0]  # first tile's indices no longer increase
    path = tmp_path / "bad.npz"
    np.savez(
        path,
        format=np.array("cs256"),
        version=np.int32(1),
        m=np.int64(cs.m),
        n=np.int64(cs.n),
        vec=np.int32(cs.vec),
        dtype=np.array("float16"),
        values=cs.values,
        indices=tampered,
        row_ptr=cs.row_ptr,
        block_increments=cs.block_increments,
    )
    with pytest.raises(CS256Error, match="increase"):
        files.load_npz(path)
    foreign = files.write_safetensors({"values": ("F16", cs.values)}, {"format": "other"})
    with pytest.raises(CS256Error, match="not a CS256"):
        files.load_safetensors(foreign)
    wrong_code = files.write_safetensors(
        {
            "values": ("F32", cs.values.astype(np.float32)),
            "indices": ("U8", cs.indices),
            "row_ptr": ("I32", cs.row_ptr),
            "block_increments": ("U8", cs.block_increments),
        },
        {"format": "cs256", "version": "1", "m": str(cs.m), "n": str(cs.n), "vec": str(cs.vec), "dtype": "float16"},
    )
    with pytest.raises(CS256Error, match="values is F32"):
        files.load_safetensors(wrong_code)
