"""Quality benchmark of the tone options: numbers per photo and mode, and a contact sheet to look at.

    python bench/quality.py [--side 768] [--repeats 3] [--out DIR]              # CPU backend
    python bench/quality.py --backend cuda [...]                               # GPU backend
    python bench/quality.py --photos rocket,moon --no-images                    # a subset, numbers only

Photos: scikit-image's real photographs (dark and low-key ones included: the Hubble deep
field, the rocket at dusk, the retina scan with its black surround) and our own low-key
ones, real photos darkened by a physical exposure change (-3 EV in linear light: `expose`).
Three sets (`Photo.group`, `--set`): the tuning photos, on which constants are chosen;
the evaluation photos, held out from tuning in issue 38's first part and looked at while
choosing its second part's constants (a portrait and it at -3 EV, grass and it at -3 EV,
a bright cell on a large flat dark ground, gravel from above, a brick wall turned onto the
diagonals, handwriting on a slanted page); and the unseen photos, real photos of the kinds
issue 38 measured on, added after its constants were chosen and drawn only to evaluate
them (bench/photos/: a portrait, a raccoon's face, a temple among trees and it at -3 EV,
a flower, people on a staircase; their sources and licences in bench/photos/README.md).
Each is resized to a longer side of --side px (area filter when shrinking, cubic when
enlarging) before rendering.

Per photo and mode (MODES: a name -> PencilParams; adding a mode is one line):
- rank: Spearman's rank correlation between the photo's luma and the drawing, both
  averaged over square blocks of max(1, shorter side // 24) px (`block_means`);
- in / out: mean grey (0..255) of the photo's luma and of the drawing;
- bright delta: the drawing's mean over the photo's brightest blocks (top 10 % of the
  photo's block means) minus the same for the `light` mode of the same texture: how far
  the paper moved from today's look (negative: darker);
- fidelity (stroke fidelity): Pearson's correlation over every pixel between the drawing's
  darkness (255 - its luma) and the photo's gradient |dx| + |dy| after a 3x3 median (the
  stroke branch's own stages 1-2): are the dark marks on the photo's edges (`stroke_fidelity`);
- SSIM: mean structural similarity of the drawing's luma with the photo's (7x7 windows);
- seams: the share of pixels where the hatching texture H the pipeline draws with has a
  local contrast (std over 9x9) under 60 % of the plain tile's median: where hatchings of
  two directions are blended their strokes wash out into light bands (`seam_share`; the
  flat tile's own share, about 0.107, is the floor);
- ms: median render time of --repeats after one warm-up (host wall time, transfers
  included, through `gpu.pencil.render` on --backend).

Issue 38's targets, per photo set (`drawing_targets`): the default drawing's rank mean >=
0.94 and worst >= 0.85, its stroke fidelity mean >= 0.40, each -3 EV photo drawn >= 40 grey
levels darker than its normal exposure; tone=light's worst rank >= 0.80; and the presets in
order on every photo: light > medium > dark and light > auto > dark in mean grey.

Targets (issue): with tone=auto, rank >= 0.85 on every photo; a photo with mean grey under
60 gives a drawing with mean grey under 150; a photo of ordinary exposure (mean grey 60..195)
keeps its brightest blocks within 30 grey levels of `light`. One line each says met / not met.

Images: docs/images/quality-contact-sheet.png (one row per photo: original and the modes
marked for the sheet, each cell labelled with its numbers, and under it a row of 2x crops
around `Photo.zoom`, pixels repeated, to see the grain and the seams) and docs/images/before-after.png
(one dark photo: original | light | auto).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import cv2
import numpy as np
import skimage.data
from PIL import Image, ImageDraw, ImageFont
from scipy.stats import spearmanr
from skimage.metrics import structural_similarity

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import median_ms

import gpu.pencil
from gpu.pencil.params import PencilParams

ROOT = Path(__file__).resolve().parent.parent
BLOCKS_PER_SIDE = 24  # blocks of 1/24 of the shorter side
BRIGHT_FRACTION = 0.10  # "brightest regions": the top 10 % of the photo's block means
DARK_PHOTO = 60.0  # mean grey under this: a dark photo ...
DARK_DRAWING = 150.0  # ... whose drawing must have a mean grey under this
HIGH_KEY_PHOTO = 195.0  # ordinary exposure: mean grey in [DARK_PHOTO, HIGH_KEY_PHOTO]
RANK_TARGET = 0.85
PAPER_TOLERANCE = 30.0  # grey levels between auto's and light's brightest blocks


@dataclass(frozen=True)
class Mode:
    """One way to draw: a name for the table, its parameters, and whether the sheet shows it."""

    name: str
    params: PencilParams
    sheet: bool = True


MODES: tuple[Mode, ...] = (
    Mode("auto/lu", PencilParams(tone="auto", texture="lu")),  # the default: hatching="follow"
    Mode("auto+flat/lu", PencilParams(tone="auto", texture="lu", hatching="flat")),
    Mode("light/lu", PencilParams(tone="light", texture="lu")),
    Mode("medium/lu", PencilParams(tone="medium", texture="lu"), sheet=False),
    Mode("dark/lu", PencilParams(tone="dark", texture="lu")),
    Mode("auto/fast", PencilParams(tone="auto", texture="fast"), sheet=False),
    Mode("light/fast", PencilParams(tone="light", texture="fast"), sheet=False),
)
PRESET_ORDER = ("light/lu", "medium/lu", "dark/lu")  # must draw lighter to darker, in this order
AUTO = "auto/lu"  # the presets are compared with this one: light lighter, dark darker


# ------------------------------------------------------------------------ photos --


def srgb_to_linear(image_u8: np.ndarray) -> np.ndarray:
    """sRGB uint8 -> linear light float64 in [0, 1] (IEC 61966-2-1)."""
    c = image_u8.astype(np.float64) / 255.0
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(linear: np.ndarray) -> np.ndarray:
    """Linear light in [0, 1] (clipped) -> sRGB uint8 (IEC 61966-2-1)."""
    x = np.clip(linear, 0.0, 1.0)
    c = np.where(x <= 0.0031308, 12.92 * x, 1.055 * x ** (1.0 / 2.4) - 0.055)
    return np.rint(c * 255.0).astype(np.uint8)


def expose(image_u8: np.ndarray, ev: float) -> np.ndarray:
    """The photo as if taken with an exposure changed by `ev` stops: linear light times 2**ev."""
    return linear_to_srgb(srgb_to_linear(image_u8) * 2.0**ev)


@dataclass(frozen=True)
class Photo:
    name: str
    note: str
    load: Callable[[], np.ndarray]
    group: str = "tuning"  # GROUPS: which set the photo is in
    zoom: tuple[float, float] = (0.5, 0.5)  # centre (x, y), as fractions, of the 2x crop on the sheet


GROUPS = {
    "tuning": "tuning photos",
    "evaluation": "evaluation photos (held out in issue 38's first part)",
    "unseen": "unseen photos (bench/photos/, drawn only to evaluate)",
}
PHOTO_DIR = ROOT / "bench/photos"


def photo_file(name: str) -> Callable[[], np.ndarray]:
    """A loader of bench/photos/<name>: (H, W, 3) RGB or (H, W) gray uint8, as stored."""

    def load() -> np.ndarray:
        with Image.open(PHOTO_DIR / name) as image:
            return np.asarray(image.convert("L" if image.mode in ("L", "I;16") else "RGB"))

    return load


def rotated_crop(image: np.ndarray, degrees: float) -> np.ndarray:
    """The largest axis-aligned centre crop of `image` turned by `degrees` (cubic): a photo
    with its structure on the diagonals, and no blank corners."""
    height, width = image.shape[:2]
    turn = cv2.getRotationMatrix2D((width / 2, height / 2), degrees, 1.0)
    turned = cv2.warpAffine(image, turn, (width, height), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
    angle = np.deg2rad(abs(degrees) % 90)
    side = min(height, width) / (np.cos(angle) + np.sin(angle))
    top, left = round((height - side) / 2), round((width - side) / 2)
    return np.ascontiguousarray(turned[top : top + round(side), left : left + round(side)])


PHOTOS: tuple[Photo, ...] = (
    # The tuning set: the photos of issue 19, the ones every constant was chosen on.
    Photo("camera", "scikit-image: cameraman, gray", skimage.data.camera),
    Photo("coffee", "scikit-image: coffee cup", skimage.data.coffee),
    Photo("chelsea", "scikit-image: Chelsea the cat", skimage.data.chelsea, zoom=(0.45, 0.4)),
    Photo("coins", "scikit-image: Greek coins, gray", skimage.data.coins),
    Photo("motorcycle", "scikit-image: stereo_motorcycle, left view", lambda: skimage.data.stereo_motorcycle()[0]),
    Photo("moon", "scikit-image: lunar surface, gray", skimage.data.moon),
    Photo("page", "scikit-image: a photographed book page, gray", skimage.data.page),
    Photo("ihc", "scikit-image: immunohistochemistry micrograph (high-key)", skimage.data.immunohistochemistry),
    Photo("retina", "scikit-image: retina fundus, black surround", skimage.data.retina),
    Photo("rocket", "scikit-image: SpaceX rocket at dusk (low-key)", skimage.data.rocket),
    Photo("hubble", "scikit-image: Hubble deep field (night sky)", skimage.data.hubble_deep_field),
    Photo("coffee-3EV", "ours: coffee at -3 EV in linear light", lambda: expose(skimage.data.coffee(), -3.0)),
    # The evaluation set (held out in issue 38): the kinds of photo the six were.
    Photo("astronaut", "held out: portrait (Eileen Collins, NASA)", skimage.data.astronaut, "evaluation", (0.45, 0.25)),
    Photo(
        "astronaut-3EV", "held out: the portrait at -3 EV", lambda: expose(skimage.data.astronaut(), -3.0), "evaluation"
    ),
    Photo("grass", "held out: a field of grass (landscape texture)", skimage.data.grass, "evaluation"),
    Photo("grass-3EV", "held out: the grass at -3 EV", lambda: expose(skimage.data.grass(), -3.0), "evaluation"),
    Photo("cell", "held out: a bright cell on a large flat dark ground", skimage.data.cell, "evaluation", (0.68, 0.67)),
    Photo("gravel", "held out: gravel seen from above (aerial texture)", skimage.data.gravel, "evaluation"),
    Photo(
        "brick-diagonal",
        "held out: a brick wall in perspective turned 30 degrees (diagonal structure, like stairs)",
        lambda: rotated_crop(skimage.data.brick(), 30.0),
        "evaluation",
    ),
    Photo("text", "held out: handwriting on a slanted page (diagonal strokes)", skimage.data.text, "evaluation"),
    # The unseen set (issue 38, after its constants were chosen): real photos of the kinds the
    # issue measured on, from other projects' sample data (bench/photos/README.md).
    Photo("hopper", "unseen: portrait (Grace Hopper, US Navy)", photo_file("grace_hopper.jpg"), "unseen", (0.5, 0.3)),
    Photo("raccoon", "unseen: a raccoon's face among leaves", photo_file("raccoon.jpg"), "unseen", (0.55, 0.35)),
    Photo("china", "unseen: landscape, a temple among trees", photo_file("china.jpg"), "unseen"),
    Photo("china-3EV", "unseen: the landscape at -3 EV", lambda: expose(photo_file("china.jpg")(), -3.0), "unseen"),
    Photo("flower", "unseen: a flower, close up", photo_file("flower.jpg"), "unseen"),
    Photo("ascent", "unseen: people on a staircase, gray (diagonals)", photo_file("ascent.png"), "unseen"),
)


def resize_longer(image: np.ndarray, side: int) -> np.ndarray:
    """The image with its longer side `side` px: area filter when shrinking, cubic when enlarging."""
    height, width = image.shape[:2]
    scale = side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if size == (width, height):
        return image
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)


# ----------------------------------------------------------------------- metrics --


def luma(image: np.ndarray) -> np.ndarray:
    """(H, W) uint8 luma (BT.601, as the pipeline's YCrCb) of a gray or RGB uint8 image."""
    return image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)


def block_size(shape: tuple[int, ...]) -> int:
    """Side in px of the metric's blocks: 1/24 of the shorter side, at least 1."""
    return max(1, min(shape[:2]) // BLOCKS_PER_SIDE)


def block_means(gray: np.ndarray, block: int) -> np.ndarray:
    """(ceil(H / block), ceil(W / block)) float64 means of `gray` over block x block squares
    from the top left; the last row and column of blocks may be smaller (the image's edge)."""
    height, width = gray.shape
    rows, cols = np.arange(0, height, block), np.arange(0, width, block)
    sums = np.add.reduceat(np.add.reduceat(gray.astype(np.float64), rows, axis=0), cols, axis=1)
    counts = np.outer(np.diff(np.append(rows, height)), np.diff(np.append(cols, width)))
    return sums / counts


def rank_correlation(photo_blocks: np.ndarray, drawing_blocks: np.ndarray) -> float:
    """Spearman's rank correlation of two block-mean maps (NaN when either is constant)."""
    if np.ptp(photo_blocks) == 0 or np.ptp(drawing_blocks) == 0:
        return float("nan")
    return float(spearmanr(photo_blocks.ravel(), drawing_blocks.ravel()).statistic)


def brightest(photo_blocks: np.ndarray, fraction: float = BRIGHT_FRACTION) -> np.ndarray:
    """Boolean mask of the photo's brightest blocks: those at or above the (1 - fraction) quantile."""
    return photo_blocks >= np.quantile(photo_blocks, 1.0 - fraction)


def gradient_of(gray: np.ndarray) -> np.ndarray:
    """The photo's gradient as the pipeline's stroke branch sees it (stages 1-2): |dx| + |dy|
    (forward differences, 0 past the last column / row) of the 3x3 median of the luma, float64."""
    smooth = cv2.medianBlur(gray, 3).astype(np.float64)
    magnitude = np.zeros_like(smooth)
    magnitude[:, :-1] += np.abs(np.diff(smooth, axis=1))
    magnitude[:-1, :] += np.abs(np.diff(smooth, axis=0))
    return magnitude


def stroke_fidelity(gray: np.ndarray, drawing_gray: np.ndarray) -> float:
    """Pearson's correlation, over every pixel, between the drawing's darkness (255 minus its
    luma) and the photo's gradient after a 3x3 median (gradient_of): are the dark marks where
    the photo has edges? 1: darkness exactly proportional to the edges; 0: unrelated (a
    drawing that is all tone, or strokes at random). NaN when either is constant."""
    darkness = 255.0 - drawing_gray.astype(np.float64)
    edges = gradient_of(gray)
    if darkness.std() == 0 or edges.std() == 0:
        return float("nan")
    return float(np.corrcoef(darkness.ravel(), edges.ravel())[0, 1])


def ssim(gray: np.ndarray, drawing_gray: np.ndarray) -> float:
    """The mean structural similarity (Wang et al. 2004; scikit-image's, 7x7 windows, data
    range 255) between the photo's luma and the drawing's."""
    return float(structural_similarity(gray, drawing_gray, data_range=255))


SEAM_WINDOW = 9  # px: the local contrast of the hatching is its std over this window
SEAM_CONTRAST = 0.6  # a seam: local contrast under this share of the tile's median local contrast


def local_contrast(texture: np.ndarray, window: int = SEAM_WINDOW) -> np.ndarray:
    """The standard deviation of `texture` over window x window squares (edges replicated)."""
    mean = cv2.blur(texture.astype(np.float64), (window, window), borderType=cv2.BORDER_REPLICATE)
    square = cv2.blur(texture.astype(np.float64) ** 2, (window, window), borderType=cv2.BORDER_REPLICATE)
    return np.sqrt(np.maximum(square - mean * mean, 0.0))


def seam_share(gray: np.ndarray, params: PencilParams) -> float:
    """Seams of the hatching's direction field: the share of pixels where the hatching
    texture the pipeline draws this photo with (H before the tone, from
    reference.texture_for or, for hatching="follow", reference.oriented_texture) has a
    local contrast (local_contrast) under SEAM_CONTRAST of the plain tile's median local
    contrast, the plain tile as that hatching samples it (for "follow": unturned, at the
    level and scale of reference.hatch_sampling). Where two hatchings of different
    directions are blended, their strokes wash out into a lighter, flat band: a seam. The
    plain tile's own share is the floor."""
    from gpu.pencil import reference

    height, width = gray.shape
    if params.hatching == "flat":
        plain = reference.texture_for(height, width)
        texture = plain
    else:
        level, inverse = reference.hatch_sampling(params.hatch_scale(height, width))
        ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
        plain = reference.sample_tile(xs * inverse, ys * inverse, level)
        texture = reference.oriented_texture(gray, params)
    typical = float(np.median(local_contrast(plain)))
    return float(np.mean(local_contrast(texture) < SEAM_CONTRAST * typical))


@dataclass
class Result:
    """The numbers of one photo drawn in one mode."""

    rank: float
    mean: float
    bright: float  # the drawing's mean over the photo's brightest blocks
    ms: float
    bright_delta: float | None = None  # bright minus the light mode's of the same texture
    fidelity: float = float("nan")  # stroke_fidelity
    ssim: float = float("nan")  # ssim with the photo's luma
    seams: float = float("nan")  # seam_share of the hatching


@dataclass
class PhotoResult:
    name: str
    note: str
    size: tuple[int, int]  # (width, height) drawn
    source_size: tuple[int, int]
    mean: float  # the photo's mean grey (luma)
    modes: dict[str, Result] = field(default_factory=dict)
    group: str = "tuning"


def baseline_of(mode: Mode, modes: tuple[Mode, ...] = MODES) -> Mode | None:
    """The mode `mode` is compared with for the brightest blocks: the first `light` mode of
    the same texture (None for a light mode itself)."""
    if mode.params.tone == "light":
        return None
    return next((m for m in modes if m.params.tone == "light" and m.params.texture == mode.params.texture), None)


def measure(
    photo: Photo, side: int, modes: tuple[Mode, ...], backend: str, repeats: int, with_seams: bool = True
) -> tuple[PhotoResult, np.ndarray, dict[str, np.ndarray]]:
    """Draw `photo` in every mode: its numbers, the resized photo and the drawings by mode name."""
    source = photo.load()
    image = resize_longer(source, side)
    gray = luma(image)
    block = block_size(gray.shape)
    photo_blocks = block_means(gray, block)
    mask = brightest(photo_blocks)
    result = PhotoResult(
        photo.name,
        photo.note,
        (image.shape[1], image.shape[0]),
        (source.shape[1], source.shape[0]),
        float(gray.mean()),
        group=photo.group,
    )
    drawings = {}
    for mode in modes:
        out: dict[str, np.ndarray] = {}

        def work(mode: Mode = mode, out: dict[str, np.ndarray] = out) -> None:
            out["drawing"] = gpu.pencil.render(image, mode.params, backend)

        ms = median_ms(work, repeats)  # one warm-up, then `repeats` timed renders
        drawing = out["drawing"]
        drawing_gray = luma(drawing)
        drawing_blocks = block_means(drawing_gray, block)
        result.modes[mode.name] = Result(
            rank_correlation(photo_blocks, drawing_blocks),
            float(drawing.mean()),
            float(drawing_blocks[mask].mean()),
            ms,
            fidelity=stroke_fidelity(gray, drawing_gray),
            ssim=ssim(gray, drawing_gray),
            seams=seam_share(gray, mode.params) if with_seams else float("nan"),
        )
        drawings[mode.name] = drawing
    for mode in modes:
        base = baseline_of(mode, modes)
        if base is not None:
            numbers = result.modes[mode.name]
            numbers.bright_delta = numbers.bright - result.modes[base.name].bright
    return result, image, drawings


# ----------------------------------------------------------------------- targets --


def targets(results: list[PhotoResult], modes: tuple[Mode, ...]) -> list[tuple[str, bool, list[str]]]:
    """(line, met, offenders) for each target of the issue and each auto mode; for the
    first two targets also the light modes, for comparison."""
    lines = []
    for mode in modes:
        auto = mode.params.tone == "auto"
        tag = mode.name if auto else f"{mode.name} (for comparison)"
        low = [
            f"{r.name} {r.modes[mode.name].rank:.3f}"
            for r in results
            if not r.modes[mode.name].rank >= RANK_TARGET  # NaN fails
        ]
        lines.append((f"{tag}: rank correlation >= {RANK_TARGET} on every photo", not low, low))
        dark = [
            f"{r.name} {r.mean:.0f} -> {r.modes[mode.name].mean:.0f}"
            for r in results
            if r.mean < DARK_PHOTO and not r.modes[mode.name].mean < DARK_DRAWING
        ]
        n_dark = sum(r.mean < DARK_PHOTO for r in results)
        lines.append(
            (
                f"{tag}: photos with mean grey < {DARK_PHOTO:.0f} ({n_dark}) give drawings with mean grey "
                f"< {DARK_DRAWING:.0f}",
                not dark,
                dark,
            )
        )
        if auto and baseline_of(mode, modes) is not None:
            ordinary = [r for r in results if DARK_PHOTO <= r.mean <= HIGH_KEY_PHOTO]
            moved = [
                f"{r.name} {r.modes[mode.name].bright_delta:+.0f}"
                for r in ordinary
                if not abs(r.modes[mode.name].bright_delta) <= PAPER_TOLERANCE
            ]
            lines.append(
                (
                    f"{tag}: brightest {BRIGHT_FRACTION:.0%} of blocks within {PAPER_TOLERANCE:.0f} grey of "
                    f"{baseline_of(mode, modes).name} on photos of ordinary exposure "
                    f"(mean {DARK_PHOTO:.0f}..{HIGH_KEY_PHOTO:.0f}: {len(ordinary)})",
                    not moved,
                    moved,
                )
            )
    return lines


RANK_MEAN_TARGET, RANK_WORST_TARGET = 0.94, 0.85  # issue 38, the default drawing
FIDELITY_TARGET = 0.40  # mean stroke fidelity of the default drawing
LIGHT_RANK_TARGET = 0.80  # tone=light, worst photo
EXPOSURE_GAP = 40.0  # grey levels a -3 EV photo is drawn darker than its normal exposure


def default_mode(modes: tuple[Mode, ...]) -> Mode | None:
    """The mode that draws with every option at its default."""
    return next((m for m in modes if m.params == PencilParams()), None)


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def drawing_targets(results: list[PhotoResult], modes: tuple[Mode, ...]) -> list[tuple[str, bool, list[str]]]:
    """(line, met, offenders) for each target of issue 38, on the photos in `results`."""
    lines: list[tuple[str, bool, list[str]]] = []
    default = default_mode(modes)
    if default is not None:
        name = default.name
        ranks = [r.modes[name].rank for r in results]
        worst = min(ranks, default=float("nan"))
        low = [f"{r.name} {r.modes[name].rank:.3f}" for r in results if not r.modes[name].rank >= RANK_WORST_TARGET]
        lines.append(
            (
                f"{name} (default): rank mean {_mean(ranks):.3f} >= {RANK_MEAN_TARGET}, worst {worst:.3f} >= "
                f"{RANK_WORST_TARGET}",
                _mean(ranks) >= RANK_MEAN_TARGET and not low,
                low,
            )
        )
        fidelity = _mean([r.modes[name].fidelity for r in results])
        lines.append(
            (
                f"{name} (default): stroke fidelity mean {fidelity:.3f} >= {FIDELITY_TARGET}",
                fidelity >= FIDELITY_TARGET,
                [],
            )
        )
        by_name = {r.name: r for r in results}
        gaps = []
        for r in results:
            if r.name.endswith("-3EV") and r.name[: -len("-3EV")] in by_name:
                normal = by_name[r.name[: -len("-3EV")]]
                gaps.append((r.name, normal.modes[name].mean - r.modes[name].mean))
        if gaps:
            short = [f"{n} {g:.0f}" for n, g in gaps if not g >= EXPOSURE_GAP]
            text = ", ".join(f"{n} {g:.0f}" for n, g in gaps)
            lines.append(
                (f"{name} (default): -3 EV drawn >= {EXPOSURE_GAP:.0f} grey darker ({text})", not short, short)
            )
    modes_by_name = {m.name: m for m in modes}
    if "light/lu" in modes_by_name:
        ranks = [r.modes["light/lu"].rank for r in results]
        low = [
            f"{r.name} {r.modes['light/lu'].rank:.3f}"
            for r in results
            if not r.modes["light/lu"].rank >= LIGHT_RANK_TARGET
        ]
        lines.append(
            (f"light/lu: rank worst {min(ranks, default=float('nan')):.3f} >= {LIGHT_RANK_TARGET}", not low, low)
        )
    if all(n in modes_by_name for n in (*PRESET_ORDER, AUTO)):
        out_of_order = []
        for r in results:
            light, medium, dark = (r.modes[n].mean for n in PRESET_ORDER)
            auto = r.modes[AUTO].mean
            if not (light > medium > dark and light > auto > dark):
                out_of_order.append(f"{r.name} {light:.0f}/{medium:.0f}/{auto:.0f}/{dark:.0f}")
        lines.append(
            (
                "presets light > medium > dark and light > auto > dark in mean grey (light/medium/auto/dark)",
                not out_of_order,
                out_of_order,
            )
        )
    return lines


def summary(results: list[PhotoResult], modes: tuple[Mode, ...]) -> str:
    """Mean and worst of every measure, per mode, over `results` (worst: the lowest rank,
    fidelity and SSIM, the highest seam share)."""
    rows = [
        "| mode | rank mean | rank worst | fidelity mean | fidelity worst | SSIM mean | SSIM worst | seams mean "
        "| seams worst | out mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        numbers = [r.modes[mode.name] for r in results]
        rank = [n.rank for n in numbers]
        fidelity = [n.fidelity for n in numbers]
        similarity = [n.ssim for n in numbers]
        seams = [n.seams for n in numbers]
        rows.append(
            f"| {mode.name} | {_mean(rank):.3f} | {min(rank):.3f} | {_mean(fidelity):.3f} | {min(fidelity):.3f} "
            f"| {_mean(similarity):.3f} | {min(similarity):.3f} | {_mean(seams):.4f} | {max(seams):.4f} "
            f"| {_mean([n.mean for n in numbers]):.1f} |"
        )
    return "\n".join(rows)


def table(results: list[PhotoResult], modes: tuple[Mode, ...]) -> str:
    """The markdown table: one row per photo and mode."""
    rows = [
        "| photo | size | mode | rank corr | fidelity | SSIM | seams | in mean | out mean | bright delta | ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for mode in modes:
            n = r.modes[mode.name]
            delta = "" if n.bright_delta is None else f"{n.bright_delta:+.1f}"
            rows.append(
                f"| {r.name} | {r.size[0]}x{r.size[1]} | {mode.name} | {n.rank:.3f} | {n.fidelity:.3f} | {n.ssim:.3f} "
                f"| {n.seams:.4f} | {r.mean:.1f} | {n.mean:.1f} "
                f"| {delta} | {n.ms:.0f} |"
            )
    return "\n".join(rows)


# ------------------------------------------------------------------------ images --

SEPARATOR = 128  # grey between cells and rows
STRIP = 40  # label strip background
GAP = 4  # px


def font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def cell(image: np.ndarray, height: int, lines: list[str], text_size: int) -> np.ndarray:
    """One labelled cell: `image` (gray or RGB) scaled to `height` px, under a strip of `lines`."""
    rgb = image if image.ndim == 3 else cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
    scaled = resize_longer(rgb, round(height * max(rgb.shape[:2]) / rgb.shape[0]))
    line_height = text_size + 3
    strip = Image.new("RGB", (scaled.shape[1], line_height * len(lines) + 4), (STRIP,) * 3)
    draw = ImageDraw.Draw(strip)
    for i, line in enumerate(lines):
        draw.text((4, 2 + i * line_height), line, fill=(255, 255, 255), font=font(text_size))
    return np.vstack([np.asarray(strip), scaled])


def hstack(cells: list[np.ndarray], gap: int = GAP) -> np.ndarray:
    """Cells side by side (same height) with grey gaps."""
    height = max(c.shape[0] for c in cells)
    parts = []
    for i, c in enumerate(cells):
        if i:
            parts.append(np.full((height, gap, 3), SEPARATOR, np.uint8))
        parts.append(np.pad(c, ((0, height - c.shape[0]), (0, 0), (0, 0)), constant_values=SEPARATOR))
    return np.hstack(parts)


def vstack(rows: list[np.ndarray], gap: int = GAP) -> np.ndarray:
    """Rows under each other, padded on the right to the widest, with grey gaps and border."""
    width = max(r.shape[1] for r in rows)
    parts = [np.full((gap, width + 2 * gap, 3), SEPARATOR, np.uint8)]
    for r in rows:
        padded = np.pad(r, ((0, 0), (gap, width - r.shape[1] + gap), (0, 0)), constant_values=SEPARATOR)
        parts += [padded, np.full((gap, width + 2 * gap, 3), SEPARATOR, np.uint8)]
    return np.vstack(parts)


def row_cells(
    result: PhotoResult, image: np.ndarray, drawings: dict[str, np.ndarray], modes: list[Mode], height: int, text: int
) -> list[np.ndarray]:
    """The cells of one photo: the original, then each mode's drawing with its numbers."""
    cells = [cell(image, height, [result.name, f"photo  mean grey {result.mean:.0f}"], text)]
    for mode in modes:
        n = result.modes[mode.name]
        label = mode.name + ("  (default)" if mode.params == PencilParams() else "")
        cells.append(cell(drawings[mode.name], height, [label, f"rank {n.rank:.2f}  mean grey {n.mean:.0f}"], text))
    return cells


def zoom_crop(image: np.ndarray, centre: tuple[float, float], side: int) -> np.ndarray:
    """A side x side crop of `image` around `centre` (fractions of width and height, moved
    inside the image), enlarged 2x by pixel repetition: every pencil grain visible."""
    height, width = image.shape[:2]
    half = side // 4
    cx = min(max(round(centre[0] * width), half), width - half)
    cy = min(max(round(centre[1] * height), half), height - half)
    crop = image[max(cy - half, 0) : cy + half, max(cx - half, 0) : cx + half]
    return cv2.resize(crop, (2 * crop.shape[1], 2 * crop.shape[0]), interpolation=cv2.INTER_NEAREST)


def zoom_cells(
    result: PhotoResult,
    image: np.ndarray,
    drawings: dict[str, np.ndarray],
    modes: list[Mode],
    height: int,
    text: int,
    centre: tuple[float, float],
) -> list[np.ndarray]:
    """The 2x crops of one photo under its row: the photo's, then each mode's."""
    side = 2 * height  # a crop of height px of the drawing, shown at 2 height px
    cells = [cell(zoom_crop(image, centre, side), side, ["2x zoom", ""], text)]
    for mode in modes:
        n = result.modes[mode.name]
        seams = "" if np.isnan(n.seams) else f"  seams {n.seams:.3f}"
        cells.append(
            cell(
                zoom_crop(drawings[mode.name], centre, side),
                side,
                [f"{mode.name} 2x", f"fid {n.fidelity:.2f}  SSIM {n.ssim:.2f}{seams}"],
                text,
            )
        )
    return cells


def split_palette(image: np.ndarray, colours: int = 128) -> Image.Image:
    """`image` (RGB uint8) as a palette image that keeps the drawings' greys: grey pixels
    (R = G = B: the drawings, labels, separators and gray photos) take 256 - `colours` evenly
    spaced grey levels, the other pixels (colour photos) `colours` median-cut colours with
    Floyd-Steinberg dithering. A palette PNG compresses like a gray one: the gray drawings'
    pencil grain costs a third of what it costs as RGB."""
    levels = 256 - colours
    grey = (image[..., 0] == image[..., 1]) & (image[..., 1] == image[..., 2])
    grey_index = (image[..., 0].astype(np.int32) * (levels - 1) + 127) // 255
    source = image.copy()
    if not grey.all():
        source[grey] = image[~grey].mean(axis=0).astype(np.uint8)  # the greys take no colour of the palette
    picture = Image.fromarray(source)
    palette = picture.quantize(colours, method=Image.Quantize.MEDIANCUT)
    colour_index = np.asarray(picture.quantize(palette=palette, dither=Image.Dither.FLOYDSTEINBERG))
    entries = palette.getpalette()[: 3 * colours]
    entries += [0] * (3 * colours - len(entries))
    greys = [round(i * 255 / (levels - 1)) for i in range(levels) for _ in range(3)]
    result = Image.fromarray(np.where(grey, grey_index, colour_index.astype(np.int32) + levels).astype(np.uint8), "P")
    result.putpalette(greys + entries)
    return result


def save_png(image: np.ndarray, path: Path, max_bytes: int) -> int:
    """Write `image` (RGB uint8) as an optimised PNG; if that exceeds `max_bytes`, as a
    palette PNG (split_palette) instead. Returns the size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path, optimize=True)
    if path.stat().st_size > max_bytes:
        split_palette(image).save(path, optimize=True)
    return path.stat().st_size


# -------------------------------------------------------------------------- main --


def resize_to(image: np.ndarray, width: int, height: int) -> np.ndarray:
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)


def device_costs(image: np.ndarray, modes: tuple[Mode, ...], repeats: int = 20) -> str:
    """A table of each mode's GPU time for one render of `image` (device arrays in and
    out, decode and encode excluded): CUDA events around gpu.pencil.cuda.render_device on a
    lease of the default pool, median of `repeats`."""
    import cupy
    from timing import device_median_ms

    from gpu.pencil import cuda
    from gpu.pool import default_pool

    def measure(lease) -> list[str]:
        rows = []
        with cupy.cuda.Device(lease.device), lease.stream:
            d_image = cupy.asarray(image)
            for mode in modes:
                ms = device_median_ms(lambda mode=mode: cuda.render_device(lease, d_image, mode.params), repeats)
                rows.append(f"| {mode.name} | {ms:.3f} |")
        return rows

    height, width = image.shape[:2]
    rows = default_pool().run(measure)
    return "\n".join([f"GPU time of one {width}x{height} render (ms):", "| mode | ms |", "|---|---|", *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--side", type=int, default=768, help="longer side of every photo, px")
    parser.add_argument("--repeats", type=int, default=3, help="timed renders per photo and mode (after a warm-up)")
    parser.add_argument("--photos", default=None, help="comma-separated photo names (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers to DIR/quality.json")
    parser.add_argument("--cell", type=int, default=192, help="height of a contact sheet cell, px")
    parser.add_argument("--sheet", type=Path, default=ROOT / "docs/images/quality-contact-sheet.png")
    parser.add_argument("--before-after", type=Path, default=ROOT / "docs/images/before-after.png")
    parser.add_argument("--before-after-photo", default="rocket")
    parser.add_argument("--before-after-width", type=int, default=900, help="total width of before-after.png, px")
    parser.add_argument("--no-images", action="store_true", help="numbers only: write neither PNG")
    parser.add_argument("--no-zoom", action="store_true", help="no 2x crops on the contact sheet")
    parser.add_argument("--no-seams", action="store_true", help="skip the seam measure (it turns the texture again)")
    parser.add_argument("--set", choices=("all", *GROUPS), default="all", help="which photo set (Photo.group)")
    parser.add_argument(
        "--device-cost",
        default=None,
        metavar="WxH",
        help="cuda: also the GPU time of one render per mode at this size (CUDA events, median of 20)",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    photos = PHOTOS
    if args.photos:
        wanted = args.photos.split(",")
        unknown = set(wanted) - {p.name for p in PHOTOS}
        if unknown:
            parser.error(f"unknown photos {sorted(unknown)}; known: {', '.join(p.name for p in PHOTOS)}")
        photos = tuple(p for p in PHOTOS if p.name in wanted)
    if args.set != "all":
        photos = tuple(p for p in photos if p.group == args.set)

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores"
    if args.backend == "cuda":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        machine = f"{props['name'].decode()}, {machine}"
    gpu.pencil.warm_up(args.backend)
    print(f"# quality: {date.today()}, backend {args.backend}, {machine}; longer side {args.side} px, ", end="")
    print(f"median of {args.repeats} after a warm-up\n")

    sheet_modes = [m for m in MODES if m.sheet]
    results, rows = [], []
    before_after = None
    for photo in photos:
        result, image, drawings = measure(photo, args.side, MODES, args.backend, args.repeats, not args.no_seams)
        results.append(result)
        print(f"{photo.name}: {photo.note}; {result.source_size[0]}x{result.source_size[1]}", file=sys.stderr)
        if not args.no_images:
            rows.append(hstack(row_cells(result, image, drawings, sheet_modes, args.cell, 12)))
            if not args.no_zoom:
                rows.append(hstack(zoom_cells(result, image, drawings, sheet_modes, args.cell // 2, 12, photo.zoom)))
            if photo.name == args.before_after_photo:
                before_after = (result, image, drawings)

    print(table(results, MODES))
    print()
    if args.device_cost and args.backend == "cuda":
        width, height = (int(v) for v in args.device_cost.lower().split("x"))
        print(device_costs(resize_to(PHOTOS[1].load(), width, height), MODES))
        print()
    checks = targets(results, MODES)
    for line, met, offenders in checks:
        print(f"- {line}: {'met' if met else 'NOT met: ' + ', '.join(offenders)}")
    print()
    for label, subset in (
        *((label, [r for r in results if r.group == group]) for group, label in GROUPS.items()),
        ("all photos", results),
    ):
        if not subset:
            continue
        print(f"{label} ({len(subset)}):\n")
        print(summary(subset, MODES))
        print()
        for line, met, offenders in drawing_targets(subset, MODES):
            checks.append((f"{label}: {line}", met, offenders))
            print(f"- {line}: {'met' if met else 'NOT met: ' + ', '.join(offenders)}")
        print()

    if not args.no_images:
        size = save_png(vstack(rows), args.sheet, 1_500_000)
        print(f"\nwrote {args.sheet} ({size / 1e6:.2f} MB)")
        if before_after is not None:
            result, image, drawings = before_after
            modes = [m for m in MODES if m.name in ("light/lu", "auto/lu")]
            # three cells, two gaps and the border make the total width: the height follows
            height = round((args.before_after_width - 4 * GAP) * image.shape[0] / (3 * image.shape[1]))
            picture = vstack([hstack(row_cells(result, image, drawings, modes, height, 14))])
            size = save_png(picture, args.before_after, 600_000)
            print(f"wrote {args.before_after} ({picture.shape[1]}x{picture.shape[0]}, {size / 1e3:.0f} KB)")
        else:
            print(f"{args.before_after} not written: photo {args.before_after_photo!r} not drawn", file=sys.stderr)

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {
            "date": str(date.today()),
            "backend": args.backend,
            "machine": machine,
            "side": args.side,
            "repeats": args.repeats,
            "modes": {
                m.name: {
                    "tone": m.params.tone,
                    "texture": m.params.texture,
                    "hatching": m.params.hatching,
                    "sheet": m.sheet,
                }
                for m in MODES
            },
            "photos": [
                {
                    "name": r.name,
                    "note": r.note,
                    "group": r.group,
                    "size": r.size,
                    "source_size": r.source_size,
                    "mean": r.mean,
                    "modes": {name: vars(n) for name, n in r.modes.items()},
                }
                for r in results
            ],
            "targets": [{"target": line, "met": met, "offenders": offenders} for line, met, offenders in checks],
        }
        (args.out / "quality.json").write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.out / 'quality.json'}")


if __name__ == "__main__":
    main()
