"""POST /jobs/video: every frame of a video clip drawn in pencil, written as H.264 in MP4 with
the clip's sound (gpu.video's front door, on a GPU lease or the CPU backend).

Input: a multipart form with the clip as the file part `video` (MP4, MOV, MKV, WebM or
AVI) and the options as JSON in the field `params`: the drawing options of /sketch (same
names, bounds and defaults) and `temporal` (steady | none). The clip's container header
is read and its first frame decoded before the job is stored, so a file that is not a
video, holds no video stream, cannot be decoded or has frames over PENCIL_MAX_PIXELS is
a 4xx now, never a failed job later.

The result: frames, fps, duration_s, width, height, audio (copied or re-encoded, or
null), backend, frames_per_second (drawn, decode to the last byte), temporal and the
encoder; the file sketch.mp4.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from pydantic import Field

from app.config import Settings
from app.errors import ApiError
from app.jobs.kinds import JobKind, ResultModel, Submission
from app.jobs.requests import form_schema, is_form, unsupported, upload_form
from gpu import video
from gpu.pencil.params import PENCIL_OPTIONS
from gpu.video.params import TEMPORAL_HELP

FORM_EXAMPLE = 'curl -F video=@clip.mp4 -F params=\'{"texture": "fast", "temporal": "steady"}\''

# The HTTP status of each VideoError code (gpu/video knows no HTTP).
VIDEO_ERROR_STATUS = {
    "empty_file": 400,
    "corrupt_video": 400,
    "video_too_small": 400,
    "too_many_pixels": 413,
    "not_a_video": 415,
    "unsupported_codec": 415,
    "no_video_stream": 422,
}


# ------------------------------------------------------------------ the request --


PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        **{option.name: option.json_schema() for option in PENCIL_OPTIONS},
        "temporal": {
            "type": "string",
            "enum": list(video.TEMPORAL_CHOICES),
            "default": "steady",
            "description": TEMPORAL_HELP,
        },
    },
}


class VideoAudio(ResultModel):
    codec: str = Field(description="the sound's codec in sketch.mp4")
    source_codec: str = Field(description="the clip's")
    copied: bool = Field(description="remuxed as it was; false: re-encoded to AAC (MP4 players read no other)")


class VideoEncoder(ResultModel):
    codec: str
    preset: str = Field(description="the x264 preset")
    crf: int = Field(description="x264's constant rate factor")


class VideoResult(ResultModel):
    frames: int = Field(description="frames drawn")
    fps: float = Field(description="the clip's nominal frame rate, kept (each frame keeps its timestamp)")
    duration_s: float
    width: int = Field(description="of the drawing: the clip's upright size after max_side, sides even")
    height: int
    time_base: str = Field(
        description="of the MP4's video: the clip's, or a finer one where MP4 needs 10,000 units a second or more"
    )
    audio: VideoAudio | None = Field(description="what became of the clip's sound; null: it has none")
    backend: str
    seconds: float = Field(description="wall time from the first packet read to the last byte written")
    frames_per_second: float = Field(description="frames / seconds")
    temporal: str
    steady_luts: int | None = Field(description="times the steady tone LUT was built (temporal steady; else null)")
    encoder: VideoEncoder
    skipped_packets: int = Field(description="video packets that did not decode and were skipped")
    source: dict[str, Any] = Field(description="the clip as probed: container, codec, size, rate, frames...")
    bytes: int = Field(description="size of sketch.mp4")


def _form_schema() -> dict[str, Any]:
    """The multipart form: the file part `video`, and `params` as JSON text whose schema
    (built from PENCIL_OPTIONS) is its contentSchema."""
    schema = form_schema(
        {"video": "the clip: MP4, MOV, MKV, WebM or AVI, with a video stream FFmpeg decodes"},
        ("video",),
        (
            "the options as a JSON object: the drawing options of /sketch (mode, tone, texture, hatching, "
            "line_frac, stroke_width, stroke_gamma, tone_gamma, max_side) and temporal"
        ),
    )
    schema["properties"]["params"].update(contentMediaType="application/json", contentSchema=PARAMS_SCHEMA)
    return schema


OPENAPI = {
    "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _form_schema()}}},
    "responses": {
        "202": {
            "description": (
                "the job, queued; poll its Location (progress: frames drawn / frames in the clip). The result: "
                "frames, fps, duration_s, width, height, audio, backend, frames_per_second, temporal, encoder; "
                "the file sketch.mp4 (H.264, yuv420p, the clip's sound)"
            )
        }
    },
}


# ------------------------------------------------------------------- parsing --


def video_error(exc: video.VideoError) -> ApiError:
    return ApiError(VIDEO_ERROR_STATUS.get(exc.code, 400), exc.code, exc.detail)


async def parse(request: Request, settings: Settings) -> Submission:
    if not is_form(request):
        raise unsupported(
            "send the clip as the file part 'video' of a multipart form and the options as JSON in the field "
            f"'params' ({FORM_EXAMPLE})"
        )
    form = await upload_form(request, ("video",), example=FORM_EXAMPLE)
    params = video.VideoParams.from_values(form.params)  # ParamError: 422 naming the option
    try:
        job = await asyncio.to_thread(video.VideoJob.uploaded, params, form.files["video"], settings.max_pixels)
    except video.VideoError as exc:
        raise video_error(exc) from None
    return Submission.of(job)


VIDEO = JobKind(
    name="video",
    summary="Draw every frame of a video clip in pencil: H.264 in MP4, the sound copied",
    parse=parse,
    job_type=video.VideoJob,
    run=video.run,
    openapi=OPENAPI,
    result_model=VideoResult,
)
