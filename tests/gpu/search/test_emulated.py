"""The CUDA kernels of gpu/search/search.cu, run on the CPU: a C++ emulation of the CUDA
execution model (emulator/emu.h: a std::thread per CUDA thread, barriers for
__syncthreads and the warp intrinsics) compiled with the host's g++, driven through the
real gpu/search/cuda.py with a NumPy stand-in for CuPy (emulator/fakecupy.py), against
the reference on every case of the issue. It checks the kernels' logic (chunking,
overlaps, tables, the skip loops, compaction, both write paths, the fused pass, line
numbers) in CI; timing, memory ordering and the device itself are for test_cuda.py on a
GPU. Skipped when there is no C++20 compiler.

The full sweep (blocks of 256 threads, every granularity; minutes):
    python tests/gpu/search/emulator/run.py <library> <seed> 6000 full
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EMULATOR = HERE / "emulator"
SOURCE = HERE.parents[2] / "gpu" / "search" / "search.cu"
PROBE = "#include <barrier>\n#include <atomic>\nint main() { std::barrier<> b(1); unsigned x = 0; std::atomic_ref<unsigned>(x).fetch_add(1); b.arrive_and_wait(); }\n"


@pytest.fixture(scope="module")
def library(request, tmp_path_factory) -> Path:
    """The emulator with the kernels, built once per source version (kept in pytest's cache)."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ to build the CUDA emulator")
    work = tmp_path_factory.mktemp("emulator")
    (work / "probe.cpp").write_text(PROBE)
    if subprocess.run([compiler, "-std=c++20", "-pthread", str(work / "probe.cpp"), "-o", str(work / "probe")], check=False, capture_output=True, timeout=120).returncode:
        pytest.skip(f"{compiler} has no C++20 std::barrier / std::atomic_ref (GCC 11 or newer needed)")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in (EMULATOR / "emu.h", EMULATOR / "emu.cpp", SOURCE))).hexdigest()[:16]
    pytest_cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    cache = pytest_cache.mkdir("search-emulator") if pytest_cache is not None else work
    built = Path(cache) / f"libsearchemu-{digest}.so"
    if not built.exists():
        partial = work / built.name
        done = subprocess.run([compiler, "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", f'-DSEARCH_SOURCE="{SOURCE}"', str(EMULATOR / "emu.cpp"), "-o", str(partial)],
                              check=False, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"search.cu does not build in the emulator:\n{done.stderr[-6000:]}"
        shutil.move(partial, built)
    return built


def test_kernels_find_what_the_reference_finds(library):
    seed = secrets.randbits(32)
    print(f"emulator seed {seed}")
    done = subprocess.run([sys.executable, str(EMULATOR / "run.py"), str(library), str(seed), "6000"], check=False, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"seed {seed}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    assert "0 mismatches" in done.stdout, done.stdout
