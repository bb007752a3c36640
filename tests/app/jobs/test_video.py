"""POST /jobs/video through the whole app on the CPU backend: a clip generated here with PyAV
(a photograph panned, with a sine as its sound) submitted as a multipart upload, its
progress watched, its result and its MP4 checked; every bad input answered at once with a
4xx JSON error and no job."""

from __future__ import annotations

import io
import json

import av
import numpy as np
import pytest
from pencil_testkit import admin_client, assert_api_error, encode, photo, wait_for_job

from gpu.pencil import reference
from gpu.pencil.params import PencilParams
from gpu.video.params import VideoResult
from tests.gpu.video import clips
from tests.gpu.video.clips import decoded_frames, drawn_frames, make_clip

TOKEN = "video-test-token"
WAIT_S = 120.0


@pytest.fixture
def client(make_client, monkeypatch):
    """An app with jobs enabled (app/main.py lists the video kind among its kinds)."""
    return admin_client(make_client, TOKEN, max_pixels=200_000)


def upload(data: bytes, name: str = "clip.mp4", **options) -> dict:
    request: dict = {"files": {"video": (name, data, "video/mp4")}}
    if options:
        request["data"] = {"params": json.dumps(options)}
    return request


def submit(client, data: bytes, **options) -> str:
    response = client.post("/jobs/video", **upload(data, **options))
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_a_clip_is_drawn_with_its_sound_and_progress(client):
    clip = make_clip("mp4", width=160, height=120, frames=24, fps=24)
    job_id = submit(client, clip, texture="fast", tone="medium", temporal="none")
    seen = set()
    while (job := client.get(f"/jobs/{job_id}").json())["status"] in ("queued", "running"):
        seen.add(job["progress"])
    assert job["status"] == "succeeded", job
    assert job["progress"] == 1.0 and all(0.0 <= p <= 1.0 for p in seen if p is not None)
    assert job["params"]["texture"] == "fast" and job["params"]["clip"]["frames"] == 24

    body = client.get(f"/jobs/{job_id}/result").json()
    result = VideoResult.model_validate(body["result"])  # every key declared, no other
    assert (result.frames, result.width, result.height, result.fps) == (24, 160, 120, 24.0)
    assert result.duration_s == pytest.approx(1.0) and result.backend == "cpu" and result.temporal == "none"
    assert result.audio is not None and result.audio.copied and result.audio.codec == "aac"
    assert result.frames_per_second > 0 and result.encoder.codec == "h264"

    response = client.get(body["files"]["sketch.mp4"])
    assert response.status_code == 200 and len(response.content) == result.bytes
    with av.open(io.BytesIO(response.content)) as output:
        streams = {stream.type: stream for stream in output.streams}
        assert set(streams) == {"video", "audio"}
        assert streams["video"].codec_context.name == "h264" and streams["video"].frames == 24
        assert streams["audio"].codec_context.name == "aac"
    # a frame of the drawing is the reference's drawing of the clip's frame, within the codec's loss
    drawn, source = drawn_frames(response.content), decoded_frames(clip)
    expected = reference.render(source[10], PencilParams(texture="fast", tone="medium"))
    assert expected.std() > 10
    assert np.abs(drawn[10].astype(np.int16) - expected).mean() < 6


def test_the_options_are_validated_and_kept(client):
    clip = make_clip("webm", frames=8, audio=None)
    job_id = submit(client, clip, mode="color", max_side=100, texture="fast")
    job = wait_for_job(client, job_id, timeout_s=WAIT_S)
    assert job["status"] == "succeeded", job
    result = client.get(f"/jobs/{job_id}/result").json()["result"]
    assert (result["width"], result["height"], result["audio"], result["temporal"]) == (100, 74, None, "steady")
    assert result["source"]["codec"] == "vp9" and result["steady_luts"] >= 1


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"texture": "quick"}, "texture"),
        ({"temporal": "smooth"}, "temporal"),
        ({"line_frac": 9}, "line_frac"),
        ({"stroke_width": True}, "stroke_width"),
        ({"max_side": "100"}, "max_side"),
        ({"format": "png"}, "format"),
    ],
)
def test_bad_options_are_422_naming_the_option(client, options, field):
    response = client.post("/jobs/video", **upload(make_clip(frames=4, audio=None), **options))
    body = assert_api_error(response, 422, "invalid_parameter")
    assert body["field"] == field
    assert client.get("/jobs").json()["jobs"] == []


def test_bad_inputs_are_answered_at_once(client):
    still = encode(photo("chelsea", 64), "png")
    sound_only = clips.sound_only()
    huge = make_clip("mp4", width=640, height=480, frames=2, audio=None)  # 307,200 px > max_pixels
    tiny = make_clip("mp4", width=16, height=8, frames=2, audio=None)
    truncated = make_clip("mp4", frames=6, audio=None)[:3000]  # its index is at the end
    undecodable = clips.undecodable(make_clip("mp4", frames=6, audio=None))
    cases = [
        (b"", 400, "empty_file"),
        (b"not a video at all\n" * 20, 415, "not_a_video"),
        (still, 415, "not_a_video"),
        (sound_only, 422, "no_video_stream"),
        (huge, 413, "too_many_pixels"),
        (tiny, 400, "video_too_small"),
        (truncated, 415, "not_a_video"),
        (undecodable, 400, "corrupt_video"),
    ]
    for data, status, code in cases:
        assert_api_error(client.post("/jobs/video", **upload(data)), status, code, client)
    assert_api_error(client.post("/jobs/video", json={"video": "clip.mp4"}), 415, "unsupported_media_type")
    assert_api_error(client.post("/jobs/video", data={"params": "{}"}, files={}), 415, "unsupported_media_type")
    response = client.post("/jobs/video", files={"clip": ("c.mp4", b"x", "video/mp4")})
    assert_api_error(response, 400, "missing_video")
    assert client.get("/jobs").json()["jobs"] == []


def test_the_openapi_documents_the_form_and_the_result(client):
    spec = client.get("/openapi.json").json()
    form = spec["paths"]["/jobs/video"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["video"] and set(form["properties"]) == {"video", "params"}
    options = form["properties"]["params"]["contentSchema"]["properties"]
    assert options["temporal"]["enum"] == ["steady", "none"] and options["texture"]["enum"] == ["lu", "fast"]
    results = spec["paths"]["/jobs/{job_id}/result"]["get"]["responses"]["200"]["content"]["application/json"]
    titles = [entry["title"] for entry in results["schema"]["properties"]["result"]["oneOf"]]
    assert "video result" in titles


def test_the_app_starts_without_loading_pyav():
    """Every server process imports the video kind; PyAV (FFmpeg) loads only for a clip."""
    import subprocess
    import sys

    check = "import sys, app.main, app.cli; sys.exit('av' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", check], timeout=120).returncode == 0
