"""One frame's drawing, on the CPU (gpu.pencil.reference.render) or on a GPU lease
(gpu.pencil.cuda: the RGB frame uploaded through the lease's pinned staging, drawn by
render_device, the drawing downloaded), with an optional explicit tone LUT."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from gpu.pencil import reference
from gpu.pencil.params import PencilParams

log = logging.getLogger("pencil.video")


class Drawer:
    """draw(image, tone_lut) -> drawing for one PencilParams: image (H, W, 3) uint8 RGB at
    its drawing size (max_side already applied); tone_lut None or a (256,) uint8 LUT
    (reference.render's); the drawing (H, W) uint8, or (H, W, 3) uint8 RGB in colour mode.
    `lease`: a gpu.pool.Lease to draw on, or None for the CPU."""

    def __init__(self, params: PencilParams, lease: Any = None):
        self.params, self.lease = params, lease
        self.on_cpu = lease is None  # also once the line kernels prove too large for the GPU passes

    def __call__(self, image: np.ndarray, tone_lut: np.ndarray | None = None) -> np.ndarray:
        if self.on_cpu:
            return reference.render(image, self.params, tone_lut)
        from gpu.pencil import cuda

        try:
            out = cuda.render_device(self.lease, cuda.upload(self.lease, image), self.params, tone_lut=tone_lut)
        except cuda.LineKernelTooLarge as exc:
            log.warning("%s; drawing this clip on the CPU", exc)
            self.on_cpu = True
            return reference.render(image, self.params, tone_lut)
        return cuda.download(self.lease, out)
