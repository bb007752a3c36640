"""Benchmark of the PNG decode of uploads (gpu/codec/decode.py, issue 37) against its anchors,
on one core.

    python bench/png_decode.py [--repeats 30] [--cpu 0]

Inputs: scikit-image's astronaut, coffee, chelsea and rocket resized (INTER_CUBIC) to
741x500 (the issue's upload) and 1920x1080, saved as 8-bit RGB PNGs by Pillow (its default
compression), and the same as gray.

For each: median wall time over --repeats runs (after one warm-up) of
- ours: gpu.codec.decode.decode_pixels (imagecodecs' libpng, straight to RGB),
- OpenCV: cv2.imdecode + BGR->RGB, the service's decode before,
- Pillow: Image.open + load + numpy.asarray,
then ours / anchor. Every decode is compared with Pillow's pixels.

One core: the process pins itself to --cpu (as `taskset -c`) and sets OpenCV to one thread.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import time
from collections.abc import Callable

import cv2
import numpy as np
from PIL import Image
from skimage import data as photos

from gpu.codec.decode import decode_pixels, open_image

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
SIZES = ((741, 500), (1920, 1080))
LIMIT = 100_000_000


def pngs() -> dict[str, bytes]:
    out = {}
    for name in PHOTOS:
        rgb = getattr(photos, name)()
        for width, height in SIZES:
            image = Image.fromarray(cv2.resize(rgb, (width, height), interpolation=cv2.INTER_CUBIC))
            for mode in ("RGB", "L"):
                buffer = io.BytesIO()
                image.convert(mode).save(buffer, format="PNG")
                out[f"{name} {width}x{height} {mode}"] = buffer.getvalue()
    return out


def median_ms(decode: Callable[[], np.ndarray], repeats: int) -> float:
    decode()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        decode()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def opencv(data: bytes) -> np.ndarray:
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    return pixels if pixels.ndim == 2 else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


def pillow(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    image.load()
    return np.asarray(image)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed runs per figure")
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin the process to")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    cv2.setNumThreads(1)
    print(f"{platform.processor() or platform.machine()}, one core (cpu {args.cpu}); medians of {args.repeats}")
    print(f"{'PNG':28} {'bytes':>9} {'ours ms':>8} {'OpenCV':>8} {'Pillow':>8} {'ours/OpenCV':>12} {'ours/Pillow':>12}")
    ratios = []
    for label, data in pngs().items():
        expected = pillow(data)
        ours = lambda data=data: decode_pixels(data, open_image(data, LIMIT))  # noqa: E731
        for decode in (ours, lambda data=data: opencv(data)):
            np.testing.assert_array_equal(decode(), expected)
        t_ours = median_ms(ours, args.repeats)
        t_cv = median_ms(lambda data=data: opencv(data), args.repeats)
        t_pil = median_ms(lambda data=data: pillow(data), args.repeats)
        ratios.append(t_ours / t_cv)
        print(
            f"{label:28} {len(data):>9,} {t_ours:8.2f} {t_cv:8.2f} {t_pil:8.2f} "
            f"{t_ours / t_cv:12.2f} {t_ours / t_pil:12.2f}"
        )
    print(f"ours / OpenCV: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
