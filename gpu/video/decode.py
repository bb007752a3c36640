"""Frames out of a clip: demux and decode (FFmpeg's own threads, thread_type AUTO) in order,
then, frame by frame and on any thread, convert to RGB, turn upright, fit to the
drawing's size; the audio packets pass through untouched, in container order, for the
encoder to copy.

The conversion is the costly part, and most of it was setting up FFmpeg's converter
(what VideoFrame.to_ndarray does each call), so one is kept per thread (BENCHMARKS.md,
"Figures behind choices in the code"). It releases the GIL, so the video pipeline spreads
`Reader.prepare` over a few threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import av
import av.container
import cv2
import numpy as np
from av.video.reformatter import VideoReformatter

from gpu.pencil import reference
from gpu.pencil.params import fitted_size
from gpu.video.probe import ClipInfo

log = logging.getLogger("pencil.video")
_converters = threading.local()  # one FFmpeg converter per thread: its set-up costs 3x the conversion


@dataclass
class Decoded:
    """One decoded frame, not yet converted: pts as Frame's; frame: FFmpeg's picture."""

    pts: int
    frame: av.VideoFrame


@dataclass
class Frame:
    """One decoded frame, ready to draw. pts: in the video stream's time base, strictly
    increasing (frames come in presentation order); image: (H, W, 3) uint8 RGB of the
    drawing's size (output_size)."""

    pts: int
    image: np.ndarray


def output_size(info: ClipInfo, max_side: int | None) -> tuple[int, int]:
    """(height, width) of the drawn frames: the upright frame fitted to max_side, each side
    rounded down to an even number (H.264 in 4:2:0 takes no odd side)."""
    height, width = fitted_size(info.height, info.width, max_side)
    return height - height % 2, width - width % 2


def to_rgb(frame: av.VideoFrame, rotation: int, size: tuple[int, int], max_side: int | None) -> np.ndarray:
    """A decoded frame as (H, W, 3) uint8 RGB of `size` (height, width): converted with
    its own colour matrix and range, turned by `rotation` degrees counterclockwise,
    shrunk for max_side (reference.fit_max_side) and cropped to even sides. A frame of
    another size than the first (a resolution change mid-stream) is resized to `size`."""
    converter = getattr(_converters, "converter", None)
    if converter is None:
        converter = _converters.converter = VideoReformatter()
    rgb = converter.reformat(frame, format="rgb24", src_color_range=frame.color_range or None).to_ndarray()
    if rotation:
        rgb = np.ascontiguousarray(np.rot90(rgb, rotation // 90))
    rgb = reference.fit_max_side(rgb, max_side)
    height, width = size
    if rgb.shape[0] - height not in (0, 1) or rgb.shape[1] - width not in (0, 1):
        rgb = cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(rgb[:height, :width])


class Reader:
    """Iterating it gives the clip's decoded frames (Decoded, in presentation order) and,
    interleaved as demuxed, the packets of `audio` (av.Packet) for the encoder to copy;
    `prepare` turns each Decoded into a Frame ready to draw (thread-safe). `skipped`
    counts the video packets that failed to decode (FFmpeg conceals what it can; a packet
    it cannot read is dropped, as the ffmpeg tool does)."""

    def __init__(
        self,
        container: av.container.InputContainer,
        video: av.VideoStream,
        audio: av.AudioStream | None,
        info: ClipInfo,
        max_side: int | None,
    ):
        self.container, self.video, self.audio, self.info = container, video, audio, info
        self.max_side = max_side
        self.size = output_size(info, max_side)
        self.skipped = 0
        video.thread_type = "AUTO"  # frame and slice threads: decoding keeps pace with the GPU
        self._step = max(1, round(1 / (info.rate * info.time_base)))  # one frame, in pts units
        self._last_pts: int | None = None

    def __iter__(self) -> Iterator[Decoded | av.Packet]:
        streams = [self.video] if self.audio is None else [self.video, self.audio]
        for packet in self.container.demux(streams):
            if self.audio is not None and packet.stream.index == self.audio.index:
                if packet.size:  # not the empty packet that ends a stream
                    yield packet
                continue
            try:
                frames = packet.decode()
            except av.FFmpegError as exc:
                self.skipped += 1
                log.warning("a video packet at pts %s does not decode (%s); skipped", packet.pts, exc)
                continue
            for frame in frames:
                if isinstance(frame, av.VideoFrame):  # what a video packet decodes to
                    yield Decoded(self._pts(frame), frame)

    def prepare(self, item: Decoded | av.Packet) -> Frame | av.Packet:
        """A decoded frame as a Frame (RGB, upright, sized); an audio packet as it is."""
        if isinstance(item, av.Packet):
            return item
        image = to_rgb(item.frame, self.info.rotation, self.size, self.max_side)
        return Frame(item.pts, image)

    def _pts(self, frame: av.VideoFrame) -> int:
        """The frame's pts, or one frame after the last when it has none or goes back (the
        encoder takes strictly increasing timestamps only)."""
        pts = frame.pts
        last = self._last_pts
        if pts is None:
            pts = 0 if last is None else last + self._step
        elif last is not None and pts <= last:
            pts = last + 1
        self._last_pts = pts
        return pts
