"""Singular value decomposition by Golub-Reinsch (Lahabar & Narayanan 2009), cuSOLVER or LAPACK.

Front door: `run(job, lease=None, progress=None)` decomposes an `SvdJob` (gpu/svd/params.py)
on a GPU lease (gpu/svd/cuda.py, or CuPy's cuSOLVER) or on the CPU (gpu/svd/reference.py,
or NumPy's LAPACK) and returns the singular values, U and V^T files, LAPACK's accuracy
ratios and the time of each phase.
"""

from __future__ import annotations

import time
from typing import Any

from gpu.errors import ParamError
from gpu.jobs import JobResult, Progress, backend_name, no_progress, npy_file
from gpu.svd.params import METHODS, MatrixSpec, SvdJob, SvdParams, auto_gpu_method

__all__ = ["METHODS", "MatrixSpec", "SvdJob", "SvdParams", "auto_gpu_method", "run"]

VALUES_IN_JSON = 1024  # singular values listed in the JSON result; all of them are in s.npy


def run(job: SvdJob, lease: Any = None, progress: Progress = no_progress) -> JobResult:
    """U diag(s) V^T of the job's matrix. Summary: m, n, dtype, method, backend,
    singular_values (the first VALUES_IN_JSON), singular_values_count, condition_number,
    accuracy {resid, orth_u, orth_v} (with vectors), times_ms; files s.npy, u.npy, vt.npy."""
    from gpu.svd import reference

    times: dict[str, float] = {}
    start = time.perf_counter()
    a = job.load()
    times["load"] = (time.perf_counter() - start) * 1000
    method = job.resolve_method(on_gpu=lease is not None)
    params = SvdParams(
        compute_uv=job.params.compute_uv,
        full_matrices=job.params.full_matrices,
        method=method,
        block_size=job.params.block_size,
    )
    progress(0.05)
    start = time.perf_counter()
    if method in ("cusolver", "golub_reinsch") and lease is not None:
        from gpu.svd import cuda

        u, s, vt = (
            cuda.cusolver_svd(a, params, lease) if method == "cusolver" else cuda.svd(a, params, lease, timings=times)
        )
    elif method == "cusolver":
        raise ParamError("method", "cusolver needs a GPU; this job ran on the CPU")
    else:
        u, s, vt = reference.svd(a, params, timings=times)
    times["svd"] = (time.perf_counter() - start) * 1000
    progress(0.9)
    files = {"s.npy": npy_file(s)}
    accuracy = None
    if params.compute_uv:
        files.update({"u.npy": npy_file(u), "vt.npy": npy_file(vt)})
        k = min(a.shape)
        accuracy = reference.accuracy(a, u[:, :k], s, vt[:k, :])
    m, n = a.shape
    summary = {
        "m": m,
        "n": n,
        "dtype": str(a.dtype),
        "method": method,
        "backend": backend_name(lease),
        "singular_values": s[:VALUES_IN_JSON].astype(float).tolist(),
        "singular_values_count": int(s.size),
        "condition_number": float(s[0] / s[-1]) if s.size and s[-1] > 0 else None,
        "accuracy": accuracy,
        "times_ms": {key: round(value, 3) for key, value in times.items()},
    }
    return JobResult(summary, files)
