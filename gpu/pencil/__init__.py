"""The pencil-drawing pipeline (Lu, Xu & Jia 2012): parameters, texture, backends."""

from __future__ import annotations

import numpy as np

from gpu.pencil.params import PencilParams


def render(image: np.ndarray, params: PencilParams, backend: str = "cpu") -> np.ndarray:
    """Photo -> drawing on the named backend; see `gpu.pencil.reference.render` for shapes."""
    if backend == "cuda":
        from gpu.pencil import cuda

        return cuda.render(image, params)
    from gpu.pencil import reference

    return reference.render(image, params)


def warm_up() -> None:
    """Build what the first render would otherwise build (the pencil texture tile), so
    the first request is not slower than the rest."""
    from gpu.pencil.texture import pencil_texture

    pencil_texture()
