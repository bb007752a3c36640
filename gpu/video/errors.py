"""The one error the video modules raise for a clip that cannot be drawn."""

from __future__ import annotations


class VideoError(ValueError):
    """A clip that is not a video we read, or that cannot be decoded. `code` is stable (the
    HTTP layer maps it to a status); `detail` is a sentence for a person.

    Codes: empty_file; not_a_video (no container we read: MP4/MOV, MKV/WebM or AVI);
    no_video_stream; unsupported_codec (no decoder for the video stream); corrupt_video
    (no frame decodes); video_too_small (a side under 16 px); too_many_pixels (a frame
    over the pixel limit, decided from the header)."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail
