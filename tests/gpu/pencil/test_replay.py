"""gpu/pencil/replay.py: a drawing captured once as a CUDA graph and replayed frame after
frame gives the bytes render_device gives drawing each frame directly.

CUDA only (marker `gpu`; skipped without a device). Frames: four scikit-image photographs
in turn (colour, or their grey), each with fresh random noise; explicit tone LUTs drawn at
random for each frame; device planes poisoned (NaN / 0xFF) before a kernel writes them.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from pencil_parity import photo

from gpu.backend import cuda_devices
from gpu.pencil.params import PencilParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device"),
]

FRAME_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
PARAMS = {
    "fast": PencilParams(texture="fast"),
    "fast-colour": PencilParams(texture="fast", mode="color"),
    "fast-follow": PencilParams(texture="fast", hatching="follow", stroke_width=3),
    "fast-preset-tone": PencilParams(texture="fast", tone="dark"),
}


def frames(rng: np.random.Generator, grey: bool, height: int = 180, width: int = 320) -> list[np.ndarray]:
    """The clip: FRAME_PHOTOS at (height, width), uint8 RGB or grey, with Gaussian noise of
    3 grey levels drawn from `rng`."""
    clip = []
    for name in FRAME_PHOTOS:
        image = photo(name, height, width)
        if grey:
            image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        noisy = image.astype(np.float32) + rng.normal(0, 3, image.shape)
        clip.append(np.clip(noisy, 0, 255).astype(np.uint8))
    return clip


@pytest.mark.parametrize("grey", [False, True], ids=["rgb", "grey"])
@pytest.mark.parametrize("explicit_tone", [True, False], ids=["lut", "own-tone"])
@pytest.mark.parametrize("name", list(PARAMS))
def test_replayed_frames_are_the_direct_drawings(lease, poison, rng, name, explicit_tone, grey):
    import cupy

    from gpu.pencil import cuda
    from gpu.pencil.replay import ReplayedRender

    params = PARAMS[name]
    clip = frames(rng, grey)
    luts = [np.sort(rng.integers(0, 256, 256)).astype(np.uint8) if explicit_tone else None for _ in clip]
    replay = ReplayedRender(lease, clip[0].shape, params, explicit_tone)
    for index, (image, lut) in enumerate(zip(clip, luts, strict=True)):
        on_device = cupy.asarray(image)
        replayed = cuda.download(lease, replay(on_device, lut))
        direct = cuda.download(lease, cuda.render_device(lease, on_device, params, tone_lut=lut))
        assert direct.std() > 10, f"frame {index}: a flat drawing proves nothing"
        np.testing.assert_array_equal(replayed, direct, err_msg=f"frame {index}")


def test_what_a_replay_refuses(lease, rng):
    import cupy

    from gpu.pencil.replay import ReplayedRender

    with pytest.raises(ValueError, match="lu"):
        ReplayedRender(lease, (90, 160, 3), PencilParams(texture="lu"), explicit_tone=False)
    replay = ReplayedRender(lease, (90, 160, 3), PencilParams(texture="fast"), explicit_tone=True)
    lut = np.arange(256, dtype=np.uint8)
    with pytest.raises(ValueError, match="shape"):
        replay(cupy.asarray(rng.integers(0, 256, (90, 162, 3), dtype=np.uint8)), lut)
    with pytest.raises(ValueError, match="explicit tone"):
        replay(cupy.asarray(rng.integers(0, 256, (90, 160, 3), dtype=np.uint8)), None)
    with pytest.raises(ValueError, match="256 entries"):
        replay(cupy.asarray(rng.integers(0, 256, (90, 160, 3), dtype=np.uint8)), lut[:128])
