"""The stencil job's pictures: the shot record in a seismic display (AGC, clipped), wavefield
sections in a diverging colour map shaded by the velocity, and the velocity section with
the source marked. Arrays in, Pillow images out (8-bit grey or RGB)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from gpu.stencil.params import StencilParams

RECORD_CLIP = 2.0  # after AGC a trace's RMS is 1: full scale at +-2, clipped beyond
AGC_PERIODS = 2.0  # AGC window: this many periods of the source's peak frequency
AGC_FLOOR = 1e-3  # windows quieter than this fraction of the trace's loudest stay grey
AGC_CHUNK_VALUES = 1 << 22  # samples gained at once (32 MiB of float64 per work array)
BLUE, WHITE, RED = np.array([5.0, 48.0, 97.0]), np.array([255.0, 255.0, 255.0]), np.array([103.0, 0.0, 31.0])


def _pick_rows(a: np.ndarray, max_rows: int) -> np.ndarray:
    """At most `max_rows` rows: each block of rows keeps, per column, its sample of largest
    magnitude (sign kept), so that no arrival disappears between pixels."""
    rows = a.shape[0]
    if rows <= max_rows:
        return a
    block = -(-rows // max_rows)
    padded = np.zeros((-(-rows // block) * block, a.shape[1]), a.dtype)
    padded[:rows] = a
    blocks = padded.reshape(-1, block, a.shape[1])
    index = np.abs(blocks).argmax(axis=1)
    return np.take_along_axis(blocks, index[:, None, :], axis=1)[:, 0, :]


def agc(record: np.ndarray, window: int) -> np.ndarray:
    """Automatic gain control, per trace: each sample divided by the RMS of its trace over
    `window` samples centred on it (float64, same shape). Windows quieter than AGC_FLOOR
    of the trace's loudest are not amplified further, so silence stays silent."""
    a = np.nan_to_num(np.asarray(record, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    rows = a.shape[0]
    energy = np.concatenate([np.zeros((1, a.shape[1])), np.cumsum(a * a, axis=0)])
    centre = np.arange(rows)
    lo, hi = np.clip(centre - window // 2, 0, rows), np.clip(centre + window // 2 + 1, 0, rows)
    rms = np.sqrt(np.maximum(energy[hi] - energy[lo], 0.0) / (hi - lo)[:, None])
    floor = AGC_FLOOR * rms.max(axis=0, keepdims=True)
    return a / np.maximum(rms, np.where(floor > 0, floor, 1.0))


def shot_record_image(
    record: np.ndarray, window: int, max_rows: int = 2000, min_width: int = 256, max_width: int = 2048
) -> Image.Image:
    """A seismic display of the record (steps, receivers): time runs down, one column per
    receiver, each trace under AGC over `window` samples (see `agc`) and clipped at
    RECORD_CLIP times its local RMS, so that the direct wave and the much weaker
    reflections show alike. Grey: positive black, negative white, zero mid-grey. Records
    wider than `max_width` keep every k-th trace, longer than `max_rows` keep each block's
    strongest sample; narrow ones are widened to `min_width` px. Works through the traces
    in chunks, so a record of any allowed size needs little memory."""
    record = np.asarray(record)
    rows, width = record.shape
    if width > max_width:
        record = record[:, :: -(-width // max_width)]
    chunk = max(1, AGC_CHUNK_VALUES // max(rows, 1))
    pieces = [
        _pick_rows(np.clip(agc(record[:, j : j + chunk], max(1, window)) / RECORD_CLIP, -1.0, 1.0), max_rows)
        for j in range(0, record.shape[1], chunk)
    ]
    v = np.concatenate(pieces, axis=1)
    if v.shape[1] < min_width:
        v = np.repeat(v, -(-min_width // v.shape[1]), axis=1)
    return Image.fromarray(np.rint(127.5 - 127.5 * v).astype(np.uint8), mode="L")


def agc_window(params: StencilParams) -> int:
    """AGC window in samples: AGC_PERIODS periods of f0, at least 9 samples."""
    return max(9, round(AGC_PERIODS / (params.f0 * params.dt)))


def _fit_side(rgb: np.ndarray, min_side: int = 512, max_side: int = 2048) -> np.ndarray:
    """Small sections enlarged by a whole factor (nearest) to about `min_side` px on the
    longer side; large ones thinned to at most `max_side`."""
    longest = max(rgb.shape[:2])
    if longest < min_side:
        factor = min_side // longest
        return np.repeat(np.repeat(rgb, factor, axis=0), factor, axis=1)
    step = -(-longest // max_side)
    return rgb[::step, ::step]


def _diverging(v: np.ndarray) -> np.ndarray:
    """v in [-1, 1] -> RGB float: blue (negative) - white - red (positive)."""
    v = v[..., None]
    return np.where(v < 0, WHITE + (BLUE - WHITE) * -v, WHITE + (RED - WHITE) * v)


def section_image(values: np.ndarray, velocity: np.ndarray, max_side: int = 2048) -> Image.Image:
    """A wavefield section (rows: z or y, columns: x) in a diverging map clipped at the
    99.5th percentile of its non-zero |p|, shaded by the velocity section (faster is
    darker, up to 30%) so that the layers show under the waves. RGB image."""
    p = np.nan_to_num(np.asarray(values, np.float64))
    magnitude = np.abs(p[p != 0])
    clip = np.percentile(magnitude, 99.5) if magnitude.size else 1.0
    rgb = _diverging(np.clip(p / clip, -1.0, 1.0))
    v = np.asarray(velocity, np.float64)
    span = v.max() - v.min()
    shade = 1.0 - 0.3 * ((v - v.min()) / span if span > 0 else np.zeros_like(v))
    rgb = rgb * shade[..., None]
    return Image.fromarray(np.rint(_fit_side(rgb, max_side=max_side)).astype(np.uint8), mode="RGB")


def velocity_image(velocity: np.ndarray, source: tuple[int, int], max_side: int = 2048) -> Image.Image:
    """The velocity section (rows z, columns x) in grey (slow light, fast dark) with the
    source (x, z) marked in red."""
    v = np.asarray(velocity, np.float64)
    span = v.max() - v.min()
    grey = 230.0 - 180.0 * ((v - v.min()) / span if span > 0 else np.zeros_like(v))
    rgb = np.repeat(grey[..., None], 3, axis=2)
    x, z = source
    rgb[max(0, z - 1) : z + 2, max(0, x - 1) : x + 2] = (220.0, 30.0, 30.0)
    return Image.fromarray(np.rint(_fit_side(rgb, max_side=max_side)).astype(np.uint8), mode="RGB")
