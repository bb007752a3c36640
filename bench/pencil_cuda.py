"""The GPU half of bench/pencil.py (run it as `python bench/pencil.py --backend cuda`).

Prints, per size and texture mode: per-stage GPU times, the whole render (compute only,
with transfers, host wall), the cupyx anchor of the same stages and the CPU reference,
with ratios; then renders per second with 1, 2, 4, 8 concurrent leases. Also prints the
measured device-to-device copy bandwidth, the floor the byte counts are read against.
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

from timing import device_median_ms

from gpu.pencil import cuda
from gpu.pencil import reference as ref
from gpu.pencil.params import PencilParams
from gpu.pool import DevicePool

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
DEFAULT_SIZES = "1024x768,1920x1080,2560x1920,4096x3072"


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
    """The same stages written the obvious CuPy way; ms per part (CUDA events, one run
    after a warm-up: the dense convolutions are slow)."""
    height, width = image.shape[:2]
    length = params.line_length(height, width)
    thin = cupy.asarray(ref.line_kernels(length, 0))
    wide = cupy.asarray(ref.line_kernels(length, params.stroke_width))
    luma_host, _ = ref.split_luma(image)

    def strokes():
        luma = cupy.asarray(luma_host)
        smooth = ndimage.median_filter(luma, size=3, mode="nearest").astype(cupy.float32) / 255
        magnitude = cupy.zeros_like(smooth)
        magnitude[:, :-1] += cupy.abs(cupy.diff(smooth, axis=1))
        magnitude[:-1, :] += cupy.abs(cupy.diff(smooth, axis=0))
        responses = cupy.stack([ndimage.convolve(magnitude, k, mode="constant") for k in thin])
        label = responses.argmax(axis=0)
        s = sum(ndimage.convolve(cupy.where(label == i, magnitude, 0), wide[i], mode="constant") for i in range(8))
        return 1 - (s - s.min()) / (s.max() - s.min())

    def tone():
        luma = cupy.asarray(luma_host)
        counts = cupy.bincount(luma.ravel(), minlength=256)
        source = cupy.cumsum(counts) / counts.sum()
        target = cupy.asarray(np.cumsum(ref.target_histogram(params.tone_weights)))
        lut = cupy.clip(cupy.searchsorted(target, source - 1e-12), 0, 255).astype(cupy.uint8)
        matched = lut[luma].astype(cupy.float32) / 255
        blur = params.tone_blur_size(height, width)
        j = ndimage.uniform_filter(matched, size=blur, mode="nearest")
        texture = cupy.asarray(ref.texture_for(height, width))
        return texture ** (1 - j)

    return {"strokes": device_median_ms(strokes, 1), "tone+fast texture": device_median_ms(tone, 1)}


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
        f"warm-up; inputs rotate among {len(PHOTOS)} photos"
    )
    pool = DevicePool(streams_per_device=8)
    rows = []
    for width, height in sizes:
        images = photos(width, height)
        for texture in ("fast", "lu"):
            params = PencilParams(texture=texture)
            with pool.lease() as lease:
                stages, compute, transfers, wall = gpu_stage_times(lease, images, params, repeats)
            anchor = cupyx_anchor(images[0], params) if texture == "fast" else None
            start = time.perf_counter()
            ref.render(images[0], params)
            cpu_ms = (time.perf_counter() - start) * 1000
            rows.append((width, height, texture, stages, compute, transfers, wall, anchor, cpu_ms))
            stroke_ms = stages["median+gradient"] + stages["responses+argmax"] + stages["stroke map"]
            print(f"\n## {width}x{height} texture={texture} (line length {params.line_length(height, width)} px)")
            print("stage | GPU ms")
            for stage, ms in stages.items():
                print(f"{stage} | {ms:.3f}")
            print(f"render compute (2 streams) | {compute:.3f}")
            print(f"render with transfers | {transfers:.3f}")
            print(f"render host wall | {wall:.3f}")
            print(f"CPU reference | {cpu_ms:.0f}  (x{cpu_ms / compute:.0f} ours compute)")
            if anchor:
                print(
                    f"cupyx stroke stages | {anchor['strokes']:.1f}  (x{anchor['strokes'] / stroke_ms:.0f} "
                    "ours stroke stages)"
                )
                print(
                    f"cupyx tone + fast texture | {anchor['tone+fast texture']:.2f}  "
                    f"(x{anchor['tone+fast texture'] / stages['tone']:.1f} ours tone)"
                )

    print("\n# summary: ms (compute | with transfers | host wall); ratios are anchor / ours")
    print("size | texture | compute | +transfers | wall | CPU ref | CPU/ours | cupyx strokes | cupyx/ours strokes")
    for width, height, texture, stages, compute, transfers, wall, anchor, cpu_ms in rows:
        stroke_ms = stages["median+gradient"] + stages["responses+argmax"] + stages["stroke map"]
        cupyx = f"{anchor['strokes']:.1f} | {anchor['strokes'] / stroke_ms:.0f}" if anchor else "- | -"
        print(
            f"{width}x{height} | {texture} | {compute:.3f} | {transfers:.3f} | {wall:.2f} | {cpu_ms:.0f} | "
            f"{cpu_ms / compute:.0f} | {cupyx}"
        )

    print("\n# throughput, renders/s (threads each on its own lease of one device)")
    print("size | texture | 1 | 2 | 4 | 8")
    for width, height in sizes[:3]:
        images = photos(width, height)
        for texture in ("fast", "lu"):
            params = PencilParams(texture=texture)
            rates = [throughput(pool, images, params, n) for n in (1, 2, 4, 8)]
            print(f"{width}x{height} | {texture} | " + " | ".join(f"{r:.0f}" for r in rates))

    print("\n# POST /sketch under load: python bench/pencil.py --e2e --backend cuda (bench/e2e.py)")
