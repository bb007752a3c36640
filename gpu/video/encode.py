"""Drawings into a video file: H.264 (libx264, yuv420p) in MP4, at the input's frame rate and
time base (each frame keeps its input pts), the audio stream copied (remuxed packets, not
re-encoded) when its codec is one MP4 players read (MP4_AUDIO), else re-encoded to AAC
(PCM from a MOV or AVI, say).

x264 runs with PRESET "superfast" at CRF 19 on its frame threads: pencil drawings are hard
to compress (the paper texture is fine grain everywhere), and that preset is the fastest
that keeps the files small; the encoder is bound by the host's cores. The presets,
threadings and sizes compared: docs/video.md, "How it runs".
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

import av
import av.container
import cv2
import numpy as np

from gpu.video.probe import codec_name, fraction

PRESET = "superfast"
CRF = 19
THREAD_TYPE = "FRAME"  # x264's frame threads; PyAV's default, slice threads, scales worse
MP4_AUDIO = ("aac", "mp3", "ac3", "eac3", "opus", "flac", "alac")  # audio codecs copied into the MP4
SMPTE170M, MPEG_RANGE = 6, 1  # FFmpeg's AVColorSpace and AVColorRange: BT.601, limited range
# full-range grey v -> the limited-range Y' 16 + 219 v / 255 that BT.601 decoders read
LIMITED_Y = np.round(16 + np.arange(256) * 219 / 255).astype(np.uint8)


class Writer:
    """An MP4 being written: `frame(drawing, pts)` encodes one drawing, `packet(p)` takes
    one packet of the input's audio stream, `close()` flushes the encoders and ends the
    file.

    target: a path or a seekable binary file. size: (height, width) of the drawings, both
    even. rate: nominal frames per second; time_base: of the pts given to `frame`.
    audio: the input's audio stream, or None. `audio` (summary) says what became of it.

    Nothing is read from the container once it is closed (PyAV 19 raises on any stream
    attribute then): `audio` is fixed when the streams are added, and `file_time_base`, the
    MP4 video's time base (the muxer may pick a finer one when it writes the header), is read
    by `close()` before it closes.
    """

    def __init__(
        self,
        target: str | Path | BinaryIO,
        size: tuple[int, int],
        rate: Fraction,
        time_base: Fraction,
        audio: av.AudioStream | None = None,
    ):
        self.time_base = time_base
        output = str(target) if isinstance(target, Path) else target
        self.container: av.container.OutputContainer = av.open(output, "w", format="mp4")
        try:
            self.video = self.container.add_stream("libx264", rate=rate)
            context = self.video.codec_context
            context.height, context.width = size
            context.pix_fmt = "yuv420p"
            context.time_base = time_base
            context.colorspace, context.color_range = SMPTE170M, MPEG_RANGE
            context.options = {"preset": PRESET, "crf": str(CRF)}
            context.thread_type = THREAD_TYPE
            self.video.time_base = time_base
            self.audio_out: av.AudioStream | None = None
            self.audio_in, self.copy_audio = audio, False
            if audio is not None and audio.codec_context is not None:
                self.copy_audio = codec_name(audio) in MP4_AUDIO
                if self.copy_audio:
                    self.audio_out = self.container.add_stream_from_template(audio)
                else:
                    self.audio_out = self.container.add_stream("aac", rate=audio.rate, layout=audio.layout)
        except BaseException:
            self.container.close()
            raise
        self.frames = 0
        self.file_time_base: Fraction | None = None  # set by close()
        # {"codec": in the drawing, "source_codec": in the clip, "copied": remuxed as it was
        # (else re-encoded)}, or None for a clip without sound.
        self.audio: dict[str, str | bool] | None = None
        if self.audio_out is not None and audio is not None:
            self.audio = {
                "codec": codec_name(self.audio_out),
                "source_codec": codec_name(audio),
                "copied": self.copy_audio,
            }

    def frame(self, drawing: np.ndarray, pts: int) -> None:
        """Encode one drawing, (H, W) uint8 grey or (H, W, 3) uint8 RGB of `size`, shown at
        `pts` (time_base units)."""
        frame = yuv420p(drawing)
        frame.pts, frame.time_base = pts, self.time_base
        self.container.mux(self.video.encode(frame))
        self.frames += 1

    def packet(self, packet: av.Packet) -> None:
        """One packet of the input's audio stream: remuxed (its timestamps rescaled to the
        MP4's), or decoded and re-encoded to AAC."""
        if self.audio_out is None:
            return
        if self.copy_audio:
            packet.stream = self.audio_out
            self.container.mux(packet)
            return
        for samples in packet.decode():
            if isinstance(samples, av.AudioFrame):  # what an audio packet decodes to
                self.container.mux(self.audio_out.encode(samples))

    def close(self) -> None:
        """Flush the encoders and end the file (MP4's index is written at its end); sets
        `file_time_base`."""
        try:
            self.container.mux(self.video.encode(None))
            if self.audio_out is not None and not self.copy_audio:
                self.container.mux(self.audio_out.encode(None))
            muxed = self.video.time_base  # set by the muxer when it wrote the header
            self.file_time_base = fraction(muxed) if muxed is not None else self.time_base
        finally:
            self.container.close()

    def abandon(self) -> None:
        """Close without flushing (the caller discards what was written)."""
        self.container.close()


def yuv420p(drawing: np.ndarray) -> av.VideoFrame:
    """A drawing, (H, W) uint8 grey or (H, W, 3) uint8 RGB with even sides, as an FFmpeg
    yuv420p picture in BT.601 limited range: grey to Y' with neutral chroma, RGB through
    OpenCV's I420 conversion.

    OpenCV and NumPy write straight into the picture's planes, releasing the GIL; PyAV's
    VideoFrame.from_ndarray copies twice holding it (a bytes object, then row by row),
    which held a quarter of the video job's GIL time (BENCHMARKS.md, "Video: where the time went")."""
    height, width = drawing.shape[:2]
    frame = av.VideoFrame(width, height, "yuv420p")
    luma, blue, red = (_plane_array(plane) for plane in frame.planes)
    if drawing.ndim == 3:
        i420 = cv2.cvtColor(drawing, cv2.COLOR_RGB2YUV_I420)  # (3 H / 2, W): Y, then U and V
        chroma = i420[height:].reshape(2, height // 2, width // 2)
        np.copyto(luma, i420[:height])
        np.copyto(blue, chroma[0])
        np.copyto(red, chroma[1])
    else:
        cv2.LUT(drawing, LIMITED_Y, dst=luma)
        blue.fill(128)
        red.fill(128)
    return frame


def _plane_array(plane: av.video.plane.VideoPlane) -> np.ndarray:
    """A writable (height, width) uint8 view of one plane of a picture (its rows may be
    padded past `width`)."""
    return np.ndarray((plane.height, plane.width), np.uint8, buffer=memoryview(plane), strides=(plane.line_size, 1))
