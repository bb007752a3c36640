"""One frame's drawing in two steps, so that a pipeline can overlap them: `stage` puts the
frame where it is drawn and counts its luma histogram (the steady tone's input), `draw`
draws it with an optional explicit tone LUT.

On a GPU lease both go through the pencil pipeline's frames (gpu.pencil.frames_on: the
upload and the histogram on the device, the drawing through a CUDA graph replayed frame
after frame); the two may run on two threads at once. On the CPU, `stage` counts the
histogram with OpenCV and `draw` is gpu.pencil.reference.render. A frame whose line
kernels do not fit the GPU is drawn on the CPU, and so is the rest of the clip.

On a GPU the histogram is counted on the device because on the host it costs about a
millisecond a frame and does not scale over threads (BENCHMARKS.md, "Figures behind
choices in the code"); render_device then computes the luma plane again, so that it stays
the one entry for every caller.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu import pencil
from gpu.pencil import reference
from gpu.pencil.params import PencilParams
from gpu.pool import Lease
from gpu.video.temporal import luma_histogram

log = logging.getLogger("pencil.video")
REPLAY = True  # draw through a CUDA graph a clip (gpu.pencil.replay) where the params allow


@dataclass
class Staged:
    """A frame ready to draw: image, the (H, W, 3) uint8 RGB frame on the host; on_device,
    the same on the lease's device (a cupy array, uploaded) or None on the CPU; histogram,
    its (256,) int64 luma counts when asked for, else None; tone_lut, the (256,) uint8
    LUT to draw it with (reference.render's), or None for its own tone matching."""

    image: np.ndarray
    on_device: Any = None
    histogram: np.ndarray | None = None
    tone_lut: np.ndarray | None = None


class Drawer:
    """Frames drawn for one PencilParams, on `lease` (a gpu.pool.Lease) or, with None, on
    the CPU. `stage(image, histogram)` then `draw(staged)`; each of the two is called from
    one thread at a time (two threads: one each). Images: (H, W, 3) uint8 RGB at their
    drawing size (max_side already applied); drawings: (H, W) uint8, or (H, W, 3) uint8
    RGB in colour mode."""

    def __init__(self, params: PencilParams, lease: Lease | None = None):
        self.params, self.lease = params, lease
        self.on_cpu = lease is None
        self.frames = None if lease is None else pencil.frames_on(lease, params, REPLAY)

    def stage(self, image: np.ndarray, histogram: bool) -> Staged:
        """The frame uploaded (on a GPU), with its luma histogram when `histogram`."""
        if self.frames is None or self.on_cpu:
            return Staged(image, None, luma_histogram(image) if histogram else None)
        on_device, counts = self.frames.upload(image, histogram)
        return Staged(image, on_device, counts)

    def draw(self, staged: Staged) -> np.ndarray:
        """The drawing of a staged frame, with its tone_lut."""
        tone_lut = staged.tone_lut
        if self.frames is None or self.on_cpu or staged.on_device is None:
            return reference.render(staged.image, self.params, tone_lut)
        try:
            return self.frames.draw(staged.on_device, tone_lut)
        except pencil.LineKernelTooLarge as exc:
            log.warning("%s; drawing this clip on the CPU", exc)
            self.on_cpu = True
            return reference.render(staged.image, self.params, tone_lut)

    def __call__(self, image: np.ndarray, tone_lut: np.ndarray | None = None) -> np.ndarray:
        """One frame staged and drawn at once, with `tone_lut` (None: its own tone)."""
        staged = self.stage(image, histogram=False)
        staged.tone_lut = tone_lut
        return self.draw(staged)
