"""The pencil kernels of gpu/pencil/pencil.cu, run on the CPU: the real source compiled by
g++ with the CUDA emulation of tests/gpu/emulator/emu.h (a std::thread per CUDA thread,
barriers for __syncthreads and the warp intrinsics), driven through the real
gpu/pencil/cuda.py with a NumPy stand-in for CuPy (emulator/fakecupy.py: the launch
geometry of an H100, every plane poisoned before a kernel writes it), against
gpu/pencil/reference.py stage by stage and end to end, with the bounds of the GPU tests
(tests/gpu/pencil/test_cuda.py).

It checks the kernels' logic in CI, on small real photos: the luma, histogram, median
and gradient bit for bit; the line passes' labels and strokes, tiled (prefix sums over
the shared tile) and untiled, across 2 x 2 tiles; the tone LUTs bit for bit and J; the
auto tone fit; the turned texture; the CG solve with its grid-wide sums; the merge; and
two whole renders. The float arithmetic is the host's (no FMA contraction, glibc's
powf / expf), so results sit within the same rounding of the reference as the GPU's,
not bit for bit the GPU's. Timing, memory ordering and the device compiler are for
test_cuda.py. Skipped without a C++20 g++.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pencil_parity import (
    assert_same_drawing,
    crossed_log_texture,
    expected_labels,
    photo,
    reference_merge,
    strokes_given_labels,
)

from gpu.pencil import reference as ref
from gpu.pencil.params import STROKE_POWER, PencilParams
from tests.gpu.emulator import library as emulator

HERE = Path(__file__).resolve().parent
EMULATOR = HERE / "emulator"
SOURCE = HERE.parents[2] / "gpu" / "pencil" / "pencil.cu"


@pytest.fixture(scope="module")
def seed() -> int:
    return secrets.randbits(32)


@pytest.fixture(autouse=True)
def show_seed(seed):
    print(f"emulator seed {seed} (python {EMULATOR / 'run.py'} LIBRARY {seed} OUT_DIR replays it)")


@pytest.fixture(scope="module")
def emulated(request, tmp_path_factory, seed) -> dict[str, dict[str, np.ndarray]]:
    """Every case of emulator/run.py, run once on a fresh seed: {case: saved arrays}."""
    work = tmp_path_factory.mktemp("pencil-emulated")
    source = emulator.with_dynamic_shared(SOURCE, work)
    library = emulator.build_in_pytest(
        request, tmp_path_factory, EMULATOR / "pencil_emu.cpp", {"PENCIL_SOURCE": source}
    )
    done = subprocess.run(
        [sys.executable, str(EMULATOR / "run.py"), str(library), str(seed), str(work / "out")],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"seed {seed}:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return {path.stem: dict(np.load(path)) for path in sorted((work / "out").glob("*.npz"))}


def photo_of(saved: dict, key: str = "photo") -> np.ndarray:
    name, height, width = saved[key]
    return photo(str(name), int(height), int(width))


def params_of(saved: dict, key: str = "params") -> PencilParams:
    return PencilParams(**json.loads(str(saved[key])))


def test_luma_histogram_median_gradient_are_bit_exact(emulated):
    saved = emulated["luma_gradient"]
    for key in ("color", "gray"):
        luma, _ = ref.split_luma(photo_of(saved, f"{key}_photo"))
        height, width = luma.shape
        np.testing.assert_array_equal(saved[f"{key}_luma"], luma)
        np.testing.assert_array_equal(saved[f"{key}_histogram"], ref.histogram(luma))
        expected = ref.gradient(ref.median3(luma))
        assert expected.any()
        padded = saved[f"{key}_padded"].copy()  # 255 M, whole numbers, in a zero border of 3 px
        np.testing.assert_array_equal(padded[3 : 3 + height, 3 : 3 + width], np.rint(expected * 255))
        padded[3 : 3 + height, 3 : 3 + width] = 0
        assert not padded.any(), "the padding must be zero"


@pytest.mark.parametrize("tiling", ["tiled", "untiled"])
def test_line_passes_label_and_draw_as_the_reference(emulated, tiling):
    saved = emulated["lines"]
    luma, _ = ref.split_luma(photo_of(saved))
    params = params_of(saved)
    length = params.line_length(*luma.shape)
    magnitude = ref.gradient(ref.median3(luma))
    label = saved[f"{tiling}_label"]

    expected, clear = expected_labels(magnitude, length)
    assert clear.mean() > 0.5
    np.testing.assert_array_equal(label[clear], expected[clear])  # only near-ties may differ
    bits = saved[f"{tiling}_packed"].view(np.uint32)
    np.testing.assert_array_equal(bits & 7, label)
    np.testing.assert_array_equal((bits & ~np.uint32(7)).view(np.float32), np.rint(magnitude * 255))

    strokes = saved[f"{tiling}_strokes"]
    wanted = strokes_given_labels(magnitude, label, length, params.stroke_width)
    assert wanted.max() > 0
    np.testing.assert_allclose(strokes, wanted, rtol=0, atol=2e-5 * float(wanted.max()))
    low, high = saved[f"{tiling}_extrema"].view(np.float32)
    assert (low, high) == (strokes.min(), strokes.max())


def test_tone_luts_are_exact_and_j_within_rounding(emulated):
    saved = emulated["tone"]
    luma, _ = ref.split_luma(photo_of(saved))
    params = params_of(saved)
    counts = ref.histogram(luma)
    np.testing.assert_array_equal(saved["lut"], ref.matching_lut(counts, ref.tone_target(counts, params.tone)))
    expected = ref.tone_map(luma, params)
    np.testing.assert_allclose(saved["j"], expected, rtol=0, atol=2e-6)
    np.testing.assert_allclose(
        saved["log_j"], np.log(np.maximum(expected, np.float32(ref.TONE_FLOOR))), rtol=0, atol=2e-5
    )

    layer, weights = ref.fit_tone(counts)
    assert int(saved["fit"][0]) == layer
    np.testing.assert_allclose(saved["fit"][1:], weights, rtol=0, atol=1e-9)
    np.testing.assert_allclose(saved["auto_cdf"], np.cumsum(ref.tone_target(counts, "auto")), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(saved["auto_lut"], ref.matching_lut(counts, ref.tone_target(counts, "auto")))
    # the preset: auto's fit moved by its shift (issue 38)
    layer, weights = ref.fit_tone(counts, params.tone_shift)
    assert int(saved["preset_fit"][0]) == layer and params.tone_shift[1] > 0
    np.testing.assert_allclose(saved["preset_fit"][1:], weights, rtol=0, atol=1e-9)
    np.testing.assert_allclose(saved["preset_cdf"], np.cumsum(ref.tone_target(counts, params.tone)), rtol=0, atol=1e-12)


def test_turned_texture_matches_the_reference(emulated):
    saved = emulated["hatch"]
    luma, _ = ref.split_luma(photo_of(saved))
    expected = ref.oriented_texture(luma, PencilParams(hatching="follow"))
    difference = np.abs(saved["texture"] - expected)
    assert difference.mean() < 1e-5 and np.mean(difference > 1e-3) < 1e-4, difference.max()
    np.testing.assert_allclose(saved["log_texture"], np.log(saved["texture"]), rtol=0, atol=1e-6)


def test_conjugate_gradient_reaches_the_reference_solution(emulated):
    saved = emulated["conjugate_gradient"]
    luma, _ = ref.split_luma(photo_of(saved))
    tone = ref.tone_map(luma, params_of(saved))
    log_tone = np.log(np.maximum(tone, np.float32(ref.TONE_FLOOR)))
    log_texture = np.log(ref.texture_for(*luma.shape))
    expected, iterations = ref.solve_beta_lu(log_texture, log_tone)
    beta, scalars = saved["beta"], saved["scalars"]
    assert np.isfinite(beta).all() and iterations > 0
    assert abs(scalars[6] - iterations) <= max(3, 0.2 * iterations)
    assert np.abs(np.exp(beta * log_texture) - np.exp(expected * log_texture)).mean() < 1.5e-3
    energy = ref.lu_energy(beta, log_texture, log_tone)
    assert energy <= ref.lu_energy(expected, log_texture, log_tone) * 1.01 + 1e-6


@pytest.mark.parametrize("mode", ["color", "gray"])
def test_merge_matches_the_reference_on_the_same_inputs(emulated, mode):
    saved = emulated["merge"]
    image = photo_of(saved)
    params = PencilParams(**{**json.loads(str(saved["params"])), "mode": mode})
    expected = reference_merge(image, params, saved["strokes"], saved["tone"], saved.get("beta"), saved.get("hatched"))
    crossed = crossed_log_texture(saved["tone"], saved.get("hatched"))
    np.testing.assert_allclose(saved["crossed"], crossed, rtol=0, atol=1e-6)
    assert (ref.cross_weight(saved["tone"]) > 0).any()  # the crossing layer drawn somewhere
    got = saved[mode]
    length = params.line_length(*saved["tone"].shape)
    sketch = 1.0 - (saved["strokes"] - saved["strokes"].min()) / np.float32(
        max(
            float(np.ptp(saved["strokes"])),
            ref.FULL_STROKE_CONTRAST * float(ref.line_kernels(length, params.stroke_width)[0][length // 2].sum()),
        )
    )
    sketch **= np.float32(STROKE_POWER * params.stroke_gamma)
    deepened = ref.deepened_strokes(sketch.astype(np.float32), saved["tone"])
    for got_mean, expected_mean in zip(saved["means"], ref.stroke_darkness_means(deepened, length), strict=True):
        np.testing.assert_allclose(got_mean, expected_mean, rtol=0, atol=1e-5)
    assert got.shape == expected.shape and expected.std() > 5
    # powf / expf (glibc's here) against NumPy's: an ulp, one grey level on a rounding edge.
    # The images are small: a share of 1 % is a few values (the GPU test allows 0.1 %).
    difference = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    assert difference.max() <= 1 and (difference > 0).mean() <= 1e-2, (params, difference.max())


@pytest.mark.parametrize("texture", ["lu", "fast"])
def test_render_draws_as_the_reference(emulated, texture):
    saved = emulated["render"]
    image = photo_of(saved, f"{texture}_photo")
    params = params_of(saved, f"{texture}_params")
    assert_same_drawing(saved[f"{texture}_drawing"], ref.render(image, params))
