"""The drawing model in pictures: the stages of reference.render for one photo, labelled, for
docs/design.md ("The pencil pipeline").

    python bench/model_figure.py [--photo astronaut] [--side 640] [--cell 300] [--out docs/images/drawing-model.png]

Row 1: the photo's luma; the tone map J (the matching LUT read at the local mean); the
strokes deepened by the tone, S_t, as they would be drawn on their own; the same strokes
after the balance, S_b (thinned and lightened where they would darken a region below its
tone). Row 2: Lu's texture T = H ** beta with the flat tile; the texture the default draws
with, T_b (hatching turned along the forms, a second layer crossing it where the tone is
dark, lifted under the strokes); the drawing S_b T_b (the default); the same with
hatching=flat. CPU backend (gpu/pencil/reference.py), default options otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality import PHOTOS, ROOT, cell, hstack, luma, resize_longer, save_png, vstack

from gpu.pencil import reference as ref
from gpu.pencil.params import PencilParams


def stages(image: np.ndarray, params: PencilParams) -> dict[str, np.ndarray]:
    """The named stages of reference.render for `image`, each (H, W) float32 in [0, 1]."""
    luma_u8, _ = ref.split_luma(image)
    height, width = luma_u8.shape
    length = params.line_length(height, width)
    tone = ref.tone_map(luma_u8, params)
    deepened = ref.deepened_strokes(ref.strokes_of(luma_u8, params), tone)
    balanced, lifted = ref.balance(deepened, ref.stroke_darkness_means(deepened, length), tone)
    flat_texture = ref.texture_rendering(tone, "lu")
    texture = ref.balanced_texture(tone, lifted, "lu", ref.oriented_texture(luma_u8, params))
    return {
        "photo (luma)": luma_u8.astype(np.float32) / 255,
        "tone J: the LUT at the local mean": tone,
        "strokes S_t, deepened by the tone": deepened,
        "strokes S_b, balanced against J": balanced,
        "Lu's texture, flat tile": flat_texture,
        "texture T_b: follow, crossed where dark": texture,
        "drawing S_b T_b (default)": balanced * texture,
        "drawing, hatching=flat": luma(ref.render(image, PencilParams(hatching="flat"))).astype(np.float32) / 255,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photo", default="astronaut", help="a photo of bench/quality.py")
    parser.add_argument("--side", type=int, default=640, help="longer side of the photo drawn, px")
    parser.add_argument("--cell", type=int, default=300, help="height of a cell, px")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/images/drawing-model.png")
    args = parser.parse_args()
    photo = next((p for p in PHOTOS if p.name == args.photo), None)
    if photo is None:
        parser.error(f"unknown photo {args.photo!r}; known: {', '.join(p.name for p in PHOTOS)}")
    image = resize_longer(photo.load(), args.side)
    planes = stages(image, PencilParams())
    cells = [cell(ref.to_u8(plane), args.cell, [name], 13) for name, plane in planes.items()]
    picture = vstack([hstack(cells[:4]), hstack(cells[4:])])
    size = save_png(picture, args.out, 1_200_000)
    print(f"wrote {args.out} ({picture.shape[1]}x{picture.shape[0]}, {size / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
