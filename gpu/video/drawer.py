"""One frame's drawing in two steps, so that a pipeline can overlap them: `stage` puts the
frame where it is drawn and counts its luma histogram (the steady tone's input), `draw`
draws it with an optional explicit tone LUT.

On a GPU lease (gpu.pencil.cuda), `stage` uploads the RGB frame on a stream of its own
through the lease's pinned staging and counts the histogram on the device (the pipeline's
own luma_histogram kernel: OpenCV's Y of YCrCb, the CPU's values), and `draw` runs
render_device on the lease's streams and downloads the drawing; the two may run on two
threads at once. The drawing is captured as a CUDA graph at the clip's first frame and
replayed for the others (gpu.pencil.replay: one host call a frame instead of ~25, for
texture "fast"; "lu" is drawn directly). On the CPU, `stage` counts the histogram with
OpenCV and `draw` is gpu.pencil.reference.render.

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
        self.on_cpu = lease is None  # also once the line kernels prove too large for the GPU passes
        self.upload_stream: Any = None  # a cupy Stream on a GPU
        self.replays: dict[tuple[tuple[int, ...], bool], Any] = {}  # (shape, explicit tone) -> ReplayedRender or None
        if lease is not None:
            import cupy

            with cupy.cuda.Device(lease.device):
                self.upload_stream = cupy.cuda.Stream(non_blocking=True)

    def stage(self, image: np.ndarray, histogram: bool) -> Staged:
        """The frame uploaded (on a GPU), with its luma histogram when `histogram`."""
        if self.on_cpu:
            return Staged(image, None, luma_histogram(image) if histogram else None)
        import cupy

        from gpu.pencil import cuda

        lease = self.lease
        assert lease is not None, "a drawer off the CPU has a lease"
        with cupy.cuda.Device(lease.device), self.upload_stream as stream:
            on_device = cuda.upload(lease, image, "in", stream)
            counts = cuda.luma_and_histogram(on_device).histogram.get(stream=stream) if histogram else None
            stream.synchronize()  # the pinned staging is free for the next frame, the upload done
        return Staged(image, on_device, None if counts is None else counts.astype(np.int64))

    def draw(self, staged: Staged) -> np.ndarray:
        """The drawing of a staged frame, with its tone_lut."""
        tone_lut = staged.tone_lut
        if self.on_cpu or staged.on_device is None:
            return reference.render(staged.image, self.params, tone_lut)
        from gpu.pencil import cuda

        try:
            out = self._render(staged.on_device, tone_lut)
        except cuda.LineKernelTooLarge as exc:
            log.warning("%s; drawing this clip on the CPU", exc)
            self.on_cpu = True
            return reference.render(staged.image, self.params, tone_lut)
        return cuda.download(self.lease, out)

    def _render(self, image: Any, tone_lut: np.ndarray | None) -> Any:
        """cuda.render_device of a device frame, through a CUDA graph captured at the first
        frame of its shape (gpu.pencil.replay) where REPLAY and the params allow, else
        directly; the drawing is ready in the order of the lease's stream."""
        from gpu.pencil import cuda

        key = (image.shape, tone_lut is not None)
        if key not in self.replays:
            self.replays[key] = self._capture(image.shape, tone_lut is not None)
        replay = self.replays[key]
        if replay is None:
            return cuda.render_device(self.lease, image, self.params, tone_lut=tone_lut)
        return replay(image, tone_lut)

    def _capture(self, shape: tuple[int, ...], explicit_tone: bool) -> Any:
        """A ReplayedRender for frames of `shape`, or None (not replayable, or the capture
        failed: logged, and the clip is drawn directly)."""
        import cupy

        from gpu.pencil import cuda
        from gpu.pencil.replay import ReplayedRender

        if not REPLAY or not ReplayedRender.supports(self.params):
            return None
        try:
            return ReplayedRender(self.lease, shape, self.params, explicit_tone)
        except (cuda.LineKernelTooLarge, cupy.cuda.memory.OutOfMemoryError):
            raise  # the CPU fallback, and the pool's free-and-retry
        except Exception as exc:  # a driver or CuPy that cannot capture this drawing
            log.warning("the drawing could not be captured as a CUDA graph (%s); drawing each frame directly", exc)
            return None

    def __call__(self, image: np.ndarray, tone_lut: np.ndarray | None = None) -> np.ndarray:
        """One frame staged and drawn at once, with `tone_lut` (None: its own tone)."""
        staged = self.stage(image, histogram=False)
        staged.tone_lut = tone_lut
        return self.draw(staged)
