"""Benchmark of the SVD job's methods, with its anchors measured in the same run.

    python bench/svd.py [--sizes 1024x1024,2048x2048,4096x4096,8192x512] [--repeats 3]

For float32 and float64, values only and with vectors: cuSOLVER through CuPy
(`cupy.linalg.svd`, gesvd; the vendor anchor, CUDA events), NumPy/LAPACK on the host
(the CPU peer), and Golub-Reinsch as written in gpu/svd/reference.py (the readable NumPy
definition, on the host: only up to --reference-max columns, it is slow). Accuracy is
LAPACK's test ratios of each with-vectors result. Times drift between machines: read
the ratios. The CUDA Golub-Reinsch of issue 4 is not written yet; this table is its
baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu.svd import reference  # noqa: E402
from gpu.svd.params import SvdParams, make_matrix  # noqa: E402
from pencil import median_ms  # noqa: E402  (bench/pencil.py, beside this file)


def cusolver_ms(a: np.ndarray, compute_uv: bool, repeats: int) -> tuple[float, tuple | None]:
    import cupy

    d_a = cupy.asarray(a)

    def run():
        return cupy.linalg.svd(d_a, full_matrices=False, compute_uv=compute_uv)

    out = run()
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        out = run()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    result = tuple(x.get() for x in out) if compute_uv else None
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256x256,1024x1024,2048x2048,4096x4096,8192x512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference-max", type=int, default=256, help="largest min(m, n) given to the NumPy Golub-Reinsch")
    args = parser.parse_args()
    try:
        import cupy

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:  # no CuPy or no device: the host columns only
        cupy, device = None, "no GPU"
    print(f"# SVD benchmark: {device}, {os.cpu_count()} CPU cores, NumPy {np.__version__}; medians of {args.repeats} after a warm-up")
    print("size | dtype | vectors | cuSOLVER ms | LAPACK ms | LAPACK / cuSOLVER | Golub-Reinsch (NumPy) ms | cuSOLVER resid, orth_u, orth_v")
    for size in args.sizes.split(","):
        m, n = (int(v) for v in size.split("x"))
        for dtype in (np.float32, np.float64):
            a = make_matrix(m, n, dtype, seed=1, kind="gaussian")
            for compute_uv in (False, True):
                gpu_ms, factors = cusolver_ms(a, compute_uv, args.repeats) if cupy is not None else (float("nan"), None)
                lapack_ms = median_ms(lambda a=a, c=compute_uv: np.linalg.svd(a, full_matrices=False, compute_uv=c), max(1, args.repeats // 2))
                reference_ms = float("nan")
                if min(m, n) <= args.reference_max:
                    params = SvdParams(compute_uv=compute_uv, method="golub_reinsch")
                    reference_ms = median_ms(lambda a=a, p=params: reference.svd(a, p), 1)
                ratios = "-"
                if factors is not None:
                    u, s, vt = factors
                    acc = reference.accuracy(a, u, s, vt)
                    ratios = f"{acc['resid']:.2f}, {acc['orth_u']:.2f}, {acc['orth_v']:.2f}"
                print(f"{m}x{n} | {np.dtype(dtype).name} | {'yes' if compute_uv else 'no'} | {gpu_ms:.1f} | {lapack_ms:.1f} | {lapack_ms / gpu_ms:.1f} | {reference_ms:.0f} | {ratios}")


if __name__ == "__main__":
    main()
