"""A steady tone for video (temporal="steady").

The pencil texture is already anchored to the frame: the same tile at the same place in
every frame, never re-randomised, so a still scene gets the same paper grain every time.
The tone stage is what still moves from frame to frame: it maps each frame's luma
through a LUT that matches the frame's own histogram to a target (tone=auto: Lu's layers
fitted to that histogram, a discrete choice of layers that can flip between two nearly
equal fits; a preset: fixed). So the LUT follows every change of the histogram, sensor
noise and an object coming into view included: a pixel of a still wall changes tone
because something else in the frame changed.

SteadyTone builds the LUT from a running (exponential moving) average of the frames'
luma histograms instead, time constant STEADY_SECONDS: the target is fitted to that
average (tone=auto) or is the preset's, and every frame goes through the same LUT, so a
luma value keeps its drawn tone from frame to frame while the map follows the scene
slowly. The LUT (and its fit, on the host) is rebuilt once the running
histogram has drifted by REFIT_DRIFT (total variation) from the one it was built from. A
frame whose histogram differs from the running one by CUT_DISTANCE or more is a cut: the
average restarts from it. A still clip gets exactly the LUT each frame would have alone.
What it does to flicker, and the first design it replaced: docs/video.md, "Temporal".
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from gpu.pencil import reference

STEADY_SECONDS = 1.0  # time constant of the running histogram
REFIT_DRIFT = 0.005  # total variation between the running histogram and the LUT's that rebuilds the LUT
CUT_DISTANCE = 0.5  # total variation between a frame and the running histogram taken for a scene cut


def luma_histogram(image: np.ndarray) -> np.ndarray:
    """(256,) int64 counts of the luma the pipeline draws from (reference.split_luma's Y)
    of an (H, W, 3) uint8 RGB or (H, W) uint8 gray image: reference.histogram's values,
    counted with OpenCV (faster than np.bincount)."""
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2YCrCb)
    counts = cv2.calcHist([image], [0], None, [256], [0, 256])
    return counts.reshape(256).astype(np.int64)


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """Half the L1 distance of two (256,) histograms, each normalised to sum 1: 0 equal,
    1 disjoint."""
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


class SteadyTone:
    """The tone LUTs of a clip's frames, in order, for `tone` (auto or a preset) at `fps`
    frames per second: `lut(counts)` for each frame's luma histogram."""

    def __init__(self, tone: str, fps: float, seconds: float = STEADY_SECONDS):
        self.tone = tone
        self.weight = 1.0 - math.exp(-1.0 / (max(fps, 1e-3) * seconds))  # of each new frame
        self.running: np.ndarray | None = None  # in counts: a still clip keeps its frames' exact histogram
        self.built_from: np.ndarray | None = None
        self.current: np.ndarray | None = None
        self.builds = 0  # how many times the LUT was built (a figure for the summary and tests)

    def lut(self, counts: np.ndarray) -> np.ndarray:
        """The (256,) uint8 tone LUT of the next frame (reference.tone_map's `lut`), whose
        luma histogram is `counts` ((256,) non-negative, not all zero)."""
        frame = counts.astype(np.float64)
        if self.running is None or total_variation(frame, self.running) >= CUT_DISTANCE:
            self.running = frame
        else:
            self.running = self.running + self.weight * (frame - self.running)
        if (
            self.current is None
            or self.built_from is None
            or total_variation(self.running, self.built_from) >= REFIT_DRIFT
        ):
            self.built_from = self.running
            self.current = reference.matching_lut(self.running, reference.tone_target(self.running, self.tone))
            self.builds += 1
        return self.current
