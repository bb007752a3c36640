"""A stand-in for the few parts of CuPy that gpu/search/cuda.py uses, over NumPy, whose
RawKernels run gpu/search/search.cu in the C++ emulator (emu.cpp, built by the test).
Device arrays are host arrays, filled with 0xFF bytes when made (cupy.empty); a kernel
launch runs to its end at once. Host-to-device copies (memcpyAsync) land late: each waits
in its stream's queue until an event recorded after it is synchronized or waited for by
another stream, or its stream is synchronized, so that a kernel launched on a stream that
did not wait for the upload of its bytes reads 0xFF instead of the text. Kernel arguments
must be arrays or NumPy scalars of the exact C type, as with CuPy (a mismatch in size is
an error here: tests/gpu/emulator/library.py)."""

from __future__ import annotations

import ctypes
import sys
import threading
import types

import numpy as np

from tests.gpu.emulator import fake_device
from tests.gpu.emulator import library as emulator
from tests.gpu.emulator.fake_device import ndarray

_streams: dict[int, Stream] = {}


class Stream:
    """Its queue holds the copies not landed yet; `done` of them have landed."""

    def __init__(self, non_blocking=False, priority=0):
        self.ptr = id(self)
        self.queue: list = []
        self.done = 0
        self.lock = threading.Lock()  # reader threads synchronize events too
        _streams[self.ptr] = self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def land(self, upto: int) -> None:
        """Carry out the queued copies up to number `upto`."""
        with self.lock:
            while self.done < upto:
                self.queue[self.done]()
                self.done += 1

    def synchronize(self):
        self.land(len(self.queue))

    def wait_event(self, event):
        event.synchronize()


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.stream, self.upto = None, 0

    def record(self, stream=None):
        self.stream = stream
        self.upto = len(stream.queue) if stream is not None else 0

    def synchronize(self):
        if self.stream is not None:
            self.stream.land(self.upto)


class Device:
    attributes = {"MultiProcessorCount": 16}  # the fused prefix sums split each pattern's row over 16 // P blocks

    def __init__(self, device=0):
        self.id = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class OutOfMemoryError(Exception):
    pass


class _Runtime:
    memcpyHostToDevice = 1

    @staticmethod
    def memcpyAsync(dst, src, size, kind, stream):
        _streams[stream].queue.append(lambda: ctypes.memmove(dst, src, size))

    @staticmethod
    def memGetInfo():
        return (1 << 34, 1 << 34)


class _MemoryPool:
    def get_limit(self):
        return 1 << 34


def _empty(shape, dtype=np.float64):
    array = np.empty(shape, dtype)
    array.view(np.uint8).fill(0xFF)
    return array.view(ndarray)


class RawKernel:
    def __init__(self, library, name: str):
        self.library, self.name = library, name

    def __call__(self, grid, block, args, shared_mem=0):
        emulator.launch(self.library, self.name, grid[0], block[0], shared_mem, args)


def install(library_path: str):
    """Put the fake `cupy` (and an empty `cupyx`) in sys.modules and return gpu.search.cuda
    with its kernels taken from the emulator library."""
    library = emulator.load(library_path)
    cupy = types.ModuleType("cupy")
    cupy.ndarray = ndarray
    for name in ("uint8", "int16", "int32", "int64", "uint32", "uint64"):
        setattr(cupy, name, getattr(np, name))
    cupy.empty = _empty
    cupy.zeros = lambda shape, dtype=np.float64: np.zeros(shape, dtype).view(ndarray)
    cupy.asarray = lambda a, dtype=None: np.array(a, dtype=dtype).view(ndarray)
    cupy.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(ndarray)
    cupy.cumsum = lambda a, axis=None, dtype=None: np.cumsum(a, axis=axis, dtype=dtype).view(ndarray)
    cupy.get_default_memory_pool = _MemoryPool
    cupy.cuda = types.SimpleNamespace(
        Stream=Stream,
        Event=Event,
        Device=Device,
        runtime=_Runtime,
        get_elapsed_time=lambda start, stop: 1.0,
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
    )
    sys.modules["cupy"] = cupy
    sys.modules["cupyx"] = types.ModuleType("cupyx")
    from gpu.search import cuda

    cuda._k = lambda name: RawKernel(library, name)
    cuda._resident_blocks = lambda: 3  # few: the write kernels' loop over logical blocks runs
    return cuda


class Lease(fake_device.Lease):
    """A gpu.pool.Lease without CUDA, with this stand-in's streams."""

    def __init__(self):
        super().__init__(Stream)
