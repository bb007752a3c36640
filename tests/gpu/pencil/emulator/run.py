"""Runs gpu/pencil/cuda.py on the emulated kernels of gpu/pencil/pencil.cu, stage by stage
and end to end, and saves what the device would return, for tests/gpu/pencil/
test_emulated.py to hold against the reference (in a subprocess, under a timeout: a
kernel whose threads miss a barrier would hang).

    python run.py LIBRARY SEED OUT_DIR [CASE ...]

Writes OUT_DIR/<case>.npz per case (every case by default; CASES names them): the
inputs the test needs to rebuild (photo name and size, the parameters as JSON) and the
device arrays. Every device plane is poisoned (gpu.kernels.POISON) before a kernel
writes it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[3])]  # fakecupy, pencil_parity, the repository


def main() -> int:
    import fakecupy  # found through the sys.path entries above
    import pencil_parity as parity

    library, seed, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    cuda = fakecupy.install(library)
    from gpu import kernels
    from gpu.pencil import reference as ref
    from gpu.pencil.params import PencilParams

    kernels.POISON = True
    rng = np.random.default_rng(seed)  # each case draws from its own stream, below
    lease = fakecupy.Lease()
    assets = cuda.assets(lease.device)

    def device(array: np.ndarray):
        return fakecupy._device(array)

    def pick_photo(height: int, width: int, color: bool | None = None) -> tuple[str, np.ndarray]:
        names = [n for n in parity.PHOTOS if color is None or (n != "camera") == color]
        name = str(rng.choice(names))
        return name, parity.photo(name, height, width)

    def as_json(params: PencilParams) -> np.ndarray:
        return np.array(json.dumps(dataclasses.asdict(params)))

    def luma_gradient() -> dict:
        saved = {}
        for key, (height, width, color) in {"color": (37, 53, True), "gray": (29, 101, False)}.items():
            name, image = pick_photo(height, width, color)
            planes = cuda.luma_and_histogram(device(image))
            saved |= {
                f"{key}_photo": np.array([name, height, width]),
                f"{key}_luma": planes.luma.get(),
                f"{key}_histogram": planes.histogram.get(),
                f"{key}_padded": cuda.gradient_padded(planes.luma, 3).get(),
            }
        return saved

    def lines() -> dict:
        """Both passes, tiled and untiled, on a photo of 2 x 2 line tiles (96 x 64 px)."""
        height, width = int(rng.integers(65, 90)), int(rng.integers(97, 130))
        name, image = pick_photo(height, width)
        luma, _ = ref.split_luma(image)
        params = PencilParams(line_frac=float(rng.uniform(0.1, 0.2)), stroke_width=int(rng.integers(1, 6)))
        length = params.line_length(height, width)
        thin, wide = assets.line_plan(length, 0), assets.line_plan(length, params.stroke_width)
        saved = {"photo": np.array([name, height, width]), "params": as_json(params)}
        for tiled in (True, False):
            cuda.FORCE_UNTILED_LINE_PASSES = not tiled
            label, packed = cuda.classify(cuda.gradient_padded(device(luma), thin.halo), thin, height, width)
            strokes, extrema = cuda.strokes(packed, wide, height, width)
            interior = packed.get()[thin.halo : thin.halo + height, thin.halo : thin.halo + width]
            tag = "tiled" if tiled else "untiled"
            saved |= {
                f"{tag}_label": label.get(),
                f"{tag}_packed": interior,
                f"{tag}_strokes": strokes.get(),
                f"{tag}_extrema": extrema.get(),
            }
        cuda.FORCE_UNTILED_LINE_PASSES = False
        return saved

    def tone() -> dict:
        """A preset's tone map with its log, and tone="auto"'s fit and LUT."""
        height, width = int(rng.integers(30, 60)), int(rng.integers(30, 60))
        name, image = pick_photo(height, width)
        luma, _ = ref.split_luma(image)
        params = PencilParams(
            tone=str(rng.choice(["light", "medium", "dark"])), tone_gamma=parity.log_uniform(rng, "tone_gamma")
        )
        planes = cuda.luma_and_histogram(device(luma))
        preset_cdf, preset_fit = cuda.fit_tone(planes, assets, params.tone_shift)
        j, log_j, lut = cuda.tone(planes, preset_cdf, params.tone_blur_size(height, width), params.tone_gamma, True)
        auto_cdf, fit = cuda.fit_tone(planes, assets)
        _, _, auto_lut = cuda.tone(planes, auto_cdf, 3, 1.0, False)
        return {
            "photo": np.array([name, height, width]),
            "params": as_json(params),
            "j": j.get(),
            "log_j": log_j.get(),
            "lut": lut.get(),
            "auto_cdf": auto_cdf.get(),
            "fit": fit.get(),
            "auto_lut": auto_lut.get(),
            "preset_cdf": preset_cdf.get(),
            "preset_fit": preset_fit.get(),
        }

    def hatch() -> dict:
        height, width = int(rng.integers(30, 70)), int(rng.integers(30, 70))
        name, image = pick_photo(height, width)
        luma, _ = ref.split_luma(image)
        params = PencilParams(hatching="follow")
        texture = cuda.oriented_texture(device(luma), params, assets, with_log=False).texture
        log_texture = cuda.oriented_texture(device(luma), params, assets, with_log=True).log_texture
        return {"photo": np.array([name, height, width]), "texture": texture.get(), "log_texture": log_texture.get()}

    def conjugate_gradient() -> dict:
        # Small: 2 x 3 or 4 blocks, each launch a grid-wide sum across them (the emulator
        # pays a context switch per thread at every barrier of the reductions).
        height, width = int(rng.integers(17, 32)), int(rng.integers(33, 64))
        name, image = pick_photo(height, width)
        luma, _ = ref.split_luma(image)
        params = PencilParams(tone=str(rng.choice(["light", "medium", "dark"])))
        tone_map = ref.tone_map(luma, params)
        log_tone = np.log(np.maximum(tone_map, np.float32(ref.TONE_FLOOR)))
        beta, scalars = cuda.solve_beta(device(log_tone), assets, lease.staging("cg", 8))
        return {
            "photo": np.array([name, height, width]),
            "params": as_json(params),
            "beta": beta.get(),
            "scalars": scalars.get(),
        }

    def merge() -> dict:
        """The merge kernel on the reference's S', J, beta and turned texture."""
        height, width = int(rng.integers(30, 60)), int(rng.integers(30, 60))
        name, image = pick_photo(height, width)
        params = parity.random_params(rng, mode="color")
        luma, _ = ref.split_luma(image)
        strokes, _ = parity.reference_strokes(luma, params)
        # the reference's J stretched onto [0.1, 1]: every photo has tones the crossing layer is drawn at
        tone_map = ref.tone_map(luma, params)
        tone_map = np.float32(0.1) + np.float32(0.9) * (tone_map - tone_map.min()) / max(float(np.ptp(tone_map)), 1e-3)
        tone_map = tone_map.astype(np.float32)
        hatched = ref.oriented_texture(luma, params) if params.hatching == "follow" else None
        log_texture = parity.crossed_log_texture(tone_map, hatched)
        beta = None
        if params.texture == "lu":
            beta, _ = ref.solve_beta_lu(log_texture, np.log(np.maximum(tone_map, np.float32(ref.TONE_FLOOR))))
        texture = assets if hatched is None else cuda.TexturePlanes(None, device(np.log(hatched)))
        crossed = cuda.cross_hatch(texture, device(tone_map), assets)
        extrema = device(np.array([strokes.min(), strokes.max()], np.float32).view(np.uint32))
        length = params.line_length(height, width)
        floor = cuda.stroke_floor(length, params.stroke_width)
        means = cuda.stroke_darkness_means(
            device(strokes), extrema, floor, params.stroke_gamma, device(tone_map), length
        )
        args = (means, device(tone_map), None if beta is None else device(beta), crossed, device(image))
        color = cuda.merge(device(strokes), extrema, floor, params.stroke_gamma, *args, True)
        gray = cuda.merge(device(strokes), extrema, floor, params.stroke_gamma, *args, False)
        saved = {"photo": np.array([name, height, width]), "params": as_json(params), "color": color.get()}
        saved |= {"gray": gray.get(), "strokes": strokes, "tone": tone_map, "means": means.get()}
        saved["crossed"] = crossed.get()
        if beta is not None:
            saved["beta"] = beta
        if hatched is not None:
            saved["hatched"] = hatched
        return saved

    def render() -> dict:
        """render_device end to end: "lu" with hatching="follow" in colour (small: its CG is
        the emulator's slowest part), "fast" flat in gray with tone="auto" on 2 x 2 line
        tiles, each with the rest drawn over their ranges."""
        saved = {}
        for key, fixed, sizes in (
            ("lu", {"texture": "lu", "hatching": "follow", "mode": "color"}, ((20, 32), (33, 64))),
            ("fast", {"texture": "fast", "hatching": "flat", "mode": "gray", "tone": "auto"}, ((65, 90), (97, 130))),
        ):
            height, width = (int(rng.integers(*size)) for size in sizes)
            name, image = pick_photo(height, width)
            params = parity.random_params(rng, **fixed)
            out = cuda.render_device(lease, device(image), params)
            saved |= {f"{key}_photo": np.array([name, height, width]), f"{key}_params": as_json(params)}
            saved[f"{key}_drawing"] = out.get()
        return saved

    cases = {
        "luma_gradient": luma_gradient,
        "lines": lines,
        "tone": tone,
        "hatch": hatch,
        "conjugate_gradient": conjugate_gradient,
        "merge": merge,
        "render": render,
    }
    out.mkdir(parents=True, exist_ok=True)
    for case in sys.argv[4:] or cases:
        rng = np.random.default_rng([seed, list(cases).index(case)])
        np.savez(out / f"{case}.npz", **cases[case]())
        print(f"{case}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
