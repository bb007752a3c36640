"""What a clip holds, read before it is drawn: the container (MP4/MOV, MKV/WebM or AVI),
the video stream's codec, upright size, frame rate, time base and frame count, and the
audio stream. The first frame is decoded too, so a clip whose video cannot be decoded is
refused before a job is queued.

Only the demuxers of CONTAINERS are opened (FFmpeg's format_whitelist): a playlist
(HLS, concat) or an image sequence uploaded as a "video" is refused unread, never
followed to other files or URLs.

PyAV (FFmpeg) is imported where a clip is read, here and in decode.py and encode.py, not
when the package is: every server process imports the video kind, few ever read a clip.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu.pencil.params import MIN_SIDE
from gpu.video.errors import VideoError

if TYPE_CHECKING:
    import av.container
    import av.stream

CONTAINERS = "mov,matroska,avi"  # FFmpeg demuxers: mov,mp4,m4a,3gp,3g2,mj2 / matroska,webm / avi
CONTAINER_NAMES = "MP4, MOV, MKV, WebM or AVI"
VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi")
DEFAULT_RATE = Fraction(25)  # frames per second of a stream that states none
FIRST_FRAME_PACKETS = 256  # packets read at most before the first frame must have decoded

Source = bytes | str | Path  # a clip's bytes, or the path of its file


def open_input(source: Source) -> av.container.InputContainer:
    """The clip's container, opened for reading; VideoError not_a_video (or empty_file)
    when it is not one of CONTAINERS. A missing file raises OSError (FileNotFoundError)."""
    import av

    if isinstance(source, bytes) and not source:
        raise VideoError("empty_file", "the uploaded video is empty")
    target = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    try:
        return av.open(target, "r", options={"format_whitelist": CONTAINERS})
    except av.FFmpegError as exc:
        if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
            raise
        raise VideoError("not_a_video", f"not a video in a container we read ({CONTAINER_NAMES}): {exc}") from None


def video_stream(container: av.container.InputContainer) -> av.VideoStream:
    """The first video stream that is not a cover picture; VideoError no_video_stream."""
    import av

    for stream in container.streams.video:
        if not stream.disposition & av.stream.Disposition.attached_pic:
            return stream
    raise VideoError("no_video_stream", f"the {container.format.long_name or 'file'} holds no video stream")


def audio_stream(container: av.container.InputContainer) -> av.AudioStream | None:
    """The first audio stream (the one copied into the drawing), or None."""
    return container.streams.audio[0] if container.streams.audio else None


def frame_rate(stream: av.VideoStream) -> Fraction:
    """The stream's frames per second: its average rate, else FFmpeg's guess, else DEFAULT_RATE."""
    for rate in (stream.average_rate, stream.guessed_rate, stream.base_rate):
        if rate is not None and rate > 0:
            return fraction(rate)
    return DEFAULT_RATE


def fraction(rational: Any) -> Fraction:
    """A rate or time base of PyAV (a Fraction before PyAV 19, an AVRational since) as a Fraction."""
    return Fraction(rational.numerator, rational.denominator)


def codec_name(stream: av.stream.Stream) -> str:
    """The stream's codec as FFmpeg names the format ("mp3", not its decoder "mp3float")."""
    context = stream.codec_context
    return context.codec.canonical_name if context is not None else "unknown"


def upright(width: int, height: int, rotation: int) -> tuple[int, int]:
    """(width, height) once a frame is turned by `rotation` degrees (a multiple of 90)."""
    return (height, width) if rotation % 180 else (width, height)


@dataclass(frozen=True)
class ClipInfo:
    """A clip as probed. width, height: a frame's size in px once turned upright (by
    `rotation`, degrees counterclockwise, a multiple of 90, from the display matrix);
    rate: nominal frames per second; time_base: s per pts unit of the video stream;
    frames: the header's frame count or, when it states none, duration x rate
    (frames_exact False; 0 when neither is known); duration_s: the video stream's, s;
    audio_codec: the first audio stream's codec, or None."""

    container: str
    codec: str
    width: int
    height: int
    rotation: int
    rate: Fraction
    time_base: Fraction
    frames: int
    frames_exact: bool
    duration_s: float
    audio_codec: str | None

    @property
    def fps(self) -> float:
        return float(self.rate)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rate": str(self.rate), "time_base": str(self.time_base)}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> ClipInfo:
        return cls(**{**stored, "rate": Fraction(stored["rate"]), "time_base": Fraction(stored["time_base"])})


def probe(source: Source, max_pixels: int | None = None) -> ClipInfo:
    """Read the clip's header and decode its first frame. VideoError: empty_file,
    not_a_video, no_video_stream, unsupported_codec, too_many_pixels (over `max_pixels`,
    from the header when it states the size), video_too_small, corrupt_video."""
    with open_input(source) as container:
        stream = video_stream(container)
        context = stream.codec_context
        if context is None or not context.is_decoder:
            raise VideoError("unsupported_codec", "the video stream's codec has no decoder here")
        if context.width and context.height:
            check_pixels(context.width, context.height, max_pixels)
        frame = first_frame(container, stream)
        check_pixels(frame.width, frame.height, max_pixels)
        rotation = round((frame.rotation or 0) / 90) * 90 % 360
        width, height = upright(frame.width, frame.height, rotation)
        if min(width, height) < MIN_SIDE:
            raise VideoError(
                "video_too_small", f"the video is {width} x {height} px; both sides must be at least {MIN_SIDE} px"
            )
        rate = frame_rate(stream)
        time_base = fraction(stream.time_base) if stream.time_base else 1 / rate
        duration = _duration(container, stream, time_base)
        counted = int(stream.frames or 0)
        audio = audio_stream(container)
        return ClipInfo(
            container=container.format.name,
            codec=codec_name(stream),
            width=width,
            height=height,
            rotation=rotation,
            rate=rate,
            time_base=time_base,
            frames=counted if counted > 0 else round(duration * rate),
            frames_exact=counted > 0,
            duration_s=duration if duration > 0 else counted / float(rate),
            audio_codec=codec_name(audio) if audio is not None else None,
        )


def check_pixels(width: int, height: int, max_pixels: int | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise VideoError(
            "too_many_pixels",
            f"a frame is {width} x {height} = {width * height:,} px; frames may have at most {max_pixels:,}",
        )


def first_frame(container: av.container.InputContainer, stream: av.VideoStream) -> av.VideoFrame:
    """The first frame that decodes (within FIRST_FRAME_PACKETS packets); VideoError
    corrupt_video when none does."""
    import av

    failure = "no frame decoded"
    for count, packet in enumerate(container.demux(stream)):
        if count >= FIRST_FRAME_PACKETS:
            break
        try:
            for frame in packet.decode():
                return frame
        except av.FFmpegError as exc:
            failure = str(exc)
    raise VideoError("corrupt_video", f"the {stream.codec_context.name} video stream cannot be decoded ({failure})")


def _duration(container: av.container.InputContainer, stream: av.VideoStream, time_base: Fraction) -> float:
    """The video stream's duration in s, else the container's, else 0."""
    import av

    if stream.duration:
        return float(stream.duration * time_base)
    if container.duration:
        return container.duration / av.time_base
    return 0.0
