"""Exact string search (Rabin-Karp, KMP, Boyer-Moore) over large texts.

Front door: `run(job, lease=None, progress=None)` finds every pattern of a `SearchJob`
(gpu/search/params.py) in its text: on a GPU lease with the CUDA kernels (gpu/search/cuda.py;
a stored corpus is streamed to the device while its first search runs, then stays resident
for the next), or on the CPU with CPython's bytes.find over an mmap of the text
(gpu/search/reference.py): the same positions. `positions` says how many of them come back.
"""

from __future__ import annotations

import base64
import mmap
import time

import numpy as np

from gpu.jobs import JobResult, Progress, backend_name, no_progress, npy_file
from gpu.pool import Lease
from gpu.search.params import Corpus, SearchJob, SearchParams
from gpu.search.residency import RESIDENT

__all__ = ["Corpus", "SearchJob", "SearchParams", "configure_residency", "evict_corpus", "resident_devices", "run"]


def configure_residency(fraction: float) -> None:
    """Let stored corpora stay in device memory between searches, up to `fraction` of each
    device (PENCIL_SEARCH_RESIDENT_FRACTION, in (0, 1])."""
    RESIDENT.configure(fraction)


def resident_devices(corpus_id: str) -> list[int]:
    """The devices whose memory holds the text of corpus `corpus_id` now."""
    return RESIDENT.resident_devices(lambda key: key[0] == corpus_id)


def evict_corpus(corpus_id: str) -> None:
    """Free the device memory holding the text of corpus `corpus_id` (it was deleted)."""
    RESIDENT.evict_matching(lambda key: key[0] == corpus_id)


def run(job: SearchJob, lease: Lease | None = None, progress: Progress = no_progress) -> JobResult:
    """Every occurrence of each pattern. Summary per pattern: count, the first
    max_positions positions (0-based byte offsets; none with positions "none") and with
    line_numbers their 1-based lines; times_ms (GPU: upload, kernels, download; CPU:
    search; and total) and GB/s. With positions "files", also the files positions_<i>.npy
    (int64) and lines_<i>.npy: all of them."""
    from gpu.search import reference

    if job.path is None:
        raise ValueError("the job's text is not stored yet: run a job rehydrated by SearchJob.from_json")
    params, n = job.params, job.text_bytes
    progress(0.02)
    start = time.perf_counter()
    if lease is None:
        with open(job.path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as text:
            output = reference.search(text, params, progress=lambda f: progress(0.02 + 0.88 * f))
    else:
        from gpu.search import cuda

        key = (job.corpus.id, job.corpus.sha256) if job.corpus is not None else None
        output = cuda.search_file(lease, job.path, n, params, key=key, progress=progress)
    total_ms = (time.perf_counter() - start) * 1000
    progress(0.92)
    patterns, files = [], {}
    listed = params.max_positions if params.positions != "none" else 0
    for i, (pattern, found) in enumerate(zip(params.patterns, output.patterns, strict=True)):
        count = int(found.count if found.count is not None else found.positions.size)
        entry = {
            "index": i,
            "pattern": _display(pattern),
            "pattern_base64": base64.b64encode(pattern).decode(),
            "length": len(pattern),
            "algorithm": found.algorithm,
            "count": count,
            "positions": found.positions[:listed].tolist(),
            "positions_truncated": count > listed,
            "positions_file": None,
        }
        if params.positions == "files":
            files[f"positions_{i}.npy"] = npy_file(found.positions)
            entry["positions_file"] = f"positions_{i}.npy"
        if params.line_numbers and params.positions != "none":
            lines = found.lines if found.lines is not None else np.zeros(0, np.int64)
            entry["lines"] = lines[:listed].tolist()
            if params.positions == "files":
                files[f"lines_{i}.npy"] = npy_file(lines)
                entry["lines_file"] = f"lines_{i}.npy"
        patterns.append(entry)
    times = {**output.times_ms, "total": total_ms}
    compute = "kernels" if "kernels" in times else "search"
    summary = {
        "backend": backend_name(lease),
        "source": "corpus" if job.corpus is not None else "text",
        "corpus_id": job.corpus.id if job.corpus else None,
        "text_bytes": n,
        "algorithm": params.algorithm,
        "variant": params.variant,
        "fused": params.fused,
        "positions": params.positions,
        "resident": output.resident,
        "launch": output.launch or None,
        "patterns": patterns,
        "times_ms": {key: round(value, 3) for key, value in times.items()},
        "throughput_gbps": {compute: _rate(n, times[compute]), "end_to_end": _rate(n, total_ms)},
    }
    return JobResult(summary, files)


def _display(pattern: bytes) -> str | None:
    try:
        return pattern.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _rate(n: int, ms: float) -> float | None:
    return round(n / (ms / 1000) / 1e9, 3) if ms > 0 else None
