"""Benchmark of the SVD job's methods, with its anchors measured in the same run.

    python bench/svd.py [--sizes 1024x1024,2048x2048,4096x4096,8192x512] [--repeats 3]

For float32 and float64, values only and with vectors: our Golub-Reinsch on the GPU
(gpu/svd/cuda.py; CUDA events from the start of the bidiagonalization to the sorted
values and vectors, the matrix already on the device as for cuSOLVER), cuSOLVER through
CuPy (`cupy.linalg.svd`, gesvd; the vendor anchor), NumPy/LAPACK on the host (the CPU
peer), and the NumPy definition gpu/svd/reference.py (only up to --reference-max columns:
its bulge chase is a Python loop). Accuracy is LAPACK's test ratios of each with-vectors
result. The bidiagonalization is set against its floor: its two GEMVs per column read
the trailing block twice, 2 sum_c (m-c)(n-c) words, at the measured copy bandwidth.
Times drift between machines: read the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import device_median_ms, median_ms

from gpu.svd import reference
from gpu.svd.params import SvdParams, make_matrix


def cusolver_ms(a: np.ndarray, compute_uv: bool, repeats: int) -> tuple[float, tuple | None]:
    """Median device ms of cupy.linalg.svd (cuSOLVER) and the factors of the last run."""
    import cupy

    d_a = cupy.asarray(a)
    out = None

    def run():
        nonlocal out
        out = cupy.linalg.svd(d_a, full_matrices=False, compute_uv=compute_uv)

    ms = device_median_ms(run, repeats)
    return ms, tuple(x.get() for x in out) if compute_uv else None


def ours_ms(a: np.ndarray, compute_uv: bool, repeats: int, lease) -> tuple[float, dict[str, float], tuple | None]:
    """Median device time of gpu/svd/cuda.py's bidiagonalization + diagonalization, the
    phases of the median run, and the factors of the last run."""
    from gpu.svd import cuda

    params = SvdParams(compute_uv=compute_uv, method="golub_reinsch")
    cuda.svd(a, params, lease)  # warm-up: NVRTC, cuBLAS handles
    runs = []
    for _ in range(repeats):
        phases: dict[str, float] = {}
        statistics: dict[str, int] = {}
        factors = cuda.svd(a, params, lease, phases, statistics)
        phases["ns_per_rotation"] = phases["diagonalization"] * 1e6 / max(statistics.get("rotations", 0), 1)
        phases["rotations_per_n2"] = statistics.get("rotations", 0) / min(a.shape) ** 2
        phases["test_steps_per_rotation"] = statistics.get("test_steps", 0) / max(statistics.get("rotations", 0), 1)
        phases["chase_ms"] = statistics.get("chase_ms", float("nan"))
        phases["rotations_ms"] = statistics.get("rotations_ms", float("nan"))
        for part in ("scan", "test", "sweep"):
            phases[f"{part}_cycles_per_rotation"] = statistics.get(f"{part}_cycles", 0) / max(
                statistics.get("rotations", 0), 1
            )
        runs.append((phases["bidiagonalization"] + phases["diagonalization"], phases))
    runs.sort(key=lambda run: run[0])
    total, phases = runs[len(runs) // 2]
    return total, phases, factors if compute_uv else None


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write of 1 GiB), CUDA events."""
    import cupy

    source = cupy.ones(1 << 28, cupy.float32)
    target = cupy.empty_like(source)
    target[...] = source
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(5):
        target[...] = source
    stop.record()
    stop.synchronize()
    return 5 * 2 * source.nbytes / (cupy.cuda.get_elapsed_time(start, stop) / 1000)


def bidiagonalization_floor_ms(m: int, n: int, itemsize: int, bandwidth: float) -> float:
    """The two GEMVs per column read the trailing (m-c) x (n-c) block twice."""
    words = 2 * sum((m - c) * (n - c) for c in range(min(m, n)))
    return words * itemsize / bandwidth * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256x256,1024x1024,2048x2048,4096x4096,8192x512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--reference-max", type=int, default=256, help="largest min(m, n) given to the NumPy Golub-Reinsch"
    )
    args = parser.parse_args()
    try:
        import cupy

        from gpu.pool import Lease

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        lease = Lease(
            device=0,
            slot=0,
            stream=cupy.cuda.Stream(non_blocking=True),
            side_stream=cupy.cuda.Stream(non_blocking=True),
        )
        bandwidth = copy_bandwidth()
    except Exception:  # no CuPy or no device: the host columns only
        cupy, device, lease, bandwidth = None, "no GPU", None, float("nan")
    print(
        f"# SVD benchmark: {device}, {os.cpu_count()} CPU cores, NumPy {np.__version__}; medians of "
        f"{args.repeats} after a warm-up"
    )
    print(f"# device-to-device copy: {bandwidth / 1e9:.0f} GB/s")
    print(
        "size | dtype | vectors | ours ms | cuSOLVER ms | cuSOLVER / ours | LAPACK ms | LAPACK / ours | ours: "
        "bidiag ms (floor ms), diag ms [kernel ms: chase, rotations, Q/P] | chase: rotations / n^2, ns per "
        "rotation, test steps per rotation, clock ticks per rotation: scan/test/sweep"
        " | Golub-Reinsch (NumPy) ms | ours resid, orth_u, orth_v | cuSOLVER resid, orth_u, orth_v"
    )
    for size in args.sizes.split(","):
        m, n = (int(v) for v in size.split("x"))
        for dtype in (np.float32, np.float64):
            a = make_matrix(m, n, dtype, seed=1, kind="gaussian")
            for compute_uv in (False, True):
                ours, phases, our_factors = (
                    ours_ms(a, compute_uv, args.repeats, lease) if cupy is not None else (float("nan"), {}, None)
                )
                gpu_ms, factors = cusolver_ms(a, compute_uv, args.repeats) if cupy is not None else (float("nan"), None)
                lapack_ms = median_ms(
                    lambda a=a, c=compute_uv: np.linalg.svd(a, full_matrices=False, compute_uv=c),
                    max(1, args.repeats // 2),
                )
                reference_ms = float("nan")
                if min(m, n) <= args.reference_max:
                    params = SvdParams(compute_uv=compute_uv, method="golub_reinsch")
                    reference_ms = median_ms(lambda a=a, p=params: reference.svd(a, p), 1)
                floor = bidiagonalization_floor_ms(max(m, n), min(m, n), np.dtype(dtype).itemsize, bandwidth)
                phase_text = (
                    f"{phases.get('bidiagonalization', float('nan')):.1f} ({floor:.1f}), "
                    f"{phases.get('diagonalization', float('nan')):.1f}"
                )
                phase_text += (
                    f" [chase {phases.get('chase_ms', float('nan')):.1f}, rotations "
                    f"{phases.get('rotations_ms', float('nan')):.1f}, Q/P "
                    f"{phases.get('accumulation', float('nan')):.1f}]"
                )
                phase_text += (
                    f" | {phases.get('rotations_per_n2', float('nan')):.2f}, "
                    f"{phases.get('ns_per_rotation', float('nan')):.0f}, "
                    f"{phases.get('test_steps_per_rotation', float('nan')):.2f}, "
                )
                phase_text += "/".join(
                    f"{phases.get(f'{part}_cycles_per_rotation', float('nan')):.0f}"
                    for part in ("scan", "test", "sweep")
                )
                print(
                    f"{m}x{n} | {np.dtype(dtype).name} | {'yes' if compute_uv else 'no'} | {ours:.1f} | "
                    f"{gpu_ms:.1f} | {gpu_ms / ours:.2f} | {lapack_ms:.1f} | {lapack_ms / ours:.1f}"
                    f" | {phase_text} | {reference_ms:.0f} | {_ratios(a, our_factors)} | {_ratios(a, factors)}",
                    flush=True,
                )


def _ratios(a: np.ndarray, factors: tuple | None) -> str:
    if factors is None:
        return "-"
    acc = reference.accuracy(a, *factors)
    return f"{acc['resid']:.2f}, {acc['orth_u']:.2f}, {acc['orth_v']:.2f}"


if __name__ == "__main__":
    main()
