"""POST /jobs/video: every frame of a video clip drawn in pencil, written as H.264 in MP4 with
the clip's sound (gpu.video's front door, on a GPU lease or the CPU backend).

Input: a multipart form with the clip as the file part `video` (MP4, MOV, MKV, WebM or
AVI) and the options as JSON in the field `params`: the drawing options of /sketch (same
names, bounds and defaults) and `temporal` (steady | none); gpu/video/params.py's
VIDEO_SPEC. The clip's container header is read and its first frame decoded before the
job is stored, so a file that is not a video, holds no video stream, cannot be decoded or
has frames over PENCIL_MAX_PIXELS is a 4xx now, never a failed job later.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from app.config import Settings
from app.jobs.requests import receive
from app.jobs.route import JobRoute
from gpu import video
from gpu.video.params import VIDEO_SPEC
from jobs.kinds import JobKind, Submission


async def parse(request: Request, settings: Settings) -> Submission:
    def from_form(options: Any, files: dict[str, bytes]) -> video.VideoJob:
        return video.VideoJob.uploaded(video.VideoParams.from_options(options), files["video"], settings.max_pixels)

    return Submission.of(await (await receive(request, VIDEO_SPEC)).job(None, from_form))


VIDEO = JobRoute(JobKind(VIDEO_SPEC.name, video.VideoJob, video.run), VIDEO_SPEC, parse)
