"""CS256 compressed sparse tiles (Lasby, Zimmer, Pokutta & Schultheis): the format, its
conversions and files, the NumPy product (reference.py) and the CUDA SpMV/SpMM (cuda.py).

Front door: `run(job, lease=None, progress=None)` prunes a `Cs256Job`'s matrix
(gpu/cs256/params.py) to CS256, reports its memory against dense, CSR, COO and a bitmask,
and times y = A x by the CS256 kernel against dense cuBLAS and cuSPARSE CSR on a GPU
lease (anchors.measure), or the NumPy reference against NumPy and SciPy on the CPU
(reference.measure).
"""

from __future__ import annotations

import time
from typing import BinaryIO

import numpy as np

from gpu.cs256.params import Cs256Job, Cs256Params
from gpu.jobs import JobResult, Progress, backend_name, no_progress, npy_file
from gpu.pool import Lease

__all__ = ["Cs256Job", "Cs256Params", "run"]


def run(job: Cs256Job, lease: Lease | None = None, progress: Progress = no_progress) -> JobResult:
    """Summary: m, n, dtype, vec, vectors, backend, source, pruning, format (the storage
    report), accuracy (max relative error against the float64 product), kernel, anchors,
    times_ms, speedup, bytes_moved, bandwidth_gb_s. Files: y.npy (float32) and the CS256
    matrix as cs256.npz and/or cs256.safetensors."""
    from gpu.cs256 import reference
    from gpu.cs256.files import save_npz, save_safetensors
    from gpu.cs256.format import STORAGE, storage_report, to_float32

    params, dtype = job.params, job.dtype
    times: dict[str, float] = {}
    start = time.perf_counter()
    a, x = job.inputs()
    times["load"] = (time.perf_counter() - start) * 1000
    progress(0.05)
    if lease is None:
        outcome = reference.measure(params, a, x, dtype, times, progress)
    else:
        from gpu.cs256 import anchors

        outcome = anchors.measure(params, a, x, dtype, times, lease, progress)
    cs, y = outcome.pop("cs"), outcome.pop("y")
    progress(0.9)
    y32 = to_float32(y, dtype)
    files = {"y.npy": npy_file(y32)}
    if params.save in ("npz", "both"):
        files["cs256.npz"] = lambda handle: save_npz(cs, handle)
    if params.save in ("safetensors", "both"):

        def write_safetensors(handle: BinaryIO) -> None:
            save_safetensors(cs, handle)

        files["cs256.safetensors"] = write_safetensors
    out_of_range = int(np.count_nonzero(~np.isfinite(y32)))  # entries of y past the dtype's range (float16: 65504)
    report = storage_report(cs)
    k = 1 if x.ndim == 1 else x.shape[1]
    error, anchor_bytes = outcome.pop("error"), outcome.pop("anchor_bytes")
    cs_ms, dense_ms, csr_ms = times["cs256"], times["dense"], times.get("csr")
    vectors_bytes = (cs.n + cs.m) * k * STORAGE[dtype].itemsize  # x and y (in the matrix's dtype)
    moved = {
        "cs256": report["formats"]["cs256"]["bytes"] + vectors_bytes,
        **{name: size + vectors_bytes for name, size in anchor_bytes.items() if size is not None},
    }
    summary = {
        "m": cs.m,
        "n": cs.n,
        "dtype": dtype,
        "vec": cs.vec,
        "vectors": k,
        "backend": backend_name(lease),
        "source": "spec" if job.matrix is None else "upload",
        "pruning": outcome.pop("pruning"),
        "format": report,
        "accuracy": {
            "max_relative_error": error,
            "tolerance": reference.TOLERANCE[dtype],
            "within_tolerance": bool(error <= reference.TOLERANCE[dtype]),
            "outputs_out_of_range": out_of_range,
        },
        **outcome,
        "times_ms": {key: round(value, 6) for key, value in times.items()},
        "speedup": {
            "vs_dense": dense_ms / cs_ms if cs_ms > 0 else None,
            "vs_csr": csr_ms / cs_ms if csr_ms and cs_ms > 0 else None,
        },
        "bytes_moved": moved,
        "bandwidth_gb_s": {name: moved[name] / (times[name] * 1e6) if times.get(name) else None for name in moved},
    }
    return JobResult(summary, files)
