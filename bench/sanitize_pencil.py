"""One small render of every kernel path, for compute-sanitizer (memcheck, racecheck):

    compute-sanitizer --tool memcheck python bench/sanitize_pencil.py

Both texture modes, gray and colour, a gray photo, a 1-px strip, and the untiled line
passes. Prints one line per render; the sanitizer prints its own summary.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import skimage.data

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu.pencil import cuda
from gpu.pencil.params import PencilParams
from gpu.pool import DevicePool


def main() -> None:
    pool = DevicePool(streams_per_device=2)
    color = cv2.resize(skimage.data.astronaut(), (131, 97), interpolation=cv2.INTER_AREA)
    gray = cv2.resize(skimage.data.camera(), (75, 64), interpolation=cv2.INTER_AREA)
    strip = color[:1, :, :]
    cases = [
        (color, PencilParams(texture="fast", mode="color")),
        (color, PencilParams(texture="lu")),
        (gray, PencilParams(texture="lu", mode="color", stroke_width=3)),
        (strip, PencilParams(texture="fast")),
    ]
    for untiled in (False, True):
        cuda.FORCE_UNTILED_LINE_PASSES = untiled
        for image, params in cases:
            drawing = pool.run(lambda lease, image=image, params=params: cuda.render_on(lease, image, params))
            print(
                f"untiled={untiled} {image.shape} {params.texture}/{params.mode}: {drawing.shape} mean "
                f"{drawing.mean():.1f}"
            )


if __name__ == "__main__":
    main()
