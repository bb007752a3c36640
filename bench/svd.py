"""Benchmark of the SVD job's methods, with its anchors measured in the same run.

    python bench/svd.py [--sizes 1024x1024,2048x2048,4096x4096,8192x512,16384x1024] [--repeats 5]
                        [--vectors both|yes|no] [--dtypes float32,float64] [--lapack-max 2048]
                        [--accuracy-max 4096]

For float32 and float64, values only and with vectors: our Golub-Reinsch on the GPU
(gpu/svd/cuda.py; CUDA events from the start of the QR (tall matrices) or of the
bidiagonalization to the sorted values and vectors, the matrix already on the device as
for cuSOLVER), cuSOLVER through CuPy (`cupy.linalg.svd`, gesvd; the vendor anchor),
NumPy/LAPACK on the host (the CPU peer, up to --lapack-max columns), and the NumPy
definition gpu/svd/reference.py (only up to --reference-max columns: its bulge chase is
a Python loop). All timings are medians of --repeats warm runs.
Accuracy: LAPACK's test ratios of each with-vectors result, and the largest singular-value
error (against float64 LAPACK of the same matrix, in units of s_max) of ours and of
cuSOLVER, on the timed gaussian matrix and on a "clustered" one of the same size
(graded 1 .. 1e-6 with min(m, n) // 6 equal values at each end: issue 21's hard case).
The bidiagonalization is set against its floor: its two GEMVs per column read
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
    """Median device time of gpu/svd/cuda.py's SVD (its "total" phase: QR, bidiagonalization,
    diagonalization, U = Q U_R), the phases of the median run, and the factors of the last run."""
    from gpu.svd import cuda

    params = SvdParams(compute_uv=compute_uv, method="golub_reinsch")
    cuda.svd(a, params, lease)  # warm-up: NVRTC, cuBLAS handles
    runs = []
    for _ in range(repeats):
        phases: dict[str, float] = {}
        statistics: dict[str, int] = {}
        factors = cuda.svd(a, params, lease, phases, statistics)
        rotations = max(statistics.get("rotations", 0), 1)
        phases["ns_per_rotation"] = statistics.get("chase_ms", float("nan")) * 1e6 / rotations
        phases["rotations_per_n2"] = statistics.get("rotations", 0) / min(a.shape) ** 2
        phases["chase_ms"] = statistics.get("chase_ms", float("nan"))
        phases["rotations_ms"] = statistics.get("rotations_ms", float("nan"))
        runs.append((phases["total"], phases))
    runs.sort(key=lambda run: run[0])
    total, phases = runs[len(runs) // 2]
    return total, phases, factors if compute_uv else None


def value_errors(a: np.ndarray, lease) -> tuple[float, float]:
    """The largest singular-value error of ours and of cuSOLVER (both with vectors) on `a`,
    against float64 LAPACK, in units of s_max."""
    from gpu.svd import cuda

    exact = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    _, ours, _ = cuda.svd(a, SvdParams(method="golub_reinsch"), lease)
    _, theirs, _ = cuda.cusolver_svd(a, SvdParams(method="cusolver"), lease)
    return tuple(float(np.max(np.abs(s.astype(np.float64) - exact)) / exact[0]) for s in (ours, theirs))


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
    parser.add_argument("--sizes", default="1024x1024,2048x2048,4096x4096,8192x512,16384x1024")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vectors", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--lapack-max", type=int, default=2048, help="largest min(m, n) timed with LAPACK")
    parser.add_argument("--accuracy-max", type=int, default=4096, help="largest min(m, n) with value errors")
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
        "QR ms, bidiag ms (floor ms), diag ms [kernel ms: chase, rotations, Q/P], U = Q U_R ms | chase: "
        "rotations / n^2, ns per rotation | Golub-Reinsch (NumPy) ms | ours resid, orth_u, orth_v | cuSOLVER "
        "resid, orth_u, orth_v | largest value error / s_max, gaussian: ours, cuSOLVER | clustered: ours, cuSOLVER"
    )
    vectors = {"both": (False, True), "yes": (True,), "no": (False,)}[args.vectors]
    nan = float("nan")
    for size in args.sizes.split(","):
        m, n = (int(v) for v in size.split("x"))
        for dtype in (np.dtype(name) for name in args.dtypes.split(",")):
            a = make_matrix(m, n, dtype, seed=1, kind="gaussian")
            for compute_uv in vectors:
                ours, phases, our_factors = (
                    ours_ms(a, compute_uv, args.repeats, lease) if cupy is not None else (nan, {}, None)
                )
                gpu_ms, factors = cusolver_ms(a, compute_uv, args.repeats) if cupy is not None else (nan, None)
                lapack_ms = nan
                if min(m, n) <= args.lapack_max:
                    lapack_ms = median_ms(
                        lambda a=a, c=compute_uv: np.linalg.svd(a, full_matrices=False, compute_uv=c),
                        max(1, args.repeats // 2),
                    )
                reference_ms = nan
                if min(m, n) <= args.reference_max:
                    params = SvdParams(compute_uv=compute_uv, method="golub_reinsch")
                    reference_ms = median_ms(lambda a=a, p=params: reference.svd(a, p), 1)
                floor = bidiagonalization_floor_ms(n if m >= 2 * n else max(m, n), min(m, n), a.itemsize, bandwidth)
                phase_text = (
                    f"{phases.get('qr', 0.0):.1f}, {phases.get('bidiagonalization', nan):.1f} ({floor:.1f}), "
                    f"{phases.get('diagonalization', nan):.1f} [chase {phases.get('chase_ms', nan):.1f}, rotations "
                    f"{phases.get('rotations_ms', nan):.1f}, Q/P {phases.get('accumulation', nan):.1f}], "
                    f"{phases.get('vectors', nan):.1f} | {phases.get('rotations_per_n2', nan):.2f}, "
                    f"{phases.get('ns_per_rotation', nan):.0f}"
                )
                errors = "-"
                if compute_uv and cupy is not None and min(m, n) <= args.accuracy_max:
                    gaussian = value_errors(a, lease)
                    with cupy.cuda.Device(0):
                        clustered = make_matrix(m, n, dtype, seed=1, kind="clustered", xp=cupy).get()
                    hard = value_errors(clustered, lease)
                    errors = f"{gaussian[0]:.2e}, {gaussian[1]:.2e} | {hard[0]:.2e}, {hard[1]:.2e}"
                print(
                    f"{m}x{n} | {np.dtype(dtype).name} | {'yes' if compute_uv else 'no'} | {ours:.1f} | "
                    f"{gpu_ms:.1f} | {gpu_ms / ours:.2f} | {lapack_ms:.1f} | {lapack_ms / ours:.1f}"
                    f" | {phase_text} | {reference_ms:.0f} | {_ratios(a, our_factors)} | {_ratios(a, factors)}"
                    f" | {errors}",
                    flush=True,
                )


def _ratios(a: np.ndarray, factors: tuple | None) -> str:
    if factors is None:
        return "-"
    acc = reference.accuracy(a, *factors)
    return f"{acc['resid']:.2f}, {acc['orth_u']:.2f}, {acc['orth_v']:.2f}"


if __name__ == "__main__":
    main()
