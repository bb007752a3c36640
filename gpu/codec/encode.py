"""Rendered array -> encoded image bytes on the host: PNG with our writer (gpu/codec/png.py:
NumPy filters, ISA-L deflate), JPEG and WebP with OpenCV's encoders."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np

from gpu.codec.errors import ImageError
from gpu.codec.png import encode_png
from gpu.pencil.params import Option

MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}
MAX_SIDE = {"png": 65535, "jpeg": 65500, "webp": 16383}  # px: what each encoder can write

ENCODE_OPTIONS: tuple[Option, ...] = (
    Option("format", str, "png", "output image format", choices=tuple(MEDIA_TYPES)),
    Option("quality", int, 90, "JPEG/WebP quality (ignored for PNG)", minimum=1, maximum=100),
)


def parse_encode_options(raw: Mapping[str, Any]) -> tuple[str, int]:
    """(format, quality) from strings or values keyed by option name; missing or empty
    means the default. Raises ParamError."""
    fmt, quality = (
        option.parse(raw[option.name]) if raw.get(option.name) not in (None, "") else option.default
        for option in ENCODE_OPTIONS
    )
    return fmt, quality


def check_encodable(width: int, height: int, fmt: str) -> None:
    """Raise ImageError too_large_for_format before rendering when `fmt` cannot hold a width x height image."""
    limit = MAX_SIDE[fmt]
    if max(width, height) > limit:
        raise ImageError(
            "too_large_for_format",
            f"a {width}x{height} drawing does not fit in {fmt.upper()} (at most {limit} px a side); choose "
            "another format or set max_side",
        )


def encode_image(image: np.ndarray, fmt: str = "png", quality: int = 90) -> bytes:
    """(H, W) uint8 gray or (H, W, 3) uint8 RGB -> bytes of the image in `fmt`."""
    if fmt == "png":
        return encode_png(image)  # ours: a tenth of OpenCV's time (BENCHMARKS.md, "PNG writer")
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    if fmt == "jpeg":
        flags = [cv2.IMWRITE_JPEG_QUALITY, quality]
    elif fmt == "webp":
        flags = [cv2.IMWRITE_WEBP_QUALITY, quality]
    else:
        raise ValueError(f"unknown format {fmt!r}")
    ok, buffer = cv2.imencode("." + EXTENSIONS[fmt], image, flags)
    if not ok:
        raise RuntimeError(f"OpenCV could not encode a {image.shape} image as {fmt}")
    return buffer.tobytes()
