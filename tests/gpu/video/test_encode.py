"""gpu/video/encode.py: drawings into H.264 in MP4 with their timestamps kept, in BT.601
limited range as a decoder reads them."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import cv2
import numpy as np

from gpu.video.encode import LIMITED_Y, Writer, yuv420p
from tests.gpu.video.clips import panned


def test_grey_maps_to_limited_range_with_neutral_chroma():
    drawing = np.arange(256, dtype=np.uint8).reshape(16, 16)
    planes = yuv420p(drawing).to_ndarray()
    assert planes.shape == (24, 16)
    assert (planes[0, 0], planes[15, 15]) == (16, 235)  # black and white
    np.testing.assert_array_equal(planes[:16], LIMITED_Y[drawing])
    assert (planes[16:] == 128).all()


def test_planes_with_padded_rows_are_written_whole(rng):
    """A width whose rows FFmpeg pads (1000 -> 1008 bytes): every pixel lands, none of the padding shows."""
    drawing = rng.integers(0, 256, (562, 1000), dtype=np.uint8)
    picture = yuv420p(drawing)
    assert picture.planes[0].line_size > 1000
    planes = picture.to_ndarray()
    np.testing.assert_array_equal(planes[:562], LIMITED_Y[drawing])
    assert (planes[562:] == 128).all()
    image = rng.integers(0, 256, (562, 1000, 3), dtype=np.uint8)
    np.testing.assert_array_equal(yuv420p(image).to_ndarray(), cv2.cvtColor(image, cv2.COLOR_RGB2YUV_I420))


def test_colour_matches_ffmpegs_bt601_conversion():
    image = panned("coffee", 96, 64, 1, 0)[0]
    ours = yuv420p(image).to_ndarray().astype(np.int16)
    theirs = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p").to_ndarray()
    difference = np.abs(ours - theirs)
    assert image.std() > 20 and difference[:64].max() <= 1  # Y': the same matrix and range
    # chroma: the same matrix, subsampled by another filter (2x2 mean; FFmpeg's sited left)
    assert difference[64:].mean() < 3 and np.corrcoef(ours[64:].ravel(), theirs[64:].ravel())[0, 1] > 0.98


def test_frames_keep_their_times_and_the_file_decodes_to_the_drawings(rng):
    times_ms = np.cumsum(rng.integers(20, 90, size=12))  # a variable frame rate
    drawings = [cv2.GaussianBlur(rng.integers(0, 256, (64, 96), dtype=np.uint8), (0, 0), 3) for _ in times_ms]
    buffer = io.BytesIO()
    writer = Writer(buffer, (64, 96), Fraction(25), Fraction(1, 1000))
    for drawing, pts in zip(drawings, times_ms, strict=True):
        writer.frame(drawing, int(pts))
    writer.close()
    assert writer.frames == 12 and writer.audio is None
    with av.open(io.BytesIO(buffer.getvalue())) as output:
        stream = output.streams.video[0]
        assert stream.codec_context.name == "h264" and (stream.width, stream.height) == (96, 64)
        frames = list(output.decode(stream))
        time_base = stream.time_base
    assert writer.file_time_base == time_base
    assert [round(float(f.pts * time_base) * 1000) for f in frames] == list(times_ms)
    for frame, drawing in zip(frames, drawings, strict=True):
        assert frame.format.name == "yuv420p" and frame.colorspace == 6  # tagged BT.601 (SMPTE 170M)
        luma = frame.to_ndarray()[:64].astype(np.float32)
        assert np.abs(luma - LIMITED_Y[drawing]).mean() < 3
