"""The `pencil-gpu` command: `serve` runs the web service, `sketch` draws files.

    pencil-gpu serve [--host 127.0.0.1] [--port 8000]
    pencil-gpu sketch photo1.jpg photo2.png -o drawings/ [--mode color --tone dark ...]
    pencil-gpu sketch clip.mp4 -o drawings/ [--texture fast --temporal steady ...]
    pencil-gpu --version

The `sketch` options are the API's, built from the same `PENCIL_OPTIONS`. Videos (MP4, MOV,
MKV, WebM, AVI, known by their extension) are drawn frame by frame into
<stem>-sketch.mp4 (gpu.video), with a progress bar of their frames and `--temporal`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tqdm import tqdm

from app.config import get_settings
from gpu import pencil, video
from gpu.backend import BackendUnavailable, select_backend
from gpu.codec.decode import open_image
from gpu.codec.encode import ENCODE_OPTIONS, EXTENSIONS, parse_encode_options
from gpu.codec.errors import ImageError
from gpu.pencil.params import PENCIL_OPTIONS, Option, ParamError, PencilParams
from gpu.video.params import TEMPORAL_HELP


def _add_option(parser: argparse.ArgumentParser, option: Option) -> None:
    parser.add_argument(
        "--" + option.name.replace("_", "-"),
        dest=option.name,
        default=None,
        choices=option.choices,
        metavar=None if option.choices else option.type.__name__.upper(),
        help=option.describe(),
    )


def package_version() -> str:
    """The installed package's version, looked up as app.main's VERSION is (without
    importing the web app)."""
    try:
        return version("pencil-gpu")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+source"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pencil-gpu", description="Photos to pencil drawings (Lu, Xu & Jia 2012).")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version()}", help="print the version and exit"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the web service (settings: PENCIL_* environment variables)")
    serve.add_argument("--host", default=None, help="address to bind [default: PENCIL_HOST or 127.0.0.1]")
    serve.add_argument("--port", type=int, default=None, help="port [default: PENCIL_PORT or 8000]")

    sketch = commands.add_parser("sketch", help="draw image and video files into a directory")
    sketch.add_argument(
        "inputs", nargs="+", type=Path, metavar="IN", help="JPEG, PNG or WebP files; MP4, MOV, MKV, WebM or AVI videos"
    )
    sketch.add_argument(
        "-o",
        "--out",
        type=Path,
        required=True,
        metavar="OUT_DIR",
        help="directory for the drawings (created if missing)",
    )
    for option in PENCIL_OPTIONS + ENCODE_OPTIONS:
        _add_option(sketch, option)
    sketch.add_argument(
        "--temporal",
        default=None,
        choices=video.TEMPORAL_CHOICES,
        help=f"videos: {TEMPORAL_HELP} [default steady]",
    )
    return parser


def serve(host: str | None, port: int | None) -> int:
    """Run the service: one uvicorn process, or PENCIL_PROCESSES under app/serve.py."""
    import os

    import uvicorn

    from app.logs import configure_logging
    from app.serve import resolve_processes, run_processes, start_mps, uvicorn_options

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)  # this process's and uvicorn's lines
    host, port = host or settings.host, port or settings.port
    try:
        chosen = select_backend(settings.backend)
    except BackendUnavailable as exc:
        print(f"pencil-gpu: {exc}", file=sys.stderr)
        return 2
    backend = chosen.name
    processes = resolve_processes(settings, backend, len(chosen.devices))
    os.environ["PENCIL_PROCESSES"] = str(processes)  # the processes read their settings anew: they agree
    if processes == 1:
        uvicorn.run(host=host, port=port, **uvicorn_options(settings, settings.log_level))
        return 0
    try:
        mps = start_mps(settings, processes, backend)
    except RuntimeError as exc:
        print(f"pencil-gpu: {exc}", file=sys.stderr)
        return 2
    try:
        return run_processes(host, port, processes, settings.log_level)
    except OSError as exc:  # the port is taken, or the address is not ours
        print(f"pencil-gpu: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
        return 2
    finally:
        if mps is not None:
            mps.stop()


def is_video(path: Path) -> bool:
    """Whether the command draws `path` as a video (by its extension: video.VIDEO_EXTENSIONS)."""
    return path.suffix.lower() in video.VIDEO_EXTENSIONS


def output_paths(inputs: list[Path], out_dir: Path, extension: str) -> list[Path]:
    """out_dir/<stem>-sketch.<extension> for each image input, out_dir/<stem>-sketch.mp4 for
    each video; inputs whose names would collide (a/x.jpg and b/x.jpg, x.jpg and x.png,
    X.jpg and x.jpg) get -2, -3, ... so no drawing overwrites another."""
    taken: Counter[str] = Counter()  # by case-folded name: A.jpg and a.jpg collide on macOS and Windows
    paths = []
    for path in inputs:
        name, ending = f"{path.stem}-sketch", "mp4" if is_video(path) else extension
        key = f"{name}.{ending}".casefold()
        taken[key] += 1
        suffix = "" if taken[key] == 1 else f"-{taken[key]}"
        paths.append(out_dir / f"{name}{suffix}.{ending}")
    return paths


def sketch_files(inputs: list[Path], out_dir: Path, raw_options: dict[str, str | None]) -> int:
    """Draw every input into out_dir (names from `output_paths`); returns the exit status
    (0 all drawn, 1 some failed, 2 bad options or no backend)."""
    settings = get_settings()
    try:
        params = PencilParams.from_options(raw_options)
        fmt, quality = parse_encode_options(raw_options)
        video_params = video.VideoParams(params, raw_options.get("temporal") or "steady")
        backend = select_backend(settings.backend)
    except (ParamError, BackendUnavailable) as exc:
        print(f"pencil-gpu: {exc}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = 0
    targets = output_paths(inputs, out_dir, EXTENSIONS[fmt])
    started = time.perf_counter()
    unit = "file" if any(map(is_video, inputs)) else "img"
    with tqdm(inputs, unit=unit, desc=f"drawing ({backend.name})", file=sys.stderr) as progress:
        for path, target in zip(progress, targets, strict=True):
            try:
                if is_video(path):
                    sketch_video(path, target, video_params, backend.name, progress)
                    continue
                data = path.read_bytes()
                drawing = pencil.draw_bytes(
                    data, open_image(data, settings.max_pixels), params, fmt, quality, backend.name
                )
                target.write_bytes(drawing.data)
            except (OSError, ImageError, video.VideoError) as exc:
                failures += 1
                progress.write(f"{path}: {exc}", file=sys.stderr)
            except Exception as exc:  # a render bug on one photo must not lose the rest
                failures += 1
                progress.write(f"{path}: render failed: {exc!r}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(f"{len(inputs) - failures} of {len(inputs)} drawn into {out_dir} in {elapsed:.1f} s", file=sys.stderr)
    return 1 if failures else 0


def sketch_video(path: Path, target: Path, params: video.VideoParams, backend: str, files: tqdm) -> None:
    """Draw the clip `path` into `target` (an MP4 written under a temporary name and renamed
    once whole), with a bar of its frames under the files' bar and a line about it after.
    Raises VideoError, OSError."""
    info = video.probe(path, get_settings().max_pixels)
    partial = target.with_name(f".{target.name}.partial")
    with tqdm(total=info.frames or None, unit="frame", desc=path.name, leave=False, file=sys.stderr) as frames:

        def progress(done: int, total: int) -> None:
            if total and frames.total != total:
                frames.total = total
            frames.update(done - frames.n)

        try:
            if backend == "cuda":
                from gpu.pool import default_pool

                summary = default_pool().run(lambda lease: video.draw(path, partial, params, info, lease, progress))
            else:
                summary = video.draw(path, partial, params, info, None, progress)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    audio = summary["audio"]
    sound = "no sound" if audio is None else f"{audio['codec']} sound {'copied' if audio['copied'] else 're-encoded'}"
    files.write(
        f"{path}: {summary['frames']} frames, {summary['width']}x{summary['height']}, {sound}, "
        f"drawn at {summary['frames_per_second']:.1f} frames/s -> {target}",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args.host, args.port)
    names = [o.name for o in PENCIL_OPTIONS + ENCODE_OPTIONS] + ["temporal"]
    return sketch_files(args.inputs, args.out, {name: getattr(args, name) for name in names})


if __name__ == "__main__":
    sys.exit(main())
