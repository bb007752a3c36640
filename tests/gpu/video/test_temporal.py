"""gpu/video/temporal.py: the steady tone LUT. A still clip gets exactly the LUT of each frame
alone; noise and a dark object coming into view move the per-frame LUT, not the steady
one; a cut restarts it; and through the whole front door the steady option draws a still
clip exactly as `none` does and holds a still scene's tone where `none` lets it jump."""

from __future__ import annotations

import io

import numpy as np
import pytest

from gpu import video
from gpu.pencil import reference
from gpu.pencil.params import PencilParams
from gpu.video.temporal import CUT_DISTANCE, REFIT_DRIFT, SteadyTone, luma_histogram, total_variation
from tests.gpu.video.clips import dark_object_entering, decoded_frames, drawn_frames, make_clip, panned

PHOTOS = ("astronaut", "coffee", "chelsea", "camera")


def per_frame_lut(counts: np.ndarray, tone: str) -> np.ndarray:
    return reference.matching_lut(counts, reference.tone_target(counts, tone))


def map_flicker(histograms: list[np.ndarray], luts: list[np.ndarray]) -> float:
    """The mean change, in grey levels, of a luma value's mapped tone from one frame to the
    next, weighted by how often the value occurs: the tone map's own flicker."""
    changes = []
    for counts, before, after in zip(histograms[1:], luts[:-1], luts[1:], strict=True):
        changes.append(float((counts / counts.sum() * np.abs(after.astype(float) - before)).sum()))
    return float(np.mean(changes))


def still_noisy(photo: str, rng, frames: int = 24, width: int = 240, height: int = 160) -> list[np.ndarray]:
    """A still shot of the photo with a camera's noise (sigma 4 grey levels) in every frame."""
    base = panned(photo, width, height, 1, 0)[0].astype(np.float32)
    return [np.clip(base + rng.normal(0.0, 4.0, base.shape), 0, 255).astype(np.uint8) for _ in range(frames)]


@pytest.mark.parametrize("photo", PHOTOS)
def test_the_luma_histogram_is_the_references(photo, rng):
    image = panned(photo, int(rng.integers(40, 300)), int(rng.integers(40, 200)), 1, 0)[0]
    expected = reference.histogram(reference.split_luma(image)[0])
    np.testing.assert_array_equal(luma_histogram(image), expected)
    np.testing.assert_array_equal(luma_histogram(image[..., 1].copy()), reference.histogram(image[..., 1]))


@pytest.mark.parametrize("tone", ["auto", "dark"])
def test_a_still_clip_gets_each_frames_own_lut(tone):
    counts = luma_histogram(panned("chelsea", 200, 150, 1, 0)[0])
    steady = SteadyTone(tone, fps=25.0)
    for _ in range(10):
        np.testing.assert_array_equal(steady.lut(counts), per_frame_lut(counts, tone))
    assert steady.builds == 1


@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("tone", ["auto", "medium"])
def test_noise_moves_the_per_frame_lut_not_the_steady_one(photo, tone, rng):
    histograms = [luma_histogram(frame) for frame in still_noisy(photo, rng)]
    steady = SteadyTone(tone, fps=24.0)
    steady_luts = [steady.lut(counts) for counts in histograms]
    alone = map_flicker(histograms, [per_frame_lut(counts, tone) for counts in histograms])
    held = map_flicker(histograms, steady_luts)
    print(f"{photo} {tone}: tone map flicker {alone:.3f} -> {held:.3f} grey levels")
    assert alone > 0.02 and held < alone / 3
    assert total_variation(steady.running, steady.built_from) < REFIT_DRIFT  # never staler than that


@pytest.mark.parametrize("photo", PHOTOS)
@pytest.mark.parametrize("tone", ["auto", "medium"])
def test_a_dark_object_coming_in_does_not_pump_the_rest(photo, tone):
    """A dark shape slides into a still scene over 15 frames (0.5 s): matching each frame's
    own histogram moves the tone of every other pixel as it comes; the steady LUT follows
    at its own pace (less than half as far meanwhile)."""
    frames, wall = dark_object_entering(photo)
    histograms = [luma_histogram(frame) for frame in frames]
    steady = SteadyTone(tone, fps=30.0)
    alone = np.array([per_frame_lut(counts, tone)[wall].mean() for counts in histograms])
    held = np.array([steady.lut(counts)[wall].mean() for counts in histograms])
    moved_alone, moved_held = np.abs(np.diff(alone)).sum(), np.abs(np.diff(held)).sum()
    print(f"{photo} {tone}: the wall's tone moved {moved_alone:.2f} -> {moved_held:.2f} grey levels")
    assert moved_alone > 1.0 and moved_held < moved_alone / 2


def test_a_cut_restarts_the_running_histogram():
    first = luma_histogram(panned("camera", 200, 150, 1, 0)[0])
    second = luma_histogram(panned("coffee", 200, 150, 1, 0)[0])
    assert total_variation(first, second) >= CUT_DISTANCE
    steady = SteadyTone("auto", fps=30.0)
    for _ in range(5):
        steady.lut(first)
    np.testing.assert_array_equal(steady.lut(second), per_frame_lut(second, "auto"))


def test_through_the_front_door_a_still_clip_is_drawn_as_with_none():
    image = panned("coffee", 160, 120, 1, 0)[0]
    clip = make_clip("mp4", frames=6, images=[image] * 6, audio=None)
    outputs = {}
    for temporal in ("steady", "none"):
        out = io.BytesIO()
        summary = video.draw(clip, out, video.VideoParams(PencilParams(texture="fast"), temporal))
        outputs[temporal] = drawn_frames(out.getvalue())
        assert summary["steady_luts"] == (None if temporal == "none" else 1)
    for steady, alone in zip(outputs["steady"], outputs["none"], strict=True):
        np.testing.assert_array_equal(steady, alone)


def test_through_the_front_door_steady_frames_are_the_reference_with_the_steady_lut(rng):
    """Each drawn frame is reference.render of the clip's frame with the LUT SteadyTone
    gives it, within the codec's loss."""
    clip = make_clip("mp4", frames=12, images=still_noisy("astronaut", rng, frames=12, width=160, height=120))
    out = io.BytesIO()
    params = PencilParams(texture="fast")
    video.draw(clip, out, video.VideoParams(params, "steady"))
    steady = SteadyTone("auto", fps=24.0)
    for drawn, frame in zip(drawn_frames(out.getvalue()), decoded_frames(clip), strict=True):
        expected = reference.render(frame, params, steady.lut(luma_histogram(frame)))
        assert expected.std() > 10 and np.abs(drawn.astype(np.int16) - expected).mean() < 6
