"""gpu/video/drawer.py on the CPU: stage counts the luma histogram only when asked, draw is
reference.render with the staged tone LUT, and calling the drawer does both."""

from __future__ import annotations

import numpy as np
from skimage import data

from gpu.pencil import reference
from gpu.pencil.params import PencilParams
from gpu.video.drawer import Drawer
from gpu.video.temporal import luma_histogram

PARAMS = PencilParams(texture="fast")


def photo() -> np.ndarray:
    return np.ascontiguousarray(data.coffee()[:200, :300])


def test_stage_counts_the_histogram_only_when_asked():
    drawer = Drawer(PARAMS)
    image = photo()
    staged = drawer.stage(image, histogram=True)
    np.testing.assert_array_equal(staged.histogram, luma_histogram(image))
    assert staged.on_device is None and staged.tone_lut is None
    assert drawer.stage(image, histogram=False).histogram is None


def test_draw_uses_the_staged_lut_and_calling_does_both():
    rng = np.random.default_rng()
    lut = np.sort(rng.integers(0, 256, 256)).astype(np.uint8)  # a random monotone map
    drawer, image = Drawer(PARAMS), photo()
    staged = drawer.stage(image, histogram=False)
    staged.tone_lut = lut
    expected = reference.render(image, PARAMS, lut)
    assert expected.std() > 10
    np.testing.assert_array_equal(drawer.draw(staged), expected)
    np.testing.assert_array_equal(drawer(image, lut), expected)
    assert not np.array_equal(drawer(image), expected)  # without the LUT: the photo's own tone
