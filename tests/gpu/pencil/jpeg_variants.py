"""Real photographs as the JPEG variants users upload: colour, gray, EXIF-rotated,
progressive, CMYK. Shared by tests/gpu/pencil/test_draw.py and test_draw_cuda.py."""

from __future__ import annotations

import io

import cv2
import numpy as np
import skimage.data
from PIL import Image

VARIANTS = ("color", "gray", "exif_rotated", "progressive", "cmyk")


def photo(name: str, rng: np.random.Generator, width: int = 640) -> np.ndarray:
    """A random crop (at least 70 % a side) of a scikit-image photograph, resized to
    `width` px wide, uint8 RGB."""
    image = getattr(skimage.data, name)()
    image = image if image.ndim == 3 else cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    h, w = image.shape[:2]
    ch, cw = int(rng.integers(int(h * 0.7), h + 1)), int(rng.integers(int(w * 0.7), w + 1))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = image[y : y + ch, x : x + cw]
    return cv2.resize(crop, (width, max(16, round(width * ch / cw))), interpolation=cv2.INTER_AREA)


def jpeg(image: np.ndarray, variant: str, quality: int = 90, orientation: int = 6) -> bytes:
    """`image` (H, W, 3) uint8 RGB as a JPEG of the given variant; "exif_rotated" carries
    the EXIF `orientation` (1-8; 6: the viewer turns it 90 degrees clockwise)."""
    picture = Image.fromarray(image)
    options: dict = {"quality": quality}
    if variant == "gray":
        picture = picture.convert("L")
    elif variant == "exif_rotated":
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    elif variant == "progressive":
        options["progressive"] = True
    elif variant == "cmyk":
        picture = picture.convert("CMYK")
    buffer = io.BytesIO()
    picture.save(buffer, "JPEG", **options)
    return buffer.getvalue()
