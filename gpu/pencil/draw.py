"""Bytes in, bytes out: an uploaded photo to an encoded drawing, on the cheapest path.

On CUDA a JPEG is decoded on the device (gpu/codec/nvjpeg.py) and a JPEG answer is
encoded there, so the pixels never cross PCIe; what the device codecs do not take (PNG
and WebP input, CMYK or truncated JPEGs, a photo to shrink for `max_side`; PNG and WebP
output) goes through the host codecs, decoded before a GPU lease is taken and encoded
after it is given back, so host codec time never holds a lease. On the CPU backend
everything is the host codecs and the reference pipeline.

Both paths give the same drawing: the host and device JPEG decoders differ by the
rounding of their inverse DCTs (a level or two of 255), which the pipeline's parity
bounds cover (tests/gpu/pencil/test_draw_cuda.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image

from gpu.codec.decode import decode_pixels
from gpu.codec.encode import encode_image
from gpu.pencil import reference
from gpu.pencil.params import LineKernelTooLarge, PencilParams, fitted_size

log = logging.getLogger("pencil.draw")

_ROTATING_ORIENTATIONS = {5, 6, 7, 8}  # EXIF orientations that swap width and height


@dataclass(frozen=True)
class Drawing:
    """An encoded drawing: the bytes, its size in px, and where its codecs ran."""

    data: bytes
    width: int
    height: int
    decoded_on: Literal["gpu", "cpu"]
    encoded_on: Literal["gpu", "cpu"]


def host_pixels(data: bytes, photo: Image.Image, params: PencilParams) -> np.ndarray:
    """Decode on the host (raises ImageError when corrupt), upright, shrunk for max_side."""
    return np.ascontiguousarray(reference.fit_max_side(decode_pixels(data, photo), params.max_side))


def upright_size(photo: Image.Image) -> tuple[int, int]:
    """(height, width) of the photo once its EXIF orientation is applied."""
    width, height = photo.size
    try:
        orientation = photo.getexif().get(0x0112, 1)
    except Exception:  # an unreadable EXIF block: the host decoder ignores it too
        orientation = 1
    return (width, height) if orientation in _ROTATING_ORIENTATIONS else (height, width)


def device_decodable(photo: Image.Image, data: bytes, params: PencilParams) -> bool:
    """Whether the device JPEG decoder takes this upload with the host path's meaning: a
    baseline 8-bit gray or YCbCr JPEG that ends with its EOI marker (a truncated file goes
    to the host decoder, which refuses it), drawn at its own size. Progressive files stay
    on the host: nvJPEG decodes them on the CPU anyway, and without libjpeg-turbo's smooth
    chroma upsampling (a colour drawing's pixels would differ: BENCHMARKS.md, "Predictions
    against measurements")."""
    if photo.format != "JPEG" or photo.mode not in ("L", "RGB") or photo.info.get("progressive"):
        return False
    if photo.info.get("adobe_transform") == 0:  # RGB stored as is, not YCbCr: Pillow's reading is the reference
        return False
    if not data.rstrip(b"\0").endswith(b"\xff\xd9"):
        return False
    height, width = upright_size(photo)
    return fitted_size(height, width, params.max_side) == (height, width)


def draw_bytes(
    data: bytes, photo: Image.Image, params: PencilParams, fmt: str, quality: int, backend: str = "cpu", pool=None
) -> Drawing:
    """An uploaded photo -> its drawing encoded as `fmt` ('png', 'jpeg', 'webp') at
    `quality`. `photo` is `gpu.codec.decode.open_image(data, ...)` (header checked).
    Raises ImageError for a corrupt file; on CUDA, the pool's PoolBusy and
    DeviceOutOfMemory."""
    if backend == "cuda":
        return _draw_cuda(data, photo, params, fmt, quality, pool)
    return _draw_cpu(host_pixels(data, photo, params), params, fmt, quality)


def _draw_cpu(pixels: np.ndarray, params: PencilParams, fmt: str, quality: int) -> Drawing:
    """Host pixels (from host_pixels) -> the reference drawing, encoded on the host."""
    drawing = reference.render(pixels, params)
    return Drawing(encode_image(drawing, fmt, quality), drawing.shape[1], drawing.shape[0], "cpu", "cpu")


def _draw_cuda(data: bytes, photo: Image.Image, params: PencilParams, fmt: str, quality: int, pool) -> Drawing:
    from gpu.codec import nvjpeg
    from gpu.pencil import cuda
    from gpu.pool import default_pool

    pool = pool or default_pool()
    device_codecs = nvjpeg.available()
    decode_on_device = device_codecs and device_decodable(photo, data, params)
    encode_on_device = device_codecs and fmt == "jpeg"
    pixels = None if decode_on_device else host_pixels(data, photo, params)
    expected = upright_size(photo) if decode_on_device else None  # EXIF of a PNG costs a full decode

    def on_lease(lease) -> tuple[bytes | np.ndarray, tuple[int, int], str]:
        d_image, decoded_on = None, "cpu"
        if decode_on_device:
            d_image = nvjpeg.decode(lease, data, gray=photo.mode == "L")
            if d_image is not None and d_image.shape[:2] != expected:
                log.warning(
                    "device JPEG decode gave %s, the header says %s: decoding on the host", d_image.shape[:2], expected
                )
                d_image = None
            decoded_on = "cpu" if d_image is None else "gpu"
        if d_image is None:
            d_image = cuda.upload(lease, pixels if pixels is not None else host_pixels(data, photo, params))
        out = cuda.render_device(lease, d_image, params)
        if encode_on_device:
            try:
                return nvjpeg.encode(lease, out, quality), out.shape[:2], decoded_on
            except Exception as exc:  # nvImageCodec failed (its own memory, say): encode on the host
                log.warning("device JPEG encode failed (%s); encoding on the host", exc)
        return cuda.download(lease, out), out.shape[:2], decoded_on

    try:
        result, (height, width), decoded_on = pool.run(on_lease)
    except LineKernelTooLarge as exc:
        log.warning("%s; rendering on the CPU", exc)
        return _draw_cpu(pixels if pixels is not None else host_pixels(data, photo, params), params, fmt, quality)
    if isinstance(result, bytes):
        return Drawing(result, width, height, decoded_on, "gpu")
    return Drawing(encode_image(result, fmt, quality), width, height, decoded_on, "cpu")
