"""gpu/video/probe.py: what a clip holds, and every clip that cannot be drawn refused with
its code, from real clips made here (tests/gpu/video/clips.py)."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

from gpu.video import ClipInfo, VideoError, probe
from tests.gpu.video import clips


@pytest.mark.parametrize(
    ("container", "codec", "audio", "exact"),
    [
        ("mp4", "h264", "aac", True),
        ("mov", "h264", "pcm_s16le", True),
        ("mkv", "h264", "flac", False),
        ("webm", "vp9", "opus", False),
        ("avi", "mpeg4", "mp3", True),
    ],
)
def test_each_container_is_read(container, codec, audio, exact):
    info = probe(clips.make_clip(container, width=176, height=96, frames=12, fps=24))
    assert (info.codec, info.width, info.height, info.rotation, info.audio_codec) == (codec, 176, 96, 0, audio)
    assert info.rate == 24 and info.fps == 24.0 and info.frames_exact is exact
    assert abs(info.frames - 12) <= 1 and info.duration_s == pytest.approx(0.5, abs=0.05)
    assert ClipInfo.from_json(info.to_json()) == info


def test_no_sound_and_a_path(tmp_path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(clips.make_clip(frames=4, audio=None, fps=30))
    info = probe(path)
    assert info.audio_codec is None and info.frames == 4 and info.rate == Fraction(30)


@pytest.mark.parametrize("rotation", [90, -90, 180])
def test_a_rotated_clip_is_measured_upright(rotation):
    info = probe(clips.make_clip(width=160, height=96, frames=3, audio=None, rotation=rotation))
    assert info.rotation == rotation % 360
    assert (info.width, info.height) == ((160, 96) if rotation == 180 else (96, 160))


def png() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda: b"", "empty_file"),
        (lambda: b"plain text, not a video\n" * 30, "not_a_video"),
        (png, "not_a_video"),  # FFmpeg reads a PNG as a one-frame video; we do not
        (lambda: clips.make_clip(frames=6)[:3000], "not_a_video"),  # cut before its index
        (lambda: clips.sound_only(), "no_video_stream"),
        (lambda: clips.undecodable(clips.make_clip(frames=6, audio=None)), "corrupt_video"),
        (lambda: clips.make_clip(width=32, height=8, frames=2, audio=None), "video_too_small"),
    ],
)
def test_what_cannot_be_drawn_is_refused_with_its_code(make, code):
    with pytest.raises(VideoError) as caught:
        probe(make())
    assert caught.value.code == code and caught.value.detail


def test_too_many_pixels_is_decided_before_decoding():
    clip = clips.make_clip(width=320, height=240, frames=2, audio=None)
    assert probe(clip, max_pixels=320 * 240).width == 320
    with pytest.raises(VideoError) as caught:
        probe(clip, max_pixels=320 * 240 - 1)
    assert caught.value.code == "too_many_pixels" and "76,800" in caught.value.detail


def test_a_playlist_is_never_followed(tmp_path):
    """An HLS playlist naming a local file: FFmpeg would open the file; only MP4/MOV, MKV/WebM
    and AVI demuxers are allowed, so it is refused unread."""
    secret = tmp_path / "clip.mp4"
    secret.write_bytes(clips.make_clip(frames=3, audio=None))
    playlist = tmp_path / "list.m3u8"
    playlist.write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\n{secret}\n#EXT-X-ENDLIST\n")
    with pytest.raises(VideoError) as caught:
        probe(playlist)
    assert caught.value.code == "not_a_video"


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        probe(tmp_path / "missing.mp4")
