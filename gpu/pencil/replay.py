"""The drawing of one frame size and PencilParams, captured once as a CUDA graph and replayed
for every frame of a clip: one host call a frame where render_device makes ~25 (kernel
launches, allocations, events, the tone LUT's upload).

Why: a video job's threads (decode, conversion, staging, drawing, encoding) share one
Python GIL, and render_device's many CuPy calls made the drawing thread the largest
holder of it (docs/video.md, "How it runs").

A graph fixes at capture everything but the data: the frame's size, the params, whether
the tone LUT is explicit, and every device address. So the frame is copied into the
graph's own input (`frame`) before each replay, an explicit tone LUT is written into the
pinned staging buffer the captured copy reads, and the drawing lands in the same output
each time (the caller downloads it before the next replay). The temporaries render_device
allocates come from a memory pool of the replay's own that nothing else allocates from, so
what render_device frees while it is captured stays where the graph reads and writes it
(one frame's temporaries, some tens of MB at 1280x720, held until the replay is dropped).
The device caches the graph reads (texture, tone tables, line tables) come from CuPy's
default pool whatever the allocator (cuda._upload_shared), and the replay keeps its line
plans referenced: the caches' LRU may drop them, the graph may not.

Not for texture "lu": its CG loop reads the residual on the host every few iterations,
which a graph cannot do.
"""

from __future__ import annotations

import cupy
import numpy as np

from gpu import kernels
from gpu.pencil import cuda
from gpu.pencil.params import PencilParams


class ReplayedRender:
    """render_device for frames of `shape` ((H, W, 3) or (H, W) uint8) and `params` on
    `lease` (a gpu.pool.Lease), with an explicit tone LUT each frame when `explicit_tone`.
    Calling it queues the drawing of a frame on lease.stream (see __call__). Raises
    ValueError for texture "lu" and whatever the capture raises (then draw directly)."""

    def __init__(self, lease, shape: tuple[int, ...], params: PencilParams, explicit_tone: bool):
        if not self.supports(params):
            raise ValueError('texture "lu" cannot be replayed: its CG loop synchronises with the host')
        self.lease, self.shape, self.explicit_tone = lease, tuple(shape), explicit_tone
        self.memory = cupy.cuda.MemoryPool()
        stream = lease.stream
        lut = np.arange(256, dtype=np.uint8) if explicit_tone else None
        with cupy.cuda.Device(lease.device), stream, cupy.cuda.using_allocator(self.memory.malloc):
            self.frame = cupy.zeros(self.shape, cupy.uint8)
            # One direct drawing first: it builds any device cache still missing and leaves
            # in this pool the blocks the captured drawing then takes.
            cuda.render_device(lease, self.frame, params, tone_lut=lut)
            stream.synchronize()
            device_assets = cuda.assets(lease.device)
            length = params.line_length(self.shape[0], self.shape[1])
            self._line_plans = [device_assets.line_plan(length, width) for width in (0, params.stroke_width)]
            self.graph, self.out = kernels.capture(
                lambda: cuda.render_device(lease, self.frame, params, tone_lut=lut), stream
            )
        # the buffer cuda.upload_tone_lut filled while captured: its address is in the graph
        self.tone_staging = lease.staging("tone", 256) if explicit_tone else None

    @staticmethod
    def supports(params: PencilParams) -> bool:
        return params.texture != "lu"

    def __call__(self, image: cupy.ndarray, tone_lut: np.ndarray | None = None) -> cupy.ndarray:
        """Queue the drawing of `image` (a C-contiguous uint8 device array of `shape`, ready
        for lease.stream) on lease.stream, with `tone_lut` ((256,) uint8, given exactly when
        explicit_tone); returns the drawing's device array, ready in the order of
        lease.stream. The next call overwrites the drawing, and the LUT's pinned staging
        (written by the host at once): the caller must have waited for this drawing
        (downloaded it) before the next call."""
        if image.shape != self.shape or image.dtype != cupy.uint8 or not image.flags.c_contiguous:
            raise ValueError(
                f"this replay draws C-contiguous uint8 frames of shape {self.shape}, got {image.dtype} {image.shape}"
            )
        if (tone_lut is not None) != self.explicit_tone:
            raise ValueError("a replay captured with an explicit tone LUT takes one every frame, and only then")
        lut = None
        if tone_lut is not None:
            lut = np.asarray(tone_lut, np.uint8)
            if lut.shape != (256,):
                raise ValueError(f"a tone LUT has 256 entries, got shape {lut.shape}")
        stream = self.lease.stream
        with cupy.cuda.Device(self.lease.device):
            self.frame.data.copy_from_device_async(image.data, self.frame.nbytes, stream)
            if self.tone_staging is not None:
                self.tone_staging[:] = lut
            self.graph.launch(stream)
        return self.out
