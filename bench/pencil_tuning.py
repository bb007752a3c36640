"""Tuning experiments for the GPU pencil pipeline, kept with their results in
BENCHMARKS.md: the line passes' register blocking (rows x columns per thread, warps
per block) and the conjugate gradient's time per iteration.

    python bench/pencil_tuning.py [--sizes 2560x1920,4096x3072]

Every variant must give the same bits as the shipped one (same taps, same order per
pixel); the script checks that before it reports a time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy
import cv2
import numpy as np
import skimage.data

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import device_median_ms

from gpu import kernels
from gpu.pencil import cuda, reference
from gpu.pencil.params import PencilParams

VARIANTS = [(8, 3, 8, ()), (4, 3, 8, ()), (4, 5, 8, ()), (8, 5, 8, ()), (2, 3, 8, ())]  # (rows, cols, warps, options)


def line_variant(luma, length, rows, cols, warps, extra=()):
    """(pass 1 ms, pass 2 ms, label, strokes) with rows x cols px per thread, warps per block."""
    source = cuda.SOURCE.read_text()
    module = cupy.RawModule(
        code=source,
        options=(
            *kernels.COMPILE_OPTIONS,
            f"-DLINE_ROWS={rows}",
            f"-DLINE_COLS={cols}",
            f"-DLINE_WARPS={warps}",
            *extra,
        ),
    )
    height, width = luma.shape
    tile_w, tile_h = 32 * cols, warps * rows
    assets = cuda.assets(cupy.cuda.Device().id)
    thin, wide = assets.line_plan(length, 0), assets.line_plan(length, 1)
    halo = thin.halo
    pitch, padded_rows = -(-width // tile_w) * tile_w + 2 * halo, -(-height // tile_h) * tile_h + 2 * halo
    magnitude = cupy.empty((padded_rows, pitch), cupy.float32)
    cuda._k("median_gradient")(
        (-(-pitch // 32), -(-padded_rows // 8)),
        (32, 8),
        (luma, np.int32(height), np.int32(width), magnitude, np.int32(pitch), np.int32(padded_rows), np.int32(halo)),
    )
    label = cupy.empty((height, width), cupy.uint8)
    packed = cupy.zeros_like(magnitude)
    strokes = cupy.empty((height, width), cupy.float32)
    extrema = cupy.zeros(2, cupy.uint32)
    grid = (-(-width // tile_w), -(-height // tile_h))
    factor = np.float32(1 + reference.LABEL_MARGIN)
    null = np.uint64(0)

    def run(name, plan, src, lab, pk, st, ex, prefix=True):
        table = plan.tiled if prefix else plan.untiled
        shared = (tile_w + 2 * halo) * (tile_h + 2 * halo) * 4 + (table.runs + table.terms) * 12 + table.weights * 4
        kernel = module.get_function(name)
        kernel.max_dynamic_shared_size_bytes = kernels.max_shared_bytes() - kernel.shared_size_bytes
        args = (
            src,
            np.int32(pitch),
            np.int32(halo),
            np.int32(height),
            np.int32(width),
            table.table,
            lab,
            pk,
            st,
            ex,
            factor,
        )
        return lambda: kernel(grid, (32, warps), args, shared_mem=shared)

    first = run("line_label_tiled", thin, magnitude, label, packed, null, null)
    second = run("line_strokes_tiled", wide, packed, null, null, strokes, extrema)
    t1_runs = device_median_ms(run("line_label_tiled", thin, magnitude, label, packed, null, null, prefix=False), 20)
    t2_runs = device_median_ms(run("line_strokes_tiled", wide, packed, null, null, strokes, extrema, prefix=False), 20)
    t1 = device_median_ms(first, 20)
    t2 = device_median_ms(second, 20)
    return t1, t2, t1_runs, t2_runs, label.get(), strokes.get()


def cg_timing(luma, params):
    planes = cuda.luma_and_histogram(cupy.asarray(luma))
    assets = cuda.assets(cupy.cuda.Device().id)
    _, log_j, _ = cuda.tone(
        planes, assets.target_cdf(params.tone_weights), params.tone_blur_size(*luma.shape), 1.0, True
    )
    staging = cupy.cuda.alloc_pinned_memory(8)
    flag = np.frombuffer(staging, np.uint8, 8)
    result = {}

    def solve():
        result["beta"], result["scalars"] = cuda.solve_beta(log_j, assets, flag)

    ms = device_median_ms(solve, 10)
    iterations = int(result["scalars"].get()[6])
    return ms, iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2560x1920,4096x3072")
    args = parser.parse_args()
    print(f"# {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    for size in args.sizes.split(","):
        width, height = (int(v) for v in size.split("x"))
        image = cv2.resize(skimage.data.astronaut(), (width, height), interpolation=cv2.INTER_CUBIC)
        luma, _ = reference.split_luma(image)
        length = PencilParams().line_length(height, width)
        print(f"\n## {width}x{height}, line length {length}: line passes, ms (median of 20)")
        print("rows x cols x warps | pass 1 | pass 2 | same bits | pass 1, runs only | pass 2, runs only")
        baseline = None
        for rows, cols, warps, extra in VARIANTS:
            try:
                t1, t2, t1_runs, t2_runs, label, strokes = line_variant(
                    cupy.asarray(luma), length, rows, cols, warps, extra
                )
            except cupy.cuda.driver.CUDADriverError as exc:
                print(f"{rows} x {cols} x {warps} {' '.join(extra)} | failed: {exc}")
                continue
            baseline = baseline or (label, strokes)
            same = np.array_equal(label, baseline[0]) and np.array_equal(strokes, baseline[1])
            print(
                f"{rows} x {cols} x {warps} {' '.join(extra)} | {t1:.3f} | {t2:.3f} | {same} | {t1_runs:.3f} | "
                f"{t2_runs:.3f}"
            )
        ms, iterations = cg_timing(luma, PencilParams())
        print(
            f"CG (texture lu): {ms:.3f} ms, {iterations} iterations, {1000 * ms / max(iterations, 1):.1f} us "
            "per iteration"
        )


if __name__ == "__main__":
    main()
