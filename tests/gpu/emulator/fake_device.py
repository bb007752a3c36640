"""What the emulators' CuPy stand-ins share: `ndarray`, a device array that is a host array
(its `.data.ptr` the host address the emulated kernels are given, `.get()` a copy), and
`Lease`, a gpu.pool.Lease without CUDA: device 0, two streams of the stand-in's own Stream
type, host staging buffers kept per name as the pool's are (copies in flight read from
them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class _Pointer:
    def __init__(self, array: np.ndarray):
        self.ptr = array.ctypes.data


class ndarray(np.ndarray):  # CuPy's name
    @property
    def data(self) -> _Pointer:
        return _Pointer(self)

    def get(self, stream: Any = None) -> np.ndarray:
        return np.array(self.view(np.ndarray))


class Lease:
    device, slot = 0, 0

    def __init__(self, stream_type: Callable[[], Any]):
        self.stream, self.side_stream = stream_type(), stream_type()
        self._staging: dict[str, np.ndarray] = {}

    def staging(self, name: str, nbytes: int) -> np.ndarray:
        """(nbytes,) uint8 host buffer `name`, grown when too small."""
        buffer = self._staging.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = self._staging[name] = np.empty(nbytes, np.uint8)
        return buffer[:nbytes]
