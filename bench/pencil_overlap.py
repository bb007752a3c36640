"""Experiment: can the CG of texture "lu" (second stream) overlap the line passes (first
stream)? One variant per process, because the line kernels' blocking is a compile-time
constant:

    python bench/pencil_overlap.py ROWS SIDE_PRIORITY     # e.g. 8 0, 4 0, 4 -5

ROWS: output rows per thread of the line passes (8: 128 registers, no room for a CG block
beside two line blocks; 4: 64 registers, room for one). SIDE_PRIORITY: the CUDA priority
of the lease's second stream (lower is more urgent; 0 = default). Prints the two-stream
render time at 2560x1920 for lu and fast (median of 20, inputs rotated).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import cupy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pencil_cuda import photos

from gpu import kernels
from gpu.pencil import cuda
from gpu.pencil.params import PencilParams
from gpu.pool import CupyRuntime, DevicePool


class PriorityRuntime(CupyRuntime):
    """Lease streams alternate main / side: the side ones get `priority`."""

    def __init__(self, priority: int):
        super().__init__()
        self.priority, self.made = priority, 0

    def new_stream(self, device: int):
        self.made += 1
        with self.cupy.cuda.Device(device):
            return self.cupy.cuda.Stream(non_blocking=True, priority=self.priority if self.made % 2 == 0 else 0)


def main() -> None:
    rows, priority = int(sys.argv[1]), int(sys.argv[2])
    kernels.COMPILE_OPTIONS = (*kernels.COMPILE_OPTIONS, f"-DLINE_ROWS={rows}")
    cuda.LINE_ROWS = rows
    cuda.LINE_TILE_H = cuda.LINE_WARPS * rows
    pool = DevicePool(streams_per_device=1, runtime=PriorityRuntime(priority))
    images = photos(2560, 1920)
    line = [f"rows {rows}, side priority {priority}"]
    for texture in ("lu", "fast"):
        params = PencilParams(texture=texture)
        times = []
        with pool.lease() as lease:
            for image in images:
                cuda.render_on(lease, image, params)
            for i in range(20):
                marks: list = []
                cuda.render_on(lease, images[i % 4], params, marks)
                events = dict(marks)
                times.append(cupy.cuda.get_elapsed_time(events["upload"], events["merge"]))
        line.append(f"{texture} {statistics.median(times):.3f} ms")
    print(" | ".join(line))


if __name__ == "__main__":
    main()
