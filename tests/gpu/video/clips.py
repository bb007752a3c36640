"""Real clips for the video tests, made here with PyAV (nothing downloaded): a photograph
from scikit-image panned across the frame, with a sine tone as its sound.

`make_clip(...)` returns the file's bytes; `decoded_frames(data)` the RGB frames a reader
of the clip sees (as gpu.video.decode converts them), for comparisons."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import cv2
import numpy as np
import skimage.data

from gpu.pencil import reference

# container -> (video codec, default audio codec)
FORMATS = {
    "mp4": ("libx264", "aac"),
    "mov": ("libx264", "pcm_s16le"),
    "mkv": ("libx264", "flac"),
    "webm": ("libvpx-vp9", "libopus"),
    "avi": ("mpeg4", "mp3"),
}
MUXERS = {"mp4": "mp4", "mov": "mov", "mkv": "matroska", "webm": "webm", "avi": "avi"}


def panned(photo: str, width: int, height: int, frames: int, step: float, noise: float = 0.0, seed: int = 0):
    """`frames` (height, width, 3) uint8 RGB views of the photo, scaled to 5/4 of the frame's
    height (or enough for the pan) and moved `step` px left per frame; plus Gaussian noise of
    `noise` grey levels (a camera's), drawn from `seed`."""
    image = getattr(skimage.data, photo)()
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    image = image[..., :3]
    needed_width = width + int(np.ceil(step * (frames - 1))) + 2
    scale = max(1.25 * height / image.shape[0], needed_width / image.shape[1])
    size = (int(np.ceil(image.shape[1] * scale)), int(np.ceil(image.shape[0] * scale)))
    big = cv2.resize(image, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    top = (big.shape[0] - height) // 2
    rng = np.random.default_rng(seed)
    out = []
    for index in range(frames):
        left = int(round(step * index))
        frame = big[top : top + height, left : left + width]
        if noise:
            frame = np.clip(frame + rng.normal(0.0, noise, frame.shape), 0, 255).astype(np.uint8)
        out.append(np.ascontiguousarray(frame))
    return out


def dark_object_entering(photo: str) -> tuple[list[np.ndarray], np.ndarray]:
    """16 frames (160, 240, 3) of a still scene into which a dark shape slides from the left
    over 15 frames (0.5 s at 30/s), and the luma of the part of the scene (its right half)
    that the shape never covers."""
    base = panned(photo, 240, 160, 1, 0)[0]
    frames = []
    for index in range(16):
        frame = base.copy()
        frame[:, : int(index / 15 * 96)] = (25, 25, 30)
        frames.append(frame)
    return frames, reference.split_luma(base[:, 120:])[0]


def make_clip(
    container: str = "mp4",
    width: int = 160,
    height: int = 120,
    frames: int = 16,
    fps: int = 24,
    photo: str = "astronaut",
    step: float = 2.0,
    audio: str | None = "default",
    noise: float = 0.0,
    rotation: int = 0,
    images: list[np.ndarray] | None = None,
    times: list[float] | None = None,
    pix_fmt: str = "yuv420p",
) -> bytes:
    """A clip of `frames` frames (`images`, or the photo panned) at `fps`, in `container`
    (mp4, mov, mkv, webm, avi) with its FORMATS codecs; `audio`: "default" (the container's
    codec), a codec name, or None for no sound (a 440 Hz sine, mono 48 kHz, as long as
    the video). `rotation`: a display rotation written into the stream (degrees).
    `times`: each frame's time in s (a variable frame rate; the time base is 1/1000 s).
    `pix_fmt`: the video's pixel format (yuv444p takes odd sides)."""
    codec, default_audio = FORMATS[container]
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=MUXERS[container]) as output:
        stream = output.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":
            stream.options = {"preset": "veryfast", "crf": "16"}
        elif codec == "libvpx-vp9":
            stream.options = {"crf": "20", "b": "0", "deadline": "realtime", "cpu-used": "8"}
        else:
            stream.bit_rate = 2_000_000
        if rotation:
            stream.set_display_rotation(rotation)
        sound = None
        if audio is not None:
            sound = output.add_stream(default_audio if audio == "default" else audio, rate=48000)
            sound.layout = "mono"
        if times is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        pictures = images if images is not None else panned(photo, width, height, frames, step, noise)
        for index, image in enumerate(pictures):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            if times is not None:
                frame.pts, frame.time_base = round(times[index] * 1000), Fraction(1, 1000)
            output.mux(stream.encode(frame))
        output.mux(stream.encode(None))
        if sound is not None:
            _sine(output, sound, frames / fps)
    return buffer.getvalue()


def _sine(output, sound, seconds: float) -> None:
    rate = 48000
    samples = (0.3 * np.sin(2 * np.pi * 440.0 * np.arange(int(rate * seconds)) / rate)).astype(np.float32)
    chunk = 960
    formats = sound.codec_context.codec.audio_formats
    sample_format = formats[0].name if formats else "flt"
    for start in range(0, samples.size, chunk):
        part = samples[start : start + chunk].reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(part, format="flt", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
        if sample_format != "flt":
            frame = av.AudioResampler(format=sample_format, layout="mono", rate=rate).resample(frame)[0]
        output.mux(sound.encode(frame))
    output.mux(sound.encode(None))


def decoded_frames(data: bytes) -> list[np.ndarray]:
    """Every frame of the clip as (H, W, 3) uint8 RGB, converted as gpu.video.decode does."""
    with av.open(io.BytesIO(data)) as container:
        return [
            frame.to_ndarray(format="rgb24", src_color_range=frame.color_range or None)
            for frame in container.decode(video=0)
        ]


def drawn_frames(data: bytes) -> list[np.ndarray]:
    """Every frame of a drawing (our MP4) as (H, W) uint8 grey: its limited-range Y' planes
    mapped back to 0..255."""
    with av.open(io.BytesIO(data)) as container:
        planes = [frame.to_ndarray()[: frame.height] for frame in container.decode(video=0)]
    return [
        np.clip((plane.astype(np.float32) - 16.0) * 255.0 / 219.0 + 0.5, 0, 255).astype(np.uint8) for plane in planes
    ]


def sound_only(seconds: float = 0.5) -> bytes:
    """An MP4 holding an AAC sine and no video stream."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        sound = output.add_stream("aac", rate=48000)
        sound.layout = "mono"
        _sine(output, sound, seconds)
    return buffer.getvalue()


def undecodable(clip: bytes) -> bytes:
    """An MP4 clip (ours: its index after its data) with every byte of its media data
    zeroed: the container reads, no frame decodes."""
    start, end = clip.index(b"mdat") + 4, clip.rindex(b"moov") - 4
    return clip[:start] + bytes(end - start) + clip[end:]
