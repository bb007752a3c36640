"""gpu.video's front door on a GPU lease (gpu.pencil.cuda) against the CPU: the same clip
drawn both ways, frame for frame within the pipelines' parity and the codec's loss.

CUDA only (marker `gpu`; skipped without a device)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from gpu import video
from gpu.backend import cuda_devices
from gpu.pencil.params import PencilParams
from tests.gpu.video.clips import drawn_frames, make_clip

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]


@pytest.mark.parametrize("temporal", ["steady", "none"])
@pytest.mark.parametrize("texture", ["fast", "lu"])
def test_a_clip_drawn_on_a_lease_is_the_cpus(pool, temporal, texture):
    clip = make_clip("mp4", width=320, height=180, frames=24, fps=30, noise=3.0)
    params = video.VideoParams(PencilParams(texture=texture), temporal)
    on_gpu, on_cpu = io.BytesIO(), io.BytesIO()
    gpu_summary = pool.run(lambda lease: video.draw(clip, on_gpu, params, lease=lease))
    cpu_summary = video.draw(clip, on_cpu, params)
    assert gpu_summary["backend"] == "cuda" and cpu_summary["backend"] == "cpu"
    assert gpu_summary["frames"] == cpu_summary["frames"] == 24
    assert gpu_summary["audio"] == cpu_summary["audio"] and gpu_summary["steady_luts"] == cpu_summary["steady_luts"]
    for index, (got, expected) in enumerate(
        zip(drawn_frames(on_gpu.getvalue()), drawn_frames(on_cpu.getvalue()), strict=True)
    ):
        assert expected.std() > 10
        difference = np.abs(got.astype(np.int16) - expected)
        assert difference.mean() < 3.0, f"frame {index}: mean |diff| {difference.mean():.2f}"


def test_a_job_runs_on_a_lease(pool):
    clip = make_clip("mkv", width=640, height=360, frames=30, fps=30)
    job = video.VideoJob.uploaded(video.VideoParams(PencilParams(texture="fast")), clip)
    result = pool.run(lambda lease: video.run(job, lease))
    assert result.summary["backend"] == "cuda" and result.summary["frames"] == 30
    assert result.summary["audio"]["copied"] is True


def test_a_frame_staged_on_a_lease_counts_the_cpus_histogram_and_draws_with_the_lut(pool):
    from skimage import data

    from gpu.video.drawer import Drawer
    from gpu.video.temporal import luma_histogram

    image = np.ascontiguousarray(data.astronaut()[:360, :480])
    lut = np.clip(np.arange(256) * 1.3 - 20, 0, 255).astype(np.uint8)  # a darkening map, not the photo's own
    params = PencilParams(texture="fast")

    def on_lease(lease):
        drawer = Drawer(params, lease)
        staged = drawer.stage(image, histogram=True)
        staged.tone_lut = lut
        return staged.histogram, drawer.draw(staged)

    histogram, drawing = pool.run(on_lease)
    np.testing.assert_array_equal(histogram, luma_histogram(image))
    on_cpu = Drawer(params)(image, lut)
    assert on_cpu.std() > 10
    difference = np.abs(drawing.astype(np.int16) - on_cpu)
    assert difference.mean() < 1.0 and np.mean(difference > 1) < 0.01, f"mean |diff| {difference.mean():.3f}"


@pytest.mark.parametrize("explicit_tone", [True, False], ids=["steady-lut", "own-tone"])
def test_a_drawer_replaying_its_graph_draws_what_it_draws_directly(pool, monkeypatch, caplog, explicit_tone):
    from gpu.video import drawer as drawer_module
    from gpu.video.temporal import SteadyTone
    from tests.gpu.video.clips import panned

    clip = panned("coffee", 320, 180, 6, 4.0, noise=3.0)
    params = PencilParams(texture="fast")

    def drawings(lease, replay: bool) -> list[np.ndarray]:
        monkeypatch.setattr(drawer_module, "REPLAY", replay)
        drawer = drawer_module.Drawer(params, lease)
        steady = SteadyTone("auto", 30.0)
        out = []
        for image in clip:
            staged = drawer.stage(image, histogram=explicit_tone)
            if explicit_tone:
                staged.tone_lut = steady.lut(staged.histogram)
            out.append(drawer.draw(staged))
        assert (next(iter(drawer.frames.replays.values())) is not None) == replay
        return out

    replayed = pool.run(lambda lease: drawings(lease, True))
    direct = pool.run(lambda lease: drawings(lease, False))
    for index, (got, expected) in enumerate(zip(replayed, direct, strict=True)):
        assert expected.std() > 10
        np.testing.assert_array_equal(got, expected, err_msg=f"frame {index}")

    # a capture that fails (a driver that cannot capture, say) is logged and the clip drawn directly
    def refuse(*args, **kwargs):
        raise RuntimeError("capture refused by this test")

    monkeypatch.setattr("gpu.pencil.replay.ReplayedRender.__init__", refuse)
    monkeypatch.setattr(drawer_module, "REPLAY", True)

    def fallback(lease) -> list[np.ndarray]:
        drawer = drawer_module.Drawer(params, lease)
        out = []
        for image in clip[:2]:
            staged = drawer.stage(image, histogram=explicit_tone)
            if explicit_tone:
                staged.tone_lut = SteadyTone("auto", 30.0).lut(staged.histogram)
            out.append(drawer.draw(staged))
        assert list(drawer.frames.replays.values()) == [None]
        return out

    with caplog.at_level("WARNING", logger="pencil.video"):
        first = pool.run(fallback)
    assert "could not be captured" in caplog.text and "capture refused by this test" in caplog.text
    np.testing.assert_array_equal(first[0], direct[0])
