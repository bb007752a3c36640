"""Benchmark of the pencil pipeline with its anchors measured in the same run.

    python bench/pencil.py [--sizes 640x480,1920x1080] [--repeats 3]            # CPU backend
    python bench/pencil.py --backend cuda [--sizes ...]                         # GPU backend
    python bench/pencil.py --e2e [--backend cuda] [bench/e2e.py's options]      # POST /sketch under load

CPU: the reference against OpenCV's `cv2.pencilSketch` (the CPU peer: a domain-transform
pencil filter) and the stroke branch written with 16 direct `cv2.filter2D` line
convolutions (the obvious version of stages 3-5); then a per-stage split.

CUDA: per-stage GPU times (CUDA events, branches serialised), the whole render (two
streams) compute only and with transfers, for texture fast and lu; the same stages
written the obvious CuPy way (cupyx.scipy.ndimage median_filter and convolve with the
dense line kernels) and the CPU reference as anchors, with ratios; renders per second
with 1, 2, 4, 8 concurrent leases. Inputs rotate among 4 real photos; medians after a
warm-up. Times drift between machines: read the ratios.

--e2e (either backend): bench/e2e.py, the server under load from bench/loadgen.py with
cv2.pencilSketch on all cores as the anchor; every other option is e2e.py's.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import cv2
import numpy as np
import skimage.data

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import median_ms

from gpu.pencil import reference as ref
from gpu.pencil.params import PencilParams


def photo(width: int, height: int) -> np.ndarray:
    """A real photograph (scikit-image's astronaut), resized to width x height, RGB uint8."""
    return cv2.resize(skimage.data.astronaut(), (width, height), interpolation=cv2.INTER_CUBIC)


def strokes_direct(luma_u8: np.ndarray, params: PencilParams) -> np.ndarray:
    """Stages 1-5 with 16 direct filter2D convolutions: the obvious version."""
    height, width = luma_u8.shape
    length = params.line_length(height, width)
    magnitude = ref.gradient(ref.median3(luma_u8))
    thin, wide = ref.line_kernels(length, 0), ref.line_kernels(length, params.stroke_width)
    responses = np.stack([ref.correlate(magnitude, k) for k in thin])
    label = responses.argmax(axis=0)
    strokes = sum(ref.correlate(np.where(label == i, magnitude, 0).astype(np.float32), wide[i]) for i in range(8))
    return 1 - (strokes - strokes.min()) / (strokes.max() - strokes.min())


def strokes_fft(luma_u8: np.ndarray, params: PencilParams) -> np.ndarray:
    height, width = luma_u8.shape
    length = params.line_length(height, width)
    magnitude = ref.gradient(ref.median3(luma_u8))
    label = ref.classify(magnitude, ref.LineFilter(height, width, length, 0))
    return ref.stroke_map(
        magnitude, label, ref.LineFilter(height, width, length, params.stroke_width), params.stroke_gamma
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--sizes", default=None, help="WxH,... (default: per backend)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed runs per figure (default: 3 on the CPU, 30 on the GPU)"
    )
    parser.add_argument(
        "--e2e",
        action="store_true",
        help="load-test POST /sketch on a local server instead (bench/e2e.py; --e2e --help lists its options)",
    )
    if "--e2e" in sys.argv[1:]:
        import e2e  # beside this script

        e2e.main([arg for arg in sys.argv[1:] if arg != "--e2e"])
        return
    args = parser.parse_args()
    if args.backend == "cuda":
        import pencil_cuda  # beside this script: the GPU half of the benchmark

        pencil_cuda.main(args)
        return
    sizes = [
        tuple(int(v) for v in s.split("x")) for s in (args.sizes or "640x480,1280x720,1920x1080,2560x1920").split(",")
    ]
    args.repeats = args.repeats or 3
    params, fast = PencilParams(), PencilParams(texture="fast")

    print(
        f"# pencil CPU benchmark: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, OpenCV "
        f"{cv2.__version__} ({cv2.getNumThreads()} threads), NumPy {np.__version__}"
    )
    print(f"# median of {args.repeats} after a warm-up; ratio = ours / anchor (below 1: ours is faster)")
    header = (
        f"{'size':>10} | {'render lu ms':>12} | {'render fast ms':>14} | {'cv2.pencilSketch ms':>19} | "
        f"{'lu / pencilSketch':>17} | {'strokes fft ms':>14} | {'strokes direct ms':>17} | {'fft / direct':>12}"
    )
    print(header)
    print("-" * len(header))
    for width, height in sizes:
        image = photo(width, height)
        luma = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        t_lu = median_ms(lambda image=image: ref.render(image, params), args.repeats)
        t_fast = median_ms(lambda image=image: ref.render(image, fast), args.repeats)
        t_cv = median_ms(lambda image=image: cv2.pencilSketch(cv2.cvtColor(image, cv2.COLOR_RGB2BGR)), args.repeats)
        t_fft = median_ms(lambda luma=luma: strokes_fft(luma, params), args.repeats)
        t_direct = median_ms(lambda luma=luma: strokes_direct(luma, params), args.repeats)
        print(
            f"{width:>5}x{height:<4} | {t_lu:12.0f} | {t_fast:14.0f} | {t_cv:19.0f} | {t_lu / t_cv:17.2f} | "
            f"{t_fft:14.0f} | {t_direct:17.0f} | {t_fft / t_direct:12.2f}"
        )

    width, height = sizes[-1]
    image = photo(width, height)
    luma, _ = ref.split_luma(image)
    length = params.line_length(height, width)
    stages = {}

    def stage(name, fn):
        stages[name] = median_ms(fn, args.repeats)
        return fn()

    smooth = stage("1 median 3x3", lambda: ref.median3(luma))
    magnitude = stage("2 gradient", lambda: ref.gradient(smooth))
    label = stage(
        "3-4 responses + argmax (FFT)", lambda: ref.classify(magnitude, ref.LineFilter(height, width, length, 0))
    )
    stage("5 stroke map (FFT)", lambda: ref.stroke_map(magnitude, label, ref.LineFilter(height, width, length, 1), 1.0))
    tone = stage("6-8 histogram, LUT, blur", lambda: ref.tone_map(luma, params))
    stage("9 texture lu (CG)", lambda: ref.texture_rendering(tone, "lu"))
    stage("9 texture fast", lambda: ref.texture_rendering(tone, "fast"))
    log_texture = np.log(ref.texture_for(height, width))
    _, iterations = ref.solve_beta_lu(log_texture, np.log(np.maximum(tone, ref.TONE_FLOOR)))
    print(f"\n# stages at {width}x{height} (line length {length} px, CG {iterations} iterations)")
    for name, ms in stages.items():
        print(f"{name:>30} | {ms:8.1f} ms")


if __name__ == "__main__":
    main()
