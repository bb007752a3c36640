"""The emulator's stand-in for cp.async (tests/gpu/emulator/emu.h), on kernels of its own
(async_copies_emu.cpp): a copy's destination holds the garbage byte until the issuing thread's
wait covers the copy's group (commit_group / wait_group / wait_all), then the source's
bytes; copies never waited for never land. This is what makes a missing wait in a real
kernel (cs256.cu, search.cu) read garbage, and fail, in the emulator tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.gpu.emulator import library as emulator

HERE = Path(__file__).resolve().parent
GARBAGE = 0xCD  # emu.h: EMU_GARBAGE
THREADS = 64


@pytest.fixture(scope="module")
def library(request, tmp_path_factory):
    driver = HERE / "async_copies_emu.cpp"
    return emulator.load(emulator.build_in_pytest(request, tmp_path_factory, driver, {}))


def source_bytes(rng, blocks: int = 1) -> np.ndarray:
    """Random bytes without the garbage byte, so that landed and not landed differ everywhere."""
    src = rng.integers(0, 255, size=blocks * THREADS * 16, dtype=np.uint8)
    src[src == GARBAGE] = 0x11
    return src


def test_groups_land_at_the_wait_that_covers_them(library, rng):
    src = source_bytes(rng)
    seen = np.zeros((3, THREADS, 16), np.uint8)
    emulator.launch(library, "stage_in_groups", 1, THREADS, THREADS * 16, (src, seen))
    expected = src.reshape(THREADS, 16)
    assert (seen[0] == GARBAGE).all(), "read before any wait: garbage"
    assert (seen[1, :, :8] == expected[:, :8]).all(), "wait_group(1): the older group landed"
    assert (seen[1, :, 8:] == GARBAGE).all(), "wait_group(1): the newest group not yet"
    assert (seen[2] == expected).all(), "wait_all: every group landed"


def test_copies_never_waited_for_never_land(library, rng):
    src = source_bytes(rng)
    seen = np.zeros((3, THREADS, 16), np.uint8)
    emulator.launch(library, "never_waited", 3, THREADS, THREADS * 16, (src, seen))
    assert (seen == GARBAGE).all(), "a block's wait landed the previous block's copies"
