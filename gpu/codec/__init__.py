"""Image codecs: uploaded bytes to pixels and drawings to bytes.

- decode.py: the host decoder (Pillow): format sniffing, header checks, EXIF
  orientation, alpha on white, 16-bit, palette and CMYK to 8-bit gray or RGB.
- encode.py: the host encoders and the output options (format, quality).
- png.py: the fast PNG writer encode.py uses.
- nvjpeg.py: JPEG decode and encode on the GPU (nvImageCodec), optional.
- errors.py: ImageError, the one error they raise.

gpu/pencil/draw.py picks, per request, which of them run.
"""

from gpu.codec.errors import ImageError

__all__ = ["ImageError"]
