"""bench/quality.py's pure functions: block means, the rank correlation, the exposure change,
the targets and the palette of the contact sheet. No photo is rendered."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import quality  # the repository root is on sys.path (pytest `pythonpath`)


def test_block_size_is_a_24th_of_the_shorter_side():
    assert quality.block_size((480, 640)) == 20
    assert quality.block_size((640, 480, 3)) == 20
    assert quality.block_size((10, 300)) == 1  # never 0


def test_block_means_with_edge_blocks(rng):
    gray = rng.integers(0, 256, (5, 7), dtype=np.uint8)
    means = quality.block_means(gray, 2)
    assert means.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            assert means[i, j] == pytest.approx(gray[2 * i : 2 * i + 2, 2 * j : 2 * j + 2].mean())
    assert means[2, 3] == gray[4, 6]  # the corner block is one pixel


def test_rank_correlation_follows_the_order_not_the_values():
    # a gradient, brightness rising to the right and a little downwards (no two blocks alike)
    ramp = np.add.outer(np.arange(96) / 100, np.arange(144) * 255 / 144)
    block = quality.block_size(ramp.shape)
    photo = quality.block_means(ramp, block)
    assert quality.rank_correlation(photo, quality.block_means(255 * (ramp / 255) ** 3, block)) == pytest.approx(1)
    assert quality.rank_correlation(photo, quality.block_means(255 - ramp, block)) == pytest.approx(-1)
    assert math.isnan(quality.rank_correlation(photo, np.full_like(photo, 200.0)))  # a blank drawing


def test_brightest_blocks_are_the_top_tenth():
    blocks = np.arange(100.0).reshape(10, 10)
    mask = quality.brightest(blocks)
    assert mask.sum() == 10 and mask[9].all()


def test_exposure_change_is_linear_light():
    values = np.arange(256, dtype=np.uint8)
    assert np.array_equal(quality.linear_to_srgb(quality.srgb_to_linear(values)), values)  # round trip
    assert np.array_equal(quality.expose(values, 0.0), values)
    darker = quality.expose(values, -3.0)
    assert np.all(np.diff(darker.astype(int)) >= 0) and np.all(darker[1:] < values[1:])
    # white at -3 EV: linear 1/8, 99 in sRGB (not 255 / 8 = 32: the curve is not linear)
    assert darker[255] == 99
    assert np.allclose(quality.srgb_to_linear(darker), quality.srgb_to_linear(values) / 8, atol=2.5e-3)
    assert quality.expose(np.array([99], np.uint8), 3.0)[0] == 255


def test_resize_longer_sets_the_longer_side():
    assert quality.resize_longer(np.zeros((300, 451, 3), np.uint8), 768).shape == (511, 768, 3)
    assert quality.resize_longer(np.zeros((1411, 1000), np.uint8), 768).shape == (768, 544)


def test_each_auto_mode_is_compared_with_light_of_its_texture():
    modes = {m.name: m for m in quality.MODES}
    assert quality.baseline_of(modes["auto/lu"]).name == "light/lu"
    assert quality.baseline_of(modes["auto/fast"]).name == "light/fast"
    assert quality.baseline_of(modes["light/lu"]) is None


def test_targets_name_the_offending_photos():
    modes = tuple(
        sorted((m for m in quality.MODES if m.name in ("light/lu", "auto/lu")), key=lambda m: m.name != "light/lu")
    )

    def photo(name, mean, light, auto):
        result = quality.PhotoResult(name, "", (8, 8), (8, 8), mean)
        result.modes["light/lu"] = quality.Result(*light, ms=1.0)
        result.modes["auto/lu"] = quality.Result(*auto, ms=1.0, bright_delta=auto[2] - light[2])
        return result

    results = [
        photo("ordinary", 120.0, (0.9, 215.0, 250.0), (0.95, 170.0, 240.0)),
        photo("dark", 30.0, (0.5, 220.0, 250.0), (0.8, 140.0, 150.0)),  # rank too low; dark enough
        photo("paper moved", 100.0, (0.9, 215.0, 250.0), (0.9, 150.0, 210.0)),  # -40 on its brightest blocks
    ]
    checks = [(met, offenders) for _, met, offenders in quality.targets(results, modes)]
    assert checks == [
        (False, ["dark 0.500"]),  # light/lu, for comparison: rank
        (False, ["dark 30 -> 220"]),  # light/lu: the dark photo's drawing
        (False, ["dark 0.800"]),  # auto/lu: rank
        (True, []),  # auto/lu: the dark photo's drawing
        (False, ["paper moved -40"]),  # auto/lu: brightest blocks of the ordinary photos
    ]


def test_split_palette_keeps_greys_and_colours_apart(rng):
    image = np.repeat(rng.integers(0, 256, (16, 16, 1), dtype=np.uint8), 3, axis=2)
    image[:4, :4] = (200, 40, 30)  # a colour patch
    picture = quality.split_palette(image)
    index = np.asarray(picture)
    palette = np.array(picture.getpalette()[: 3 * 256]).reshape(256, 3)
    rendered = palette[index]
    grey = np.ones((16, 16), bool)
    grey[:4, :4] = False
    assert np.abs(rendered[grey] - image[grey].astype(int)).max() <= 1  # 128 levels: at most 1 off
    assert np.all(index[~grey] >= 128)
    assert np.abs(rendered[~grey] - (200, 40, 30)).max() <= 8


def test_stroke_fidelity_sees_dark_marks_on_the_edges():
    photo = np.zeros((64, 64), np.uint8)
    photo[:, 32:] = 200  # one vertical edge
    on_edge = np.full_like(photo, 250)
    on_edge[:, 30:33] = 40  # a dark line on it
    elsewhere = np.full_like(photo, 250)
    elsewhere[:, 5:8] = 40
    assert quality.stroke_fidelity(photo, on_edge) > 0.5  # a 3 px line on a 1 px edge: 1 / sqrt(3)
    assert quality.stroke_fidelity(photo, elsewhere) < 0.1
    assert math.isnan(quality.stroke_fidelity(photo, np.full_like(photo, 255)))


def test_zoom_crop_doubles_a_crop_inside_the_image():
    image = np.arange(100 * 80, dtype=np.int32).reshape(100, 80).astype(np.uint8)
    crop = quality.zoom_crop(image, (1.0, 0.0), 40)  # asked at the top-right corner: moved inside
    assert crop.shape == (40, 40)
    np.testing.assert_array_equal(crop[::2, ::2], image[0:20, 60:80])


def test_drawing_targets_check_the_presets_order_and_exposure():
    modes = tuple(m for m in quality.MODES if m.params.texture == "lu")

    def photo(name, means):
        result = quality.PhotoResult(name, "", (8, 8), (8, 8), 100.0)
        for mode, mean in zip(modes, means, strict=True):
            result.modes[mode.name] = quality.Result(0.95, mean, 200.0, 1.0, fidelity=0.5, ssim=0.3)
        return result

    names = [m.name for m in modes]
    assert names == ["auto/lu", "auto+flat/lu", "light/lu", "medium/lu", "dark/lu"]
    results = [photo("a", (170, 170, 210, 190, 150)), photo("a-3EV", (120, 120, 200, 190, 199))]
    checks = [(met, offenders) for _, met, offenders in quality.drawing_targets(results, modes)]
    assert checks == [
        (True, []),  # rank
        (True, []),  # fidelity
        (True, []),  # -3 EV: 50 darker
        (True, []),  # light's rank
        (False, ["a-3EV 200/190/120/199"]),  # dark lighter than auto
    ]


def test_every_photo_set_has_its_photos_and_the_unseen_ones_load():
    """The three sets of Photo.group; the unseen photos are files of bench/photos/ (their
    sources in its README) and load as 8-bit gray or RGB."""
    groups = {p.group for p in quality.PHOTOS}
    assert groups == set(quality.GROUPS)
    unseen = [p for p in quality.PHOTOS if p.group == "unseen"]
    assert len(unseen) == 6
    readme = (quality.PHOTO_DIR / "README.md").read_text()
    for photo in unseen:
        image = photo.load()
        assert image.dtype == np.uint8 and image.ndim in (2, 3) and min(image.shape[:2]) >= 400, photo.name
        if not photo.name.endswith("-3EV"):
            assert image.std() > 20, photo.name
    for name in ("grace_hopper.jpg", "raccoon.jpg", "ascent.png", "china.jpg", "flower.jpg"):
        assert (quality.PHOTO_DIR / name).is_file() and f"`{name}`" in readme
