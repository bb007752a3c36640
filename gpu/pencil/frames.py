"""A clip's frames drawn on one GPU lease, in two steps that a pipeline may overlap on two
threads: `upload` puts a frame on the device on a stream of its own, through the lease's
pinned staging, and counts its luma histogram there (the pipeline's own luma_histogram
kernel: OpenCV's Y of YCrCb, the CPU's values); `draw` runs render_device on the lease's
streams, with an optional explicit tone LUT, and downloads the drawing.

The drawing is captured as a CUDA graph at the first frame of each shape and replayed for
the others (gpu/pencil/replay.py: one host call a frame instead of ~25, for texture
"fast"; "lu" is drawn directly).
"""

from __future__ import annotations

import logging
from typing import Any

import cupy
import numpy as np

from gpu.pencil import cuda
from gpu.pencil.params import LineKernelTooLarge, PencilParams
from gpu.pencil.replay import ReplayedRender
from gpu.pool import Lease

log = logging.getLogger("pencil.video")


class DeviceFrames:
    """Frames drawn with `params` on `lease`; `replay`: through CUDA graphs where the params
    allow. Images: (H, W, 3) uint8 RGB; drawings (H, W) uint8, or (H, W, 3) in colour mode."""

    def __init__(self, lease: Lease, params: PencilParams, replay: bool = True):
        self.lease, self.params, self.replay = lease, params, replay
        self.replays: dict[tuple[tuple[int, ...], bool], Any] = {}  # (shape, explicit tone) -> ReplayedRender or None
        with cupy.cuda.Device(lease.device):
            self.upload_stream = cupy.cuda.Stream(non_blocking=True)

    def upload(self, image: np.ndarray, histogram: bool) -> tuple[Any, np.ndarray | None]:
        """The frame on the device, and its (256,) int64 luma counts when `histogram`."""
        with cupy.cuda.Device(self.lease.device), self.upload_stream as stream:
            on_device = cuda.upload(self.lease, image, "in", stream)
            counts = cuda.luma_and_histogram(on_device).histogram.get(stream=stream) if histogram else None
            stream.synchronize()  # the pinned staging is free for the next frame, the upload done
        return on_device, None if counts is None else counts.astype(np.int64)

    def draw(self, on_device: Any, tone_lut: np.ndarray | None) -> np.ndarray:
        """The drawing of an uploaded frame, on the host. LineKernelTooLarge when the line
        kernels of these params do not fit this frame (the caller draws it on the CPU)."""
        key = (on_device.shape, tone_lut is not None)
        if key not in self.replays:
            self.replays[key] = self._capture(on_device.shape, tone_lut is not None)
        replay = self.replays[key]
        if replay is None:
            out = cuda.render_device(self.lease, on_device, self.params, tone_lut=tone_lut)
        else:
            out = replay(on_device, tone_lut)
        return cuda.download(self.lease, out)

    def _capture(self, shape: tuple[int, ...], explicit_tone: bool) -> Any:
        """A ReplayedRender for frames of `shape`, or None (not replayable, or the capture
        failed: logged, and the clip is drawn directly)."""
        if not self.replay or not ReplayedRender.supports(self.params):
            return None
        try:
            return ReplayedRender(self.lease, shape, self.params, explicit_tone)
        except (LineKernelTooLarge, cupy.cuda.memory.OutOfMemoryError):
            raise  # the CPU fallback, and the pool's free-and-retry
        except Exception as exc:  # a driver or CuPy that cannot capture this drawing
            log.warning("the drawing could not be captured as a CUDA graph (%s); drawing each frame directly", exc)
            return None
