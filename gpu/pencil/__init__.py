"""The pencil-drawing pipeline (Lu, Xu & Jia 2012): parameters, texture, backends."""

from __future__ import annotations

import numpy as np

from gpu.pencil.params import PencilParams


def render(image: np.ndarray, params: PencilParams, backend: str = "cpu", pool=None) -> np.ndarray:
    """Photo -> drawing on the named backend; see `gpu.pencil.reference.render` for shapes.
    backend "cuda" runs on a lease of `pool` (a gpu.pool.DevicePool; default: every GPU)."""
    if backend == "cuda":
        from gpu.pencil import cuda

        return cuda.render(image, params, pool)
    from gpu.pencil import reference

    return reference.render(image, params)


def warm_up(backend: str = "cpu", pool=None) -> None:
    """Build what the first render would otherwise build: the pencil texture tile and,
    on CUDA, the kernels and per-device assets of every device in `pool`."""
    from gpu.pencil.texture import pencil_texture

    pencil_texture()
    if backend == "cuda":
        from gpu.pencil import cuda

        for device in pool.device_ids if pool is not None else [0]:
            cuda.assets(device)
