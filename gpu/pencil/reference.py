"""The pencil pipeline of Lu, Xu & Jia (2012) in NumPy/OpenCV: the definition of correct
and the CPU backend.

Ten stages (numbers as in DESIGN.md). Stroke branch: (1) median 3x3, (2) forward
gradient |dx|+|dy|, (3) 8 normalised line kernels, (4) responses and argmax label,
(5) the classified gradient drawn with the widened lines -> stroke map S, deepened where
the tone is dark. Tone branch: (6) histogram of L, (7) the three-layer target histogram
fitted to the photo, (8) matching LUT read at the box mean of L -> tone map J, (9) pencil
texture T = H ** beta, cross-hatched where dark, (10) the balance of strokes and tone,
R = S * T, colour through YCbCr.

Images are float32 in [0, 1] unless a name says `_u8`. Shapes are (height, width).
Borders: the median and the tone blur replicate the edge; the line convolutions see
zero gradient outside the image (a GPU version must pad its halos the same way).
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np

from gpu.pencil.params import (
    CG_MAX_ITERATIONS,
    CG_TOLERANCE,
    CROSS_HATCH_TONES,
    DIRECTIONS,
    HATCH_BIAS,
    HATCH_BIAS_FLOOR,
    HATCH_TURNS,
    LU_LAMBDA,
    MU_D,
    SIGMA_B,
    SIGMA_D,
    STROKE_BUDGET,
    STROKE_DEEPENING,
    STROKE_POWER,
    STROKE_THINNING_MAX,
    TONE_SHIFTS,
    U_A,
    U_B,
    PencilParams,
    fitted_size,
)
from gpu.pencil.texture import H_MAX, H_MIN, HATCH_ANGLE_DEG, pencil_texture, tile_texture

# ---------------------------------------------------------------- input and output --


def fit_max_side(image: np.ndarray, max_side: int | None) -> np.ndarray:
    """Downscale (area filter) so that max(height, width) <= max_side; never upscales."""
    height, width = fitted_size(image.shape[0], image.shape[1], max_side)
    if (height, width) == image.shape[:2]:
        return image
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)


def split_luma(image: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(H, W) gray or (H, W, 3) RGB uint8 -> (luma uint8 (H, W), YCrCb uint8 or None)."""
    if image.ndim == 2:
        return image, None
    ycrcb = cv2.cvtColor(image, cv2.COLOR_RGB2YCrCb)
    return np.ascontiguousarray(ycrcb[..., 0]), ycrcb


def to_u8(values: np.ndarray) -> np.ndarray:
    """float in [0, 1] -> uint8, rounded to nearest."""
    return np.clip(values * 255.0 + 0.5, 0, 255).astype(np.uint8)


# ------------------------------------------------------------------ stroke branch --


def median3(luma_u8: np.ndarray) -> np.ndarray:
    """Stage 1: 3x3 median (edge replicated) of uint8 luma -> float32 in [0, 1]."""
    return cv2.medianBlur(luma_u8, 3).astype(np.float32) / 255.0


def gradient(smooth: np.ndarray) -> np.ndarray:
    """Stage 2: M = |L(x+1,y) - L(x,y)| + |L(x,y+1) - L(x,y)|, 0 past the last column/row."""
    magnitude = np.zeros_like(smooth)
    magnitude[:, :-1] += np.abs(np.diff(smooth, axis=1))
    magnitude[:-1, :] += np.abs(np.diff(smooth, axis=0))
    return magnitude


@lru_cache(maxsize=32)
def line_kernels(length: int, width: int = 0) -> np.ndarray:
    """Stage 3: (8, length, length) float32 line kernels at angles i*pi/8, each summing to 1.

    A line through the centre, `length` px long (odd) and 2*width+1 px wide, anti-aliased:
    full weight within `width` px of the centre line, falling linearly to 0 one px
    further, and likewise past the ends. width=0 is the 1 px line of the first pass.
    Normalising each kernel removes the +-6% angle bias of rotated-line kernels.
    """
    if length < 3 or length % 2 == 0:
        raise ValueError(f"line length must be odd and >= 3, got {length}")
    half = length // 2
    y, x = np.mgrid[-half : half + 1, -half : half + 1].astype(np.float64)
    kernels = np.empty((DIRECTIONS, length, length), np.float32)
    for i in range(DIRECTIONS):
        angle = i * np.pi / DIRECTIONS
        along = x * np.cos(angle) + y * np.sin(angle)
        across = np.abs(-x * np.sin(angle) + y * np.cos(angle))
        weight = np.clip(width + 1.0 - across, 0.0, 1.0) * np.clip(half + 0.5 - np.abs(along), 0.0, 1.0)
        kernels[i] = weight / weight.sum()
    kernels.setflags(write=False)
    return kernels


def correlate(image: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Direct correlation with zeros outside the image, float32 (H, W). The line kernels
    are point-symmetric, so this equals convolution. The readable form of `LineFilter`."""
    return cv2.filter2D(image, cv2.CV_32F, kernel, borderType=cv2.BORDER_CONSTANT)


class LineFilter:
    """The 8 line convolutions of one image size, through the FFT.

    Same result as `correlate` with each kernel (to float32 rounding). The image is
    zero-padded by the kernel length so that the DFT's circular convolution is the linear
    one; the kernel sits unshifted in the top-left corner, so the result is read `half`
    px down and right. M is transformed once for the 8 responses, and the 8 classified
    products are summed in the frequency domain before one inverse: with the kernel
    spectra cached, faster than 16 direct filters. Spectra use
    OpenCV's packed real (CCS) layout.
    """

    def __init__(self, height: int, width: int, length: int, stroke_width: int):
        self.length = length
        self.kernels = line_kernels(length, stroke_width)
        self.shape = (height, width)
        self.padded = (cv2.getOptimalDFTSize(height + length - 1), cv2.getOptimalDFTSize(width + length - 1))
        self.spectra = _kernel_spectra(self.padded, length, stroke_width)

    def _transform(self, plane: np.ndarray) -> np.ndarray:
        padded = np.zeros(self.padded, np.float32)
        padded[: plane.shape[0], : plane.shape[1]] = plane
        return cv2.dft(padded)

    def _inverse(self, spectrum: np.ndarray) -> np.ndarray:
        half = self.length // 2
        height, width = self.shape
        full = cv2.idft(spectrum, flags=cv2.DFT_REAL_OUTPUT | cv2.DFT_SCALE)
        return full[half : half + height, half : half + width]

    def responses(self, image: np.ndarray):
        """Yield kernel_i * image for i = 0..7, float32 (H, W)."""
        spectrum = self._transform(image)
        for kernel_spectrum in self.spectra:
            yield self._inverse(cv2.mulSpectrums(spectrum, kernel_spectrum, 0))

    def summed(self, images) -> np.ndarray:
        """sum_i kernel_i * images[i], float32 (H, W), with a single inverse transform."""
        total = None
        for image, kernel_spectrum in zip(images, self.spectra, strict=True):
            product = cv2.mulSpectrums(self._transform(image), kernel_spectrum, 0)
            total = product if total is None else cv2.add(total, product, dst=total)
        assert total is not None, "summed needs the 8 images"
        return self._inverse(total)


class _LazySpectra:
    """The 8 kernel spectra of a padded size, each computed when asked for: for sizes too
    large to keep 8 padded planes in memory."""

    def __init__(self, padded: tuple[int, int], kernels: np.ndarray):
        self.padded, self.kernels = padded, kernels

    def __iter__(self):
        for kernel in self.kernels:
            yield _spectrum(kernel, self.padded)


def _spectrum(kernel: np.ndarray, padded: tuple[int, int]) -> np.ndarray:
    plane = np.zeros(padded, np.float32)
    plane[: kernel.shape[0], : kernel.shape[1]] = kernel
    return cv2.dft(plane)


SPECTRUM_CACHE_MAX_PIXELS = 1 << 22  # padded planes up to 4 MP (8 spectra = 128 MiB) are cached


@lru_cache(maxsize=2)  # the two passes of the latest image size
def _cached_spectra(padded: tuple[int, int], length: int, stroke_width: int) -> tuple[np.ndarray, ...]:
    return tuple(_spectrum(kernel, padded) for kernel in line_kernels(length, stroke_width))


def _kernel_spectra(padded: tuple[int, int], length: int, stroke_width: int):
    if padded[0] * padded[1] <= SPECTRUM_CACHE_MAX_PIXELS:
        return _cached_spectra(padded, length, stroke_width)
    return _LazySpectra(padded, line_kernels(length, stroke_width))


# A later direction takes the label only when its response beats the current one by
# this factor: exact ties (frequent: M is quantised to 1/255 and the kernels are
# symmetric) then go to the lowest direction whatever the rounding of the sums, so the
# FFT here and the direct sums on the GPU label them alike.
LABEL_MARGIN = 1e-3


def classify(magnitude: np.ndarray, lines: LineFilter) -> np.ndarray:
    """Stage 4: label(p) = argmax_i (L_i * M)(p), uint8 in 0..7, with ties (within a
    relative LABEL_MARGIN) going to the lowest direction: scanning i upwards, direction i
    replaces the current label when G_i > G_label * (1 + LABEL_MARGIN)."""
    responses = lines.responses(magnitude)
    best = next(responses).copy()
    label = np.zeros(magnitude.shape, np.uint8)
    factor = np.float32(1.0 + LABEL_MARGIN)
    for i, response in enumerate(responses, start=1):
        better = response > best * factor
        label[better] = i
        best[better] = response[better]
    return label


# An edge of this contrast (a quarter of the grey range) or more may draw a full-black
# stroke; weaker ones only when nothing in the image is stronger than they are.
FULL_STROKE_CONTRAST = 0.25


def stroke_map(magnitude: np.ndarray, label: np.ndarray, wide_lines: LineFilter, stroke_gamma: float) -> np.ndarray:
    """Stage 5: S' = sum_i L'_i * C_i with C_i = M where label == i, normalised to [0, 1];
    S = (1 - S') ** (STROKE_POWER * stroke_gamma), float32 (H, W).

    Lu et al. normalise S' by its range. On a photo the strongest edges set that range;
    on a flat, noisy image (fog, a wall) the range is tiny and normalising it would turn
    noise into black scribbles, so the range is never taken below the S' of a straight
    edge of contrast FULL_STROKE_CONTRAST (that contrast times the share of the widened
    line's weight on its centre line). Photos are unaffected: their range is 3-6x that.
    """
    classified = (np.where(label == i, magnitude, np.float32(0)) for i in range(DIRECTIONS))
    strokes = wide_lines.summed(classified)
    half = wide_lines.length // 2
    floor = FULL_STROKE_CONTRAST * float(wide_lines.kernels[0][half].sum())
    low, high = float(strokes.min()), float(strokes.max())
    sketch = 1.0 - (strokes - low) / np.float32(max(high - low, floor))
    sketch **= np.float32(STROKE_POWER * stroke_gamma)
    return sketch.astype(np.float32, copy=False)


def strokes_of(luma_u8: np.ndarray, params: PencilParams) -> np.ndarray:
    """Stages 1-5 of the (H, W) uint8 luma: the stroke map S, float32 (H, W), before the tone."""
    height, width = luma_u8.shape
    length = params.line_length(height, width)
    magnitude = gradient(median3(luma_u8))
    label = classify(magnitude, LineFilter(height, width, length, 0))
    wide_lines = LineFilter(height, width, length, params.stroke_width)
    return stroke_map(magnitude, label, wide_lines, params.stroke_gamma)


def deepened_strokes(sketch: np.ndarray, tone: np.ndarray) -> np.ndarray:
    """Stage 5b (issue 38): S_t = S ** (1 + STROKE_DEEPENING (1 - J)), float32 (H, W): the
    strokes darker where the tone is dark. The balance lightens the tone between them by as
    much, so a dark region's darkness moves from the flat tone onto its edges."""
    exponent = np.float32(1.0) + np.float32(STROKE_DEEPENING) * (np.float32(1.0) - tone)
    return np.power(sketch, exponent).astype(np.float32, copy=False)


def stroke_darkness_means(strokes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Stage 5c: (D1, D2), the means of the strokes' darkness d = 1 - S_t and of d ** 2 over
    size x size squares (edges replicated), float32 (H, W) each."""
    darkness = np.float32(1.0) - strokes
    first = cv2.blur(darkness, (size, size), borderType=cv2.BORDER_REPLICATE)
    second = cv2.blur(darkness * darkness, (size, size), borderType=cv2.BORDER_REPLICATE)
    return first, second


def balance(
    strokes: np.ndarray, means: tuple[np.ndarray, np.ndarray], tone: np.ndarray, stroke_gamma: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 10a (issue 38): strokes that keep the tone. Returns (S_b, J_b), float32 (H, W).

    Over a square of the line length the strokes may darken the drawing on average by at
    most the tone's darkness plus a little room, times the strokes' darkness option:
    B = stroke_gamma (1 - J + STROKE_BUDGET) (at the default 1, the tone's own). Where they
    would darken it more (a bright, detailed region), they are thinned first: d -> d ** p,
    which keeps the dark cores of the outlines. The mean of d ** p is modelled from the two
    means (D1, D2) as log-linear in p, E(p) = D1 r ** (p - 1) with r = D2 / D1, and p
    solves E(p) = B within [1, STROKE_THINNING_MAX]; if that is not enough, they are drawn
    lighter by k = min(1, B / E(p)): S_b = 1 - k d ** p. An outline alone in a light region
    (D1 <= B) keeps p = 1 and k = 1. Then J_b = J / max(1 - k E(p), J) (at most 1): the
    tone under the strokes is lightened by what they darken on average, so a region's mean
    stays near J and the tone map's order of light and dark survives the strokes."""
    first, second = means
    one = np.float32(1.0)
    allowed = np.float32(stroke_gamma) * (one - tone + np.float32(STROKE_BUDGET))
    first = np.maximum(first, np.float32(1e-6))
    ratio = np.clip(second / first, np.float32(1e-6), np.float32(0.999))
    excess = np.minimum(np.maximum(allowed / first, np.float32(1e-6)), one)
    power = np.clip(one + np.log(excess) / np.log(ratio), one, np.float32(STROKE_THINNING_MAX))
    expected = first * np.power(ratio, power - one)
    share = np.minimum(one, allowed / expected)
    balanced = one - share * np.power(one - strokes, power)
    balanced_tone = tone / np.maximum(one - share * expected, tone)
    return balanced.astype(np.float32, copy=False), balanced_tone.astype(np.float32, copy=False)


# -------------------------------------------------------------------- tone branch --


def histogram(luma_u8: np.ndarray) -> np.ndarray:
    """Stage 6: (256,) int64 counts of the luma values."""
    return np.bincount(luma_u8.ravel(), minlength=256)


@lru_cache(maxsize=8)
def target_histogram(weights: tuple[float, float, float]) -> np.ndarray:
    """Stage 7: Lu's tone model p(v), v = 0..255, as (256,) float64 summing to 1.

    p = (w1 p1 + w2 p2 + w3 p3) / Z: p1 Laplacian from white (SIGMA_B), p2 uniform on
    [U_A, U_B], p3 Gaussian (MU_D, SIGMA_D); w1 weighs the bright layer.
    """
    v = np.arange(256, dtype=np.float64)
    bright = np.exp(-(255.0 - v) / SIGMA_B) / SIGMA_B
    mid = np.where((v >= U_A) & (v <= U_B), 1.0 / (U_B - U_A), 0.0)
    dark = np.exp(-((v - MU_D) ** 2) / (2.0 * SIGMA_D**2)) / np.sqrt(2.0 * np.pi * SIGMA_D**2)
    w1, w2, w3 = weights
    p = w1 * bright + w2 * mid + w3 * dark
    p = p / p.sum()
    p.setflags(write=False)
    return p


@lru_cache(maxsize=1)
def auto_layer_cdfs() -> np.ndarray:
    """(len(AUTO_DARK_LAYERS), 3, 256) float64: for each dark layer (mean, sd) tone="auto"
    may choose, the CDFs of the bright, mid and that dark layer, each layer alone (its
    density normalised to sum to 1 over v = 0..255)."""
    v = np.arange(256, dtype=np.float64)
    bright = np.exp(-(255.0 - v) / SIGMA_B)
    mid = np.where((v >= U_A) & (v <= U_B), 1.0, 0.0)
    sets = []
    for mean, sd in AUTO_DARK_LAYERS:
        layers = np.stack([bright, mid, np.exp(-((v - mean) ** 2) / (2.0 * sd**2))])
        cdfs = np.cumsum(layers / layers.sum(axis=1, keepdims=True), axis=1)
        cdfs[:, -1] = 1.0
        sets.append(cdfs)
    table = np.stack(sets)
    table.setflags(write=False)
    return table


@lru_cache(maxsize=1)
def auto_layer_grams() -> np.ndarray:
    """(len(AUTO_DARK_LAYERS), 3, 3) float64: the Gram matrix G G^T of each layer set of
    auto_layer_cdfs (the GPU's fit reads these same values)."""
    grams = np.stack([layers @ layers.T for layers in auto_layer_cdfs()])
    grams.setflags(write=False)
    return grams


@lru_cache(maxsize=1)
def auto_brightening() -> np.ndarray:
    """(256,) int64: where tone="auto" counts a photo value v when it compares the photo
    with the layers: round(255 (v / 255) ** AUTO_EXPONENT). Lu's layers describe pencil
    drawings, which are lighter than photos; fitted to the photo's own values, the mixture
    copies the photo's exposure and loses the drawing's paper."""
    v = np.arange(256, dtype=np.float64)
    table = np.rint(255.0 * (v / 255.0) ** AUTO_EXPONENT).astype(np.int64)
    table.setflags(write=False)
    return table


@lru_cache(maxsize=1)
def auto_fit_systems() -> tuple[np.ndarray, np.ndarray]:
    """The constant half of fit_tone's KKT systems, for every dark layer and TONE_SUPPORTS
    entry: (len(AUTO_DARK_LAYERS), 7, 4, 4) float64 inverses of the systems in (w0, w1,
    w2, lambda), rows i in the support sum_j G_ij w_j + lambda = r_i, rows i outside it
    w_i = 0, the last row sum w = 1; and the (7, 3) bool support masks. Only the right-hand
    side r depends on the photo, so a fit is one batched product (a loop of 112 small
    solves held the GIL, which the video pipeline's threads wait on)."""
    grams = auto_layer_grams()
    masks = np.zeros((len(TONE_SUPPORTS), 3), bool)
    systems = np.zeros((len(grams), len(TONE_SUPPORTS), 4, 4))
    for s, support in enumerate(TONE_SUPPORTS):
        masks[s, list(support)] = True
        inside = np.outer(masks[s], masks[s])
        systems[:, s, :3, :3] = np.where(inside, grams, 0.0) + np.diag(~masks[s])
        systems[:, s, :3, 3] = systems[:, s, 3, :3] = masks[s]
    inverses = np.linalg.inv(systems)
    inverses.setflags(write=False)
    masks.setflags(write=False)
    return inverses, masks


def fit_tone(source_counts: np.ndarray, shift: tuple[int, float] = (0, 0.0)) -> tuple[int, np.ndarray]:
    """Stage 7 for tone="auto": the dark layer (an index into AUTO_DARK_LAYERS) and the (3,)
    float64 weights (bright, mid, dark), >= 0 and summing to 1, whose mixture has the CDF
    closest in least squares to the CDF F of the photo's brightened values (auto_brightening):
    minimise sum_v (F(v) - sum_i w_i G_i(v))^2. Three unknowns on a simplex: each support
    (TONE_SUPPORTS) is solved exactly (equality-constrained least squares by its KKT
    system, auto_fit_systems), and the best feasible fit over every dark layer is kept
    (the first, layer by layer and support by support, on a tie). `shift` (layer, share): a
    preset's move of that share of the weight onto that layer (params.TONE_SHIFTS), w =
    (1 - share) w + share e_layer. gpu/pencil/pencil.cu fit_tone does the same."""
    brightened = np.bincount(auto_brightening(), weights=source_counts.astype(np.float64), minlength=256)
    source = np.cumsum(brightened, dtype=np.float64)
    if source[-1] <= 0:
        raise ValueError("fit_tone needs a histogram with at least one count")
    source /= source[-1]
    inverses, masks = auto_fit_systems()
    grams = auto_layer_grams()
    rhs = auto_layer_cdfs() @ source  # (layers, 3): G_i . F
    right = np.zeros(inverses.shape[:3])
    right[..., :3] = np.where(masks, rhs[:, None, :], 0.0)
    right[..., 3] = 1.0
    weights = np.where(masks, np.einsum("lsij,lsj->lsi", inverses, right)[..., :3], 0.0)
    feasible = ~np.any(weights < 0.0, axis=2)
    cost = np.einsum("lsi,lij,lsj->ls", weights, grams, weights) - 2.0 * np.einsum("li,lsi->ls", rhs, weights)
    best = int(np.argmin(np.where(feasible, cost, np.inf)))  # the first of equal costs
    layer, support = divmod(best, len(TONE_SUPPORTS))
    toward, share = shift
    chosen = (1.0 - share) * weights[layer, support]
    chosen[toward] += share
    return layer, chosen


# Brightens the photo's values before the fit (Lu's layers describe drawings lighter than
# photos): chosen with bench/quality.py (BENCHMARKS.md, "Drawing quality").
AUTO_EXPONENT = 0.3
# The dark layers tone="auto" chooses from, (mean, sd) on 0..255: Lu's (90, 11) and darker
# and wider ones, so that a night sky can be darker than Lu's darkest pencil.
AUTO_DARK_LAYERS = tuple((float(mean), sd) for mean in range(20, 100, 10) for sd in (SIGMA_D, 2.0 * SIGMA_D))
# every non-empty subset of the three layers, singletons first
TONE_SUPPORTS = ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))


def tone_target(source_counts: np.ndarray, tone: str) -> np.ndarray:
    """Stage 7: the target distribution (256,) float64: the mixture fitted to this photo
    (fit_tone), for a preset moved toward its layer (params.TONE_SHIFTS)."""
    layer, weights = fit_tone(source_counts, TONE_SHIFTS.get(tone, (0, 0.0)))
    return np.diff(weights @ auto_layer_cdfs()[layer], prepend=0.0)


def matching_lut(source_counts: np.ndarray, target_p: np.ndarray) -> np.ndarray:
    """Stage 8a: (256,) uint8 LUT sending each source value to the target value whose CDF
    first reaches the source CDF at that value (classic histogram specification)."""
    source_cdf = np.cumsum(source_counts, dtype=np.float64)
    source_cdf /= source_cdf[-1]
    target_cdf = np.cumsum(target_p)
    target_cdf /= target_cdf[-1]
    lut = np.searchsorted(target_cdf, source_cdf - 1e-12, side="left")
    return np.clip(lut, 0, 255).astype(np.uint8)


def tone_map(luma_u8: np.ndarray, params: PencilParams, lut: np.ndarray | None = None) -> np.ndarray:
    """Stages 6-8: J = LUT(box_mean(L)) ** tone_gamma, float32 in [0, 1]: the matching LUT read
    at the photo's local mean (box of tone_blur_size, edges replicated), linearly between
    its entries. Lu et al. blur LUT[L]; a LUT applied pixel by pixel before the mean bends
    regions of mixed light and dark (a brick wall's mortar) out of their order of
    brightness, the LUT of the mean keeps it (issue 38). `lut`: an explicit (256,) uint8
    matching LUT applied instead of the one that matches this image's histogram to its
    target, such as a video's steady tone (gpu/video/temporal.py)."""
    if lut is None:
        counts = histogram(luma_u8)
        lut = matching_lut(counts, tone_target(counts, params.tone))
    tone = lut_at(lut, local_mean(luma_u8, params.tone_blur_size(*luma_u8.shape)))
    if params.tone_gamma != 1.0:
        tone **= np.float32(params.tone_gamma)
    return tone


def local_mean(luma_u8: np.ndarray, size: int) -> np.ndarray:
    """(H, W) float64 means of `luma_u8` over size x size boxes (edges replicated): exact
    integer sums over size ** 2, as the GPU's tone kernels."""
    sums = cv2.boxFilter(luma_u8.astype(np.float64), -1, (size, size), normalize=False, borderType=cv2.BORDER_REPLICATE)
    return sums / float(size * size)


def lut_at(lut: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The (256,) uint8 `lut` read at float64 `values` in [0, 255], linearly between entries,
    / 255 -> float32: (lut[i] + f (lut[i + 1] - lut[i])) / 255, i = min(floor(v), 254)."""
    index = np.minimum(values.astype(np.int32), 254)  # values >= 0: the cast floors
    fraction = values - index
    low = lut[index].astype(np.float64)
    high = lut[index + 1].astype(np.float64)
    return ((low + fraction * (high - low)) / 255.0).astype(np.float32)


# ----------------------------------------------------------------------- texture --

TONE_FLOOR = 1.0 / 255.0  # J is clamped here so ln J stays finite


def texture_for(height: int, width: int) -> np.ndarray:
    """The pencil texture H tiled over (height, width), float32 in [0.05, 0.95]."""
    return tile_texture(pencil_texture(), height, width)


@lru_cache(maxsize=1)
def log_crossing_tile() -> np.ndarray:
    """ln of the texture tile turned a quarter turn (np.rot90, counterclockwise): its
    hatching crosses the tile's at a right angle. (side, side) float32, read-only; the log
    taken once, not per drawing."""
    tile = np.log(np.ascontiguousarray(np.rot90(pencil_texture())))
    tile.setflags(write=False)
    return tile


def cross_weight(tone: np.ndarray) -> np.ndarray:
    """c(J), float32 (H, W): 0 at tones of CROSS_HATCH_TONES[0] and lighter, rising linearly
    to 1 at CROSS_HATCH_TONES[1] and darker."""
    start, full = (np.float32(t) for t in CROSS_HATCH_TONES)
    return np.clip((start - tone) / (start - full), np.float32(0.0), np.float32(1.0))


def crossed_log_texture(log_texture: np.ndarray, tone: np.ndarray) -> np.ndarray:
    """ln H_x = ln H + c(J) ln H_turned (cross_weight; ln H_turned the log_crossing_tile tiled
    over the image), float32 (H, W): where one layer of hatching would have to be pressed
    hard to reach the tone, a second crosses it (issue 38). `log_texture` is overwritten."""
    log_turned = tile_texture(log_crossing_tile(), *tone.shape)
    log_texture += cross_weight(tone) * log_turned
    return log_texture


def structure_tensor(luma_u8: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """hatching="follow", step 1: the structure tensor (Jxx, Jxy, Jyy), float32 (H, W) each:
    products of the central differences gx, gy of L (edges replicated), averaged over a
    size x size box (edges replicated)."""
    padded = cv2.LUT(cv2.copyMakeBorder(luma_u8, 1, 1, 1, 1, cv2.BORDER_REPLICATE), UNIT)  # L / 255
    dx = cv2.subtract(padded[1:-1, 2:], padded[1:-1, :-2])
    dy = cv2.subtract(padded[2:, 1:-1], padded[:-2, 1:-1])
    # gx = dx / 2 exactly, so gx gy = dx dy / 4 exactly: one pass per product, no gx plane
    products = (cv2.multiply(dx, dx, scale=0.25), cv2.multiply(dx, dy, scale=0.25), cv2.multiply(dy, dy, scale=0.25))
    del padded, dx, dy
    for product in products:
        cv2.boxFilter(product, -1, (size, size), dst=product, borderType=cv2.BORDER_REPLICATE)
    return products


UNIT = (np.arange(256, dtype=np.float32) / np.float32(255.0)).reshape(1, 256)  # cv2.LUT: v -> v / 255


@lru_cache(maxsize=1)
def hatch_turns() -> tuple[np.ndarray, np.ndarray]:
    """(HATCH_TURNS,) float32 cos and sin of the turns k pi / HATCH_TURNS of the texture."""
    angles = np.arange(HATCH_TURNS) * (np.pi / HATCH_TURNS)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@lru_cache(maxsize=1)
def hatch_own_direction() -> tuple[np.float32, np.float32, np.float32]:
    """The tile's hatching direction in image coordinates (y down), as float32: its angle
    (rad) and the cos and sin of twice it (a doubled angle, as the tensor's)."""
    own = -np.deg2rad(HATCH_ANGLE_DEG)
    return np.float32(own), np.float32(np.cos(2 * own)), np.float32(np.sin(2 * own))


def hatch_turn(tensor: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """hatching="follow", step 2: float32 (H, W) turn t in [0, HATCH_TURNS) that brings the
    tile's hatching (HATCH_ANGLE_DEG) along the local structure, in units of pi /
    HATCH_TURNS. The hatching runs across the gradient (along edges and contours): the
    tensor's minor direction, as a doubled angle (Jyy - Jxx, -2 Jxy); a bias toward the
    tile's own direction (HATCH_BIAS of the tensor's isotropic part, plus a floor) keeps it
    where the photo has no single direction, and leaves a clear one as it is."""
    jxx, jxy, jyy = tensor
    ux, uy = jyy - jxx, np.float32(-2.0) * jxy
    isotropic = (jxx + jyy) - np.sqrt(ux * ux + uy * uy)  # 2 x the tensor's smaller eigenvalue
    bias = np.float32(HATCH_BIAS) * isotropic + np.float32(HATCH_BIAS_FLOOR)
    own, own_x, own_y = hatch_own_direction()
    ux = ux + bias * own_x
    uy = uy + bias * own_y
    turn = (np.float32(0.5) * np.arctan2(uy, ux) - own) * np.float32(HATCH_TURNS / np.pi)
    np.add(turn, np.float32(HATCH_TURNS), out=turn, where=turn < 0)  # into [0, HATCH_TURNS)
    return turn


def oriented_texture(luma_u8: np.ndarray, params: PencilParams) -> np.ndarray:
    """hatching="follow": the pencil texture H over the photo, float32 (H, W), turned at
    each pixel by hatch_turn: the tile turned by the two nearest multiples of
    pi / HATCH_TURNS (each a rigid turn about the origin of the tiled plane, so no seams),
    sampled bilinearly and blended by the fraction."""
    height, width = luma_u8.shape
    tensor = structure_tensor(luma_u8, params.structure_size(height, width))
    level, inverse_scale = hatch_sampling(params.hatch_scale(height, width))
    out = np.empty((height, width), np.float32)
    # Every step after the tensor is per pixel: bands of rows keep the temporaries in cache
    # (full planes cost more in page faults than in arithmetic).
    for top in range(0, height, HATCH_BAND_ROWS):
        rows = slice(top, top + HATCH_BAND_ROWS)
        xx, xy, yy = (plane[rows] for plane in tensor)
        out[rows] = _turned_samples(hatch_turn((xx, xy, yy)), top, inverse_scale, level)
    return out


HATCH_LEVELS = 4  # the tile and 3 halvings (512, 256, 128, 64 px)


def hatch_sampling(scale: float) -> tuple[int, np.float32]:
    """(level, inverse scale): the level of hatch_tile to sample for a drawing that shows the
    tile at `scale` px per tile px, and the tile-level px per drawing px. A drawing smaller
    than HATCH_SCALE_SIDE shrinks the tile; bilinear samples of a shrunk tile alias into a
    moire, so the tile halved round(log2(1 / scale)) times (at most HATCH_LEVELS - 1) is
    sampled instead, at 0.7-1.4 of its own scale."""
    level = 0 if scale >= 1.0 else min(HATCH_LEVELS - 1, int(np.floor(np.log2(1.0 / scale) + 0.5)))
    return level, np.float32(1.0 / (scale * 2**level))


@lru_cache(maxsize=HATCH_LEVELS)
def hatch_tile(level: int) -> np.ndarray:
    """The texture tile halved `level` times, each halving the mean of 2 x 2 pixels (so the
    mean, TILE_MEAN, is kept): (side / 2 ** level,) * 2 float32, read-only."""
    tile = pencil_texture()
    for _ in range(level):
        tile = (tile[0::2, 0::2] + tile[1::2, 0::2] + tile[0::2, 1::2] + tile[1::2, 1::2]) * np.float32(0.25)
    tile = np.ascontiguousarray(tile, dtype=np.float32)
    tile.setflags(write=False)
    return tile


HATCH_BAND_ROWS = 32


def _turned_samples(turn: np.ndarray, top: int, inverse_scale: np.float32, level: int = 0) -> np.ndarray:
    """oriented_texture for the rows top.. of the photo: hatch_tile(level) turned by the (h, W)
    float32 turn and scaled by 1 / inverse_scale, sampled and blended (blend_hatchings)."""
    height, width = turn.shape
    low = np.floor(turn)
    fraction = turn - low
    low = low.astype(np.uint8)
    cosines, sines = (np.resize(table, 256).reshape(1, 256) for table in hatch_turns())  # cv2.LUT tables
    xs = np.arange(width, dtype=np.float32).reshape(1, width) * inverse_scale
    ys = np.arange(top, top + height, dtype=np.float32).reshape(height, 1) * inverse_scale
    samples = []
    for k in (low, cv2.LUT(low, NEXT_TURN)):
        c, s = cv2.LUT(k, cosines), cv2.LUT(k, sines)
        u = xs * c + ys * s  # the point R(-angle) (x, y) of the tile's plane
        v = ys * c - xs * s
        samples.append(sample_tile(u, v, level))
    return blend_hatchings(samples[0], samples[1], fraction)


def blend_hatchings(first: np.ndarray, second: np.ndarray, fraction: np.ndarray) -> np.ndarray:
    """Two turned hatchings blended by `fraction` without washing out (issue 38): a plain
    mix of two unrelated hatchings has less contrast than either (at 1/2, 1/sqrt(2) of it:
    a light seam wherever the direction turns), so the mix's departure from the tile's mean
    is divided by sqrt((1 - f)^2 + f^2), which keeps its variance (Heitz and Neyret's
    variance-preserving blending), and the result is clamped into [H_MIN, H_MAX]."""
    mean = np.float32(TILE_MEAN)
    rest = np.float32(1.0) - fraction
    mixed = (first - mean) * rest + (second - mean) * fraction
    spread = np.sqrt(rest * rest + fraction * fraction)
    return np.clip(mixed / spread + mean, np.float32(H_MIN), np.float32(H_MAX))


def sample_tile(u: np.ndarray, v: np.ndarray, level: int = 0) -> np.ndarray:
    """The tiled hatch_tile(level) at float32 points (u, v) of its plane, bilinear: the coordinates
    wrapped into the tile, u - side floor(u / side) (exact but for small negative u), then
    OpenCV's remap on the tile with one wrapped row and column added, so that every sample
    is inside it (remap's fast path; OpenCV 5 interpolates float coordinates exactly)."""
    tile = _wrapped_tile(level)
    side = np.float32(tile.shape[0] - 1)
    u = u - np.floor(u / side) * side
    v = v - np.floor(v / side) * side
    return cv2.remap(tile, u, v, cv2.INTER_LINEAR, borderMode=cv2.BORDER_WRAP)


@lru_cache(maxsize=HATCH_LEVELS)
def _wrapped_tile(level: int) -> np.ndarray:
    """hatch_tile(level), (side, side) float32, with its first row and column repeated after
    its last: (side + 1, side + 1)."""
    return cv2.copyMakeBorder(hatch_tile(level), 0, 1, 0, 1, cv2.BORDER_WRAP)


NEXT_TURN = ((np.arange(256) + 1) % HATCH_TURNS).astype(np.uint8)
TILE_MEAN = float(pencil_texture().mean(dtype=np.float64))  # blend_hatchings' centre


def lu_energy(beta: np.ndarray, log_texture: np.ndarray, log_tone: np.ndarray, lam: float = LU_LAMBDA) -> float:
    """Lu's energy ||beta ln H - ln J||^2 + lam ||grad beta||^2 (forward differences)."""
    data = float(np.sum((beta.astype(np.float64) * log_texture - log_tone) ** 2))
    smooth = float(
        np.sum(np.diff(beta, axis=0).astype(np.float64) ** 2) + np.sum(np.diff(beta, axis=1).astype(np.float64) ** 2)
    )
    return data + lam * smooth


# lam * (4 p - sum of the 4 neighbours), scaled by lam at call time
_LAPLACIAN = np.array([[0, -1, 0], [-1, 4, -1], [0, -1, 0]], np.float32)


def solve_beta_lu(
    log_texture: np.ndarray,
    log_tone: np.ndarray,
    lam: float = LU_LAMBDA,
    tolerance: float = CG_TOLERANCE,
    max_iterations: int = CG_MAX_ITERATIONS,
) -> tuple[np.ndarray, int]:
    """Stage 9 (lu): minimise Lu's energy over beta by Jacobi-preconditioned conjugate
    gradient, matrix-free. Returns (beta float32 (H, W), iterations used).

    The normal equations are (diag(ln^2 H) + lam * D^T D) beta = ln H * ln J, where D^T D
    is the graph Laplacian of the pixel grid with free (Neumann) borders: a 3x3 filter
    with replicated edges, since a replicated neighbour adds a zero difference, which is
    exactly the free border. The start is the per-pixel solution ln J / ln H, so the
    energy can only go down. Updates are in place (cv2.scaleAdd) to keep each iteration
    to a few passes over memory.
    """
    diagonal = log_texture * log_texture
    degree = np.full(diagonal.shape, 4, np.float32)  # neighbours inside the image
    degree[0, :] -= 1
    degree[-1, :] -= 1
    degree[:, 0] -= 1
    degree[:, -1] -= 1
    preconditioner = 1.0 / (diagonal + np.float32(lam) * degree)  # Jacobi: 1 / diag(A)
    del degree
    laplacian = _LAPLACIAN * np.float32(lam)
    product, scratch = np.empty_like(diagonal), np.empty_like(diagonal)

    def apply(p: np.ndarray, out: np.ndarray) -> np.ndarray:
        cv2.filter2D(p, cv2.CV_32F, laplacian, dst=out, borderType=cv2.BORDER_REPLICATE)
        cv2.add(out, cv2.multiply(diagonal, p, dst=scratch), dst=out)
        return out

    beta = (log_tone / log_texture).astype(np.float32)
    residual = log_texture * log_tone  # the right-hand side, then b - A beta in place
    threshold = (tolerance * float(np.linalg.norm(residual))) ** 2
    cv2.subtract(residual, apply(beta, product), dst=residual)
    z = preconditioner * residual
    direction = z.copy()
    rz = float(np.vdot(residual, z))
    if float(np.vdot(residual, residual)) <= threshold:  # e.g. a flat white page: J = 1, beta = 0
        return beta, 0
    iterations = 0
    while iterations < max_iterations:
        iterations += 1
        a_direction = apply(direction, product)
        curvature = float(np.vdot(direction, a_direction))
        if curvature <= 0.0:  # direction vanished in float32: nothing left to gain
            break
        step = rz / curvature
        cv2.scaleAdd(direction, step, beta, dst=beta)
        cv2.scaleAdd(a_direction, -step, residual, dst=residual)
        if float(np.vdot(residual, residual)) <= threshold:
            break
        np.multiply(preconditioner, residual, out=z)
        rz_next = float(np.vdot(residual, z))
        cv2.scaleAdd(direction, rz_next / rz, z, dst=direction)
        rz = rz_next
    return beta, iterations


def beta_fast(tone: np.ndarray) -> np.ndarray:
    """Stage 9 (fast): Qiu et al.'s per-pixel closed form beta = 1 - J."""
    return 1.0 - tone


def balanced_texture(
    tone: np.ndarray, balanced_tone: np.ndarray, method: str, texture: np.ndarray | None = None
) -> np.ndarray:
    """Stage 9 with the cross-hatching and the balance: T_b, float32 in [0, 1], the texture
    drawn at J_b, from ln H_x = crossed_log_texture(ln H, J). lu: beta is solved for J as
    Lu's (texture_rendering, on ln H_x) and scaled per pixel by ln J_b / ln J (J clamped
    into [1/255, 254/255], J_b from 1/255), T_b = exp(scaled beta ln H_x): the texture's
    grain where Lu's solve put it, its tone lifted to J_b. fast: T_b = exp((1 - J_b) ln H_x),
    Qiu's H ** (1 - J_b) with the crossing layer. `texture` (H; default the tiled one) is
    overwritten."""
    texture = texture_for(*tone.shape) if texture is None else texture
    log_texture = crossed_log_texture(np.log(texture, out=texture), tone)
    if method != "lu":
        return np.exp(np.multiply(np.float32(1.0) - balanced_tone, log_texture, out=log_texture), out=log_texture)
    log_tone = np.log(np.maximum(tone, np.float32(TONE_FLOOR)))
    beta, _ = solve_beta_lu(log_texture, log_tone)
    gain = np.log(np.maximum(balanced_tone, np.float32(TONE_FLOOR))) / np.log(
        np.clip(tone, np.float32(TONE_FLOOR), np.float32(254.0 / 255.0))
    )
    beta *= gain
    return np.exp(np.multiply(beta, log_texture, out=beta), out=beta)


def texture_rendering(tone: np.ndarray, method: str, texture: np.ndarray | None = None) -> np.ndarray:
    """Stage 9: T = H ** beta, float32 in [0, 1]; H the tiled texture unless given (it is
    then overwritten)."""
    texture = texture_for(*tone.shape) if texture is None else texture
    if method == "lu":
        log_texture = np.log(texture, out=texture)
        log_tone = np.log(np.maximum(tone, np.float32(TONE_FLOOR)))
        beta, _ = solve_beta_lu(log_texture, log_tone)
        return np.exp(np.multiply(beta, log_texture, out=beta), out=beta)
    return np.power(texture, beta_fast(tone), out=texture)


# ---------------------------------------------------------------------- pipeline --


def render(image: np.ndarray, params: PencilParams, tone_lut: np.ndarray | None = None) -> np.ndarray:
    """Photo -> pencil drawing.

    image: (H, W) uint8 gray or (H, W, 3) uint8 RGB. Returns (H', W') uint8 for
    mode="gray" or (H', W', 3) uint8 RGB for mode="color", where (H', W') is the size after
    `params.max_side`. tone_lut: None, or a (256,) uint8 LUT the tone stage applies instead
    of matching this photo's histogram to the target of `params.tone` (see tone_map).
    """
    image = fit_max_side(image, params.max_side)
    luma_u8, ycrcb = split_luma(image)
    height, width = luma_u8.shape

    length = params.line_length(height, width)
    sketch = strokes_of(luma_u8, params)
    tone = tone_map(luma_u8, params, tone_lut)
    sketch = deepened_strokes(sketch, tone)
    sketch, balanced_tone = balance(sketch, stroke_darkness_means(sketch, length), tone, params.stroke_gamma)
    hatched = oriented_texture(luma_u8, params) if params.hatching == "follow" else None
    texture = balanced_texture(tone, balanced_tone, params.texture, hatched)
    drawing_u8 = to_u8(np.multiply(sketch, texture, out=texture))
    del sketch, texture, tone, balanced_tone

    if params.mode == "gray":
        return drawing_u8
    if ycrcb is None:  # a gray photo has no chroma to keep
        return cv2.cvtColor(drawing_u8, cv2.COLOR_GRAY2RGB)
    ycrcb = ycrcb.copy()
    ycrcb[..., 0] = drawing_u8
    return cv2.cvtColor(ycrcb, cv2.COLOR_YCrCb2RGB)
