"""The video job's frames a second against a CPU pipeline, measured in the same run.

    python bench/video.py [--backend cuda|cpu] [--size 1280x720] [--frames N] [--texture fast]
    python bench/video.py --flicker

Makes a clip with PyAV (nothing downloaded): scikit-image photographs (astronaut, coffee,
chelsea, a third of the clip each) panned 2 px a frame, H.264 (x264 veryfast, CRF 23) with
an AAC sine, 30 frames a second. Then, on that clip:

- ours: gpu.video.draw, the front door of the video job and `pencil-gpu sketch clip.mp4`,
  on a GPU lease (--backend cuda) or the CPU: frames / wall time from the first packet
  read to the last byte written (threaded decode, drawing and x264 encode overlapped);
- its stages alone, to see which one sets the pace: decode (demux, threaded decode; RGB
  on PREPARE_WORKERS threads), drawing (frames already in memory: staged with the luma
  histogram, the steady LUT, drawn), encode (drawings already made);
- the CPU pipeline, serially: OpenCV's decoder (cv2.VideoCapture), our CPU backend
  (gpu.pencil.reference.render) and OpenCV's encoder (cv2.VideoWriter, MPEG-4 part 2: the
  wheel's FFmpeg has no H.264 encoder), on the first --anchor-frames frames (it is slow);

and prints the frames a second of each and the ratio. `main(argv)` is what bench/live.py
--video calls.

--gil-profile DIR then runs ours again for a few seconds under py-spy (`--gil`: samples of
the thread holding Python's GIL only), writes the raw stacks to DIR and prints the share of
GIL samples by thread and by source line: what serialises the job's threads.

--flicker measures the temporal option instead (the figures of docs/video.md): the tone
map's own flicker (how much a luma value's drawn tone changes from frame to frame),
per-frame matching against the steady LUT and against the first design (a steady target,
each frame matched to it), on panned and on still, noisy clips; the drawing's flicker
through the whole front door (16 px block means, the pan compensated); and how far a still
wall's tone moves while a dark object comes into view.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import av
import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: gpu/ and tests/

from gpu import video
from gpu.pencil import reference
from gpu.pencil.params import PencilParams
from gpu.video import PREPARE_WORKERS
from gpu.video.decode import Reader
from gpu.video.drawer import Drawer
from gpu.video.encode import PRESET, Writer
from gpu.video.pipeline import Step, pipelined
from gpu.video.probe import audio_stream, open_input, video_stream
from gpu.video.temporal import SteadyTone, luma_histogram
from tests.gpu.video.clips import dark_object_entering, decoded_frames, drawn_frames, make_clip, panned, sound_only

PHOTOS = ("astronaut", "coffee", "chelsea")


def bench_clip(width: int, height: int, frames: int, fps: int = 30) -> bytes:
    """The benchmark's clip: PHOTOS panned in turn, H.264 CRF 23 and an AAC sine, as bytes."""
    images = []
    for index, photo in enumerate(PHOTOS):
        count = frames // len(PHOTOS) + (1 if index < frames % len(PHOTOS) else 0)
        images += panned(photo, width, height, count, 2.0, noise=2.0, seed=index)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "23"}
        for image in images:
            output.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        output.mux(stream.encode(None))
    silent = buffer.getvalue()
    return _remux(silent, sound_only(frames / fps))


def _remux(video_clip: bytes, sound_clip: bytes) -> bytes:
    """video_clip's video and sound_clip's audio in one MP4 (packets copied)."""
    buffer = io.BytesIO()
    with (
        av.open(io.BytesIO(video_clip)) as pictures,
        av.open(io.BytesIO(sound_clip)) as sound,
        av.open(buffer, "w", format="mp4") as output,
    ):
        streams = {}
        for source in (pictures.streams.video[0], sound.streams.audio[0]):
            streams[source.type] = output.add_stream_from_template(source)
        for container, kind in ((pictures, "video"), (sound, "audio")):
            for packet in container.demux(getattr(container.streams, kind)[0]):
                if packet.size:
                    packet.stream = streams[kind]
                    output.mux(packet)
    return buffer.getvalue()


# ------------------------------------------------------------------ frames a second --


def ours(path: Path, params: video.VideoParams, backend: str, out: Path) -> dict:
    """gpu.video.draw on the clip: its summary."""
    info = video.probe(path)
    if backend == "cuda":
        from gpu.pool import default_pool

        return default_pool().run(lambda lease: video.draw(path, out, params, info, lease))
    return video.draw(path, out, params, info)


def stages(path: Path, params: video.VideoParams, backend: str, frames: int) -> dict[str, float]:
    """Frames a second of each stage alone: decode (to RGB frames), drawing (on frames in
    memory, one after the other: staged, the steady LUT when the option is on, drawn),
    x264 encode."""
    info = video.probe(path)
    rates = {}
    with open_input(path) as container:
        stream = video_stream(container)
        reader = Reader(container, stream, audio_stream(container), info, params.pencil.max_side)
        start = time.perf_counter()
        with pipelined(reader, [Step("prepare", reader.prepare, PREPARE_WORKERS)]) as items:
            decoded = [item for item in items if not isinstance(item, av.Packet)][:frames]
        rates["decode"] = len(decoded) / (time.perf_counter() - start)

    def draw_all(lease=None) -> list[np.ndarray]:
        drawer = Drawer(params.pencil, lease)
        steady = SteadyTone(params.pencil.tone, info.fps) if params.temporal == "steady" else None
        drawings = []
        for frame in decoded:
            staged = drawer.stage(frame.image, histogram=steady is not None)
            if steady is not None and staged.histogram is not None:
                staged.tone_lut = steady.lut(staged.histogram)
            drawings.append(drawer.draw(staged))
        return drawings

    start = time.perf_counter()
    if backend == "cuda":
        from gpu.pool import default_pool

        drawings = default_pool().run(draw_all)
    else:
        drawings = draw_all()
    rates["drawing"] = len(decoded) / (time.perf_counter() - start)
    with tempfile.TemporaryFile() as sink:
        start = time.perf_counter()
        writer = Writer(sink, reader.size, info.rate, info.time_base)
        for frame, drawing in zip(decoded, drawings, strict=True):
            writer.frame(drawing, frame.pts)
        writer.close()
        rates["encode"] = len(decoded) / (time.perf_counter() - start)
    return rates


def opencv_pipeline(path: Path, params: PencilParams, frames: int, out: Path) -> float:
    """The CPU pipeline: cv2.VideoCapture -> reference.render -> cv2.VideoWriter (mp4v), one
    frame after the other; frames a second over the first `frames` frames."""
    capture = cv2.VideoCapture(str(path))
    fps = capture.get(cv2.CAP_PROP_FPS)
    writer = None
    count = 0
    start = time.perf_counter()
    while count < frames:
        ok, bgr = capture.read()
        if not ok:
            break
        drawing = reference.render(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), params)
        if writer is None:
            height, width = drawing.shape[:2]
            writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height), isColor=False)
        writer.write(drawing)
        count += 1
    if writer is not None:
        writer.release()
    capture.release()
    return count / (time.perf_counter() - start)


def speed(args: argparse.Namespace) -> None:
    width, height = (int(v) for v in args.size.split("x"))
    frames = args.frames or (600 if args.backend == "cuda" else 48)
    params = video.VideoParams(PencilParams(texture=args.texture), args.temporal)
    device = "CPU"
    if args.backend == "cuda":
        import cupy

        from gpu import pencil
        from gpu.pool import default_pool

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        pencil.warm_up("cuda", default_pool())
    with tempfile.TemporaryDirectory() as folder:
        clip = Path(folder) / "clip.mp4"
        clip.write_bytes(bench_clip(width, height, frames))
        print(
            f"# video: {width}x{height}, {frames} frames at 30/s (H.264 + AAC, {clip.stat().st_size / 1e6:.1f} MB), "
            f"texture {args.texture}, temporal {args.temporal}, backend {args.backend} ({device}), x264 {PRESET}"
        )
        warm = Path(folder) / "warm.mp4"
        warm.write_bytes(bench_clip(width, height, 12))
        ours(warm, params, args.backend, Path(folder) / "warm-out.mp4")  # first-call costs out of the timing
        runs = [ours(clip, params, args.backend, Path(folder) / "out.mp4") for _ in range(args.repeats)]
        rates = [run["frames_per_second"] for run in runs]
        ours_fps = statistics.median(rates)
        print(
            f"ours (gpu.video.draw, {args.backend}): {ours_fps:.1f} frames/s "
            f"(median of {args.repeats}: {', '.join(f'{rate:.1f}' for rate in rates)}), "
            f"sound {'copied' if runs[0]['audio']['copied'] else 're-encoded'}, "
            f"{(Path(folder) / 'out.mp4').stat().st_size / 1e6:.1f} MB"
        )
        alone = stages(clip, params, args.backend, frames)
        print("  stages alone: " + ", ".join(f"{name} {rate:.1f} frames/s" for name, rate in alone.items()))
        anchor = opencv_pipeline(clip, params.pencil, args.anchor_frames, Path(folder) / "opencv.mp4")
        print(
            f"CPU pipeline (cv2.VideoCapture, reference.render, cv2.VideoWriter mp4v; {args.anchor_frames} frames): "
            f"{anchor:.2f} frames/s"
        )
        print(f"ratio: {ours_fps / anchor:.1f}x")
        if args.gil_profile:
            gil_profile(lambda: ours(clip, params, args.backend, Path(folder) / "out.mp4"), Path(args.gil_profile))


def gil_profile(job: Callable[[], object], folder: Path, seconds: int = 6) -> None:
    """`job` run over and over for `seconds` while py-spy samples the thread holding the GIL
    (raw stacks to folder/pyspy-gil.txt); prints the shares of the samples by thread and by
    the innermost line of this repository's code."""
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        print("gil profile: py-spy is not installed (bench/prepare_device.sh carries it)")
        return
    folder.mkdir(parents=True, exist_ok=True)
    raw, log = folder / "pyspy-gil.txt", folder / "pyspy-gil.log"
    command = [pyspy, "record", "--pid", str(os.getpid()), "--gil", "--threads", "--nonblocking"]
    with log.open("wb") as errors:
        recorder = subprocess.Popen(
            [*command, "--format", "raw", "--rate", "400", "--duration", str(seconds), "--output", str(raw)],
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        started = time.perf_counter()
        while recorder.poll() is None and time.perf_counter() - started < seconds + 5:
            job()
        status = recorder.wait()
    if status != 0 or not raw.exists():
        print(f"gil profile: py-spy failed ({log}): {log.read_text(errors='replace')[-300:]}")
        return
    threads: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for record in raw.read_text().splitlines():
        stack, _, count = record.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0]  # "thread (0x7f..): name", or "thread (0x7f..)" for an unnamed one
        threads[thread.rsplit(": ", 1)[-1] if ": " in thread else thread] += int(count)
        ours = [frame for frame in frames[1:] if "gpu/" in frame]  # py-spy names bench/ files bare
        lines[ours[-1] if ours else frames[-1]] += int(count)
    total = sum(threads.values())
    if total == 0:
        print(f"gil profile: no samples held the GIL ({raw})")
        return
    shares = ", ".join(f"{name} {n / total:.0%}" for name, n in threads.most_common(6))
    print(f"GIL samples ({total}, {raw}) by thread: {shares}")
    for line, count in lines.most_common(15):
        print(f"  {count / total:6.1%}  {line}")


# ------------------------------------------------------------------------ flicker --


def map_flicker(histograms: list[np.ndarray], luts: list[np.ndarray]) -> float:
    """Mean change, in grey levels, of a luma value's mapped tone from a frame to the next,
    weighted by the values' frequency in the later frame."""
    changes = [
        float((counts / counts.sum() * np.abs(after.astype(float) - before)).sum())
        for counts, before, after in zip(histograms[1:], luts[:-1], luts[1:], strict=True)
    ]
    return float(np.mean(changes))


def block_flicker(drawings: list[np.ndarray], step: int, block: int = 16) -> float:
    """Mean change of the drawings' block means from a frame to the next, the pan (`step` px
    a frame to the left) compensated."""
    changes = []
    for before, after in zip(drawings[:-1], drawings[1:], strict=True):
        a, b = before[:, step:].astype(float), after[:, : after.shape[1] - step].astype(float)
        h, w = a.shape[0] // block * block, a.shape[1] // block * block
        means = [x[:h, :w].reshape(h // block, block, w // block, block).mean(axis=(1, 3)) for x in (a, b)]
        changes.append(float(np.abs(means[0] - means[1]).mean()))
    return float(np.mean(changes))


def flicker(args: argparse.Namespace) -> None:
    width, height, count = 640, 360, 40
    photos = ("astronaut", "coffee", "chelsea", "camera")
    print(f"# temporal: {width}x{height}, {count} frames at 30/s, texture fast, tone auto (grey levels)")
    print("clip              | tone map flicker: none  target  steady | drawing flicker: none  steady")
    for photo in photos:
        for kind in ("pan", "still"):
            if kind == "pan":
                images, step = panned(photo, width, height, count, 1.0, noise=2.0, seed=1), 1
            else:
                base = panned(photo, width, height, 1, 0)[0].astype(np.float32)
                rng = np.random.default_rng(1)
                noisy = [base + rng.normal(0.0, 4.0, base.shape) for _ in range(count)]
                images, step = [np.clip(image, 0, 255).astype(np.uint8) for image in noisy], 0
            clip = make_clip("mp4", width, height, count, fps=30, images=images, audio=None)
            histograms = [luma_histogram(frame) for frame in decoded_frames(clip)]
            alone = [reference.matching_lut(h, reference.tone_target(h, "auto")) for h in histograms]
            steady, targeted = SteadyTone("auto", 30.0), SteadyTone("auto", 30.0)
            held = [steady.lut(h) for h in histograms]
            first_design = []
            for h in histograms:
                targeted.lut(h)
                first_design.append(reference.matching_lut(h, reference.tone_target(targeted.built_from, "auto")))
            drawn = {}
            for temporal in ("none", "steady"):
                out = io.BytesIO()
                video.draw(clip, out, video.VideoParams(PencilParams(texture="fast"), temporal))
                drawn[temporal] = block_flicker(drawn_frames(out.getvalue()), step)
            tones = [map_flicker(histograms, luts) for luts in (alone, first_design, held)]
            print(
                f"{photo:9s} {kind:7s} | {tones[0]:22.3f} {tones[1]:7.3f} {tones[2]:7.3f} | "
                f"{drawn['none']:21.3f} {drawn['steady']:7.3f}",
                flush=True,
            )
    print("\n# a dark object comes into a still scene over 0.5 s: how far a wall it never covers moves in tone")
    for photo in photos:
        frames, wall = dark_object_entering(photo)
        histograms = [luma_histogram(frame) for frame in frames]
        steady = SteadyTone("auto", 30.0)
        alone = [reference.matching_lut(h, reference.tone_target(h, "auto"))[wall].mean() for h in histograms]
        held = [steady.lut(h)[wall].mean() for h in histograms]
        print(
            f"{photo:9s}: none {np.abs(np.diff(alone)).sum():.2f}, steady {np.abs(np.diff(held)).sum():.2f} grey levels"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--frames", type=int, default=None, help="frames of the clip [600 on cuda, 48 on the CPU]")
    parser.add_argument("--anchor-frames", type=int, default=24, help="frames the CPU pipeline draws")
    parser.add_argument("--texture", default="fast", choices=("fast", "lu"))
    parser.add_argument("--temporal", default="steady", choices=video.TEMPORAL_CHOICES)
    parser.add_argument("--repeats", type=int, default=3, help="runs of ours (the median is printed)")
    parser.add_argument("--flicker", action="store_true", help="measure the temporal option instead")
    parser.add_argument("--gil-profile", metavar="DIR", help="then profile the GIL with py-spy, raw stacks to DIR")
    args = parser.parse_args(argv)
    if args.flicker:
        flicker(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
