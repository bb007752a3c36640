"""Video files drawn frame by frame: every frame of a clip through the pencil pipeline, into
H.264 in MP4 with the clip's sound.

Front door: `run(job, lease=None, progress=no_progress)` draws a `VideoJob`'s clip
(gpu/video/params.py) on a GPU lease (gpu.pencil.cuda) or the CPU (gpu.pencil.reference)
and returns the MP4 as the result file `sketch.mp4`; `draw(source, target, params)` does
the same into a path or file (the command line's `pencil-gpu sketch clip.mp4`).

Modules, one idea each: probe.py (what a clip holds, checked before a job is queued),
decode.py (frames out: demux, threaded decode; RGB, upright, sized on worker threads),
temporal.py (the steady tone LUT), drawer.py (a frame staged, then drawn, on a lease or the CPU), encode.py
(drawings in: libx264 on its frame threads, the audio copied), pipeline.py (decode,
prepare, stage with the steady tone, draw and encode on their own threads with bounded
queues).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from gpu.jobs import JobResult, Progress, no_progress
from gpu.pool import Lease
from gpu.video.drawer import Drawer, Staged
from gpu.video.errors import VideoError
from gpu.video.params import TEMPORAL_CHOICES, VideoJob, VideoParams
from gpu.video.pipeline import Step, pipelined
from gpu.video.probe import VIDEO_EXTENSIONS, ClipInfo, Source, audio_stream, open_input, probe, video_stream
from gpu.video.temporal import SteadyTone

if TYPE_CHECKING:
    import av

    from gpu.video.decode import Frame

__all__ = [
    "RESULT_FILE",
    "TEMPORAL_CHOICES",
    "VIDEO_EXTENSIONS",
    "ClipInfo",
    "VideoError",
    "VideoJob",
    "VideoParams",
    "draw",
    "probe",
    "run",
]

RESULT_FILE = "sketch.mp4"
PROGRESS_S = 0.5  # a job's progress (a database write, and its cancel checkpoint) at most this often
# Threads converting decoded frames to RGB: enough to keep ahead of the drawing at 720p
# (BENCHMARKS.md, "Figures behind choices in the code").
PREPARE_WORKERS = 4

FrameProgress = Callable[[int, int], None]  # (frames drawn, frames in the clip: exact or estimated, 0 unknown)


def run(job: VideoJob, lease: Lease | None = None, progress: Progress = no_progress) -> JobResult:
    """Summary: see `draw`, plus bytes (of sketch.mp4). Files: sketch.mp4. `progress`
    gets frames drawn / frames in the clip (the header's count or its estimate), at most
    every PROGRESS_S."""
    output = tempfile.TemporaryFile()  # nameless: nothing is left behind whatever happens
    try:
        summary = draw(job.source, output, job.params, job.info, lease, _every(PROGRESS_S, progress))
        summary["bytes"] = output.seek(0, 2)
    except BaseException:
        output.close()
        raise

    def write(handle: BinaryIO) -> None:
        output.seek(0)
        shutil.copyfileobj(output, handle, 1 << 20)

    return JobResult(summary, {RESULT_FILE: write})


def draw(
    source: Source,
    target: str | Path | BinaryIO,
    params: VideoParams,
    info: ClipInfo | None = None,
    lease: Lease | None = None,
    progress: FrameProgress | None = None,
) -> dict[str, Any]:
    """Draw every frame of the clip `source` (bytes or a path) into an MP4 at `target` (a
    path or a seekable binary file). `info`: its probe, when already made. `progress(done,
    total)` is called after each frame; it may raise to stop (nothing usable is left at
    `target` then).

    Returns the summary: frames (drawn), fps (nominal), duration_s, width, height (of the
    drawing, even), time_base (of the MP4's video: the clip's, or a finer one where MP4
    asks for at least 10,000 units a second; every frame keeps its time), audio ({codec,
    source_codec, copied} or None), backend, seconds (wall, decode to the last byte),
    frames_per_second (frames / seconds), temporal, steady_luts (times the steady tone LUT
    was built; None unless steady), encoder ({codec, preset, crf}),
    skipped_packets, source (the probe). VideoError when no frame decodes."""
    import av  # with decode.py and encode.py: see probe.py on why PyAV loads here

    from gpu.video.decode import Reader
    from gpu.video.encode import CRF, PRESET, Writer

    info = info or probe(source)
    pencil = params.pencil
    steady = SteadyTone(pencil.tone, info.fps) if params.temporal == "steady" else None
    drawer = Drawer(pencil, lease)

    def stage(item: Frame | av.Packet) -> tuple[Frame, Staged] | av.Packet:
        """Upload (on a GPU) and, for the steady tone, the histogram and the frame's LUT
        (in frame order: this step runs on one thread)."""
        if isinstance(item, av.Packet):
            return item
        staged = drawer.stage(item.image, histogram=steady is not None)
        if steady is not None and staged.histogram is not None:
            staged.tone_lut = steady.lut(staged.histogram)
        return item, staged

    def draw_one(item: tuple[Frame, Staged] | av.Packet) -> tuple[Frame, Any] | av.Packet:
        if isinstance(item, av.Packet):
            return item
        frame, staged = item
        return frame, drawer.draw(staged)

    started = time.perf_counter()
    with open_input(source) as container:
        video, audio = video_stream(container), audio_stream(container)
        reader = Reader(container, video, audio, info, pencil.max_side)
        writer = Writer(target, reader.size, info.rate, info.time_base, audio)
        first_pts = last_pts = None
        try:
            steps = [Step("prepare", reader.prepare, PREPARE_WORKERS), Step("stage", stage), Step("draw", draw_one)]
            with pipelined(reader, steps) as results:
                for result in results:
                    if isinstance(result, av.Packet):
                        writer.packet(result)
                        continue
                    frame, drawing = result
                    writer.frame(drawing, frame.pts)
                    first_pts = frame.pts if first_pts is None else first_pts
                    last_pts = frame.pts
                    if progress is not None:
                        progress(writer.frames, max(info.frames, writer.frames) if info.frames else 0)
            if writer.frames == 0:
                raise VideoError("corrupt_video", "no frame of the clip decodes")
            writer.close()
        except BaseException:
            writer.abandon()
            raise
    seconds = time.perf_counter() - started
    assert first_pts is not None and last_pts is not None
    height, width = reader.size
    return {
        "frames": writer.frames,
        "fps": info.fps,
        "duration_s": float((last_pts - first_pts) * info.time_base) + 1.0 / info.fps,
        "width": width,
        "height": height,
        "time_base": str(writer.file_time_base),
        "audio": writer.audio,
        "backend": "cpu" if drawer.on_cpu else "cuda",
        "seconds": seconds,
        "frames_per_second": writer.frames / seconds,
        "temporal": params.temporal,
        "steady_luts": steady.builds if steady is not None else None,
        "encoder": {"codec": "h264", "preset": PRESET, "crf": CRF},
        "skipped_packets": reader.skipped,
        "source": info.to_json(),
    }


def _every(seconds: float, progress: Progress) -> FrameProgress:
    """A FrameProgress that hands done / total to `progress` at most every `seconds` (and at
    the first frame); 0 while the total is unknown (still a cancel checkpoint)."""
    last = [float("-inf")]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            progress(min(done / total, 0.99) if total else 0.0)

    return report
