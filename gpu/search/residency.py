"""Corpora kept in device memory between searches: a least-recently-used cache per device.

A search of a stored corpus on a GPU leaves the corpus's text (gpu.search.cuda.DeviceText)
here under the corpus's key; the next search of it on that device finds it and skips the
upload. Each device holds at most `fraction` of the bytes its memory pool may use (the
rest stays for renders, other jobs and the searches' own arrays); putting a text that
does not fit evicts the least recently used ones first, and a text larger than the whole
budget is not kept. Deleting a corpus evicts it everywhere; a job that runs out of device
memory evicts its device's texts before the pool retries it.

Eviction only drops the cache's reference: a search still using the text keeps it alive
until it finishes (CuPy frees it then). Importable without CuPy: entries are any objects
with an `nbytes` attribute.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_FRACTION = 0.5


class Residency:
    def __init__(self, fraction: float = DEFAULT_FRACTION):
        self.fraction = fraction
        self._lock = threading.Lock()
        self._devices: dict[int, OrderedDict[Hashable, Any]] = {}
        self._loading: dict[tuple[int, Hashable], threading.Lock] = {}

    def configure(self, fraction: float) -> None:
        """Set the share (0..1] of each device's pool memory that resident texts may hold."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"the resident fraction must be in (0, 1], got {fraction}")
        self.fraction = fraction

    def get(self, device: int, key: Hashable) -> Any | None:
        """The entry of `key` on `device` (now the most recently used), or None."""
        with self._lock:
            entries = self._devices.get(device)
            if entries is None or key not in entries:
                return None
            entries.move_to_end(key)
            return entries[key]

    def put(self, device: int, key: Hashable, entry: Any, capacity: int) -> list[Hashable]:
        """Keep `entry` for `key` on `device`, whose pool may hold `capacity` bytes: evict
        least recently used entries until it fits in fraction x capacity. Returns the
        evicted keys; an entry larger than the budget is not kept (nothing is evicted)."""
        budget = int(self.fraction * capacity)
        with self._lock:
            entries = self._devices.setdefault(device, OrderedDict())
            entries.pop(key, None)
            if entry.nbytes > budget:
                return []
            evicted = []
            while entries and sum(e.nbytes for e in entries.values()) + entry.nbytes > budget:
                old_key, _ = entries.popitem(last=False)
                evicted.append(old_key)
            entries[key] = entry
            return evicted

    def evict(self, key: Hashable) -> int:
        """Drop `key` on every device; returns how many copies were dropped."""
        dropped = 0
        with self._lock:
            for entries in self._devices.values():
                if entries.pop(key, None) is not None:
                    dropped += 1
        return dropped

    def evict_matching(self, predicate) -> int:
        """Drop every key for which predicate(key) is true, on every device (and their
        upload locks: a deleted corpus leaves nothing behind)."""
        dropped = 0
        with self._lock:
            for entries in self._devices.values():
                for key in [k for k in entries if predicate(k)]:
                    del entries[key]
                    dropped += 1
            for device, key in [slot for slot in self._loading if predicate(slot[1])]:
                del self._loading[(device, key)]
        return dropped

    def evict_device(self, device: int) -> int:
        """Drop every entry of `device`; returns the bytes they held."""
        with self._lock:
            entries = self._devices.pop(device, OrderedDict())
        return sum(e.nbytes for e in entries.values())

    def clear(self) -> None:
        with self._lock:
            self._devices.clear()

    def resident_devices(self, predicate) -> list[int]:
        """Devices holding a key for which predicate(key) is true."""
        with self._lock:
            return sorted(device for device, entries in self._devices.items() if any(predicate(k) for k in entries))

    def used(self, device: int) -> int:
        """Bytes the entries of `device` hold."""
        with self._lock:
            return sum(e.nbytes for e in self._devices.get(device, {}).values())

    def keys(self, device: int) -> list[Hashable]:
        """Keys on `device`, least recently used first."""
        with self._lock:
            return list(self._devices.get(device, {}))

    @contextmanager
    def loading(self, device: int, key: Hashable) -> Iterator[None]:
        """Held while one thread uploads `key` to `device`: others wanting the same text
        wait for it and then find it resident, instead of uploading it again."""
        with self._lock:
            lock = self._loading.setdefault((device, key), threading.Lock())
        with lock:
            yield


RESIDENT = Residency()
