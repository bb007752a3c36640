"""Which compute backend runs the work: CUDA (CuPy) when asked for or available, else
the NumPy/OpenCV CPU backend. Importable without CuPy."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field

log = logging.getLogger("pencil.backend")

BACKEND_CHOICES = ("auto", "cuda", "cpu")


class BackendUnavailable(RuntimeError):
    """The backend that was asked for cannot run in this process."""


@dataclass(frozen=True)
class Backend:
    name: str  # "cuda" | "cpu"
    devices: list[str] = field(default_factory=list)  # e.g. ["0: NVIDIA H100 80GB HBM3"]


def cuda_devices() -> list[str]:
    """Names of the CUDA devices that answer, or [] when CuPy or a device is missing."""
    if importlib.util.find_spec("cupy") is None:
        return []
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        return [f"{i}: {cupy.cuda.runtime.getDeviceProperties(i)['name'].decode()}" for i in range(count)]
    except Exception as exc:  # no driver, no device, broken install: all mean "no CUDA"
        log.info("CUDA not usable: %s", exc)
        return []


def cuda_pipeline_available() -> bool:
    """Whether this build carries the CUDA pencil pipeline (gpu/pencil/cuda.py)."""
    return importlib.util.find_spec("gpu.pencil.cuda") is not None


def select_backend(requested: str) -> Backend:
    """Resolve PENCIL_BACKEND: 'cpu', 'cuda' (raises BackendUnavailable when it cannot
    run) or 'auto' (CUDA when a device answers and the pipeline exists, else CPU)."""
    if requested not in BACKEND_CHOICES:
        raise BackendUnavailable(f"unknown backend {requested!r}; choose one of {', '.join(BACKEND_CHOICES)}")
    if requested == "cpu":
        return Backend("cpu")
    devices = cuda_devices()
    if devices and cuda_pipeline_available():
        return Backend("cuda", devices)
    if requested == "cuda":
        reason = (
            "no CUDA device answers (is CuPy installed, with the pencil-gpu[cuda] extra?)"
            if not devices
            else "this build has no CUDA pencil pipeline yet"
        )
        raise BackendUnavailable(f"PENCIL_BACKEND=cuda but {reason}")
    if devices:
        log.warning(
            "CUDA devices found (%s) but this build has no CUDA pencil pipeline; using the CPU", ", ".join(devices)
        )
    return Backend("cpu")
