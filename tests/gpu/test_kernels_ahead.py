"""The kernels compiled ahead (gpu/ahead.py, as the Docker image builds them) on a GPU: every
source's fatbin loads (gpu/kernels.py takes it over NVRTC), and the drawings it makes are the
NVRTC build's, bit for bit. Each build runs in a fresh process, as a server would.

CUDA and nvcc only (marker `gpu`). bench/gpu_session.sh's `ahead` step also runs every GPU
test with the fatbins in place."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpu import ahead
from gpu.backend import cuda_devices

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (a CUDA toolkit)"),
]

ROOT = Path(__file__).resolve().parents[2]
# argv: the fatbins' folder ("-": none, NVRTC compiles), the .npz to write. Prints where each
# source's module came from (the fatbin's path, or null for NVRTC).
DRAW = """
import json, sys
from pathlib import Path
import cupy, numpy as np
from gpu import ahead, kernels
folder = None if sys.argv[1] == "-" else Path(sys.argv[1])
kernels.fatbin_for = lambda source: ahead.fatbin_for(source, folder or Path(sys.argv[2]).parent / "none")
from gpu.pencil import cuda
from gpu.pencil.params import PencilParams
from gpu.pool import DevicePool
sys.path.insert(0, "tests/gpu/pencil")
from pencil_parity import PHOTOS, photo
drawings = {}
with DevicePool(streams_per_device=1).lease() as lease, cupy.cuda.Device(lease.device), lease.stream:
    for name in PHOTOS[:2]:
        for texture in ("lu", "fast"):
            for hatching in ("flat", "follow"):
                params = PencilParams(texture=texture, hatching=hatching)
                drawings[f"{name}-{texture}-{hatching}"] = cuda.render_on(lease, photo(name, 720, 1280), params)
kernels.load_all(0)
np.savez(sys.argv[2], **drawings)
print(json.dumps({source.name: kernels._modules[(source, 0)].file_path for source in ahead.SOURCES}))
"""


def draw(tmp_path: Path, fatbins: Path | None, name: str) -> tuple[dict[str, np.ndarray], dict[str, str | None]]:
    out = tmp_path / f"{name}.npz"
    done = subprocess.run(
        [sys.executable, "-c", DRAW, str(fatbins) if fatbins else "-", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(out) as saved:
        return {key: saved[key] for key in saved.files}, json.loads(done.stdout.strip().splitlines()[-1])


def test_fatbins_load_and_draw_as_nvrtcs_build(tmp_path):
    import cupy

    fatbins = tmp_path / "fatbins"
    fatbins.mkdir()
    built = ahead.build("nvcc", (cupy.cuda.Device(0).compute_capability,), ahead.SOURCES, fatbins)  # e.g. "90"
    ahead_drawings, ahead_modules = draw(tmp_path, fatbins, "ahead")
    nvrtc_drawings, nvrtc_modules = draw(tmp_path, None, "nvrtc")
    assert ahead_modules == {path.name.split(".")[0] + ".cu": str(path) for path in built}
    assert set(nvrtc_modules.values()) == {None}
    assert ahead_drawings.keys() == nvrtc_drawings.keys() and len(ahead_drawings) == 8
    for key, drawing in ahead_drawings.items():
        assert drawing.std() > 10, f"{key}: compare on a drawing, not a blank page"
        np.testing.assert_array_equal(drawing, nvrtc_drawings[key], err_msg=key)
