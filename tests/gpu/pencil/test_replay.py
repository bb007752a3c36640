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


def test_the_device_caches_stay_outside_the_replays_pool(lease, monkeypatch):
    """The first drawing of a process builds the device caches (texture, tone tables, line
    tables): built by a replay, they must not come from its pool, which dies with it while
    the caches live on. The pool holds the graph's input and output, nothing else in use."""
    from gpu.pencil import cuda
    from gpu.pencil.replay import ReplayedRender

    monkeypatch.setattr(cuda, "_assets", {})  # as in a fresh process
    replay = ReplayedRender(lease, (120, 200, 3), PencilParams(texture="fast", tone="dark"), explicit_tone=False)

    def rounded(nbytes: int) -> int:  # CuPy's pool hands out multiples of 512 bytes
        return -(-nbytes // 512) * 512

    assert replay.memory.used_bytes() == rounded(replay.frame.nbytes) + rounded(replay.out.nbytes)


def test_a_replay_outlives_its_line_tables_leaving_the_cache(lease, rng):
    """The line tables' cache keeps the 64 last used: other sizes drawn meanwhile push a
    clip's out, and their memory is handed out again; the graph still reads them."""
    import cupy

    from gpu.pencil import cuda
    from gpu.pencil.replay import ReplayedRender

    params = PencilParams(texture="fast")
    image = frames(rng, grey=False)[0]
    replay = ReplayedRender(lease, image.shape, params, explicit_tone=False)
    device_assets = cuda.assets(lease.device)
    length = params.line_length(*image.shape[:2])
    others = [(other, width) for width in range(6) for other in range(3, 27, 2) if other != length]
    for other, width in others[:70]:
        device_assets.line_plan(other, width)
    assert (length, 0) not in device_assets._lines and (length, params.stroke_width) not in device_assets._lines
    garbage = [cupy.full(1 << 16, -1, cupy.int32) for _ in range(64)]  # freed tables' memory, overwritten
    on_device = cupy.asarray(image)
    replayed = cuda.download(lease, replay(on_device))
    direct = cuda.download(lease, cuda.render_device(lease, on_device, params))
    del garbage
    assert direct.std() > 10
    np.testing.assert_array_equal(replayed, direct)
