"""The CUDA C sources compiled ahead of time: one fatbin per source, beside it, built by nvcc
where a CUDA toolkit is (the Docker image's builder stage), so no server compiles a kernel
before its first request.

    python -m gpu.ahead                      # every source, ARCHITECTURES, with nvcc on PATH
    python -m gpu.ahead --arch 90 --nvcc /usr/local/cuda/bin/nvcc

A fatbin holds machine code (SASS) for each architecture in ARCHITECTURES and PTX of the
newest, which the driver compiles for later GPUs. Its name carries a digest of the source
and COMPILE_OPTIONS (`pencil.3f2a....fatbin`), so an edited source never loads a stale
binary: gpu/kernels.py loads the fatbin whose name matches, and compiles the source with
NVRTC where there is none, or where none of its code runs on the GPU at hand.

Standard library only: the image's builder runs this before anything else is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# Every CUDA C source of the package, relative to gpu/.
SOURCES = tuple(
    ROOT / name
    for name in ("pencil/pencil.cu", "svd/svd.cu", "search/search.cu", "stencil/stencil.cu", "cs256/cs256.cu")
)
# Exact IEEE division and square root, as the reference's float32 NumPy arithmetic: the
# median and gradient stages are compared bit for bit. NVRTC and nvcc take the same flags.
COMPILE_OPTIONS = ("-std=c++17", "--prec-div=true", "--prec-sqrt=true", "--fmad=true")
# A100 (8.0), A10/A40/RTX 30 (8.6), L4/L40/RTX 40 (8.9), H100/H200 (9.0); PTX of the last.
ARCHITECTURES = ("80", "86", "89", "90")


def digest(source: Path) -> str:
    """16 hex digits identifying the source's text and the compile options."""
    h = hashlib.sha256(source.read_bytes())
    h.update("\0".join(COMPILE_OPTIONS).encode())
    return h.hexdigest()[:16]


def fatbin_for(source: Path, directory: Path | None = None) -> Path:
    """Where the fatbin of `source`, as it is now, lies (whether or not it was built): beside
    it, or in `directory`."""
    return (directory or source.parent) / f"{source.stem}.{digest(source)}.fatbin"


def nvcc_command(nvcc: str, source: Path, output: Path, architectures: tuple[str, ...]) -> list[str]:
    """nvcc's arguments for one fatbin: SASS for each architecture, PTX of the last."""
    targets = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in architectures]
    targets.append(f"-gencode=arch=compute_{architectures[-1]},code=compute_{architectures[-1]}")
    # --threads 0: the architectures compile side by side, on as many threads as there are cores
    return [nvcc, "-fatbin", "--threads", "0", *COMPILE_OPTIONS, *targets, "-o", str(output), str(source)]


def build(
    nvcc: str = "nvcc",
    architectures: tuple[str, ...] = ARCHITECTURES,
    sources: tuple[Path, ...] = SOURCES,
    directory: Path | None = None,
) -> list[Path]:
    """Build the fatbin of every source (in parallel; each written whole, then renamed into
    place; beside its source or in `directory`), remove those of older versions of the
    sources; returns the fatbins. Raises subprocess.CalledProcessError with nvcc's message
    when a source does not compile."""
    if shutil.which(nvcc) is None:
        raise FileNotFoundError(f"no {nvcc}: the fatbins are built where a CUDA toolkit is installed")

    def one(source: Path) -> Path:
        target = fatbin_for(source, directory)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        started = time.perf_counter()
        done = subprocess.run(
            nvcc_command(nvcc, source, partial, architectures), capture_output=True, text=True, check=False
        )
        if done.returncode:
            partial.unlink(missing_ok=True)
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        os.replace(partial, target)
        for stale in target.parent.glob(f"{source.stem}.*.fatbin"):
            if stale != target:
                stale.unlink()
        size_mb, seconds = target.stat().st_size / 1e6, time.perf_counter() - started
        print(f"{target}: {size_mb:.1f} MB in {seconds:.1f} s")
        return target

    with ThreadPoolExecutor(max_workers=len(sources)) as threads:
        return list(threads.map(one, sources))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu.ahead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvcc", default="nvcc", help="the nvcc to run (default: nvcc on PATH)")
    parser.add_argument(
        "--arch",
        default=",".join(ARCHITECTURES),
        help=f"compute capabilities without the dot, comma-separated (default {','.join(ARCHITECTURES)})",
    )
    args = parser.parse_args(argv)
    architectures = tuple(a.strip() for a in args.arch.split(",") if a.strip())
    try:
        build(args.nvcc, architectures)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        stderr = getattr(exc, "stderr", None)
        print(f"python -m gpu.ahead: {exc}\n{stderr or ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
