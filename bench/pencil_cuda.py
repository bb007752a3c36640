"""The GPU half of bench/pencil.py (run it as `python bench/pencil.py --backend cuda`).

Prints, per size and texture mode: per-stage GPU times (kernels only), the whole render
(compute only: kernels, upload done -> merge done; with transfers: host copy to pinned,
upload and download included; host wall), the cupyx anchor of the same stages and the CPU
reference, with ratios against both our compute-only and our with-transfers figures; then
renders per second with 1, 2, 4, 8 concurrent leases. Also prints the measured
device-to-device copy bandwidth, the floor the byte counts are read against.

Anchors are timed like ours, on the same work: the CPU reference warm, median of
CPU_REPEATS renders rotating among the same photos; the cupyx stages from data already on
the device (ours start after the upload), median of ANCHOR_REPEATS after a warm-up.
The HTTP service under load is bench/e2e.py (`python bench/pencil.py --e2e --backend cuda`).
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import cupy
import cupyx.scipy.ndimage as ndimage
import cv2
import numpy as np
import skimage.data

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import device_median_ms, median_ms

from gpu.pencil import cuda
from gpu.pencil import reference as ref
from gpu.pencil.params import PencilParams
from gpu.pool import DevicePool

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
DEFAULT_SIZES = "1024x768,1920x1080,2560x1920,4096x3072"
# tone=light (fixed layer weights), as the published tables: the cupyx tone anchor matches
# to a fixed target; the default tone=auto adds its fit (about 0.03 ms on the GPU).
TONE = "light"
CPU_REPEATS = 5  # CPU reference renders timed per figure (after a warm-up render)
ANCHOR_REPEATS = 5  # cupyx anchor runs timed per figure (after a warm-up run)


def photos(width: int, height: int) -> list[np.ndarray]:
    """4 real photographs resized to width x height, RGB uint8: the inputs rotate among them."""
    out = []
    for name in PHOTOS:
        image = getattr(skimage.data, name)()
        image = image if image.ndim == 3 else cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
        out.append(cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC))
    return out


def copy_bandwidth() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written per second (median of 10)."""
    a = cupy.ones(1 << 28, cupy.float32)
    b = cupy.empty_like(a)
    times = []
    for _ in range(12):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        b[...] = a
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1000)
    return 2 * a.nbytes / statistics.median(times[2:])


def gpu_stage_times(lease, images, params, repeats):
    """Median ms of each stage (branches serialised) and of the whole render (two streams):
    compute (upload done -> merge done), with transfers (start -> download done), host wall."""
    for image in images:  # warm-up: compile, caches, pinned buffers at this size
        cuda.render_on(lease, image, params)
    per_stage: dict[str, list[float]] = {}
    for i in range(repeats):
        marks: list = []
        cuda.render_on(lease, images[i % len(images)], params, marks, serial=True)
        for (_, before), (name, after) in itertools.pairwise(marks):
            per_stage.setdefault(name, []).append(cupy.cuda.get_elapsed_time(before, after))
    compute, transfers, wall = [], [], []
    for i in range(repeats):
        marks = []
        start = time.perf_counter()
        cuda.render_on(lease, images[i % len(images)], params, marks)
        wall.append((time.perf_counter() - start) * 1000)
        events = dict(marks)
        compute.append(cupy.cuda.get_elapsed_time(events["upload"], events["merge"]))
        transfers.append(cupy.cuda.get_elapsed_time(events["start"], events["download"]))
    stages = {name: statistics.median(v) for name, v in per_stage.items()}
    return stages, statistics.median(compute), statistics.median(transfers), statistics.median(wall)


def cupyx_anchor(image: np.ndarray, params: PencilParams) -> dict[str, float]:
    """The same stages written the obvious CuPy way; GPU ms per part (CUDA events, median
    of ANCHOR_REPEATS after a warm-up). Each part starts, as ours does, from data already
    on the device (uploaded before the timer): "strokes" from the luma plane, as our
    median+gradient, responses+argmax and stroke map stages; "luma+tone" from the RGB image
    to J (luma, histogram, LUT, box blur), as our luma+histogram and tone stages. Neither
    side applies the texture there (ours does it in the merge, from the tile)."""
    height, width = image.shape[:2]
    length = params.line_length(height, width)
    thin = cupy.asarray(ref.line_kernels(length, 0))
    wide = cupy.asarray(ref.line_kernels(length, params.stroke_width))
    luma_host, _ = ref.split_luma(image)
    luma = cupy.asarray(luma_host)
    rgb = cupy.asarray(image)
    target = cupy.asarray(np.cumsum(ref.target_histogram(params.tone_weights)))
    cupy.cuda.get_current_stream().synchronize()

    def strokes():
        smooth = ndimage.median_filter(luma, size=3, mode="nearest").astype(cupy.float32) / 255
        magnitude = cupy.zeros_like(smooth)
        magnitude[:, :-1] += cupy.abs(cupy.diff(smooth, axis=1))
        magnitude[:-1, :] += cupy.abs(cupy.diff(smooth, axis=0))
        responses = cupy.stack([ndimage.convolve(magnitude, k, mode="constant") for k in thin])
        label = responses.argmax(axis=0)
        s = sum(ndimage.convolve(cupy.where(label == i, magnitude, 0), wide[i], mode="constant") for i in range(8))
        return 1 - (s - s.min()) / (s.max() - s.min())

    def tone():
        weighted = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114  # YCrCb's Y
        y = cupy.clip(cupy.rint(weighted), 0, 255).astype(cupy.uint8)
        counts = cupy.bincount(y.ravel(), minlength=256)
        source = cupy.cumsum(counts) / counts.sum()
        lut = cupy.clip(cupy.searchsorted(target, source - 1e-12), 0, 255).astype(cupy.uint8)
        matched = lut[y].astype(cupy.float32) / 255
        blur = params.tone_blur_size(height, width)
        return ndimage.uniform_filter(matched, size=blur, mode="nearest")

    return {
        "strokes": device_median_ms(strokes, ANCHOR_REPEATS),
        "luma+tone": device_median_ms(tone, ANCHOR_REPEATS),
    }


def cpu_reference_ms(images: list[np.ndarray], params: PencilParams) -> float:
    """The CPU reference's ms per render, warm: median of CPU_REPEATS renders after a
    warm-up, rotating among `images` as the GPU figures do."""
    rotation = itertools.cycle(images)
    return median_ms(lambda: ref.render(next(rotation), params), CPU_REPEATS)


def stroke_stages_ms(stages: dict[str, float]) -> float:
    """Our stroke branch's GPU ms: the stages the cupyx "strokes" anchor does."""
    return stages["median+gradient"] + stages["responses+argmax"] + stages["stroke map"]


def tone_stages_ms(stages: dict[str, float]) -> float:
    """Our GPU ms from RGB on the device to J: the stages the cupyx "luma+tone" anchor does."""
    return stages["luma+histogram"] + stages["tone"]


def throughput(pool: DevicePool, images, params, leases: int, seconds: float = 2.0) -> float:
    """Renders per second with `leases` threads each rendering on its own lease."""
    count = 0
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def worker(offset: int) -> None:
        nonlocal count
        i = offset
        while time.perf_counter() < stop:
            image = images[i % len(images)]
            pool.run(lambda lease, image=image: cuda.render_on(lease, image, params))
            i += 1
            with lock:
                count += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(leases)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return count / (time.perf_counter() - start)


def main(args) -> None:
    sizes = [tuple(int(v) for v in s.split("x")) for s in (args.sizes or DEFAULT_SIZES).split(",")]
    repeats = args.repeats or 30
    device = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(device.id)["name"].decode()
    bandwidth = copy_bandwidth()
    print(
        f"# pencil GPU benchmark: {name}, CuPy {cupy.__version__}, CUDA runtime "
        f"{cupy.cuda.runtime.runtimeGetVersion()}, {os.cpu_count()} CPU cores"
    )
    print(
        f"# device-to-device copy: {bandwidth / 1e12:.2f} TB/s (read + write); medians of {repeats} after a "
        f"warm-up; inputs rotate among {len(PHOTOS)} photos; tone={TONE}"
    )
    pool = DevicePool(streams_per_device=8)
    rows = []
    for width, height in sizes:
        images = photos(width, height)
        for texture in ("fast", "lu"):
            params = PencilParams(texture=texture, tone=TONE)
            with pool.lease() as lease:
                stages, compute, transfers, wall = gpu_stage_times(lease, images, params, repeats)
            anchor = cupyx_anchor(images[0], params) if texture == "fast" else None
            cpu_ms = cpu_reference_ms(images, params)
            rows.append((width, height, texture, stages, compute, transfers, wall, anchor, cpu_ms))
            stroke_ms, tone_ms = stroke_stages_ms(stages), tone_stages_ms(stages)
            print(f"\n## {width}x{height} texture={texture} (line length {params.line_length(height, width)} px)")
            print("stage (branches serialised) | GPU ms, kernels only (upload, download: copies)")
            for stage, ms in stages.items():
                print(f"{stage} | {ms:.3f}")
            print(f"render compute, kernels only (2 streams) | {compute:.3f}")
            print(f"render with transfers (host copy to pinned, upload, download) | {transfers:.3f}")
            print(f"render host wall | {wall:.3f}")
            print(
                f"CPU reference, warm, median of {CPU_REPEATS} | {cpu_ms:.0f}  (x{cpu_ms / compute:.0f} ours compute, "
                f"x{cpu_ms / transfers:.0f} ours with transfers)"
            )
            if anchor:
                print(
                    f"cupyx stroke stages, from luma on the device | {anchor['strokes']:.1f}  "
                    f"(x{anchor['strokes'] / stroke_ms:.0f} ours stroke stages)"
                )
                print(
                    f"cupyx luma + tone (to J), from RGB on the device | {anchor['luma+tone']:.3f}  "
                    f"(x{anchor['luma+tone'] / tone_ms:.1f} ours luma+histogram + tone)"
                )

    print(
        "\n# summary: ms; compute = kernels only, +transfers = with the host copy, upload and download; "
        f"CPU ref warm, median of {CPU_REPEATS}; ratios are anchor / ours"
    )
    print(
        "size | texture | compute | +transfers | wall | CPU ref | CPU/ours compute | CPU/ours +transfers | "
        "cupyx strokes | cupyx/ours strokes | cupyx luma+tone | cupyx/ours luma+tone"
    )
    for width, height, texture, stages, compute, transfers, wall, anchor, cpu_ms in rows:
        cupyx = (
            f"{anchor['strokes']:.1f} | {anchor['strokes'] / stroke_stages_ms(stages):.0f} | "
            f"{anchor['luma+tone']:.3f} | {anchor['luma+tone'] / tone_stages_ms(stages):.1f}"
            if anchor
            else "- | - | - | -"
        )
        print(
            f"{width}x{height} | {texture} | {compute:.3f} | {transfers:.3f} | {wall:.2f} | {cpu_ms:.0f} | "
            f"{cpu_ms / compute:.0f} | {cpu_ms / transfers:.0f} | {cupyx}"
        )

    print("\n# throughput, renders/s (threads each on its own lease of one device)")
    print("size | texture | 1 | 2 | 4 | 8")
    for width, height in sizes[:3]:
        images = photos(width, height)
        for texture in ("fast", "lu"):
            params = PencilParams(texture=texture, tone=TONE)
            rates = [throughput(pool, images, params, n) for n in (1, 2, 4, 8)]
            print(f"{width}x{height} | {texture} | " + " | ".join(f"{r:.0f}" for r in rates))

    print("\n# POST /sketch under load: python bench/pencil.py --e2e --backend cuda (bench/e2e.py)")
