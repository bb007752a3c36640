"""Uploaded bytes -> an 8-bit image array, or an ImageError.

Accepts JPEG, PNG and WebP (decided from the file's signature, not its name). The
pixel count is checked from the header before any pixel is decoded, so a decompression
bomb never allocates. EXIF orientation is applied, alpha is composited on white, and
grayscale, palette, 16-bit and CMYK images are brought to 8-bit gray or RGB.
"""

from __future__ import annotations

import io
import warnings

import cv2
import imagecodecs
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from gpu.codec.errors import ImageError
from gpu.pencil.params import MIN_SIDE

# Our own pixel limit, checked from the header before decoding, is the guard against
# decompression bombs; Pillow's warning about large images would only repeat it.
warnings.simplefilter("ignore", Image.DecompressionBombWarning)

# Pillow format name -> what we call it in messages
SUPPORTED_FORMATS = {"JPEG": "JPEG", "PNG": "PNG", "WEBP": "WebP"}
_SIGNATURES = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
)


def sniff_format(data: bytes) -> str | None:
    """The supported format the bytes start like ('JPEG', 'PNG', 'WEBP'), or None."""
    for signature, name in _SIGNATURES:
        if data.startswith(signature):
            return name
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Read an uploaded image's header only (nothing is decoded): a lazy Pillow image
    whose `.size` is the stored (width, height).

    Raises ImageError: empty_file, corrupt_image (header), image_too_small,
    too_many_pixels (more than `max_pixels`), unsupported_format (not JPEG, PNG or WebP).
    """
    if not data:
        raise ImageError("empty_file", "the uploaded file is empty")
    kind = sniff_format(data)
    if kind is None:
        raise ImageError("unsupported_format", "only JPEG, PNG and WebP images are accepted; this file is none of them")
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
        # Pillow refuses images over 2x this process-wide limit inside open(); raise it
        # (only ever up, so concurrent calls agree) so that our limit is the one that holds.
        Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        image = Image.open(io.BytesIO(data), formats=[kind])
    except Image.DecompressionBombError:
        raise ImageError("too_many_pixels", f"the image has more than {max_pixels:,} pixels") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ImageError(
            "corrupt_image", f"the file starts like a {SUPPORTED_FORMATS[kind]} but its header is invalid ({exc})"
        ) from None

    width, height = image.size
    if width * height > max_pixels:
        raise ImageError(
            "too_many_pixels", f"the image is {width}x{height} = {width * height:,} pixels; the limit is {max_pixels:,}"
        )
    if min(width, height) < MIN_SIDE:
        raise ImageError("image_too_small", f"the image is {width}x{height}; both sides must be at least {MIN_SIDE} px")
    return image


def decode_image(data: bytes, max_pixels: int) -> np.ndarray:
    """Decode an uploaded image (checked as `open_image` does); see `load_pixels`."""
    return decode_pixels(data, open_image(data, max_pixels))


def decode_pixels(data: bytes, image: Image.Image) -> np.ndarray:
    """`data` decoded as load_pixels(image) decodes it (`image` = open_image(data, ...)).
    A plain 8-bit gray or RGB PNG goes through imagecodecs' libpng, which decodes in about
    0.7x OpenCV's time, straight to RGB, with the GIL released (BENCHMARKS.md, "PNG
    decode"); any other image, or one it cannot read, through Pillow."""
    if (
        image.format == "PNG"
        and image.mode in ("L", "RGB")
        and "transparency" not in image.info
        and not image.info.get("interlace")  # libpng would print a warning past the logs
        and not _png_has_exif(data)
    ):
        try:
            pixels = imagecodecs.png_decode(data)
        except (imagecodecs.PngError, ValueError, RuntimeError):
            pixels = None  # Pillow decides what is wrong with it
        if pixels is not None and pixels.dtype == np.uint8 and pixels.shape[:2] == (image.height, image.width):
            if pixels.ndim == 2 and image.mode == "L":
                return pixels
            if pixels.ndim == 3 and pixels.shape[2] == 3 and image.mode == "RGB":
                return pixels
    return load_pixels(image)


def _png_has_exif(data: bytes) -> bool:
    """Whether a PNG carries EXIF (an eXIf chunk, or ImageMagick's text chunk: an
    orientation OpenCV would not apply), found by walking the chunk headers: Pillow reads
    it only by decoding the whole image."""
    offset = 8
    while offset + 8 <= len(data):
        length, kind = int.from_bytes(data[offset : offset + 4], "big"), data[offset + 4 : offset + 8]
        if kind == b"eXIf":
            return True
        if kind in (b"tEXt", b"zTXt", b"iTXt") and data[offset + 8 : offset + 8 + length].startswith(
            b"Raw profile type exif"
        ):
            return True  # ImageMagick's way of storing EXIF, which Pillow reads too
        if kind == b"IEND":
            return False
        offset += 12 + length
    return False


def load_pixels(image: Image.Image) -> np.ndarray:
    """Decode an image from `open_image`: (H, W) uint8 gray or (H, W, 3) uint8 RGB,
    C-contiguous, upright. Raises ImageError corrupt_image when the data is corrupt or truncated."""
    try:
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageError(
            "corrupt_image",
            f"the {SUPPORTED_FORMATS.get(image.format or '', 'image')} file is corrupt or truncated ({exc})",
        ) from None
    return to_array(_upright(image))


def _upright(image: Image.Image) -> Image.Image:
    """Apply the EXIF orientation; an unreadable EXIF block leaves the image as stored.
    An upright image is returned as it is (exif_transpose would copy it)."""
    try:
        if image.getexif().get(0x0112, 1) == 1:
            return image
        return ImageOps.exif_transpose(image)
    except Exception:  # any malformed EXIF (struct.error, ZeroDivisionError ... seen fuzzing): as stored
        return image


def to_array(image: Image.Image) -> np.ndarray:
    """A decoded Pillow image of any mode -> (H, W) uint8 gray or (H, W, 3) uint8 RGB."""
    mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):  # 16-bit gray PNG
        values = np.asarray(image)
        return cv2.convertScaleAbs(np.clip(values, 0, 65535).astype(np.uint16, copy=False), alpha=255.0 / 65535.0)
    if "transparency" in image.info and mode in ("L", "RGB"):  # PNG tRNS: one colour is transparent
        image = image.convert("LA" if mode == "L" else "RGBA")
    elif mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif mode == "PA":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "RGBa", "La"):
        gray = image.mode in ("LA", "La")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, image.convert("RGBA")).convert("L" if gray else "RGB")
    if image.mode == "1":
        image = image.convert("L")
    if image.mode not in ("L", "RGB"):
        image = image.convert("RGB")  # CMYK, YCbCr, LAB, HSV, RGBX ...
    return np.ascontiguousarray(np.asarray(image))  # L and RGB are uint8; a dtype argument would copy via tobytes()
