"""The `pencil-gpu` command: `serve` runs the web service, `sketch` draws files.

    pencil-gpu serve [--host 127.0.0.1] [--port 8000]
    pencil-gpu sketch photo1.jpg photo2.png -o drawings/ [--mode color --tone dark ...]
    pencil-gpu --version

The `sketch` options are the API's, built from the same `PENCIL_OPTIONS`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tqdm import tqdm

from app.config import get_settings
from gpu import pencil
from gpu.backend import BackendUnavailable, select_backend
from gpu.codec.decode import open_image
from gpu.codec.encode import ENCODE_OPTIONS, EXTENSIONS, parse_encode_options
from gpu.codec.errors import ImageError
from gpu.pencil.params import PENCIL_OPTIONS, Option, ParamError, PencilParams


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

    sketch = commands.add_parser("sketch", help="draw image files into a directory")
    sketch.add_argument("inputs", nargs="+", type=Path, metavar="IN", help="JPEG, PNG or WebP files")
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
    return parser


def serve(host: str | None, port: int | None) -> int:
    """Run the service: one uvicorn process, or PENCIL_PROCESSES under app/serve.py."""
    import os

    import uvicorn

    from app.logs import configure_logging
    from app.serve import resolve_processes, run_processes, start_mps

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
        # log_config=None: uvicorn leaves logging to app/logs.py; no access log: AccessLogMiddleware writes it.
        uvicorn.run(
            "app.main:create_app",
            factory=True,
            host=host,
            port=port,
            log_level=settings.log_level,
            proxy_headers=True,
            log_config=None,
            access_log=False,
        )
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


def output_paths(inputs: list[Path], out_dir: Path, extension: str) -> list[Path]:
    """out_dir/<stem>-sketch.<extension> for each input; inputs whose names would collide
    (a/x.jpg and b/x.jpg, x.jpg and x.png, X.jpg and x.jpg) get -2, -3, ... so no drawing overwrites
    another."""
    taken: Counter[str] = Counter()  # by case-folded name: A.jpg and a.jpg collide on macOS and Windows
    paths = []
    for path in inputs:
        name = f"{path.stem}-sketch"
        taken[name.casefold()] += 1
        count = taken[name.casefold()]
        suffix = "" if count == 1 else f"-{count}"
        paths.append(out_dir / f"{name}{suffix}.{extension}")
    return paths


def sketch_files(inputs: list[Path], out_dir: Path, raw_options: dict[str, str | None]) -> int:
    """Draw every input into out_dir (names from `output_paths`); returns the exit status
    (0 all drawn, 1 some failed, 2 bad options or no backend)."""
    settings = get_settings()
    try:
        params = PencilParams.from_options(raw_options)
        fmt, quality = parse_encode_options(raw_options)
        backend = select_backend(settings.backend)
    except (ParamError, BackendUnavailable) as exc:
        print(f"pencil-gpu: {exc}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = 0
    targets = output_paths(inputs, out_dir, EXTENSIONS[fmt])
    started = time.perf_counter()
    with tqdm(inputs, unit="img", desc=f"drawing ({backend.name})", file=sys.stderr) as progress:
        for path, target in zip(progress, targets, strict=True):
            try:
                data = path.read_bytes()
                drawing = pencil.draw_bytes(
                    data, open_image(data, settings.max_pixels), params, fmt, quality, backend.name
                )
                target.write_bytes(drawing.data)
            except (OSError, ImageError) as exc:
                failures += 1
                progress.write(f"{path}: {exc}", file=sys.stderr)
            except Exception as exc:  # a render bug on one photo must not lose the rest
                failures += 1
                progress.write(f"{path}: render failed: {exc!r}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(f"{len(inputs) - failures} of {len(inputs)} drawn into {out_dir} in {elapsed:.1f} s", file=sys.stderr)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args.host, args.port)
    names = [o.name for o in PENCIL_OPTIONS + ENCODE_OPTIONS]
    return sketch_files(args.inputs, args.out, {name: getattr(args, name) for name in names})


if __name__ == "__main__":
    sys.exit(main())
