"""PNG encoder: row filters in NumPy, deflate by Intel ISA-L (python-isal), one core.

- `encode_png(image)`: image (H, W) uint8 gray or (H, W, 3) uint8 RGB, any strides, H, W >= 1
  -> bytes of a PNG: 8-bit, colour type 0 (gray) or 2 (RGB), no interlace, one IDAT (more
  only past 2**31 - 1 compressed bytes). One filter for every row: Average unless
  `row_filter` names another.
- `filter_rows(image, row_filter)`: the filtered scanlines, (H, 1 + W * C) uint8, column 0
  the filter type: what a GPU kernel will compute instead.
- `png_from_filtered(rows, width, height, channels)`: such scanlines -> PNG bytes.
- `encode_png` = `filtered_strips` (filter_rows a strip at a time) + deflate + container.

Deflate is most of the time and pencil texture leaves LZ77 little to find, so the fastest
deflate (ISA-L level 1) with the Average filter gives about OpenCV's size in a tenth of its
time; strips of about STRIP_BYTES are filtered and fed to the compressor in turn, so the
temporaries stay in cache. The sweep that chose them: BENCHMARKS.md, "PNG writer" and
"Figures behind choices in the code".
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from isal import isal_zlib

SIGNATURE = b"\x89PNG\r\n\x1a\n"
FILTER_TYPES = {"none": 0, "sub": 1, "up": 2, "average": 3, "paeth": 4}
DEFAULT_FILTER = "average"  # the smallest for its time (BENCHMARKS.md, "PNG writer")
COLOR_TYPES = {1: 0, 3: 2}  # channels -> PNG colour type (gray, truecolour)
LEVEL = 1  # ISA-L compression level, 0..3
STRIP_BYTES = 128 * 1024  # the unit of filtering and of feeding the compressor
MAX_CHUNK = 2**31 - 1  # the longest chunk data PNG allows, bytes
MAX_SIDE = 2**31 - 1  # px

Buffer = bytes | bytearray | memoryview | np.ndarray


def encode_png(image: np.ndarray, row_filter: str | None = None) -> bytes:
    """(H, W) uint8 gray or (H, W, 3) uint8 RGB, any strides -> PNG bytes.

    row_filter: one of FILTER_TYPES for every row; None: DEFAULT_FILTER.
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise ValueError(f"expected (H, W) or (H, W, 3) uint8, got {image.shape} {image.dtype}")
    height, width = image.shape[:2]
    if height < 1 or width < 1:
        raise ValueError(f"a PNG has at least one row and column, got {height} x {width}")
    channels = 1 if image.ndim == 2 else 3
    strips = filtered_strips(image, row_filter or DEFAULT_FILTER)
    return _png(width, height, channels, _deflate(strips))


def filtered_strips(image: np.ndarray, row_filter: str) -> Iterator[np.ndarray]:
    """filter_rows of the whole image in strips of about STRIP_BYTES (at least one row):
    (rows, 1 + W * C) uint8 arrays, top to bottom."""
    height, width = image.shape[:2]
    step = max(1, STRIP_BYTES // image[0].size)
    for start in range(0, height, step):
        yield filter_rows(image, row_filter, start, start + step)


def filter_rows(image: np.ndarray, row_filter: str, start: int = 0, stop: int | None = None) -> np.ndarray:
    """(H, W) or (H, W, C) uint8, any strides -> (stop - start, 1 + W * C) uint8: scanlines
    start..stop of the image (default all), each the filter type byte and then the row
    filtered by `row_filter` (PNG spec, section 9) byte by byte against the byte one pixel
    to the left (a), above (b) and above-left (c); those outside the image are 0."""
    if row_filter not in FILTER_TYPES:
        raise ValueError(f"unknown filter {row_filter!r}; one of {', '.join(FILTER_TYPES)}")
    height, width = image.shape[:2]
    bpp = 1 if image.ndim == 2 else image.shape[2]
    if height < 1 or width < 1:
        raise ValueError(f"a PNG has at least one row and column, got {height} x {width}")
    stop = height if stop is None else min(stop, height)
    if not 0 <= start < stop:
        raise ValueError(f"rows {start}..{stop} are not inside 0..{height}")
    count = stop - start

    # The rows under the row above (zero above the image) and right of one zero pixel:
    # x, a, b, c are then shifted views of one small copy.
    padded = np.zeros((count + 1, width + 1, bpp), np.uint8)
    if start > 0:
        padded[0, 1:] = image[start - 1].reshape(width, bpp)
    padded[1:, 1:] = image[start:stop].reshape(count, width, bpp)
    flat = padded.reshape(count + 1, (width + 1) * bpp)
    x, a, b, c = flat[1:, bpp:], flat[1:, :-bpp], flat[:-1, bpp:], flat[:-1, :-bpp]

    rows = np.empty((count, 1 + width * bpp), np.uint8)
    rows[:, 0] = FILTER_TYPES[row_filter]
    out = rows[:, 1:]  # uint8 arithmetic wraps modulo 256, as the spec asks
    if row_filter == "none":
        out[...] = x
    elif row_filter == "sub":
        np.subtract(x, a, out=out)
    elif row_filter == "up":
        np.subtract(x, b, out=out)
    elif row_filter == "average":
        np.subtract(x, (a & b) + ((a ^ b) >> 1), out=out)  # floor((a + b) / 2) within uint8
    else:
        np.subtract(x, paeth_predictor(a, b, c), out=out)
    return rows


def paeth_predictor(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Elementwise Paeth predictor of uint8 arrays: whichever of a, b, c is nearest to
    a + b - c, ties going to a, then b."""
    a16, b16, c16 = (v.astype(np.int16) for v in (a, b, c))
    pa = np.abs(b16 - c16)  # |p - a| with p = a + b - c
    pb = np.abs(a16 - c16)
    pc = np.abs(a16 + b16 - 2 * c16)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))


def png_from_filtered(rows: Buffer, width: int, height: int, channels: int, *, chunk_size: int = MAX_CHUNK) -> bytes:
    """Filtered scanlines -> PNG bytes.

    rows: height rows of 1 filter-type byte (0..4) + width * channels bytes, back to back:
    bytes-like, or a uint8 array of any shape and strides holding them in C order.
    channels: 1 (gray) or 3 (RGB); 8 bits each. chunk_size: the longest IDAT's data, bytes.
    Raises ValueError on a wrong length, size, channel count or filter type.
    """
    if channels not in COLOR_TYPES:
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"width and height must be 1 .. {MAX_SIDE}, got {width} x {height}")
    if isinstance(rows, np.ndarray):
        if rows.dtype != np.uint8:
            raise ValueError(f"rows must be uint8, got {rows.dtype}")
        data = np.ascontiguousarray(rows).reshape(-1)
    else:
        data = np.frombuffer(rows, np.uint8)
    stride = 1 + width * channels
    if data.size != height * stride:
        raise ValueError(f"{height} rows of {stride} bytes are {height * stride} bytes, got {data.size}")
    if data[::stride].max() > 4:
        raise ValueError("a row's filter type is not 0..4")
    strips = (data[start : start + STRIP_BYTES] for start in range(0, data.size, STRIP_BYTES))
    return _png(width, height, channels, _deflate(strips), chunk_size)


def _deflate(strips: Iterable[np.ndarray]) -> list[bytes]:
    """The zlib stream of the strips' bytes in order, as the compressor's pieces."""
    compressor = isal_zlib.compressobj(LEVEL)
    pieces = [compressor.compress(strip) for strip in strips]
    pieces.append(compressor.flush())
    return pieces


def _png(width: int, height: int, channels: int, compressed: list[bytes], chunk_size: int = MAX_CHUNK) -> bytes:
    """Signature, IHDR, the zlib stream in IDATs of at most chunk_size bytes, IEND."""
    if sum(map(len, compressed)) <= chunk_size:
        idats: list[Sequence[bytes | memoryview]] = [compressed]
    else:
        stream = memoryview(b"".join(compressed))
        idats = [[stream[start : start + chunk_size]] for start in range(0, len(stream), chunk_size)]
    header = struct.pack(">IIBBBBB", width, height, 8, COLOR_TYPES[channels], 0, 0, 0)
    parts = [SIGNATURE, *_chunk(b"IHDR", [header])]
    for pieces in idats:
        parts += _chunk(b"IDAT", pieces)
    parts += _chunk(b"IEND", [])
    return b"".join(parts)  # the one copy of the compressed stream


def _chunk(kind: bytes, pieces: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """A chunk as pieces: length, type, the data (given in pieces), CRC-32 of type and data."""
    crc = isal_zlib.crc32(kind)
    for piece in pieces:
        crc = isal_zlib.crc32(piece, crc)
    return [struct.pack(">I", sum(map(len, pieces))), kind, *pieces, struct.pack(">I", crc)]
