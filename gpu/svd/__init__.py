"""Singular value decomposition by Golub-Reinsch (Lahabar & Narayanan 2009), cuSOLVER or LAPACK.

Front door: `run(job, lease=None, progress=None)` decomposes an `SvdJob` (gpu/svd/params.py)
on a GPU lease (gpu/svd/cuda.py, or CuPy's cuSOLVER) or on the CPU (gpu/svd/reference.py,
or NumPy's LAPACK) and returns the singular values, U and V^T files, LAPACK's accuracy
ratios and the time of each phase.
"""

from __future__ import annotations

import dataclasses
import functools
import time

from gpu.errors import ParamError
from gpu.jobs import JobResult, Progress, backend_name, no_progress, npy_file, steady_progress
from gpu.pool import Lease
from gpu.svd.params import GPU_METHODS, METHODS, MatrixSpec, SvdJob, SvdParams, auto_gpu_method

__all__ = ["METHODS", "MatrixSpec", "SvdJob", "SvdParams", "auto_gpu_method", "cpu_seconds", "run"]

VALUES_IN_JSON = 1024  # singular values listed in the JSON result; all of them are in s.npy


def run(job: SvdJob, lease: Lease | None = None, progress: Progress = no_progress) -> JobResult:
    """U diag(s) V^T of the job's matrix. Summary: m, n, dtype, method, backend,
    singular_values (the first VALUES_IN_JSON), singular_values_count, condition_number,
    accuracy {resid, orth_u, orth_v} (with vectors), times_ms; files s.npy, u.npy, vt.npy.
    On a GPU lease a spec's matrix is generated on the device, and the accuracy ratios are
    computed there too."""
    from gpu.svd import reference

    times: dict[str, float] = {}
    method = job.resolve_method(on_gpu=lease is not None)
    params = dataclasses.replace(job.params, method=method)
    if method in GPU_METHODS and lease is not None:
        shape, dtype, (u, s, vt), accuracy = _run_on_gpu(job, params, lease, times, progress)
    elif method == "cusolver":
        raise ParamError("method", "cusolver needs a GPU; this job ran on the CPU")
    else:
        start = time.perf_counter()
        a = job.load()
        times["load"] = (time.perf_counter() - start) * 1000
        progress(0.05)
        start = time.perf_counter()
        expected = cpu_seconds(a.shape, params.compute_uv, params.full_matrices)
        with steady_progress(progress, 0.05, 0.9, expected):
            u, s, vt = reference.svd(a, params, timings=times)
        times["svd"] = (time.perf_counter() - start) * 1000
        k = min(a.shape)
        accuracy = reference.accuracy(a, u[:, :k], s, vt[:k, :]) if params.compute_uv else None
        shape, dtype = a.shape, a.dtype
    progress(0.9)
    files = {"s.npy": npy_file(s)}
    if params.compute_uv:
        files.update({"u.npy": npy_file(u), "vt.npy": npy_file(vt)})
    m, n = shape
    summary = {
        "m": m,
        "n": n,
        "dtype": str(dtype),
        "method": method,
        "backend": backend_name(lease),
        "singular_values": s[:VALUES_IN_JSON].astype(float).tolist(),
        "singular_values_count": int(s.size),
        "condition_number": float(s[0] / s[-1]) if s.size and s[-1] > 0 else None,
        "accuracy": accuracy,
        "times_ms": {key: round(value, 3) for key, value in times.items()},
    }
    return JobResult(summary, files)


def _run_on_gpu(job: SvdJob, params: SvdParams, lease: Lease, times: dict[str, float], progress: Progress):
    """The job on the lease's device, from the matrix's upload (or its generation there)
    to the host copies of the factors: (shape, dtype, (u, s, vt), accuracy or None)."""
    import cupy

    from gpu.svd import cuda, reference

    with cupy.cuda.Device(lease.device), lease.stream:
        start = time.perf_counter()
        a = job.load(cupy)
        lease.stream.synchronize()
        times["load"] = (time.perf_counter() - start) * 1000
        progress(0.05)
        start = time.perf_counter()
        if params.method == "cusolver":
            factors = cuda.cusolver_on_device(a, params)
        else:
            factors = cuda.svd_on_device(a, params, lease, times, {})
        lease.stream.synchronize()
        times["svd"] = (time.perf_counter() - start) * 1000
        u, s, vt = factors
        accuracy = None
        if params.compute_uv:
            k = min(a.shape)
            accuracy = reference.accuracy(a, u[:, :k], s, vt[:k, :], xp=cupy)
        host = tuple(None if x is None else x.get() for x in factors)
    return a.shape, a.dtype, host, accuracy


def cpu_seconds(shape: tuple[int, int], compute_uv: bool, full_matrices: bool = False) -> float:
    """How long LAPACK should take for a matrix of `shape` on this machine: its flop count
    (Golub & Van Loan's: 4 m n^2 + 8 n^3 with the thin vectors, 4 m^2 n + 8 m n^2 + 9 n^3
    with the full ones, 4 m n^2 - 4/3 n^3 for the values, m >= n) over the rate of a small
    SVD timed once per process. An estimate for the progress of a call that reports none,
    not a promise (the NumPy Golub-Reinsch takes longer: its progress creeps near the end)."""
    return _flops(shape, compute_uv, full_matrices) / _lapack_flops_per_s()


@functools.cache
def _lapack_flops_per_s() -> float:
    import numpy as np

    probe = np.random.default_rng(0).standard_normal((384, 384))
    began = time.perf_counter()
    np.linalg.svd(probe, full_matrices=False)
    return _flops((384, 384), True) / max(time.perf_counter() - began, 1e-6)


def _flops(shape: tuple[int, int], compute_uv: bool, full_matrices: bool = False) -> float:
    m, n = max(shape), min(shape)
    if not compute_uv:
        return 4.0 * m * n * n - 4.0 / 3.0 * n**3
    if full_matrices:
        return 4.0 * m * m * n + 8.0 * m * n * n + 9.0 * n**3
    return 4.0 * m * n * n + 8.0 * n**3
