"""gpu/npy.py: .npy uploads read header first, for every job kind."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from gpu.errors import InputError
from gpu.npy import load_npy, read_header


def npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version)
    return buffer.getvalue()


def handmade(
    shape: tuple[int, ...], version: tuple[int, int], payload: bytes = b"\0" * 64, descr: str = "<f4"
) -> bytes:
    """A .npy file whose header says `shape` whatever the payload holds."""
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode("utf-8")
    length_size = 2 if version == (1, 0) else 4
    pad = -(6 + 2 + length_size + len(header) + 1) % 64
    header += b" " * pad + b"\n"
    length = struct.pack("<H" if length_size == 2 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header + payload


def refused(data: bytes, code: str, **kwargs) -> InputError:
    with pytest.raises(InputError) as caught:
        load_npy(data, "matrix", **kwargs)
    assert caught.value.code == code, caught.value.detail
    return caught.value


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_every_format_version_loads(version):
    array = np.random.default_rng().standard_normal((7, 5)).astype(np.float32)
    data = npy(array, version) if version != (3, 0) else handmade((7, 5), (3, 0), array.tobytes())
    np.testing.assert_array_equal(load_npy(data, "matrix"), array)
    assert read_header(data, "matrix")[:2] == ((7, 5), np.dtype(np.float32))


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_a_header_declaring_more_than_the_file_holds_is_malformed_before_any_allocation(version):
    error = refused(handmade((100_000, 100_000, 100_000), version), "malformed_npy")
    assert "truncated" in error.detail and "(100000, 100000, 100000)" in error.detail


def test_the_check_sees_the_header_before_the_data_is_read():
    seen = []

    def check(shape, dtype):
        seen.append((shape, dtype))
        raise InputError("too_many_elements", "too big")

    refused(npy(np.ones((3, 4), np.float64)), "too_many_elements", check=check)
    assert seen == [((3, 4), np.dtype(np.float64))]


def test_empty_garbage_objects_and_unknown_versions():
    refused(b"", "empty_file")
    refused(b"not a numpy file", "malformed_npy")
    refused(handmade((2,), (1, 0), descr="|O"), "malformed_npy")
    refused(handmade((2,), (4, 0)), "malformed_npy")
    refused(npy(np.ones(10))[:-3], "malformed_npy")
