"""gpu/codec/png.py: PNGs decoded by Pillow and OpenCV equal the input exactly (real photos
from skimage.data and random images of odd sizes down to one row or column; gray and RGB;
strided views; each of the five filters and the default; strips of one row and more); the chunks are well formed
(Pillow's verify, our own CRC walk, IHDR fields, the filter byte of every row, several
IDATs); filter_rows against a per-byte transcription of the PNG spec; png_from_filtered
takes bytes or arrays and rejects wrong lengths, channels and filter types."""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from gpu.codec import png as png_module
from gpu.codec.png import DEFAULT_FILTER, FILTER_TYPES, encode_png, filter_rows, png_from_filtered

FILTERS = list(FILTER_TYPES)


def photo(name: str) -> np.ndarray:
    from skimage import data

    return getattr(data, name)()


def decoded_by_pillow(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as image:
        assert image.mode in ("L", "RGB")
        return np.asarray(image)


def decoded_by_cv2(png: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None, "OpenCV could not decode the PNG"
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if image.ndim == 3 else image


def assert_round_trip(image: np.ndarray, png: bytes) -> None:
    for decode in (decoded_by_pillow, decoded_by_cv2):
        decoded = decode(png)
        assert decoded.dtype == np.uint8 and decoded.shape == image.shape, decode.__name__
        np.testing.assert_array_equal(decoded, image, err_msg=decode.__name__)


def chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """(type, data) of every chunk, checking the signature, lengths and CRCs with zlib."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    result, offset = [], 8
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset : offset + 4])
        kind, data = png[offset + 4 : offset + 8], png[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", png[offset + 8 + length : offset + 12 + length])
        assert len(data) == length, f"{kind!r} runs past the end"
        assert crc == zlib.crc32(kind + data), f"bad CRC on {kind!r}"
        result.append((kind, data))
        offset += 12 + length
    return result


def scanlines(png: bytes) -> bytes:
    return zlib.decompress(b"".join(data for kind, data in chunks(png) if kind == b"IDAT"))


# ------------------------------------------------------------------------ round trips --


@pytest.mark.parametrize("row_filter", [None, *FILTERS])
@pytest.mark.parametrize("name", ["camera", "astronaut", "coffee"])
def test_real_photos_round_trip(name, row_filter):
    image = photo(name)
    assert_round_trip(image, encode_png(image, row_filter))


@pytest.mark.parametrize("row_filter", FILTERS)
@pytest.mark.parametrize("channels", [1, 3])
def test_random_images_of_odd_sizes_round_trip(rng, channels, row_filter):
    for height, width in [(1, 1), (1, 9), (7, 1), (2, 2), *rng.integers(1, 70, size=(4, 2))]:
        shape = (height, width) if channels == 1 else (height, width, 3)
        image = rng.integers(0, 256, size=shape, dtype=np.uint8)
        assert_round_trip(image, encode_png(image, row_filter))


@pytest.mark.parametrize("row_filter", [None, "average", "paeth"])
def test_strided_views_round_trip(rng, row_filter):
    rgb = photo("astronaut")
    gray = photo("camera")
    views = [
        rgb[::3, 1::2],  # every other column: a pixel stride of 6 bytes
        rgb[:, ::-1],  # negative strides
        rgb[..., ::-1],  # BGR as a view
        np.asfortranarray(rgb[:37, :29]),
        gray.T,  # column-major
        gray[5:-3:2, ::-5],
        rng.integers(0, 256, size=(40, 60, 4), dtype=np.uint8)[..., :3],  # RGB out of RGBA
    ]
    for view in views:
        assert not view.flags.c_contiguous
        assert_round_trip(view, encode_png(view, row_filter))


def test_smooth_and_flat_images_round_trip():
    """Long matches and runs, which random data never gives the compressor."""
    ramp = np.add.outer(np.arange(300), np.arange(200)).astype(np.uint8)
    for image in (
        ramp,
        np.full((50, 70), 255, np.uint8),
        np.zeros((33, 65, 3), np.uint8),
        np.dstack([ramp, ramp[::-1], 255 - ramp]),
    ):
        assert_round_trip(image, encode_png(image))


# --------------------------------------------------------------------- the container --


@pytest.mark.parametrize("channels", [1, 3])
def test_pillow_verifies_the_crcs_and_catches_a_flipped_bit(rng, channels):
    shape = (23, 31) if channels == 1 else (23, 31, 3)
    png = encode_png(rng.integers(0, 256, size=shape, dtype=np.uint8))
    with Image.open(io.BytesIO(png)) as image:
        image.verify()
    broken = bytearray(png)
    broken[-20] ^= 0x10  # inside the last IDAT's data
    with pytest.raises(SyntaxError), Image.open(io.BytesIO(bytes(broken))) as image:
        image.verify()


@pytest.mark.parametrize("shape, color_type", [((19, 41), 0), ((19, 41, 3), 2)])
def test_chunks_and_header(rng, shape, color_type):
    png = encode_png(rng.integers(0, 256, size=shape, dtype=np.uint8))
    found = chunks(png)
    kinds = [kind for kind, _ in found]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and set(kinds[1:-1]) == {b"IDAT"}
    assert found[-1][1] == b""
    width, height, depth, colour, compression, filter_method, interlace = struct.unpack(">IIBBBBB", found[0][1])
    assert (width, height) == (shape[1], shape[0])
    assert (depth, colour, compression, filter_method, interlace) == (8, color_type, 0, 0, 0)


@pytest.mark.parametrize("row_filter", [None, *FILTERS])
@pytest.mark.parametrize("channels", [1, 3])
def test_every_row_carries_the_filter_asked_for(rng, channels, row_filter):
    height, width = 13, 17
    shape = (height, width) if channels == 1 else (height, width, channels)
    png = encode_png(rng.integers(0, 256, size=shape, dtype=np.uint8), row_filter)
    rows = np.frombuffer(scanlines(png), np.uint8).reshape(height, 1 + width * channels)
    expected = FILTER_TYPES[row_filter or DEFAULT_FILTER]
    np.testing.assert_array_equal(rows[:, 0], expected)


def test_several_idat_chunks(rng):
    image = rng.integers(0, 256, size=(40, 50, 3), dtype=np.uint8)
    png = png_from_filtered(filter_rows(image, "sub"), 50, 40, 3, chunk_size=1000)
    idats = [data for kind, data in chunks(png) if kind == b"IDAT"]
    assert len(idats) > 3 and all(len(data) <= 1000 for data in idats)
    assert_round_trip(image, png)


# ------------------------------------------------------------------------- filtering --


def spec_filter(image: np.ndarray, row_filter: str) -> np.ndarray:
    """PNG spec section 9.2, one byte at a time: the definition filter_rows must match."""
    height, width = image.shape[:2]
    raw = image.reshape(height, -1).astype(int)
    bpp = 1 if image.ndim == 2 else image.shape[2]
    out = np.zeros((height, 1 + raw.shape[1]), np.uint8)
    for y in range(height):
        out[y, 0] = FILTER_TYPES[row_filter]
        for i in range(raw.shape[1]):
            a = raw[y, i - bpp] if i >= bpp else 0
            b = raw[y - 1, i] if y > 0 else 0
            c = raw[y - 1, i - bpp] if y > 0 and i >= bpp else 0
            if row_filter == "none":
                predicted = 0
            elif row_filter == "sub":
                predicted = a
            elif row_filter == "up":
                predicted = b
            elif row_filter == "average":
                predicted = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                predicted = a if pa <= pb and pa <= pc else b if pb <= pc else c
            out[y, 1 + i] = (raw[y, i] - predicted) % 256
    return out


@pytest.mark.parametrize("row_filter", FILTERS)
@pytest.mark.parametrize("shape", [(1, 1), (6, 1), (1, 5, 3), (9, 7), (8, 11, 3)])
def test_filter_rows_matches_the_spec(rng, shape, row_filter):
    image = rng.integers(0, 256, size=shape, dtype=np.uint8)
    image[0, 0] = 255  # extremes, where a widening or a carry slip shows
    image[-1, -1] = 0
    np.testing.assert_array_equal(filter_rows(image, row_filter), spec_filter(image, row_filter))


@pytest.mark.parametrize("row_filter", FILTERS)
def test_strips_join_up_to_the_whole(rng, row_filter):
    image = rng.integers(0, 256, size=(23, 9, 3), dtype=np.uint8)
    whole = filter_rows(image, row_filter)
    for step in (1, 4, 10, 23):
        strips = [filter_rows(image, row_filter, start, start + step) for start in range(0, 23, step)]
        np.testing.assert_array_equal(np.concatenate(strips), whole)


@pytest.mark.parametrize("strip_bytes", [1, 20, 100, 1000])
def test_encoding_in_small_strips_round_trips(rng, monkeypatch, strip_bytes):
    """Strips of one row (rows longer than STRIP_BYTES) up to several rows, gray and RGB."""
    monkeypatch.setattr(png_module, "STRIP_BYTES", strip_bytes)
    for shape in [(30, 41), (17, 29, 3)]:
        image = rng.integers(0, 256, size=shape, dtype=np.uint8)
        for row_filter in [None, "paeth"]:
            assert_round_trip(image, encode_png(image, row_filter))
        channels = 1 if image.ndim == 2 else 3
        assert_round_trip(image, png_from_filtered(filter_rows(image, "up"), shape[1], shape[0], channels))


def test_filter_rows_rejects_an_unknown_filter_or_rows_outside():
    image = np.zeros((4, 4), np.uint8)
    with pytest.raises(ValueError, match="unknown filter"):
        filter_rows(image, "median")
    for start, stop in [(2, 2), (3, 1), (4, 6), (-1, 2)]:
        with pytest.raises(ValueError, match="rows"):
            filter_rows(image, "sub", start, stop)


# ----------------------------------------------------------------- inputs and errors --


def test_png_from_filtered_takes_bytes_and_any_uint8_array(rng):
    image = rng.integers(0, 256, size=(21, 13, 3), dtype=np.uint8)
    rows = filter_rows(image, "paeth")
    wide = np.zeros((21, rows.shape[1] + 5), np.uint8)
    wide[:, 2:-3] = rows
    strided = wide[:, 2:-3]  # the rows inside a wider buffer: not C-contiguous
    assert not strided.flags.c_contiguous
    expected = png_from_filtered(rows, 13, 21, 3)
    for same in (rows.tobytes(), bytearray(rows.tobytes()), memoryview(rows.tobytes()), rows.reshape(-1), strided):
        assert png_from_filtered(same, 13, 21, 3) == expected
    assert_round_trip(image, expected)


@pytest.mark.parametrize("size_change", [-1, 1, -14, 14])
def test_png_from_filtered_rejects_a_wrong_length(size_change):
    stride = 1 + 13 * 3
    rows = np.zeros(21 * stride + size_change, np.uint8)
    with pytest.raises(ValueError, match="bytes"):
        png_from_filtered(rows, 13, 21, 3)
    with pytest.raises(ValueError, match="bytes"):
        png_from_filtered(rows.tobytes(), 13, 21, 3)


def test_png_from_filtered_rejects_mismatched_geometry():
    rows = filter_rows(np.zeros((10, 12), np.uint8), "up").tobytes()
    assert png_from_filtered(rows, 12, 10, 1)
    for width, height, channels in [(12, 11, 1), (11, 10, 1), (12, 10, 3), (0, 10, 1), (12, 0, 1)]:
        with pytest.raises(ValueError):
            png_from_filtered(rows, width, height, channels)


@pytest.mark.parametrize("channels", [2, 4, 0])
def test_png_from_filtered_rejects_other_channel_counts(channels):
    with pytest.raises(ValueError, match="channels"):
        png_from_filtered(bytes(3 * (1 + 4 * channels)), 4, 3, channels)


def test_png_from_filtered_rejects_a_bad_filter_type_or_dtype():
    rows = filter_rows(np.zeros((5, 6), np.uint8), "sub")
    rows[3, 0] = 5
    with pytest.raises(ValueError, match="filter type"):
        png_from_filtered(rows, 6, 5, 1)
    with pytest.raises(ValueError, match="uint8"):
        png_from_filtered(np.zeros((5, 7), np.int16), 6, 5, 1)


@pytest.mark.parametrize(
    "image",
    [
        np.zeros((4, 5, 4), np.uint8),
        np.zeros((4, 5, 1), np.uint8),
        np.zeros((4, 5), np.uint16),
        np.zeros((4, 5), np.float32),
        np.zeros(5, np.uint8),
        np.zeros((0, 5), np.uint8),
    ],
)
def test_encode_png_rejects_other_images(image):
    with pytest.raises(ValueError):
        encode_png(image)
