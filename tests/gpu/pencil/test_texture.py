"""Tests for gpu.pencil.texture: the procedural, tileable pencil texture H."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu.pencil.texture import HATCH_ANGLE_DEG, TILE_SIZE, pencil_texture, tile_texture

# Uncached generator (same function lru_cache wraps): lets the determinism
# tests compare two independent generations instead of one cached object.
_generate_uncached = pencil_texture.__wrapped__


@pytest.fixture(scope="module")
def tile() -> np.ndarray:
    return pencil_texture()


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _seam_ratios(h: np.ndarray) -> tuple[float, float]:
    """Mean |jump| across the wrap edge divided by the mean interior |jump|.

    Returned for (columns, rows).  A seamless tile gives ~1 on both axes.
    """
    h = h.astype(np.float64)
    interior_c = np.abs(np.diff(h, axis=1)).mean()
    seam_c = np.abs(h[:, 0] - h[:, -1]).mean()
    interior_r = np.abs(np.diff(h, axis=0)).mean()
    seam_r = np.abs(h[0, :] - h[-1, :]).mean()
    return seam_c / interior_c, seam_r / interior_r


def _structure_tensor(h: np.ndarray) -> tuple[float, float]:
    """(coherence, stroke orientation in degrees, [0, 180)) of the global structure tensor.

    Coherence = (l1 - l2) / (l1 + l2) of J = sum grad grad^T: 0 for an
    isotropic field, 1 for perfectly parallel lines.  The orientation is that
    of the lines (perpendicular to the dominant gradient), measured
    counter-clockwise from the +x axis with y pointing up on screen.
    """
    h = h.astype(np.float64)
    gy, gx = np.gradient(h)
    j = np.array([[np.sum(gx * gx), np.sum(gx * gy)], [np.sum(gx * gy), np.sum(gy * gy)]])
    w, v = np.linalg.eigh(j)
    g = v[:, 1]  # dominant gradient direction (x, y-down)
    grad_angle = math.degrees(math.atan2(-g[1], g[0]))
    return float((w[1] - w[0]) / (w[1] + w[0])), (grad_angle + 90.0) % 180.0


# --------------------------------------------------------------------------
# pencil_texture
# --------------------------------------------------------------------------
def test_shape_dtype_range(tile):
    assert tile.shape == (TILE_SIZE, TILE_SIZE)
    assert tile.dtype == np.float32
    assert tile.flags.c_contiguous
    assert np.isfinite(tile).all()
    assert float(tile.min()) >= 0.05
    assert float(tile.max()) <= 0.95
    # The remap uses the full range: both ends are actually reached.
    assert float(tile.min()) < 0.06 and float(tile.max()) > 0.94


def test_not_constant_and_mid_tone(tile):
    # Measured std ~0.18; a nearly flat tile (e.g. paper only) would be < 0.05.
    assert float(tile.std()) > 0.1
    # Mid tone so that H**beta can reach both light and dark tones (~0.68).
    assert 0.55 <= float(tile.mean()) <= 0.75
    # Both paper (light) and graphite (dark) occupy a real share of the tile.
    assert (tile > 0.8).mean() > 0.1
    assert (tile < 0.5).mean() > 0.1


def test_cached_and_read_only(tile):
    assert pencil_texture() is tile
    assert pencil_texture(TILE_SIZE, 7) is pencil_texture(TILE_SIZE, 7)
    assert not tile.flags.writeable
    with pytest.raises(ValueError):
        tile[0, 0] = 0.5


def test_deterministic_same_seed():
    a = _generate_uncached(128, 3)
    b = _generate_uncached(128, 3)
    assert a is not b
    np.testing.assert_array_equal(a, b)


def test_different_seed_differs():
    a = _generate_uncached(128, 3)
    b = _generate_uncached(128, 4)
    assert a.shape == b.shape
    # Not just a few pixels: the stroke layout is different throughout.
    assert float(np.abs(a - b).mean()) > 0.05
    assert abs(float(np.corrcoef(a.ravel(), b.ravel())[0, 1])) < 0.5


@pytest.mark.parametrize("size", [16, 100, 256])
def test_other_sizes(size):
    h = pencil_texture(size, 11)
    assert h.shape == (size, size) and h.dtype == np.float32
    assert float(h.min()) >= 0.05 and float(h.max()) <= 0.95
    assert float(h.std()) > 0.1


def test_rejects_tiny_size():
    with pytest.raises(ValueError):
        pencil_texture(8)


def test_seamless(tile):
    rc, rr = _seam_ratios(tile)
    # The jump across the wrap edge must look like any interior jump (measured
    # ~0.9-1.05); a 1.5x band leaves room for the noise of a 512-sample mean.
    assert 1 / 1.5 < rc < 1.5, rc
    assert 1 / 1.5 < rr < 1.5, rr


@pytest.mark.parametrize("seed", [0, 1])
def test_seamless_other_seeds(seed):
    rc, rr = _seam_ratios(_generate_uncached(256, seed))
    assert 1 / 1.5 < rc < 1.5, rc
    assert 1 / 1.5 < rr < 1.5, rr


def test_seam_metric_detects_a_seam(tile):
    # Control: cropping breaks periodicity (strokes and grain are cut at the
    # new edge); the metric must then exceed the 1.5x bound (measured ~2.3-2.7),
    # showing that test_seamless can fail.
    cropped = np.asarray(tile)[: TILE_SIZE - 101, : TILE_SIZE - 73]
    rc, rr = _seam_ratios(cropped)
    assert rc > 1.5 and rr > 1.5, (rc, rr)


def test_tiled_copy_has_no_visible_seam(tile):
    # In a 2x2 tiling the column pair straddling the tile boundary must not
    # stand out among all neighbouring column pairs.
    big = tile_texture(tile, 2 * TILE_SIZE, 2 * TILE_SIZE).astype(np.float64)
    col_jumps = np.abs(np.diff(big, axis=1)).mean(axis=0)
    row_jumps = np.abs(np.diff(big, axis=0)).mean(axis=1)
    b = TILE_SIZE - 1
    assert col_jumps[b] < np.percentile(col_jumps, 99)
    assert row_jumps[b] < np.percentile(row_jumps, 99)


def test_hatching_is_directional(tile):
    coherence, angle = _structure_tensor(tile)
    # Bound justification: for an isotropic field the summed structure tensor
    # has l1 ~= l2 and the coherence is ~0 (0.003 for 512^2 white noise, see
    # the control below); parallel lines give 1; a cross-hatch layer carrying
    # a fraction r of the main layer's gradient energy gives (1-r)/(1+r).
    # Requiring > 0.4 means l1/l2 > 2.3: the main hatching direction carries
    # well over twice the energy of the perpendicular one (measured ~0.75).
    assert coherence > 0.4, coherence
    # The dominant stroke direction is the configured hatching angle (45 deg).
    assert abs(angle - HATCH_ANGLE_DEG) < 5.0, angle


def test_directionality_metric_control():
    # Control: isotropic noise, and a rotated tile whose strokes run at 135 deg.
    noise = np.random.default_rng(0).random((TILE_SIZE, TILE_SIZE))
    coherence, _ = _structure_tensor(noise)
    assert coherence < 0.05
    _, angle = _structure_tensor(np.rot90(pencil_texture()))
    assert abs(angle - (HATCH_ANGLE_DEG + 90.0)) < 5.0, angle


def test_spectrum_anisotropy(tile):
    # Same property seen in the Fourier domain: parallel strokes at 45 deg put
    # their energy along the perpendicular (135 deg) frequency direction.
    # Compare the AC energy in two +-20 deg wedges around 135 and 45 deg
    # (frequency-space angles, y up); measured ratio ~14, isotropic noise ~1.0,
    # so > 4 is a clear anisotropy with margin.
    h = np.asarray(tile, dtype=np.float64)
    p = np.abs(np.fft.fft2(h - h.mean())) ** 2
    fy = -np.fft.fftfreq(TILE_SIZE)[:, None]  # y up
    fx = np.fft.fftfreq(TILE_SIZE)[None, :]
    ang = np.degrees(np.arctan2(fy, fx)) % 180.0
    r = np.hypot(fx, fy)
    band = (r > 0.02) & (r < 0.45)
    across = band & (np.abs(ang - (HATCH_ANGLE_DEG + 90.0)) < 20.0)
    along = band & (np.abs(ang - HATCH_ANGLE_DEG) < 20.0)
    ratio = p[across].sum() / p[along].sum()
    assert ratio > 4.0, ratio


@pytest.mark.parametrize(
    "height,width", [(1, 1), (37, 100), (512, 512), (513, 1), (700, 300), (1080, 1920), (2000, 2100)]
)
def test_tile_texture_shape_and_values(tile, height, width):
    out = tile_texture(tile, height, width)
    assert out.shape == (height, width)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    assert out.flags.writeable
    ys = np.arange(height) % TILE_SIZE
    xs = np.arange(width) % TILE_SIZE
    # Exactly the tile at the same coordinates modulo its size: no resampling.
    np.testing.assert_array_equal(out, np.asarray(tile)[np.ix_(ys, xs)])


def test_tile_texture_non_square_tile():
    t = np.arange(7 * 5, dtype=np.float64).reshape(7, 5)
    out = tile_texture(t, 23, 17)
    expected = t[np.arange(23)[:, None] % 7, np.arange(17)[None, :] % 5]
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    assert out.dtype == np.float32 and out.flags.c_contiguous


def test_tile_texture_does_not_alias_input():
    t = np.random.default_rng(1).random((8, 8)).astype(np.float32)
    before = t.copy()
    out = tile_texture(t, 8, 8)
    out[:] = 0
    np.testing.assert_array_equal(t, before)


def test_tile_texture_empty_and_invalid():
    t = np.ones((4, 4), np.float32)
    assert tile_texture(t, 0, 5).shape == (0, 5)
    with pytest.raises(ValueError):
        tile_texture(np.ones(5), 4, 4)
    with pytest.raises(ValueError):
        tile_texture(t, -1, 4)
