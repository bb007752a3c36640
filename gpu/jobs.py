"""What the front doors of the batch job kinds share (gpu/svd, gpu/search, gpu/stencil,
gpu/cs256): each is `run(job, lease=None, progress=None) -> JobResult`.

- `job`: the kind's job object (its params.py), built from a request or rehydrated from
  storage with `Job.from_json(stored, files)`; `job.to_json()` and `job.input_files()`
  are what is stored.
- `lease`: a gpu.pool.Lease to run on, or None for the CPU (the NumPy reference).
- `progress(fraction)`: called with 0..1 at checkpoints; it may raise to stop the job
  (the service's cancel), so a front door lets exceptions from it pass.
"""

from __future__ import annotations

import io
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
from PIL import Image

Progress = Callable[[float], None]
TICK_S = 0.5  # how often steady_progress reports
FileWriter = Callable[[BinaryIO], None]  # writes one result file's content to an open binary file


def no_progress(fraction: float) -> None:
    """The progress callback of a job nobody watches."""


def backend_name(lease: object) -> str:
    """The backend a job ran on, as results name it: "cuda" on a lease, else "cpu"."""
    return "cpu" if lease is None else "cuda"


@dataclass
class JobResult:
    """A finished job: its JSON summary (JSON types only) and its result files by name."""

    summary: dict[str, Any]
    files: dict[str, FileWriter] = field(default_factory=dict)


def npy_file(array: np.ndarray) -> FileWriter:
    """A .npy file of `array` (numpy.save, no pickles)."""
    return lambda handle: np.save(handle, array, allow_pickle=False)


def png_file(image: Image.Image) -> FileWriter:
    """A PNG file of `image` (Pillow, default compression)."""
    return lambda handle: image.save(handle, format="PNG", optimize=False)


def npy_bytes(array: np.ndarray) -> bytes:
    """`array` as the bytes of a .npy file (C order, native byte order as given)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


@contextmanager
def steady_progress(progress: Progress, start: float, end: float, expected_s: float) -> Iterator[None]:
    """While the block runs one long call that reports nothing (LAPACK, say), move the
    progress from `start` toward `end` as time passes: start + (end - start) (1 - e^(-t /
    expected_s)), reported every TICK_S from a thread of its own. It never reaches `end`:
    a call slower than expected creeps on rather than claiming to be done. A progress
    callback that raises (a cancel) stops the ticking; the caller's next checkpoint after
    the call raises it again."""
    stopped = threading.Event()

    def tick() -> None:
        began = time.monotonic()
        while not stopped.wait(TICK_S):
            share = 1.0 - math.exp(-(time.monotonic() - began) / max(expected_s, 1e-3))
            try:
                progress(start + (end - start) * share)
            except Exception:  # a cancel, or the store: the job's own checkpoints see it
                return

    ticker = threading.Thread(target=tick, name="steady-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stopped.set()
        ticker.join()
