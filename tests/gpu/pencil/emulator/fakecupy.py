"""A stand-in for the parts of CuPy that gpu/pencil/cuda.py uses, over NumPy, whose
RawKernels run gpu/pencil/pencil.cu in the C++ emulator (pencil_emu.cpp, built by
tests/gpu/pencil/test_emulated.py). Device arrays are host arrays; the emulator runs each
launch to its end, so streams and events only keep the calls' shapes (`with stream:`
makes it current). The device is an H100 as far as the launch geometry asks (its SM
count and opt-in shared memory), so the launches are the production ones. Kernel
arguments must be arrays or NumPy scalars of the exact C type, as with CuPy (a size
mismatch is an error: tests/gpu/emulator/library.py)."""

from __future__ import annotations

import contextlib
import ctypes
import sys
import types

import numpy as np

from tests.gpu.emulator import fake_device
from tests.gpu.emulator import library as emulator
from tests.gpu.emulator.fake_device import ndarray

H100 = {"MultiProcessorCount": 132, "MaxSharedMemoryPerBlockOptin": 232448}


def _device(array) -> ndarray:
    return np.ascontiguousarray(array).view(ndarray)


class Event:
    def synchronize(self):
        pass


class Stream:
    current: list[Stream] = []

    def __init__(self, non_blocking=False, priority=0):
        self.ptr = id(self)

    def __enter__(self):
        Stream.current.append(self)
        return self

    def __exit__(self, *exc):
        Stream.current.pop()
        return False

    def synchronize(self):
        pass

    def record(self, event=None):
        return Event()

    def wait_event(self, event):
        pass


_NULL_STREAM = Stream()


def get_current_stream() -> Stream:
    return Stream.current[-1] if Stream.current else _NULL_STREAM


class Device:
    def __init__(self, device=0):
        self.id = device
        self.attributes = dict(H100)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Runtime:
    memcpyHostToDevice, memcpyDeviceToHost = 1, 2

    @staticmethod
    def memcpyAsync(dst, src, size, kind, stream):
        ctypes.memmove(dst, src, size)


class _MemoryPool:
    """CuPy's memory pool, in name only: the emulator's arrays are NumPy's, whatever
    allocator is current (`using_allocator` is a no-op)."""

    def malloc(self, size):
        raise NotImplementedError("the emulator allocates with NumPy")


_DEFAULT_POOL = _MemoryPool()


class RawKernel:
    def __init__(self, library, name: str):
        self.library, self.name = library, name

    def __call__(self, grid, block, args, shared_mem=0):
        emulator.launch_dims(self.library, self.name, tuple(grid), tuple(block), shared_mem, args)


def install(library_path: str):
    """Put the fake `cupy` in sys.modules and return gpu.pencil.cuda with its kernels
    taken from the emulator library."""
    library = emulator.load(library_path)
    cupy = types.ModuleType("cupy")
    cupy.ndarray = ndarray
    for name in ("uint8", "int32", "uint32", "float32", "float64"):
        setattr(cupy, name, getattr(np, name))
    cupy.empty = lambda shape, dtype=np.float64: np.empty(shape, dtype).view(ndarray)
    cupy.zeros = lambda shape, dtype=np.float64: np.zeros(shape, dtype).view(ndarray)
    cupy.full = lambda shape, value, dtype=None: np.full(shape, value, dtype).view(ndarray)
    cupy.zeros_like = lambda a: np.zeros_like(a).view(ndarray)
    cupy.asarray = lambda a, dtype=None: _device(np.array(a, dtype=dtype))
    cupy.get_default_memory_pool = lambda: _DEFAULT_POOL
    cupy.cuda = types.SimpleNamespace(
        Stream=Stream,
        Event=Event,
        Device=Device,
        runtime=_Runtime,
        get_current_stream=get_current_stream,
        using_allocator=contextlib.nullcontext,
    )
    sys.modules["cupy"] = cupy
    from gpu.pencil import cuda

    cuda._k = lambda name: RawKernel(library, name)
    return cuda


class Lease(fake_device.Lease):
    """A gpu.pool.Lease without CUDA, with this stand-in's streams."""

    def __init__(self):
        super().__init__(Stream)
