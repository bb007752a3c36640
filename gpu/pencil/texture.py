"""Procedural pencil texture H for the tone stage of Lu, Xu & Jia (2012).

The tone stage renders a tone map J as T = H ** beta, where H is a "pencil
texture image": a mid-grey patch of graphite hatching on paper.  This module
synthesises H procedurally, deterministically (seeded) and seamlessly
tileable:

* Paper: fBm made of a few octaves of periodic band-pass noise (white noise
  filtered in the Fourier domain, so it wraps around exactly) gives a bright
  sheet (~0.88-0.96) with soft cloudiness; a finer, high-frequency "tooth"
  field models the paper's grain.
* Graphite: tonal-art-map style accumulation of a few hundred long strokes,
  mostly parallel (about 45 degrees, a few degrees of jitter) plus a sparser,
  lighter cross-hatch layer.  Every stroke has a Gaussian cross profile
  (sigma ~0.6-1.2 px), smoothly tapered ends, pressure varying along its
  length and a slight bow and wobble.  Darkening composes multiplicatively,
  H *= 1 - a * coverage, so overlaps get darker as graphite does; the
  coverage is modulated by the paper tooth (graphite catches on the peaks of
  the grain and skips the valleys), which gives strokes their speckle.
* Seamlessness: every stroke is rasterised column by column (or row by row)
  along its major axis, only a few pixels either side of its centre line, and
  all pixel indices are taken modulo the tile size; the log-darkening is
  accumulated with one ``np.bincount``.  Nothing is clipped at the border, so
  ``np.tile`` of the tile has no seam.
* Finally H is mapped affinely from its 0.5/99.5 percentiles to
  [0.05, 0.95] and clipped, so ln H is finite and bounded; its mean is a mid
  tone (about 0.68) so that H ** beta reaches both light and dark tones.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["TILE_SIZE", "pencil_texture", "tile_texture"]

TILE_SIZE = 512
"""Default side of the square texture tile, in pixels."""

H_MIN = 0.05
H_MAX = 0.95

# Hatching parameters (image coordinates: x to the right, y downwards; an
# angle of 45 degrees is a stroke rising from lower left to upper right).
HATCH_ANGLE_DEG = 45.0
_MAIN_JITTER_DEG = 4.0  # +-2 standard deviations of the per-stroke angle
_CROSS_ANGLE_DEG = -45.0  # i.e. 135 degrees: falling from upper left
_CROSS_JITTER_DEG = 6.0
# Total stroke centre-line length per tile pixel, per layer.
_MAIN_DENSITY = 0.45
_CROSS_DENSITY = 0.05
_MIN_SIZE = 16


# --------------------------------------------------------------------------
# periodic noise
# --------------------------------------------------------------------------
def _normalise(a: np.ndarray) -> np.ndarray:
    """Zero mean, unit standard deviation (unchanged if constant)."""
    a = a - a.mean()
    s = a.std()
    return a / s if s > 0 else a


def _paper_fields(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Periodic (fbm, tooth) fields, each (size, size) float64, zero mean, unit std.

    Both are white noise filtered in the Fourier domain (hence exactly
    periodic).  ``fbm`` sums octaves of log-Gaussian band-pass filters centred
    on 1/96, 1/48, ... cycles/px with amplitude 0.6**k; ``tooth`` is a fine
    grain: Gaussian low-pass at ~0.7 px plus a little energy around 1/6
    cycles/px.  Their spectra barely overlap, so one white noise serves both.
    """
    fy = np.fft.fftfreq(size)[:, None]
    fx = np.fft.rfftfreq(size)[None, :]
    fr = np.sqrt(fy * fy + fx * fx)
    fr[0, 0] = 1.0  # avoid log(0); DC is zeroed below
    lf = np.log(fr)

    def band(f0: float, bw: float) -> np.ndarray:
        return np.exp(-0.5 * ((lf - math.log(f0)) / bw) ** 2)

    spec = np.fft.rfft2(rng.standard_normal((size, size)))
    g_fbm = np.zeros_like(fr)
    amp, f0 = 1.0, 1.0 / 96.0
    while f0 < 0.5:
        g_fbm += amp * band(f0, 0.6)
        amp *= 0.6
        f0 *= 2.0
    sig_f = 1.0 / (2.0 * math.pi * 0.7)
    g_tooth = np.exp(-0.5 * (fr / sig_f) ** 2) + 0.6 * band(1.0 / 6.0, 0.5)
    g_fbm[0, 0] = g_tooth[0, 0] = 0.0
    # Use independent phases for the two fields where their bands meet.
    spec2 = np.fft.rfft2(rng.standard_normal((size, size)))
    fbm = np.fft.irfft2(spec * g_fbm, s=(size, size))
    tooth = np.fft.irfft2(spec2 * g_tooth, s=(size, size))
    return _normalise(fbm), _normalise(tooth)


# --------------------------------------------------------------------------
# strokes
# --------------------------------------------------------------------------
def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _stroke_samples(
    rng: np.random.Generator,
    size: int,
    angle_deg: float,
    jitter_deg: float,
    density: float,
    dark: tuple[float, float],
    len_range: tuple[float, float],
    pickup: np.ndarray,
    rows: list,
    cols: list,
    weights: list,
) -> None:
    """Rasterise one layer of strokes; append wrapped (row, col, log-darkening) samples.

    Strokes are added until their total centre-line length reaches
    ``density * size**2``.  ``rows``/``cols`` receive int64 indices already
    reduced modulo ``size``; ``weights`` receives ln(1 - coverage) <= 0.
    """
    lo_len, hi_len = len_range
    hi_len = min(hi_len, 0.8 * size)
    lo_len = min(lo_len, 0.5 * hi_len)
    target = density * size * size
    total = 0.0
    while total < target:
        length = float(rng.uniform(lo_len, hi_len))
        total += length
        theta = math.radians(angle_deg + rng.normal(0.0, jitter_deg / 2.0))
        # Direction in image coordinates (y down): positive angle rises to the right.
        dx, dy = math.cos(theta), -math.sin(theta)
        x0, y0 = rng.uniform(0.0, size, 2)
        sigma = float(rng.uniform(0.6, 1.2))
        a = float(rng.uniform(*dark))
        bow = float(rng.normal(0.0, 0.012)) * length  # sagitta, px
        wob_amp = float(rng.uniform(0.1, 0.35))
        wob_freq = float(rng.uniform(0.7, 2.5))
        wob_ph = float(rng.uniform(0, 2 * math.pi))
        p1f, p2f = float(rng.uniform(0.4, 1.3)), float(rng.uniform(2.0, 5.0))
        p1p, p2p = rng.uniform(0, 2 * math.pi, 2)
        p1a, p2a = float(rng.uniform(0.1, 0.3)), float(rng.uniform(0.04, 0.12))
        t_in = float(rng.uniform(0.05, 0.15))
        t_out = float(rng.uniform(0.15, 0.35))

        # Work in (major, minor) coordinates: iterate the axis along which the
        # stroke advances fastest, so each step covers a short minor span.
        if abs(dx) >= abs(dy):
            m0, n0, dm, dn = x0, y0, dx, dy
            swap = False
        else:
            m0, n0, dm, dn = y0, x0, dy, dx
            swap = True
        if dm < 0:  # walk in increasing major coordinate
            m0, n0 = m0 + dm * length, n0 + dn * length
            dm, dn = -dm, -dn
        m_idx = np.arange(math.ceil(m0), math.floor(m0 + dm * length) + 1, dtype=np.float64)
        if m_idx.size < 2:
            continue
        s = (m_idx - m0) / dm  # arc length along the chord
        t = s / length
        # Normal displacement b(t): bow + wobble; its slope for the local angle.
        b = 4.0 * bow * t * (1.0 - t) + wob_amp * np.sin(2 * math.pi * wob_freq * t + wob_ph)
        db = (
            4.0 * bow * (1.0 - 2.0 * t) + wob_amp * 2 * math.pi * wob_freq * np.cos(2 * math.pi * wob_freq * t + wob_ph)
        ) / length
        slope0 = dn / dm
        # Normal (-dn, dm) has minor component dm: displacement b along the
        # normal moves the centre line by b / dm in the minor coordinate.
        nc = n0 + s * dn + b / dm
        slope = slope0 + db / dm
        cos_local = 1.0 / np.sqrt(1.0 + slope * slope)

        pressure = 1.0 + p1a * np.sin(2 * math.pi * p1f * t + p1p) + p2a * np.sin(2 * math.pi * p2f * t + p2p)
        env = _smoothstep(t / t_in) * _smoothstep((1.0 - t) / t_out)
        amp = a * pressure * env  # (L,)
        sig_t = sigma * (0.85 + 0.15 * pressure)

        # Window: 3.3 sigma of the widest cross-section (sig_t <= 1.07 sigma),
        # measured along the minor axis (stretched by 1 / cos).
        half = int(math.ceil(3.3 * 1.07 * sigma * float(np.max(1.0 / cos_local)))) + 1
        offs = np.arange(-half, half + 1, dtype=np.float64)
        n_idx = np.round(nc)[:, None] + offs[None, :]  # (L, W)
        v = (n_idx - nc[:, None]) * cos_local[:, None]  # perpendicular distance
        prof = np.exp(-0.5 * (v / sig_t[:, None]) ** 2)
        mi = np.broadcast_to(m_idx[:, None], n_idx.shape).astype(np.int64) % size
        ni = n_idx.astype(np.int64) % size
        r, c = (ni, mi) if not swap else (mi, ni)
        cov = amp[:, None] * prof * pickup[r, c]
        keep = cov > 1e-4
        rows.append(r[keep])
        cols.append(c[keep])
        weights.append(np.log1p(-np.minimum(cov[keep], 0.92)))


def _generate(size: int, seed: int) -> np.ndarray:
    """Uncached generator behind :func:`pencil_texture` (same contract, writeable)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, size, 0x9E3779B9]))

    # Paper: bright, faint cloudiness, fine tooth.
    fbm, tooth = _paper_fields(rng, size)
    paper = 0.925 + 0.012 * fbm + 0.018 * tooth

    # Graphite pickup in [0.25, 1]: peaks of the tooth catch more graphite.
    pickup = np.clip(0.70 + 0.22 * tooth + 0.06 * fbm, 0.25, 1.0)

    rows: list = []
    cols: list = []
    weights: list = []
    _stroke_samples(
        rng,
        size,
        HATCH_ANGLE_DEG,
        _MAIN_JITTER_DEG,
        _MAIN_DENSITY,
        (0.12, 0.35),
        (100.0, 380.0),
        pickup,
        rows,
        cols,
        weights,
    )
    _stroke_samples(
        rng,
        size,
        _CROSS_ANGLE_DEG,
        _CROSS_JITTER_DEG,
        _CROSS_DENSITY,
        (0.08, 0.22),
        (60.0, 220.0),
        pickup,
        rows,
        cols,
        weights,
    )
    idx = np.concatenate(rows) * size + np.concatenate(cols)
    log_dark = np.bincount(idx, weights=np.concatenate(weights), minlength=size * size)
    h = paper * np.exp(log_dark.reshape(size, size))

    lo, hi = np.percentile(h, [0.5, 99.5])
    h = H_MIN + (H_MAX - H_MIN) * (h - lo) / max(hi - lo, 1e-6)
    return np.clip(h, H_MIN, H_MAX).astype(np.float32)


@functools.lru_cache(maxsize=8)
def pencil_texture(size: int = TILE_SIZE, seed: int = 7) -> np.ndarray:
    """Seamlessly tileable pencil texture H (hatching on paper).

    Parameters
    ----------
    size: side of the square tile in pixels (>= 16).
    seed: RNG seed; the same (size, seed) always gives the same texture.

    Returns
    -------
    (size, size) float32 C-contiguous array with values in [0.05, 0.95] and a
    mid-tone mean (about 0.68).  The result is cached per (size, seed) and is
    read-only (``flags.writeable`` is False); copy it before modifying.
    """
    size = int(size)
    if size < _MIN_SIZE:
        raise ValueError(f"texture size must be >= {_MIN_SIZE}, got {size}")
    h = _generate(size, int(seed))
    h.flags.writeable = False
    return h


def tile_texture(tile: np.ndarray, height: int, width: int) -> np.ndarray:
    """Cover a (height, width) canvas by repeating ``tile`` at its native scale.

    Pixel (y, x) of the result equals ``tile[y % th, x % tw]``; the tile is
    never resampled.  ``tile`` is any 2-D real array of shape (th, tw).

    Returns a new C-contiguous, writeable float32 array of shape
    (height, width).  Implemented by block copies (no index arrays).
    """
    tile = np.asarray(tile)
    if tile.ndim != 2 or tile.shape[0] == 0 or tile.shape[1] == 0:
        raise ValueError(f"tile must be a non-empty 2-D array, got shape {tile.shape}")
    height, width = int(height), int(width)
    if height < 0 or width < 0:
        raise ValueError(f"height and width must be >= 0, got {(height, width)}")
    th, tw = tile.shape
    out = np.empty((height, width), dtype=np.float32)
    if height == 0 or width == 0:
        return out
    # First band of rows: horizontal repeats of the tile.
    band = min(th, height)
    for x in range(0, width, tw):
        w = min(tw, width - x)
        out[:band, x : x + w] = tile[:band, :w]
    # Remaining rows: copy whole bands from the first one, doubling as we go.
    filled = band
    while filled < height:
        n = min(filled, height - filled)
        out[filled : filled + n] = out[:n]
        filled += n
    return out
