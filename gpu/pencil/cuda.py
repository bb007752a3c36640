"""The pencil pipeline on the GPU: the ten stages of `reference.py` as the CUDA kernels
of `pencil.cu`, launched through CuPy on a lease of the device pool.

One render, on the lease's two streams:

    stream    upload -> luma+histogram -> median+gradient -> line pass 1 (label)
                 -> line pass 2 (S') -> wait A -> stroke means (D1, D2) -> wait B -> merge -> download
    side               wait luma -> LUT -> LUT at the box mean (J) -> event A -> cross-hatching
                           [-> CG for beta: texture "lu"] -> event B

Copies go through the lease's pinned staging buffers, so they are asynchronous and
renders on other leases overlap them. Per device, the kernels, the texture tile (H and
ln H), the target CDFs and the line tables are built once and cached.

Stage functions take and return device arrays; tests call them one by one against the
reference (tests/gpu/pencil/test_cuda.py).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import cupy
import numpy as np

from gpu import kernels
from gpu.pencil import reference
from gpu.pencil.params import (
    CG_MAX_ITERATIONS,
    CG_TOLERANCE,
    CROSS_HATCH_TONES,
    DIRECTIONS,
    HATCH_BIAS,
    HATCH_BIAS_FLOOR,
    LU_LAMBDA,
    STROKE_BUDGET,
    STROKE_DEEPENING,
    STROKE_POWER,
    STROKE_THINNING_MAX,
    LineKernelTooLarge,
    PencilParams,
)
from gpu.pencil.texture import H_MAX, H_MIN, pencil_texture

log = logging.getLogger("pencil.cuda")

SOURCE = Path(__file__).with_name("pencil.cu")
_k = partial(kernels.kernel, SOURCE)

# Launch geometry, mirrored from pencil.cu.
LINE_COLS, LINE_ROWS, LINE_WARPS = 3, 8, 8
LINE_TILE_W, LINE_TILE_H = 32 * LINE_COLS, LINE_WARPS * LINE_ROWS
TABLE_HEADER = 20
CG_BLOCK, CG_BLOCKS_PER_SM = (32, 8), 8  # blocks stride down the image: few partial sums
TONE_RUN, TONE_ROW_BLOCK = 32, 256
FIT_MAX_SETS = 64  # the shared rhs table of pencil.cu fit_tone
BOX_RUN, HATCH_RUN = 32, 8  # pixels a thread of structure_rows / hatch_texture slides over
CG_CHUNK = 8  # CG iterations queued between looks at the "done" flag
# Directions whose line is nearer vertical than horizontal: their runs go along y.
ALONG_Y = tuple(d for d in range(DIRECTIONS) if DIRECTIONS // 4 < d < 3 * DIRECTIONS // 4)


def _upload_shared(array: np.ndarray) -> cupy.ndarray:
    """A device copy of `array` for every stream of the device: the copy is finished on
    return (renders on other, non-blocking streams would not wait for it). Allocated from
    CuPy's default memory pool whatever allocator the caller has set: these are the
    device caches, which outlive a caller's private pool (gpu/pencil/replay.py's)."""
    with cupy.cuda.using_allocator(cupy.get_default_memory_pool().malloc):
        device_array = cupy.asarray(array)
    cupy.cuda.get_current_stream().synchronize()
    return device_array


# ------------------------------------------------------------------ line tables --


# Directions whose lines follow a pixel axis or diagonal, with that step (dx, dy): along
# such a line the kernel's weight is constant between its anti-aliased ends, so the
# tiled passes sum those stretches from prefix sums of the tile (two loads per stretch)
# instead of tap by tap. The other four directions go tap by tap.
PREFIX_STEPS = {0: (1, 0), 2: (1, 1), 4: (0, 1), 6: (-1, 1)}
MIN_STRETCH = 3  # shorter equal-weight stretches stay single taps


def _pack(dx: int, dy: int) -> int:
    return (dy << 16) | (dx & 0xFFFF)


def _runs(kernel: np.ndarray, half: int, along_y: bool, weights: list[float]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive non-zero taps along x (or y): (packed first tap, length, first weight)."""
    runs = []
    lines = kernel.T if along_y else kernel
    for line_index, line in enumerate(lines):  # rows (or columns)
        nonzero = np.flatnonzero(line)
        if nonzero.size == 0:
            continue
        for run in np.split(nonzero, np.flatnonzero(np.diff(nonzero) > 1) + 1):
            along, across = int(run[0]) - half, line_index - half
            runs.append((_pack(across, along) if along_y else _pack(along, across), run.size, len(weights)))
            weights.extend(line[run].tolist())
    return runs


def _same_weight(a: float, b: float) -> bool:
    """Equal up to the float rounding of the kernel's construction (cos(pi/2) is 6e-17,
    not 0, so a vertical line's weights differ in their last bits)."""
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


def _prefix_terms(
    kernel: np.ndarray, half: int, step: tuple[int, int], weights: list[float]
) -> list[tuple[int, int, int]]:
    """The kernel as terms w * (D[a] - D[b]) over the prefix sums D(q) = sum_t T(q - t step):
    an equal-weight stretch f..l of a line along `step` is (a, b) = (l, f - step); any other
    tap q is (q, q - step). Returns (packed a, packed b, weight index)."""
    sx, sy = step
    lines: dict[int, list[tuple[int, int, int, float]]] = {}
    for ky, kx in zip(*np.nonzero(kernel), strict=True):
        dx, dy = int(kx) - half, int(ky) - half
        line = dy * sx - dx * sy  # constant along the step
        position = dx * sx + dy * sy if sx else dy  # increases by 1 (or 2 on diagonals) per step
        lines.setdefault(line, []).append((position, dx, dy, float(kernel[ky, kx])))
    terms = []
    for taps in lines.values():
        taps.sort()
        i = 0
        while i < len(taps):
            j = i  # extend an equal-weight stretch of consecutive taps
            while (
                j + 1 < len(taps)
                and _same_weight(taps[j + 1][3], taps[i][3])
                and (taps[j + 1][1], taps[j + 1][2]) == (taps[j][1] + sx, taps[j][2] + sy)
            ):
                j += 1
            if j - i + 1 >= MIN_STRETCH:
                (_, fx, fy, w), (_, lx, ly, _) = taps[i], taps[j]
                terms.append((_pack(lx, ly), _pack(fx - sx, fy - sy), len(weights)))
                weights.append(w)
                i = j + 1
            else:
                _, qx, qy, w = taps[i]
                terms.append((_pack(qx, qy), _pack(qx - sx, qy - sy), len(weights)))
                weights.append(w)
                i += 1
    return terms


@lru_cache(maxsize=32)
def line_table(length: int, width: int, prefix: bool) -> np.ndarray:
    """The 8 line kernels of `reference.line_kernels(length, width)`, scaled by 1/255 (the
    GPU works on M * 255, whole numbers), as an int32 table for pencil.cu (layout there).
    Every tap of the dense kernel is covered once (but negligible ones, see below). With `prefix`, the directions
    of PREFIX_STEPS are prefix-sum terms (tiled passes only); otherwise runs."""
    dense = reference.line_kernels(length, width) / np.float32(255.0)
    # Taps under a millionth of the largest only carry the rounding of cos(pi/2) = 6e-17
    # (a vertical line's neighbouring column): below float32 resolution of the sums.
    dense = np.where(dense < 1e-6 * dense.max(axis=(1, 2), keepdims=True), np.float32(0), dense)
    half = length // 2
    run_starts: list[int] = []
    term_starts: list[int] = []
    runs: list[tuple[int, int, int]] = []  # (packed start, taps, first weight)
    terms: list[tuple[int, int, int]] = []  # (packed tap, packed prefix offset, weight)
    weights: list[float] = []
    for direction in range(DIRECTIONS):
        run_starts.append(len(runs))
        term_starts.append(len(terms))
        if prefix and direction in PREFIX_STEPS:
            terms += _prefix_terms(dense[direction], half, PREFIX_STEPS[direction], weights)
        else:
            runs += _runs(dense[direction], half, direction in ALONG_Y, weights)
    run_starts.append(len(runs))
    term_starts.append(len(terms))
    along_y_bits = sum(1 << d for d in ALONG_Y)
    header = np.array([*run_starts, len(weights), along_y_bits, *term_starts], np.int64)
    assert header.size == TABLE_HEADER
    table = np.concatenate(
        [
            header,
            np.array(runs, np.int64).reshape(-1),
            np.array(terms, np.int64).reshape(-1),
            np.array(weights, np.float32).view(np.int32).astype(np.int64),
        ]
    ).astype(np.int32)
    table.setflags(write=False)
    return table


@dataclass(frozen=True)
class LineTable:
    """One line table on the device, with its sizes."""

    table: cupy.ndarray  # int32, layout in pencil.cu
    runs: int
    terms: int
    weights: int

    @classmethod
    def upload(cls, table: np.ndarray) -> LineTable:
        return cls(_upload_shared(table), int(table[8]), int(table[TABLE_HEADER - 1]), int(table[9]))


@dataclass(frozen=True)
class LinePlan:
    """How the line passes run for one (length, width) on one device: the tiled table
    (prefix terms) and the untiled one (runs only), and the halo, which is one more
    than the kernels' half length for the prefix terms' "before" taps."""

    tiled: LineTable
    untiled: LineTable
    halo: int

    def shared_bytes(self, tiled: bool) -> int:
        if not tiled:
            return self.untiled.runs * 12
        tile = (LINE_TILE_W + 2 * self.halo) * (LINE_TILE_H + 2 * self.halo) * 4
        return tile + (self.tiled.runs + self.tiled.terms) * 12 + self.tiled.weights * 4


def stroke_floor(length: int, width: int) -> float:
    """The smallest range S' is normalised by (reference.stroke_map's floor)."""
    kernel = reference.line_kernels(length, width)[0]
    return reference.FULL_STROKE_CONTRAST * float(kernel[length // 2].sum())


# --------------------------------------------------------------- device caches --


class DeviceAssets:
    """What every render on one device shares: the texture tile (H, ln H), ln of the tile
    turned a quarter turn (the cross-hatching's), the target CDFs per tone preset and the
    line tables per (length, width)."""

    def __init__(self, device: int):
        self.device = device
        self._lock = threading.Lock()
        with cupy.cuda.Device(device):
            texture = pencil_texture()
            self.texture = _upload_shared(texture)
            self.log_texture = _upload_shared(np.log(texture))
            self.log_crossing = _upload_shared(reference.log_crossing_tile())
            self.texture_size = texture.shape[0]
            if texture.shape != (self.texture_size, self.texture_size) or self.texture_size & (self.texture_size - 1):
                raise ValueError(
                    "the GPU wraps the texture tile with a mask: it must be square with a power-of-two side, "
                    f"got {texture.shape}"
                )
            for name in (
                "luma_histogram",
                "median_gradient",
                "line_label_tiled",
                "line_strokes_tiled",
                "matching_lut",
                "fit_tone",
                "merge",
                "structure_rows",
                "hatch_texture",
                "stroke_rows",
                "stroke_columns",
                "cross_hatch",
                "tone_columns",
                "tone_rows",
            ):
                _k(name)  # compile now, not inside the first request
        self._cdfs: dict[tuple[float, float, float], cupy.ndarray] = {}
        self._auto: tuple[cupy.ndarray, ...] | None = None
        self._hatch: tuple[cupy.ndarray, ...] | None = None
        self._lines: OrderedDict[tuple[int, int], LinePlan] = OrderedDict()

    def target_cdf(self, weights: tuple[float, float, float]) -> cupy.ndarray:
        """float64 (256,) target CDF of Lu's tone model, as reference.matching_lut builds it."""
        with self._lock:
            cdf = self._cdfs.get(weights)
            if cdf is None:
                target = np.cumsum(reference.target_histogram(weights))
                target /= target[-1]
                with cupy.cuda.Device(self.device):
                    cdf = self._cdfs[weights] = _upload_shared(target)
            return cdf

    def auto_tone_tables(self) -> tuple[cupy.ndarray, cupy.ndarray, cupy.ndarray]:
        """The reference's tables of tone="auto": int32 (256,) brightening, float64 (sets, 3,
        256) layer CDFs and (sets, 3, 3) Gram matrices (the same bits as the reference's)."""
        with self._lock:
            if self._auto is None:
                tables = (
                    reference.auto_brightening().astype(np.int32),
                    reference.auto_layer_cdfs(),
                    reference.auto_layer_grams(),
                )
                if tables[1].shape[0] > FIT_MAX_SETS:  # the fit_tone kernel's shared arrays
                    raise ValueError(f"fit_tone takes at most {FIT_MAX_SETS} layer sets, got {tables[1].shape[0]}")
                with cupy.cuda.Device(self.device):
                    self._auto = tuple(_upload_shared(np.ascontiguousarray(table)) for table in tables)
            return self._auto

    def hatch_tables(self) -> tuple[cupy.ndarray, cupy.ndarray, tuple[cupy.ndarray, ...]]:
        """hatching="follow": float32 cosines and sines of the turns (reference.hatch_turns)
        and the texture tile H at each of its levels (reference.hatch_tile)."""
        with self._lock:
            if self._hatch is None:
                cosines, sines = reference.hatch_turns()
                with cupy.cuda.Device(self.device):
                    levels = (self.texture,) + tuple(
                        _upload_shared(reference.hatch_tile(level)) for level in range(1, reference.HATCH_LEVELS)
                    )
                    self._hatch = (_upload_shared(cosines), _upload_shared(sines), levels)
            return self._hatch

    def line_plan(self, length: int, width: int) -> LinePlan:
        key = (length, width)
        with self._lock:
            plan = self._lines.get(key)
            if plan is None:
                with cupy.cuda.Device(self.device):
                    tiled, untiled = (LineTable.upload(line_table(length, width, prefix)) for prefix in (True, False))
                    plan = LinePlan(tiled, untiled, length // 2 + 1)
                self._lines[key] = plan
                while len(self._lines) > 64:
                    self._lines.popitem(last=False)
            else:
                self._lines.move_to_end(key)
            return plan


_assets: dict[int, DeviceAssets] = {}
_assets_lock = threading.Lock()


def assets(device: int) -> DeviceAssets:
    with _assets_lock:
        found = _assets.get(device)
        if found is None:
            found = _assets[device] = DeviceAssets(device)
        return found


# --------------------------------------------------------------------- stages --


@dataclass
class Planes:
    """Device planes of one render (H, W): luma uint8 and its histogram."""

    luma: cupy.ndarray
    histogram: cupy.ndarray


def luma_and_histogram(image: cupy.ndarray) -> Planes:
    """(H, W) or (H, W, 3) uint8 -> luma (H, W) uint8 (OpenCV's Y of YCrCb) and the
    (256,) uint32 histogram of it (stage 6)."""
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else 3
    luma = kernels.empty((height, width), cupy.uint8)
    histogram = cupy.zeros(256, cupy.uint32)
    pixels = height * width
    blocks = min(kernels.div_up(pixels, 256), 132 * 8)
    _k("luma_histogram")((blocks,), (256,), (image, np.int32(channels), np.int64(pixels), luma, histogram))
    return Planes(luma, histogram)


def padded_shape(height: int, width: int, halo: int) -> tuple[int, int]:
    return kernels.div_up(height, LINE_TILE_H) * LINE_TILE_H + 2 * halo, kernels.div_up(
        width, LINE_TILE_W
    ) * LINE_TILE_W + 2 * halo


def gradient_padded(luma: cupy.ndarray, halo: int) -> cupy.ndarray:
    """Stages 1-2: M of the 3x3 median of luma, float32, in a zero-bordered padded plane
    (see padded_shape); M itself is padded[halo:halo+H, halo:halo+W]."""
    height, width = luma.shape
    rows, pitch = padded_shape(height, width, halo)
    magnitude = kernels.empty((rows, pitch), cupy.float32)
    grid = (kernels.div_up(pitch, 32), kernels.div_up(rows, 8))
    _k("median_gradient")(
        grid,
        (32, 8),
        (luma, np.int32(height), np.int32(width), magnitude, np.int32(pitch), np.int32(rows), np.int32(halo)),
    )
    return magnitude


# Tests and the sanitizer run set this to exercise the untiled line passes (taps read
# from the padded plane in global memory), which real renders use only for huge halos.
FORCE_UNTILED_LINE_PASSES = False


def _line_pass(pass_number: int, plan: LinePlan, source: cupy.ndarray, height: int, width: int, **outputs) -> None:
    tiled = plan.shared_bytes(True) <= kernels.max_shared_bytes() and not FORCE_UNTILED_LINE_PASSES
    if not tiled and plan.shared_bytes(False) > kernels.max_shared_bytes():
        raise LineKernelTooLarge(f"line kernels with {plan.untiled.runs} runs do not fit in shared memory")
    name = ("line_label_" if pass_number == 1 else "line_strokes_") + ("tiled" if tiled else "global")
    grid = (kernels.div_up(width, LINE_TILE_W), kernels.div_up(height, LINE_TILE_H))
    null = np.uint64(0)
    args = (
        source,
        np.int32(source.shape[1]),
        np.int32(plan.halo),
        np.int32(height),
        np.int32(width),
        (plan.tiled if tiled else plan.untiled).table,
        outputs.get("label", null),
        outputs.get("packed", null),
        outputs.get("strokes", null),
        outputs.get("extrema", null),
        np.float32(1.0 + reference.LABEL_MARGIN),
    )
    _k(name)(grid, (32, LINE_WARPS), args, shared_mem=plan.shared_bytes(tiled))


def classify(magnitude_padded: cupy.ndarray, plan: LinePlan, height: int, width: int, with_label: bool = True):
    """Stages 3-4: argmax label (H, W) uint8 (None unless with_label) and the packed plane
    for pass 2 (padded float32: M with the label in its 3 low mantissa bits)."""
    label = kernels.empty((height, width), cupy.uint8) if with_label else None
    packed = cupy.zeros_like(magnitude_padded)
    _line_pass(
        1, plan, magnitude_padded, height, width, label=label if label is not None else np.uint64(0), packed=packed
    )
    return label, packed


def strokes(packed: cupy.ndarray, plan: LinePlan, height: int, width: int) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Stage 5 before normalisation: S' (H, W) float32 and its (min, max) as uint32 bits."""
    out = kernels.empty((height, width), cupy.float32)
    extrema = cupy.full(2, 0x7F800000, cupy.uint32)  # (+inf, then 0 below)
    extrema[1] = 0
    _line_pass(2, plan, packed, height, width, strokes=out, extrema=extrema)
    return out, extrema


@dataclass
class TexturePlanes:
    """The texture as the CG and merge kernels read it, like DeviceAssets' tile: here a
    plane over the image (texture_size 0: read as it is, not wrapped)."""

    texture: cupy.ndarray | None  # H, for "fast"
    log_texture: cupy.ndarray | None  # ln H, for "lu"
    texture_size: int = 0


def oriented_texture(luma: cupy.ndarray, params: PencilParams, device_assets: DeviceAssets, with_log: bool):
    """hatching="follow", as reference.oriented_texture: the texture turned along the
    photo's structure, float32 (H, W), and its log when with_log (texture "lu"). Two
    launches: the tensor's row sums, then its column sums fused with the turn and the
    samples (the tensor itself is never stored)."""
    height, width = luma.shape
    size = np.int32(params.structure_size(height, width))
    block = (32, 8)
    rows = kernels.empty((3, height, width), cupy.float32)
    _k("structure_rows")(
        (kernels.div_up(kernels.div_up(width, BOX_RUN), 32), kernels.div_up(height, 8)),
        block,
        (luma, np.int32(height), np.int32(width), size, rows),
    )
    cosines, sines, tiles = device_assets.hatch_tables()
    level, inverse_scale = reference.hatch_sampling(params.hatch_scale(height, width))
    tile = tiles[level]
    texture = None if with_log else kernels.empty((height, width), cupy.float32)  # "lu" reads ln H alone
    log_texture = kernels.empty((height, width), cupy.float32) if with_log else None
    _k("hatch_texture")(
        (kernels.div_up(width, 32), kernels.div_up(kernels.div_up(height, HATCH_RUN), 8)),
        block,
        (
            rows,
            np.int32(height),
            np.int32(width),
            size,
            tile,
            np.int32(tile.shape[0]),
            cosines,
            sines,
            np.float32(HATCH_BIAS),
            np.float32(HATCH_BIAS_FLOOR),
            *reference.hatch_own_direction(),
            inverse_scale,
            np.float32(reference.TILE_MEAN),
            np.float32(H_MIN),
            np.float32(H_MAX),
            texture if texture is not None else np.uint64(0),
            log_texture if log_texture is not None else np.uint64(0),
        ),
    )
    return TexturePlanes(texture, log_texture)


def cross_hatch(texture: DeviceAssets | TexturePlanes, j: cupy.ndarray, device_assets: DeviceAssets) -> cupy.ndarray:
    """Stage 9, as reference.crossed_log_texture: ln H_x = ln H + c(J) ln H_turned, float32
    (H, W), from the tile's ln H or a turned texture's plane (written over in place)."""
    height, width = j.shape
    out = texture.log_texture if isinstance(texture, TexturePlanes) else kernels.empty((height, width), cupy.float32)
    start, full = CROSS_HATCH_TONES
    _k("cross_hatch")(
        (kernels.div_up(width, 32), kernels.div_up(height, 8)),
        (32, 8),
        (
            texture.log_texture,
            np.int32(texture.texture_size),
            device_assets.log_crossing,
            np.int32(device_assets.texture_size),
            j,
            np.float32(start),
            np.float32(full),
            np.int32(height),
            np.int32(width),
            out,
        ),
    )
    return out


def fit_tone(
    planes: Planes, device_assets: DeviceAssets, shift: tuple[int, float] = (0, 0.0)
) -> tuple[cupy.ndarray, cupy.ndarray]:
    """Stage 7, as reference.fit_tone: the float64 (256,) target CDF of the mixture fitted to
    the photo's histogram, moved by a preset's `shift` (PencilParams.tone_shift), and (4,)
    float64 (dark layer index, weights)."""
    brighten, layers, gram = device_assets.auto_tone_tables()
    cdf = kernels.empty(256, cupy.float64)
    fit = kernels.empty(4, cupy.float64)
    toward, share = shift
    args = (planes.histogram, brighten, layers, gram, np.int32(layers.shape[0]), np.int32(toward), np.float64(share))
    _k("fit_tone")((1,), (256,), (*args, cdf, fit))
    return cdf, fit


def tone(planes: Planes, cdf: cupy.ndarray | None, blur: int, gamma: float, with_log: bool, lut=None):
    """Stages 7-8, as reference.tone_map: J = LUT(box mean of luma) ** gamma, float32 (H, W),
    and ln max(J, 1/255) when with_log (texture "lu"), else None. Also returns the uint8
    LUT: the one matching the histogram to the target `cdf`, or `lut` as given ((256,)
    uint8 on the device)."""
    height, width = planes.luma.shape
    if lut is None:
        lut = kernels.empty(256, cupy.uint8)
        _k("matching_lut")((1,), (256,), (planes.histogram, cdf, lut))
    colsum = kernels.empty((height, width), cupy.int32)
    _k("tone_columns")(
        (kernels.div_up(width, 128), kernels.div_up(height, TONE_RUN)),
        (128,),
        (planes.luma, np.int32(height), np.int32(width), np.int32(blur), colsum),
    )
    j = kernels.empty((height, width), cupy.float32)
    log_j = kernels.empty((height, width), cupy.float32) if with_log else None
    _k("tone_rows")(
        (kernels.div_up(width, TONE_ROW_BLOCK), height),
        (TONE_ROW_BLOCK,),
        (
            colsum,
            lut,
            np.int32(height),
            np.int32(width),
            np.int32(blur),
            np.float32(gamma),
            j,
            log_j if with_log else np.uint64(0),
        ),
        shared_mem=(TONE_ROW_BLOCK + blur - 1) * 4,
    )
    return j, log_j, lut


def solve_beta(
    log_tone: cupy.ndarray,
    texture: DeviceAssets | TexturePlanes,
    staging: np.ndarray | None = None,
    lam: float = LU_LAMBDA,
    tolerance: float = CG_TOLERANCE,
    max_iterations: int = CG_MAX_ITERATIONS,
):
    """Stage 9 (lu): Lu's beta by Jacobi-preconditioned CG on the device, as
    reference.solve_beta_lu. Returns (beta float32 (H, W), scalars float64 device array;
    scalars[6] is the number of iterations). Two launches per iteration, no host sync:
    the kernels skip themselves once converged. `staging` (>= 8 pinned bytes): the done
    flag is read through it every CG_CHUNK iterations, one chunk late, so that the host
    stops queueing soon after convergence without ever draining the stream."""
    height, width = log_tone.shape
    sms = kernels.device_attribute("MultiProcessorCount")
    columns = kernels.div_up(width, CG_BLOCK[0])
    grid = (columns, max(1, min(kernels.div_up(height, CG_BLOCK[1]), CG_BLOCKS_PER_SM * sms // columns)))
    stream = cupy.cuda.get_current_stream()
    beta = kernels.empty(log_tone.shape, cupy.float32)
    residual = kernels.empty(log_tone.shape, cupy.float32)
    directions = [kernels.empty(log_tone.shape, cupy.float32), kernels.empty(log_tone.shape, cupy.float32)]
    jacobi = kernels.empty(log_tone.shape, cupy.float32)
    partials = kernels.empty(3 * grid[0] * grid[1], cupy.float64)
    arrivals = cupy.zeros(1, cupy.uint32)
    scalars = cupy.zeros(9, cupy.float64)
    scalars[7] = tolerance
    scalars[8] = max_iterations
    tex = (texture.log_texture, np.int32(texture.texture_size))
    size = (np.int32(height), np.int32(width), np.float32(lam))
    _k("cg_start")(grid, CG_BLOCK, (log_tone, *tex, *size, beta, residual, jacobi, partials, arrivals, scalars))
    direction_kernel, update_kernel = _k("cg_direction"), _k("cg_update")
    done_flag = staging[:8].view(np.float64) if staging is not None else None
    previous_check: cupy.cuda.Event | None = None
    for iteration in range(max_iterations):
        previous, current = directions[iteration % 2], directions[(iteration + 1) % 2]
        direction_kernel(grid, CG_BLOCK, (residual, previous, jacobi, *size, scalars, current, partials, arrivals))
        update_kernel(grid, CG_BLOCK, (current, jacobi, *size, scalars, beta, residual, partials, arrivals))
        if done_flag is not None and (iteration + 1) % CG_CHUNK == 0:
            if previous_check is not None:
                previous_check.synchronize()
                if done_flag[0] != 0.0:
                    break
            cupy.cuda.runtime.memcpyAsync(
                done_flag.ctypes.data, scalars.data.ptr + 5 * 8, 8, cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr
            )
            previous_check = stream.record()
    return beta, scalars


def stroke_darkness_means(
    strokes_plane, extrema, floor_range: float, stroke_gamma: float, j, size: int
) -> cupy.ndarray:
    """Stages 5b-c, as reference.deepened_strokes and stroke_darkness_means: (2, H, W) float32,
    the size x size box means of d = 1 - S_t and of d^2, S_t the normalised strokes deepened
    by the tone `j`. Two launches: row sums, then column sums."""
    height, width = strokes_plane.shape
    rows = kernels.empty((2, height, width), cupy.float32)
    _k("stroke_rows")(
        (kernels.div_up(kernels.div_up(width, 32), 32), kernels.div_up(height, 8)),
        (32, 8),
        (
            strokes_plane,
            extrema,
            np.float32(floor_range),
            np.float32(STROKE_POWER * stroke_gamma),
            j,
            np.float32(STROKE_DEEPENING),
            np.int32(height),
            np.int32(width),
            np.int32(size),
            rows,
        ),
    )
    means = kernels.empty((2, height, width), cupy.float32)
    _k("stroke_columns")(
        (kernels.div_up(width, 32), kernels.div_up(kernels.div_up(height, 8), 8), 2),
        (32, 8),
        (rows, np.int32(height), np.int32(width), np.int32(size), means),
    )
    return means


def merge(
    strokes_plane,
    extrema,
    floor_range: float,
    stroke_gamma: float,
    means,
    j,
    beta,
    log_texture: cupy.ndarray,
    image: cupy.ndarray,
    color: bool,
) -> cupy.ndarray:
    """Stages 9-10 fused: the normalised, deepened strokes S_t, the balance (reference.balance,
    with the (2, H, W) means from stroke_darkness_means), texture T from ln H_x (cross_hatch),
    R = S * T as uint8, (H, W) or,
    with color, (H, W, 3) RGB with the photo's chroma."""
    height, width = strokes_plane.shape
    channels_in = 1 if image.ndim == 2 else 3
    out = kernels.empty((height, width, 3) if color else (height, width), cupy.uint8)
    _k("merge")(
        (kernels.div_up(width, 32), kernels.div_up(height, 8)),
        (32, 8),
        (
            strokes_plane,
            extrema,
            np.float32(floor_range),
            np.float32(STROKE_POWER * stroke_gamma),
            np.float32(stroke_gamma),
            np.float32(STROKE_DEEPENING),
            np.float32(STROKE_BUDGET),
            np.float32(STROKE_THINNING_MAX),
            means,
            j,
            beta if beta is not None else np.uint64(0),
            log_texture,
            np.int32(height),
            np.int32(width),
            image,
            np.int32(channels_in),
            np.int32(3 if color else 1),
            out,
        ),
    )
    return out


# -------------------------------------------------------------------- pipeline --


def upload(lease, image: np.ndarray, staging: str = "in", stream=None) -> cupy.ndarray:
    """Host uint8 array -> the same on the lease's device, through its pinned staging
    buffer `staging`, queued on `stream` (default `lease.stream`; the copy is asynchronous)."""
    image = np.ascontiguousarray(image)
    runtime = cupy.cuda.runtime
    stream = stream or lease.stream
    with cupy.cuda.Device(lease.device), stream:
        pinned = lease.staging(staging, image.nbytes)
        pinned[:] = image.reshape(-1).view(np.uint8)
        d_image = kernels.empty(image.shape, cupy.uint8)
        runtime.memcpyAsync(d_image.data.ptr, pinned.ctypes.data, image.nbytes, runtime.memcpyHostToDevice, stream.ptr)
    return d_image


def download(lease, out: cupy.ndarray, marks: list | None = None) -> np.ndarray:
    """A device array ready in the order of `lease.stream` -> a host copy (waits for it).
    With `marks`, a ("download", event) pair is appended after the copy."""
    runtime = cupy.cuda.runtime
    with cupy.cuda.Device(lease.device):
        pinned_out = lease.staging("out", out.nbytes)
        runtime.memcpyAsync(
            pinned_out.ctypes.data, out.data.ptr, out.nbytes, runtime.memcpyDeviceToHost, lease.stream.ptr
        )
        if marks is not None:
            marks.append(("download", lease.stream.record()))
        lease.stream.synchronize()
    return pinned_out.copy().reshape(out.shape)


def upload_tone_lut(lease, lut: np.ndarray) -> cupy.ndarray:
    """An explicit tone LUT, (256,) uint8 as reference.tone_map's `lut`, on the lease's
    device: `upload`ed through its own staging on the current stream. Like the photo's,
    the staging is the lease's: its holder draws one frame at a time (each drawing is
    downloaded before the next frame is queued)."""
    lut = np.asarray(lut, np.uint8)
    if lut.shape != (256,):
        raise ValueError(f"a tone LUT has 256 entries, got shape {lut.shape}")
    return upload(lease, lut, "tone", cupy.cuda.get_current_stream())


def render_on(
    lease,
    image: np.ndarray,
    params: PencilParams,
    marks: list | None = None,
    serial: bool = False,
    tone_lut: np.ndarray | None = None,
) -> np.ndarray:
    """Photo -> drawing on `lease` (a gpu.pool.Lease), host arrays in and out; shapes as
    reference.render. `marks`, `serial` and `tone_lut`: see render_device."""
    image = np.ascontiguousarray(reference.fit_max_side(image, params.max_side))
    if marks is not None:
        with cupy.cuda.Device(lease.device):
            marks.append(("start", lease.stream.record()))
    d_image = upload(lease, image)
    out = render_device(lease, d_image, params, marks, serial, tone_lut)
    return download(lease, out, marks)


def render_device(
    lease,
    d_image: cupy.ndarray,
    params: PencilParams,
    marks: list | None = None,
    serial: bool = False,
    tone_lut: np.ndarray | None = None,
) -> cupy.ndarray:
    """Photo -> drawing on `lease`, device arrays in and out: (H, W) or (H, W, 3) uint8
    ready in the order of `lease.stream` -> (H, W) uint8 or, in colour mode, (H, W, 3)
    uint8 RGB, ready in the same order. The photo is drawn at its own size (max_side is
    the caller's).

    tone_lut: None, or a (256,) uint8 LUT the tone stage applies instead of matching the
    photo's histogram to the target of `params.tone`, as reference.render's: uploaded
    (upload_tone_lut) in place of fit_tone and the matching LUT.

    For timing: with `marks` a list, (stage name, cupy Event) pairs recorded on the main
    stream are appended to it; with `serial`, the tone branch runs on the main stream
    too, so that the marks time every stage alone.
    """
    height, width = d_image.shape[:2]
    length = params.line_length(height, width)
    device_assets = assets(lease.device)
    main = lease.stream
    side = main if serial else lease.side_stream

    def mark(name: str, stream=main) -> None:
        if marks is not None and stream is main:
            marks.append((name, main.record()))

    with cupy.cuda.Device(lease.device), main:
        mark("upload")
        planes = luma_and_histogram(d_image)
        luma_ready = main.record()
        mark("luma+histogram")
        # hatching="follow" turns the texture from the luma alone. With "lu" it goes first on
        # the main stream, beside the tone map on the side stream, since the CG solve waits
        # for both; with "fast" it goes on the side stream, beside the stroke branch.
        texture: DeviceAssets | TexturePlanes = device_assets
        turned_ready = None
        if params.hatching == "follow" and params.texture == "lu":
            texture = oriented_texture(planes.luma, params, device_assets, with_log=True)
            turned_ready = main.record()
            mark("texture turned (follow)")

        # Stroke branch (stages 1-5). Both line tables span length x length: one halo.
        thin, wide = device_assets.line_plan(length, 0), device_assets.line_plan(length, params.stroke_width)
        magnitude = gradient_padded(planes.luma, thin.halo)
        mark("median+gradient")
        _, packed = classify(magnitude, thin, height, width, with_label=False)
        mark("responses+argmax")
        del magnitude
        stroke_plane, extrema = strokes(packed, wide, height, width)
        mark("stroke map")
        del packed
        # Tone branch (stages 6-9) on the side stream, queued second: the CG loop paces the host.
        side.wait_event(luma_ready)
        with side:
            cdf, lut = None, None
            if tone_lut is not None:
                lut = upload_tone_lut(lease, tone_lut)
            else:
                cdf, _ = fit_tone(planes, device_assets, params.tone_shift)
            j, log_j, _ = tone(
                planes, cdf, params.tone_blur_size(height, width), params.tone_gamma, params.texture == "lu", lut
            )
            mark("tone", side)
            j_ready = side.record()
            if params.hatching == "follow" and params.texture == "fast":
                texture = oriented_texture(planes.luma, params, device_assets, with_log=True)
                mark("texture turned (follow)", side)
            if turned_ready is not None:
                side.wait_event(turned_ready)
            log_texture = cross_hatch(texture, j, device_assets)
            mark("cross-hatching", side)

        # The strokes deepen with the tone: their means wait for J, and run beside the CG solve.
        main.wait_event(j_ready)
        floor = stroke_floor(length, params.stroke_width)
        means = stroke_darkness_means(stroke_plane, extrema, floor, params.stroke_gamma, j, length)
        mark("stroke means")

        with side:
            beta = None
            if params.texture == "lu":
                beta, _ = solve_beta(log_j, TexturePlanes(None, log_texture), lease.staging("cg", 8))
                mark("texture lu (CG)", side)
            tone_ready = side.record()

        main.wait_event(tone_ready)
        color = params.mode == "color"
        out = merge(stroke_plane, extrema, floor, params.stroke_gamma, means, j, beta, log_texture, d_image, color)
        mark("merge")
        return out


def render(image: np.ndarray, params: PencilParams, pool=None) -> np.ndarray:
    """Photo -> drawing on a lease of `pool` (default: the process-wide pool of every
    visible GPU). Line kernels too large for the GPU passes (an extreme line length on a
    huge photo) render on the CPU reference instead."""
    from gpu.pool import default_pool

    pool = pool or default_pool()
    try:
        return pool.run(lambda lease: render_on(lease, image, params))
    except LineKernelTooLarge as exc:
        log.warning("%s; rendering on the CPU", exc)
        return reference.render(image, params)
