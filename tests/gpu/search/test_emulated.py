"""The CUDA kernels of gpu/search/search.cu, run on the CPU: a C++ emulation of the CUDA
execution model (tests/gpu/emulator/emu.h: a std::thread per CUDA thread, barriers for
__syncthreads and the warp intrinsics) compiled with the host's g++, driven through the
real gpu/search/cuda.py with a NumPy stand-in for CuPy (emulator/fakecupy.py), against
the reference on every case of the issue. It checks the kernels' logic (chunking,
overlaps, tables, the skip loops, compaction, both write paths, the fused pass, line
numbers) in CI; timing, memory ordering and the device itself are for test_cuda.py on a
GPU. Blocks of the production size (256 threads). Searches streamed in while they run
(the first search of a corpus) too, with copies that land late (emulator/fakecupy.py): a
count launch that does not wait for its bytes reads 0xFF. Skipped when there is no C++20
compiler.

The full sweep (every granularity; minutes):
    python tests/gpu/search/emulator/run.py <library> <seed> 6000 full
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.emulator import library as emulator

HERE = Path(__file__).resolve().parent
EMULATOR = HERE / "emulator"
SOURCE = HERE.parents[2] / "gpu" / "search" / "search.cu"


@pytest.fixture(scope="module")
def library(request, tmp_path_factory) -> Path:
    """The emulator with the kernels, built once per source version (kept in pytest's cache)."""
    return emulator.build_in_pytest(request, tmp_path_factory, EMULATOR / "emu.cpp", {"SEARCH_SOURCE": SOURCE})


def test_kernels_find_what_the_reference_finds(library):
    seed = secrets.randbits(32)
    print(f"emulator seed {seed}")
    done = subprocess.run(
        [sys.executable, str(EMULATOR / "run.py"), str(library), str(seed), "6000"],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"seed {seed}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    summary = re.fullmatch(r"(\d+) searches, (\d+) mismatches", done.stdout.strip().splitlines()[-1])
    assert summary is not None, done.stdout[-6000:]  # the exact last line: "10 mismatches" must not pass
    runs, failures = map(int, summary.groups())
    assert runs > 0 and failures == 0, done.stdout[-6000:]
