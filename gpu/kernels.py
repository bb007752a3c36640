"""CUDA C sources (gpu/**/*.cu, listed in gpu/ahead.py) loaded as cupy.RawModules: from the
fatbin compiled ahead of time beside each source (the Docker image has them), else compiled
at run time by NVRTC. Each (source, device) is loaded once per process and its kernels are
cached; callers ask for a kernel on the current device. `load_all(device)` loads every
source, for a process about to run batch jobs. Also the helpers every gpu/*/cuda.py launches
with: `div_up` (grid sizes), `empty` (poisoned in tests) and `capture` (launches recorded
once as a CUDA graph, to replay in one host call).

Importing this module needs CuPy; nothing in `app/` or the CPU backend imports it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import cupy

from gpu import ahead
from gpu.ahead import SOURCES, fatbin_for

# NVRTC's flags (gpu/ahead.py's, which the fatbins were built with). A benchmark that adds a
# define here (bench/pencil_overlap.py) compiles with NVRTC: a fatbin holds the stock build.
COMPILE_OPTIONS = ahead.COMPILE_OPTIONS

log = logging.getLogger("pencil.kernels")

# Tests set this: every array `empty` returns, and every one passed to `poison`, is filled
# with 0xFF bytes (NaN as a float, -1 as a signed integer), so an entry a kernel forgot to
# write shows up.
POISON = False

_lock = threading.Lock()  # guards the dictionaries below, held for lookups only
_loading: dict[tuple[Path, int], threading.Lock] = {}  # one per (source, device): a compile blocks no other source
_modules: dict[tuple[Path, int], cupy.RawModule] = {}
_kernels: dict[tuple[Path, int, str], cupy.RawKernel] = {}


def _module(source: Path, device: int) -> cupy.RawModule:
    key = (source, device)
    with _lock:
        module = _modules.get(key)
        if module is not None:
            return module
        loading = _loading.setdefault(key, threading.Lock())
    with loading:  # a second caller waits for the first one's compile instead of repeating it
        module = _modules.get(key)
        if module is None:
            module = _load(source, device)
            with _lock:
                _modules[key] = module
        return module


def _load(source: Path, device: int) -> cupy.RawModule:
    """`source`'s module on `device`: its fatbin when one was built for this version and
    holds code this GPU runs, else NVRTC's compile (CuPy keeps it in its on-disk cache)."""
    started = time.perf_counter()
    fatbin = fatbin_for(source)
    with cupy.cuda.Device(device):
        if COMPILE_OPTIONS == ahead.COMPILE_OPTIONS and fatbin.exists():
            module = cupy.RawModule(path=str(fatbin))
            try:
                module.compile()  # loads the fatbin on this device
                log.debug("%s: compiled ahead, loaded in %.3f s", source.name, time.perf_counter() - started)
                return module
            except cupy.cuda.driver.CUDADriverError as exc:  # no SASS or PTX for this GPU in it
                log.warning(
                    "%s: %s holds no code for device %d (%s); compiling with NVRTC",
                    source.name,
                    fatbin.name,
                    device,
                    exc,
                )
        module = cupy.RawModule(code=source.read_text(), options=COMPILE_OPTIONS)
        module.compile()  # NVRTC for this device's architecture, now rather than at first launch
    log.info(
        "%s: no fatbin, NVRTC built it for device %d in %.1f s (or CuPy read its cache)",
        source.name,
        device,
        time.perf_counter() - started,
    )
    return module


def load_all(device: int) -> float:
    """Load (or compile) every CUDA source's module on `device`, so that no batch job waits
    for one; returns the seconds it took."""
    started = time.perf_counter()
    for source in SOURCES:
        _module(source, device)
    return time.perf_counter() - started


def kernel(source: Path, name: str) -> cupy.RawKernel:
    """The kernel `name` of `source`, loaded on the current device (compiled on first use).
    Its dynamic shared memory limit is raised to the device's opt-in maximum."""
    device = cupy.cuda.Device().id
    key = (source, device, name)
    found = _kernels.get(key)
    if found is not None:
        return found
    function = _module(source, device).get_function(name)
    function.max_dynamic_shared_size_bytes = max_shared_bytes() - function.shared_size_bytes
    with _lock:
        return _kernels.setdefault(key, function)


T = TypeVar("T")


def capture(work: Callable[[], T], stream: cupy.cuda.Stream) -> tuple[Any, T]:
    """(graph, result): what `work()` queues on `stream` (and on streams it joins back)
    recorded into a CUDA graph in relaxed mode, not run; `graph.launch(stream)` replays
    it. Device addresses are fixed at capture: what the launches read and write must stay
    allocated while the graph lives. If `work` raises, the capture is ended and work's own
    error raised."""
    stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
    try:
        result = work()
    except BaseException:
        with contextlib.suppress(Exception):  # the launch's error is the one to see
            stream.end_capture()
        raise
    return stream.end_capture(), result


def div_up(a: int, b: int) -> int:
    """ceil(a / b) for integers: blocks of b that cover a."""
    return -(-a // b)


def empty(shape, dtype) -> cupy.ndarray:
    """cupy.empty(shape, dtype) on the current device, poisoned (see `poison`)."""
    return poison(cupy.empty(shape, dtype))


def poison(array: cupy.ndarray) -> cupy.ndarray:
    """`array` (C-contiguous) filled with 0xFF bytes on the current stream while POISON is
    set, else untouched; returned."""
    if POISON:
        array.view(cupy.uint8).fill(0xFF)
    return array


def blocks_per_sm(function: cupy.RawKernel, block_threads: int, dynamic_shared: int = 0) -> int:
    """Blocks of `function` (block_threads threads, dynamic_shared bytes of dynamic shared
    memory) one SM of the current device holds at once: the least of what its threads,
    registers (allocated per warp in units of 256), shared memory (1 KiB reserved per block)
    and block slots allow; at least 1."""
    warps = -(-block_threads // 32)
    by_threads = device_attribute("MaxThreadsPerMultiProcessor") // block_threads
    regs_per_warp = -(-max(function.num_regs, 1) * 32 // 256) * 256
    by_regs = device_attribute("MaxRegistersPerMultiprocessor") // regs_per_warp // warps
    by_shared = device_attribute("MaxSharedMemoryPerMultiprocessor") // (
        dynamic_shared + function.shared_size_bytes + 1024
    )
    try:
        by_blocks = device_attribute("MaxBlocksPerMultiprocessor")
    except KeyError:  # an older runtime's attribute list: 32 on every architecture since Maxwell
        by_blocks = 32
    return max(1, min(by_threads, by_regs, by_shared, by_blocks))


def max_shared_bytes() -> int:
    """Shared memory one block may use on the current device (opt-in limit), in bytes."""
    return device_attribute("MaxSharedMemoryPerBlockOptin")


def device_attribute(name: str) -> int:
    """A CUDA attribute of the current device (e.g. "MultiProcessorCount"), read once per
    device: cupy's Device.attributes queries every attribute on each call, too slow for
    the launch path."""
    return _attributes(cupy.cuda.Device().id)[name]


@cache
def _attributes(device: int) -> dict[str, int]:
    return dict(cupy.cuda.Device(device).attributes)
