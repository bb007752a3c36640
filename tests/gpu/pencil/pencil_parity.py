"""What the GPU and the emulated kernels are held to against gpu/pencil/reference.py: real
photos, the bounds on a finished drawing, and the reference's side of the stage tests
(tests/gpu/pencil/test_cuda.py on a device, test_emulated.py on the CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import cv2
import numpy as np
import skimage.data

from gpu.pencil import reference as ref
from gpu.pencil.params import PENCIL_OPTIONS, PencilParams

PHOTOS = ("astronaut", "coffee", "chelsea", "camera")
OPTIONS = {option.name: option for option in PENCIL_OPTIONS}


def photo(name: str, height: int, width: int) -> np.ndarray:
    """A scikit-image photograph resized (area filter; cubic when enlarged) to (height,
    width): (H, W, 3) RGB or (H, W) gray uint8."""
    image = getattr(skimage.data, name)()
    enlarging = height * width > image.shape[0] * image.shape[1]
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC if enlarging else cv2.INTER_AREA)


def option_range(name: str) -> tuple[float, float]:
    """(minimum, maximum) of a numeric option, as the API accepts it."""
    option = OPTIONS[name]
    assert option.minimum is not None and option.maximum is not None
    return option.minimum, option.maximum


def log_uniform(rng: np.random.Generator, name: str) -> float:
    """A value of the float option `name` drawn log-uniformly over its whole range (its
    ends as likely, per octave, as its middle)."""
    low, high = option_range(name)
    return float(np.exp(rng.uniform(np.log(low), np.log(high))))


def random_params(rng: np.random.Generator, **fixed) -> PencilParams:
    """Every option drawn over its whole range (`fixed` ones given), max_side left out."""
    widths = option_range("stroke_width")
    drawn = {
        "mode": str(rng.choice(OPTIONS["mode"].choices)),
        "tone": str(rng.choice(OPTIONS["tone"].choices)),
        "texture": str(rng.choice(OPTIONS["texture"].choices)),
        "hatching": str(rng.choice(OPTIONS["hatching"].choices)),
        "line_frac": log_uniform(rng, "line_frac"),
        "stroke_width": int(rng.integers(widths[0], widths[1] + 1)),
        "stroke_gamma": log_uniform(rng, "stroke_gamma"),
        "tone_gamma": log_uniform(rng, "tone_gamma"),
    }
    return PencilParams(**{**drawn, **fixed})


# Bounds of a finished drawing (uint8) against the reference's. Where the two may differ:
# - rounding of the transcendental functions (powf, expf, logf, atan2f against NumPy's):
#   an ulp or two, which moves a pixel by one grey level where it lies on a rounding edge;
# - the CG solve for beta (texture "lu"): each side stops at a relative residual of
#   CG_TOLERANCE after its own rounding, a few iterations apart, each within 1.5 grey
#   levels of the converged drawing (params.CG_TOLERANCE): 3 between them, 4 with the
#   final rounding;
# - near-tied line labels (reference.classify): where two directions' responses lie
#   within float32 rounding of the label margin the GPU may pick the other one, and that
#   pixel's gradient is drawn along the other line: the pixels of both lines move by its
#   share of the stroke, M(p) times a kernel weight (about 1 / length) over the
#   normalising range. Such ties are rare and their gradient small on photos.
# Measured on an H100 over 474 drawings of the GPU suite (four runs, fresh seeds: every
# option's ends, 1 px strips to 2560x1920): at most 0.005 % of pixels off by more than
# one grey level, a mean difference of at most 0.008 and a largest one of 3 (also with
# texture "fast": a label flip). The bounds: at most 0.1 % outliers, a mean of 0.05, and
# no pixel beyond twice the CG's allowance above.
OUTLIER_SHARE = 1e-3
MEAN_GREY_LEVELS = 0.05
MAX_GREY_LEVELS = 8


def drawing_difference(got: np.ndarray, expected: np.ndarray) -> str:
    """A one-line summary of |got - expected| in grey levels (for messages and logs)."""
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    return (
        f"mean |diff| {difference.mean():.4f}, {(difference > 1).mean():.5f} of pixels off by more than 1, "
        f"max {int(difference.max())} (shape {got.shape})"
    )


def assert_same_drawing(got: np.ndarray, expected: np.ndarray) -> None:
    """got (GPU) and expected (reference) drawings, uint8 of one shape, agree within the
    bounds above: at most OUTLIER_SHARE of the pixels off by more than one grey level,
    the mean difference at most MEAN_GREY_LEVELS and none above MAX_GREY_LEVELS."""
    assert got.shape == expected.shape and got.dtype == np.uint8 == expected.dtype, (got.shape, expected.shape)
    assert expected.max() > expected.min(), "a drawing of one grey proves nothing"
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    summary = drawing_difference(got, expected)
    print(f"drawing parity: {summary}")
    assert (difference > 1).mean() <= OUTLIER_SHARE, summary
    assert difference.mean() <= MEAN_GREY_LEVELS, summary
    assert difference.max() <= MAX_GREY_LEVELS, summary


# ------------------------------------------------------------ reference stages --


def reference_strokes(luma: np.ndarray, params: PencilParams) -> tuple[np.ndarray, np.ndarray]:
    """The reference's S' (before normalising) and its labels: float32 (H, W), uint8 (H, W)."""
    height, width = luma.shape
    length = params.line_length(height, width)
    magnitude = ref.gradient(ref.median3(luma))
    label = ref.classify(magnitude, ref.LineFilter(height, width, length, 0))
    wide = ref.LineFilter(height, width, length, params.stroke_width)
    classified = [np.where(label == i, magnitude, np.float32(0)) for i in range(8)]
    return wide.summed(classified), label


def texture_of(tone: np.ndarray, hatched: np.ndarray | None) -> np.ndarray:
    """A copy of the texture H the pipeline draws with: the tiled tile, or `hatched` (the
    turned texture of hatching "follow")."""
    return (ref.texture_for(*tone.shape) if hatched is None else hatched).copy()


def crossed_log_texture(tone: np.ndarray, hatched: np.ndarray | None) -> np.ndarray:
    """ln H_x, reference.crossed_log_texture of texture_of's H: what the CG solves on and
    the merge reads."""
    return ref.crossed_log_texture(np.log(texture_of(tone, hatched)), tone)


def reference_merge(
    image: np.ndarray,
    params: PencilParams,
    strokes: np.ndarray,
    tone: np.ndarray,
    beta: np.ndarray | None,
    hatched: np.ndarray | None,
) -> np.ndarray:
    """Stages 9-10 of reference.render on given inputs: S' (float32 (H, W), as
    reference_strokes), J, beta (texture "lu", else None; solved on crossed_log_texture)
    and the turned texture H (hatching "follow", else None), with the balance of strokes
    and tone (the strokes deepened by the tone and their box means computed here, as
    reference.render does). Returns the drawing as reference.render does."""
    height, width = tone.shape
    length = params.line_length(height, width)
    given = SimpleNamespace(
        summed=lambda _: strokes, length=length, kernels=ref.line_kernels(length, params.stroke_width)
    )
    sketch = ref.stroke_map(None, None, given, params.stroke_gamma)  # type: ignore[arg-type]
    sketch = ref.deepened_strokes(sketch, tone)
    sketch, balanced_tone = ref.balance(sketch, ref.stroke_darkness_means(sketch, length), tone, params.stroke_gamma)
    if params.texture == "lu":
        assert beta is not None
        # reference.balanced_texture after its solve
        gain = np.log(np.maximum(balanced_tone, np.float32(ref.TONE_FLOOR))) / np.log(
            np.clip(tone, np.float32(ref.TONE_FLOOR), np.float32(254.0 / 255.0))
        )
        texture = np.exp(np.multiply(beta * gain, crossed_log_texture(tone, hatched)))
    else:
        texture = ref.balanced_texture(tone, balanced_tone, "fast", texture_of(tone, hatched))
    drawing = ref.to_u8(np.multiply(sketch, texture))
    if params.mode == "gray":
        return drawing
    _, ycrcb = ref.split_luma(image)
    if ycrcb is None:
        return cv2.cvtColor(drawing, cv2.COLOR_GRAY2RGB)
    ycrcb = ycrcb.copy()
    ycrcb[..., 0] = drawing
    return cv2.cvtColor(ycrcb, cv2.COLOR_YCrCb2RGB)


def expected_labels(magnitude: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """reference.classify's rule on exact (float64) responses: (labels int64 (H, W), clear
    bool (H, W)), clear where no comparison came within float32 rounding of its threshold
    (elsewhere float32 sums may label either way)."""
    kernels = ref.line_kernels(length, 0).astype(np.float64)
    responses = np.stack(
        [cv2.filter2D(magnitude.astype(np.float64), cv2.CV_64F, k, borderType=cv2.BORDER_CONSTANT) for k in kernels]
    )
    factor = 1.0 + ref.LABEL_MARGIN
    best, labels = responses[0].copy(), np.zeros(magnitude.shape, np.int64)
    closest = np.full(magnitude.shape, np.inf)
    floor = 1e-6 * float(responses.max())  # responses of a flat neighbourhood are 0 up to the float64 filter's noise
    for i in range(1, 8):
        threshold = best * factor
        closest = np.minimum(closest, np.abs(responses[i] - threshold) / np.maximum(threshold, floor))
        better = responses[i] > threshold
        labels[better], best[better] = i, responses[i][better]
    return labels, closest > 1e-5


def strokes_given_labels(magnitude: np.ndarray, label: np.ndarray, length: int, stroke_width: int) -> np.ndarray:
    """S' = sum_i L'_i * (M where label == i) in float64 (H, W): the exact sums the float32
    passes round, for the labels the GPU chose."""
    kernels = ref.line_kernels(length, stroke_width).astype(np.float64)
    return sum(
        cv2.filter2D(
            np.where(label == i, magnitude, 0).astype(np.float64),
            cv2.CV_64F,
            kernels[i],
            borderType=cv2.BORDER_CONSTANT,
        )
        for i in range(8)
    )
