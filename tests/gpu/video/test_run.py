"""gpu.video's front door on the CPU: real clips made here (a photograph panned, a sine as
their sound), stored and rehydrated as the job service keeps them, drawn, and the MP4
checked: every frame, its time, its size, the sound, and each frame the reference's
drawing of the clip's frame within the codec's loss."""

from __future__ import annotations

import io
import threading

import av
import numpy as np
import pytest

from gpu import video
from gpu.errors import ParamError
from gpu.pencil import reference
from gpu.pencil.params import PencilParams
from tests.gpu.jobkit import stored_and_back, written
from tests.gpu.video.clips import decoded_frames, drawn_frames, make_clip

CODEC_LOSS = 6.0  # mean |difference| in grey levels of a drawn frame to the reference's drawing, after x264


def streams(data: bytes) -> dict[str, dict[str, object]]:
    """{stream type: {codec, pix_fmt, average_rate}} of a media file, read while it is open
    (PyAV 19 refuses to read a stream of a closed container)."""
    with av.open(io.BytesIO(data)) as container:
        return {
            stream.type: {
                "codec": stream.codec_context.name,
                "pix_fmt": getattr(stream.codec_context, "pix_fmt", None),
                "average_rate": getattr(stream, "average_rate", None),
            }
            for stream in container.streams
        }


def frame_times(data: bytes) -> list[float]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        return [round(float(frame.pts * stream.time_base), 4) for frame in container.decode(stream)]


def assert_drawings_of(drawn: list[np.ndarray], frames: list[np.ndarray], params: PencilParams) -> None:
    assert len(drawn) == len(frames)
    for index in (0, len(frames) // 2, len(frames) - 1):
        expected = reference.render(frames[index], params)
        assert expected.std() > 10, "compare on a drawing, not a blank page"
        difference = np.abs(drawn[index].astype(np.int16) - expected)
        assert difference.mean() < CODEC_LOSS, f"frame {index}: mean |diff| {difference.mean():.2f}"


def test_a_job_is_stored_rehydrated_and_drawn_with_its_sound(tmp_path):
    clip = make_clip("mp4", width=160, height=120, frames=20, fps=24)
    params = video.VideoParams(PencilParams(texture="fast", tone="light"), temporal="none")
    job = video.VideoJob.uploaded(params, clip)
    assert set(job.input_files()) == {"video"} and job.to_json()["clip"]["frames"] == 20
    back = stored_and_back(job, tmp_path / "in")
    assert back.params == params and back.info == job.info
    reported: list[float] = []
    result = video.run(back, progress=reported.append)
    files = written(result, tmp_path / "out")
    data = files["sketch.mp4"].read_bytes()
    summary = result.summary
    assert (summary["frames"], summary["width"], summary["height"], summary["fps"]) == (20, 160, 120, 24.0)
    assert summary["backend"] == "cpu" and summary["bytes"] == len(data) and summary["frames_per_second"] > 0
    assert summary["audio"] == {"codec": "aac", "source_codec": "aac", "copied": True}
    assert summary["duration_s"] == pytest.approx(20 / 24)
    assert reported and reported == sorted(reported) and 0 < reported[0] <= reported[-1] < 1
    out = streams(data)
    assert out["video"]["codec"] == "h264" and out["video"]["pix_fmt"] == "yuv420p"
    assert out["video"]["average_rate"] == 24 and out["audio"]["codec"] == "aac"
    assert frame_times(data) == frame_times(clip)
    with av.open(io.BytesIO(clip)) as source, av.open(io.BytesIO(data)) as drawing:
        copied = [bytes(p) for p in source.demux(source.streams.audio[0]) if p.size]
        remuxed = [bytes(p) for p in drawing.demux(drawing.streams.audio[0]) if p.size]
    assert copied == remuxed  # the sound's packets, byte for byte
    assert_drawings_of(drawn_frames(data), decoded_frames(clip), PencilParams(texture="fast", tone="light"))


@pytest.mark.parametrize(
    ("container", "sound", "copied"),
    [("mov", "aac", False), ("mkv", "flac", True), ("webm", "opus", True), ("avi", "mp3", True)],
)
def test_every_container_is_drawn(container, sound, copied):
    clip = make_clip(container, width=128, height=96, frames=10, fps=25)
    out = io.BytesIO()
    summary = video.draw(clip, out, video.VideoParams(PencilParams(texture="fast"), temporal="none"))
    frames = decoded_frames(clip)
    assert summary["frames"] == len(frames) and (summary["width"], summary["height"]) == (128, 96)
    assert summary["audio"]["codec"] == sound and summary["audio"]["copied"] is copied
    assert set(streams(out.getvalue())) == {"video", "audio"}
    assert_drawings_of(drawn_frames(out.getvalue()), frames, PencilParams(texture="fast"))


def test_a_variable_frame_rate_keeps_every_frames_time():
    times = [0.0, 0.04, 0.1, 0.13, 0.2, 0.5, 0.52, 0.9]
    clip = make_clip("mkv", frames=len(times), times=times, audio=None)
    out = io.BytesIO()
    summary = video.draw(clip, out, video.VideoParams())
    assert frame_times(out.getvalue()) == times and summary["duration_s"] == pytest.approx(0.9 + 1 / summary["fps"])


@pytest.mark.parametrize("rotation", [90, 180, -90])
def test_a_rotated_clip_is_drawn_upright(rotation):
    clip = make_clip("mp4", width=160, height=96, frames=4, audio=None, rotation=rotation)
    out = io.BytesIO()
    params = PencilParams(texture="fast")
    summary = video.draw(clip, out, video.VideoParams(params, "none"))
    assert (summary["width"], summary["height"]) == ((160, 96) if rotation == 180 else (96, 160))
    upright = [np.ascontiguousarray(np.rot90(frame, rotation // 90)) for frame in decoded_frames(clip)]
    assert_drawings_of(drawn_frames(out.getvalue()), upright, params)


def test_odd_sizes_colour_and_max_side():
    clip = make_clip("mp4", width=171, height=97, frames=4, audio=None, photo="coffee", pix_fmt="yuv444p")
    out = io.BytesIO()
    summary = video.draw(clip, out, video.VideoParams(PencilParams(mode="color", texture="fast"), "none"))
    assert (summary["width"], summary["height"]) == (170, 96)  # even sides for 4:2:0
    with av.open(io.BytesIO(out.getvalue())) as drawing:
        rgb = next(drawing.decode(video=0)).to_ndarray(format="rgb24")
    assert rgb.shape == (96, 170, 3) and np.abs(rgb[..., 0].astype(int) - rgb[..., 2]).mean() > 5  # colour kept

    out = io.BytesIO()
    summary = video.draw(clip, out, video.VideoParams(PencilParams(max_side=64, texture="fast"), "none"))
    assert (summary["width"], summary["height"]) == (64, 36)
    assert drawn_frames(out.getvalue())[0].shape == (36, 64)


class Canceled(Exception):
    """What the runner's progress raises (JobCanceled), as far as the front door knows."""


def test_a_progress_that_raises_stops_the_job_and_its_threads():
    clip = make_clip("mp4", frames=40, audio=None)
    job = video.VideoJob.uploaded(video.VideoParams(PencilParams(texture="fast")), clip)
    calls: list[float] = []

    def cancel(fraction: float) -> None:
        calls.append(fraction)
        raise Canceled()

    with pytest.raises(Canceled):
        video.run(job, progress=cancel)
    assert len(calls) == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("video-")]


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"temporal": "smooth"}, "temporal"),
        ({"temporal": 1}, "temporal"),
        ({"texture": "quick"}, "texture"),
        ({"line_frac": "0.05"}, "line_frac"),
        ({"stroke_width": 1.5}, "stroke_width"),
        ({"quality": 80}, "quality"),
    ],
)
def test_bad_parameters_name_their_field(values, field):
    with pytest.raises(ParamError) as caught:
        video.VideoParams.from_values(values)
    assert caught.value.field == field


def test_parameters_round_trip():
    params = video.VideoParams.from_values({"mode": "color", "max_side": 640, "temporal": "none", "tone": None})
    assert params.pencil == PencilParams(mode="color", max_side=640) and params.temporal == "none"
    assert video.VideoParams.from_values(params.to_json()) == params
