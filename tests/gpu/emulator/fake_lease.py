"""A gpu.pool.Lease without CUDA, for the emulators' CuPy stand-ins: device 0, two streams
of the stand-in's own Stream type, host staging buffers kept per name as the pool's are
(copies in flight read from them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


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
