"""The pencil-drawing pipeline (Lu, Xu & Jia 2012): parameters, texture, backends.

Front door: `render` (pixels in, pixels out), `draw_bytes` (an uploaded file in, an
encoded drawing out, on the cheapest codec path: gpu/pencil/draw.py), `frames_on` (a
clip's frames on one GPU lease, for gpu/video) and `warm_up`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from gpu.pencil.params import LineKernelTooLarge, PencilParams

if TYPE_CHECKING:  # draw.py imports the codecs, which import gpu.pencil.params: no cycle at run time
    from gpu.pencil.draw import Drawing
    from gpu.pencil.frames import DeviceFrames
    from gpu.pool import Lease

__all__ = ["LineKernelTooLarge", "draw_bytes", "frames_on", "render", "warm_up"]

log = logging.getLogger("pencil")

# Photo sizes whose line tables warm_up builds on every device (width, height): the
# common camera and screen sizes (a table depends on the shorter side only, so either
# orientation). Any other size builds its tables (a few ms) on its first render.
WARM_SIZES = (
    (640, 480),
    (800, 600),
    (1024, 768),
    (1280, 720),
    (1280, 960),
    (1600, 1200),
    (1920, 1080),
    (2048, 1536),
    (2560, 1440),
    (2560, 1920),
    (3840, 2160),
    (4032, 3024),
)


def render(image: np.ndarray, params: PencilParams, backend: str = "cpu", pool=None) -> np.ndarray:
    """Photo -> drawing on the named backend; see `gpu.pencil.reference.render` for shapes.
    backend "cuda" runs on a lease of `pool` (a gpu.pool.DevicePool; default: every GPU)."""
    if backend == "cuda":
        from gpu.pencil import cuda

        return cuda.render(image, params, pool)
    from gpu.pencil import reference

    return reference.render(image, params)


def frames_on(lease: Lease, params: PencilParams, replay: bool = True) -> DeviceFrames:
    """A clip's frames drawn on `lease`: upload (with the luma histogram) and draw (with an
    optional tone LUT), through CUDA graphs where `replay` and the params allow; see
    gpu/pencil/frames.py."""
    from gpu.pencil.frames import DeviceFrames

    return DeviceFrames(lease, params, replay)


def draw_bytes(
    data: bytes, photo, params: PencilParams, fmt: str, quality: int, backend: str = "cpu", pool=None
) -> Drawing:
    """An uploaded photo -> its encoded drawing; see gpu.pencil.draw.draw_bytes."""
    from gpu.pencil import draw

    return draw.draw_bytes(data, photo, params, fmt, quality, backend, pool)


def warm_up(backend: str = "cpu", pool=None) -> None:
    """Build what a first request would otherwise pay for: the pencil texture tile and,
    on CUDA, on every lease of `pool`: the kernels, the device assets, the line tables of
    the default options at WARM_SIZES, the device JPEG codecs, the pinned staging and a
    first render of each texture mode (CuPy's memory pool and launch caches)."""
    from gpu.pencil.texture import pencil_texture

    started = time.perf_counter()
    pencil_texture()
    if backend != "cuda":
        return
    from gpu.codec import nvjpeg
    from gpu.pencil import cuda
    from gpu.pool import default_pool

    pool = pool or default_pool()
    defaults = PencilParams()
    lengths = {defaults.line_length(height, width) for width, height in WARM_SIZES}
    phases: dict[str, float] = {}  # seconds of each step, logged: where a start goes
    mark = started

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name], mark = now - mark, now

    phase("texture")
    for device in pool.device_ids:
        device_assets = cuda.assets(device)  # loads the kernels
        for length in lengths:
            device_assets.line_plan(length, 0)
            device_assets.line_plan(length, defaults.stroke_width)
    phase("kernels and line tables")
    sample = np.zeros((1080, 1920, 3), np.uint8)
    sample[::7] = 200  # edges and tone for every stage to work on
    for lease in pool.leases():
        nvjpeg.warm(lease)
    phase("device codecs")
    for lease in pool.leases():
        for texture in ("lu", "fast"):
            cuda.render_on(lease, sample, PencilParams(texture=texture))
    phase("first renders")
    log.info(
        "warmed up in %.2f s (%s)",
        time.perf_counter() - started,
        ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items()),
    )
