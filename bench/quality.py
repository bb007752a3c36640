"""Quality benchmark of the tone options: numbers per photo and mode, and a contact sheet to look at.

    python bench/quality.py [--side 768] [--repeats 3] [--out DIR]              # CPU backend
    python bench/quality.py --backend cuda [...]                               # GPU backend
    python bench/quality.py --photos rocket,moon --no-images                    # a subset, numbers only

Photos: scikit-image's real photographs (dark and low-key ones included: the Hubble deep
field, the rocket at dusk, the retina scan with its black surround) and our own low-key
ones, real photos darkened by a physical exposure change (-3 EV in linear light: `expose`).
Each is resized to a longer side of --side px (area filter when shrinking, cubic when
enlarging) before rendering.

Per photo and mode (MODES: a name -> PencilParams; adding a mode is one line):
- rank: Spearman's rank correlation between the photo's luma and the drawing, both
  averaged over square blocks of max(1, shorter side // 24) px (`block_means`);
- in / out: mean grey (0..255) of the photo's luma and of the drawing;
- bright delta: the drawing's mean over the photo's brightest blocks (top 10 % of the
  photo's block means) minus the same for the `light` mode of the same texture: how far
  the paper moved from today's look (negative: darker);
- ms: median render time of --repeats after one warm-up (host wall time, transfers
  included, through `gpu.pencil.render` on --backend).

Targets (issue): with tone=auto, rank >= 0.85 on every photo; a photo with mean grey under
60 gives a drawing with mean grey under 150; a photo of ordinary exposure (mean grey 60..195)
keeps its brightest blocks within 30 grey levels of `light`. One line each says met / not met.

Images: docs/images/quality-contact-sheet.png (one row per photo: original and the modes
marked for the sheet, each cell labelled with its numbers) and docs/images/before-after.png
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
    Mode("light/lu", PencilParams(tone="light", texture="lu")),  # today's default
    Mode("auto/lu", PencilParams(tone="auto", texture="lu")),
    Mode("light/fast", PencilParams(tone="light", texture="fast"), sheet=False),
    Mode("auto/fast", PencilParams(tone="auto", texture="fast"), sheet=False),
    Mode("auto+follow/lu", PencilParams(tone="auto", texture="lu", hatching="follow")),
    Mode("light+follow/lu", PencilParams(tone="light", texture="lu", hatching="follow"), sheet=False),
    Mode("light+follow/fast", PencilParams(tone="light", texture="fast", hatching="follow"), sheet=False),
)


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


PHOTOS: tuple[Photo, ...] = (
    Photo("camera", "scikit-image: cameraman, gray", skimage.data.camera),
    Photo("astronaut", "scikit-image: Eileen Collins, NASA", skimage.data.astronaut),
    Photo("coffee", "scikit-image: coffee cup", skimage.data.coffee),
    Photo("chelsea", "scikit-image: Chelsea the cat", skimage.data.chelsea),
    Photo("coins", "scikit-image: Greek coins, gray", skimage.data.coins),
    Photo("motorcycle", "scikit-image: stereo_motorcycle, left view", lambda: skimage.data.stereo_motorcycle()[0]),
    Photo("moon", "scikit-image: lunar surface, gray", skimage.data.moon),
    Photo("page", "scikit-image: a photographed book page, gray", skimage.data.page),
    Photo("ihc", "scikit-image: immunohistochemistry micrograph (high-key)", skimage.data.immunohistochemistry),
    Photo("retina", "scikit-image: retina fundus, black surround", skimage.data.retina),
    Photo("rocket", "scikit-image: SpaceX rocket at dusk (low-key)", skimage.data.rocket),
    Photo("hubble", "scikit-image: Hubble deep field (night sky)", skimage.data.hubble_deep_field),
    Photo("astronaut-3EV", "ours: astronaut at -3 EV in linear light", lambda: expose(skimage.data.astronaut(), -3.0)),
    Photo("coffee-3EV", "ours: coffee at -3 EV in linear light", lambda: expose(skimage.data.coffee(), -3.0)),
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


@dataclass
class Result:
    """The numbers of one photo drawn in one mode."""

    rank: float
    mean: float
    bright: float  # the drawing's mean over the photo's brightest blocks
    ms: float
    bright_delta: float | None = None  # bright minus the light mode's of the same texture


@dataclass
class PhotoResult:
    name: str
    note: str
    size: tuple[int, int]  # (width, height) drawn
    source_size: tuple[int, int]
    mean: float  # the photo's mean grey (luma)
    modes: dict[str, Result] = field(default_factory=dict)


def baseline_of(mode: Mode, modes: tuple[Mode, ...] = MODES) -> Mode | None:
    """The mode `mode` is compared with for the brightest blocks: the first `light` mode of
    the same texture (None for a light mode itself)."""
    if mode.params.tone == "light":
        return None
    return next((m for m in modes if m.params.tone == "light" and m.params.texture == mode.params.texture), None)


def measure(
    photo: Photo, side: int, modes: tuple[Mode, ...], backend: str, repeats: int
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
    )
    drawings = {}
    for mode in modes:
        out: dict[str, np.ndarray] = {}

        def work(mode: Mode = mode, out: dict[str, np.ndarray] = out) -> None:
            out["drawing"] = gpu.pencil.render(image, mode.params, backend)

        ms = median_ms(work, repeats)  # one warm-up, then `repeats` timed renders
        drawing = out["drawing"]
        drawing_blocks = block_means(luma(drawing), block)
        result.modes[mode.name] = Result(
            rank_correlation(photo_blocks, drawing_blocks),
            float(drawing.mean()),
            float(drawing_blocks[mask].mean()),
            ms,
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


def table(results: list[PhotoResult], modes: tuple[Mode, ...]) -> str:
    """The markdown table: one row per photo and mode."""
    rows = [
        "| photo | size | mode | rank corr | in mean | out mean | bright delta | ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for mode in modes:
            n = r.modes[mode.name]
            delta = "" if n.bright_delta is None else f"{n.bright_delta:+.1f}"
            rows.append(
                f"| {r.name} | {r.size[0]}x{r.size[1]} | {mode.name} | {n.rank:.3f} | {r.mean:.1f} | {n.mean:.1f} "
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
        label = mode.name + ("  (today's default)" if mode.params == PencilParams() else "")
        cells.append(cell(drawings[mode.name], height, [label, f"rank {n.rank:.2f}  mean grey {n.mean:.0f}"], text))
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
        result, image, drawings = measure(photo, args.side, MODES, args.backend, args.repeats)
        results.append(result)
        print(f"{photo.name}: {photo.note}; {result.source_size[0]}x{result.source_size[1]}", file=sys.stderr)
        if not args.no_images:
            rows.append(hstack(row_cells(result, image, drawings, sheet_modes, args.cell, 12)))
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
