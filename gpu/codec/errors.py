"""The one error the codecs raise: an image that cannot be read or written as asked."""

from __future__ import annotations


class ImageError(ValueError):
    """A bad or unsupported image, or a drawing a format cannot hold. `code` is stable
    (the HTTP layer maps it to a status); `detail` is a sentence for a person.

    Codes: empty_file, corrupt_image, image_too_small (the input); too_many_pixels (over
    the pixel limit, decided from the header); unsupported_format (not JPEG, PNG or WebP);
    too_large_for_format (the output does not fit the chosen format)."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail
