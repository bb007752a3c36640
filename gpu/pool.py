"""DevicePool: every GPU the process may use, shared by the sketches and the batch jobs.

Each device offers `streams_per_device` leases. A lease is one slot of work: a pair of
CUDA streams (the render's two branches; the second at the device's highest priority)
and pinned host staging buffers, kept by the
slot and reused by every render that holds it, so uploads and downloads are async and
consecutive renders on different leases overlap copy and compute.

- Who gets a lease: waiters are served in (priority, arrival) order, interactive before
  batch; batch work never holds more than `batch_share` of a device's leases (rounded
  down, but at least one, so that jobs can run on a device of one lease), so a long job
  cannot starve /sketch. A lease goes to the least-loaded device.
- Waiting is bounded: at most `max_waiting` waiters (PoolBusy past that) and
  `lease_timeout` seconds each (PoolBusy when it runs out).
- Memory: each device's CuPy memory pool is capped at `memory_fraction` of the card.
  `run()` answers an out-of-memory error by freeing the cached blocks and retrying once,
  then raises DeviceOutOfMemory; the process keeps serving.

Importing this module needs no CuPy; creating a pool does (unless given another runtime).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

log = logging.getLogger("pencil.pool")

INTERACTIVE = 0
BATCH = 1
PRIORITY_NAMES = {INTERACTIVE: "interactive", BATCH: "batch"}

T = TypeVar("T")


class PoolBusy(RuntimeError):
    """No lease could be had in time (or too many were already waiting)."""


class DeviceOutOfMemory(RuntimeError):
    """The work did not fit in device memory, even after freeing the pool's cached blocks."""


def parse_devices(spec: str) -> list[int] | None:
    """'0,1' -> [0, 1]; '' or 'all' -> None (every visible device). Raises ValueError."""
    spec = spec.strip().lower()
    if spec in ("", "all"):
        return None
    ids = [int(part) for part in spec.split(",") if part.strip()]
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"PENCIL_DEVICES must be 'all' or distinct device numbers like '0,1', got {spec!r}")
    return ids


@dataclass(eq=False)
class Lease:
    """One slot on one device: streams and pinned staging that a holder uses exclusively."""

    device: int
    slot: int
    stream: Any  # cupy.cuda.Stream: the main stream (stroke branch, copies)
    side_stream: Any  # cupy.cuda.Stream: the second branch, joined back with an event
    priority: int = INTERACTIVE
    _staging: dict[str, np.ndarray] = field(default_factory=dict)
    _resources: dict[str, Any] = field(default_factory=dict)

    def resource(self, name: str, make: Callable[[], T]) -> T:
        """A per-slot object built once by `make()` and reused by every holder of this
        lease (for example the device codecs, which must not be shared between threads)."""
        found = self._resources.get(name)
        if found is None:
            found = self._resources[name] = make()
        return found

    def staging(self, name: str, nbytes: int) -> np.ndarray:
        """A pinned host buffer of at least `nbytes` (uint8, 1-D view of exactly nbytes),
        owned by this slot and grown on demand."""
        import cupyx

        buffer = self._staging.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = cupyx.empty_pinned(max(nbytes, 1 << 16), np.uint8)
            self._staging[name] = buffer
        return buffer[:nbytes]


@dataclass
class _Device:
    id: int
    name: str
    total_memory: int
    leases: list[Lease]
    free: list[Lease]
    batch_in_use: int = 0
    granted: int = 0  # leases handed out since start

    @property
    def in_use(self) -> int:
        return len(self.leases) - len(self.free)


@dataclass(eq=False)
class _Waiter:
    priority: int
    order: int
    lease: Lease | None = None


class CupyRuntime:
    """The few CUDA calls the pool makes, through CuPy (tests substitute a fake)."""

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.OutOfMemoryError = cupy.cuda.memory.OutOfMemoryError

    def device_count(self) -> int:
        return self.cupy.cuda.runtime.getDeviceCount()

    def describe(self, device: int) -> tuple[str, int]:
        """(name, total memory in bytes)."""
        properties = self.cupy.cuda.runtime.getDeviceProperties(device)
        return properties["name"].decode(), int(properties["totalGlobalMem"])

    def new_stream(self, device: int, urgent: bool = False):
        """A non-blocking stream; `urgent` ones get the device's highest priority (CUDA
        clamps a priority beyond the device's range to its greatest: -5 on Hopper)."""
        with self.cupy.cuda.Device(device):
            return self.cupy.cuda.Stream(non_blocking=True, priority=-1000 if urgent else 0)

    def cap_memory(self, device: int, fraction: float) -> None:
        with self.cupy.cuda.Device(device):
            self.cupy.get_default_memory_pool().set_limit(fraction=fraction)

    def memory(self, device: int) -> tuple[int, int]:
        """(bytes in use by CuPy's pool, its cap; 0 = none)."""
        pool = self.cupy.get_default_memory_pool()
        with self.cupy.cuda.Device(device):
            return pool.used_bytes(), pool.get_limit()

    def free_cached(self, lease: Lease) -> None:
        """Wait for the lease's work, then give the pool's unused blocks back to the driver."""
        lease.stream.synchronize()
        lease.side_stream.synchronize()
        with self.cupy.cuda.Device(lease.device):
            self.cupy.get_default_memory_pool().free_all_blocks()


class DevicePool:
    def __init__(
        self,
        devices: Sequence[int] | None = None,
        streams_per_device: int = 4,
        memory_fraction: float = 0.9,
        batch_share: float = 0.5,
        max_waiting: int = 256,
        lease_timeout: float = 30.0,
        runtime: CupyRuntime | None = None,
    ):
        if streams_per_device < 1:
            raise ValueError("streams_per_device must be >= 1")
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError("memory_fraction must be in (0, 1]")
        if not 0.0 < batch_share <= 1.0:
            raise ValueError("batch_share must be in (0, 1]")
        if max_waiting < 0 or lease_timeout <= 0:
            raise ValueError("max_waiting must be >= 0 and lease_timeout > 0")
        self.runtime = runtime or CupyRuntime()
        visible = self.runtime.device_count()
        ids = list(range(visible)) if devices is None else list(devices)
        if not ids:
            raise ValueError("no CUDA device to pool")
        for i in ids:
            if not 0 <= i < visible:
                raise ValueError(f"device {i} does not exist ({visible} visible)")
        self.streams_per_device = streams_per_device
        self.memory_fraction = memory_fraction
        self.batch_slots = max(1, int(streams_per_device * batch_share))
        self.max_waiting = max_waiting
        self.lease_timeout = lease_timeout
        self._cond = threading.Condition()
        self._waiters: list[_Waiter] = []
        self._order = itertools.count()
        self._devices: dict[int, _Device] = {}
        for i in ids:
            name, total = self.runtime.describe(i)
            self.runtime.cap_memory(i, memory_fraction)
            # The side stream is urgent: its work (the tone branch, the CG of texture lu)
            # then runs in the gaps of the main stream's line passes instead of after them
            # (BENCHMARKS.md, "What was tried").
            leases = [
                Lease(i, slot, self.runtime.new_stream(i), self.runtime.new_stream(i, urgent=True))
                for slot in range(streams_per_device)
            ]
            self._devices[i] = _Device(i, name, total, leases, list(reversed(leases)))

    @property
    def device_ids(self) -> list[int]:
        return list(self._devices)

    def set_memory_fraction(self, fraction: float) -> None:
        """Re-cap every device's memory pool at `fraction` of the card (a server process
        that starts running the batch jobs takes a larger share)."""
        if not 0.0 < fraction <= 1.0:
            raise ValueError("memory_fraction must be in (0, 1]")
        for device in self._devices:
            self.runtime.cap_memory(device, fraction)
        self.memory_fraction = fraction

    def leases(self) -> list[Lease]:
        """Every lease of every device, for start-up work done before serving (warm-up);
        at any other time take one with `lease()` or `run()`."""
        return [lease for device in self._devices.values() for lease in device.leases]

    @property
    def size(self) -> int:
        """Leases in all: devices x streams per device."""
        return len(self._devices) * self.streams_per_device

    # ---------------------------------------------------------------- leasing --

    @contextmanager
    def lease(self, priority: int = INTERACTIVE, timeout: float | None = None) -> Iterator[Lease]:
        """Hold a lease for the duration of the block. Raises PoolBusy when none comes
        within `timeout` seconds or when `max_waiting` others already wait."""
        lease = self.acquire(priority, timeout)
        try:
            yield lease
        finally:
            self.release(lease)

    def acquire(self, priority: int = INTERACTIVE, timeout: float | None = None) -> Lease:
        """A lease, or PoolBusy after `timeout` s (default: the pool's lease_timeout) or at
        once when it would have to wait behind `max_waiting` others. Pair with release()."""
        timeout = self.lease_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            waiter = _Waiter(priority, next(self._order))
            self._waiters.append(waiter)
            self._waiters.sort(key=lambda w: (w.priority, w.order))
            self._dispatch()
            if waiter.lease is None and len(self._waiters) > self.max_waiting:
                self._waiters.remove(waiter)
                raise PoolBusy(f"{len(self._waiters)} others already wait for a GPU lease")
            try:
                while waiter.lease is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise PoolBusy(f"no GPU lease free within {timeout:g} s")
                    self._cond.wait(remaining)
            except BaseException:  # timed out, or interrupted while waiting: leave no trace
                if waiter.lease is None:
                    self._waiters.remove(waiter)
                    self._dispatch()  # a batch waiter behind us may be servable now
                else:
                    self._return(waiter.lease)
                raise
            return waiter.lease

    def release(self, lease: Lease) -> None:
        with self._cond:
            self._return(lease)

    def _return(self, lease: Lease) -> None:
        device = self._devices[lease.device]
        if lease in device.free:
            raise RuntimeError(f"lease {lease.device}/{lease.slot} released twice")
        if lease.priority == BATCH:
            device.batch_in_use -= 1
        device.free.append(lease)
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free leases to waiters in (priority, arrival) order. Called with the lock."""
        granted = False
        for waiter in list(self._waiters):
            device = self._pick_device(waiter.priority)
            if device is None:
                continue  # a batch waiter may be capped while an interactive one behind it fits
            lease = device.free.pop()
            lease.priority = waiter.priority
            if waiter.priority == BATCH:
                device.batch_in_use += 1
            device.granted += 1
            waiter.lease = lease
            self._waiters.remove(waiter)
            granted = True
        if granted:
            self._cond.notify_all()

    def _pick_device(self, priority: int) -> _Device | None:
        candidates = [
            d for d in self._devices.values() if d.free and (priority != BATCH or d.batch_in_use < self.batch_slots)
        ]
        return min(candidates, key=lambda d: (d.in_use, d.granted), default=None)

    # ------------------------------------------------------------ running work --

    def run(self, work: Callable[[Lease], T], priority: int = INTERACTIVE, timeout: float | None = None) -> T:
        """Run `work(lease)` on a lease. On device out-of-memory: free the pool's cached
        blocks on that device and retry once; then raise DeviceOutOfMemory."""
        with self.lease(priority, timeout) as lease:
            try:
                return work(lease)
            except self.runtime.OutOfMemoryError:
                log.warning("GPU %d out of memory; freeing cached blocks and retrying once", lease.device)
                self.runtime.free_cached(lease)
            try:
                return work(lease)
            except self.runtime.OutOfMemoryError as exc:
                self.runtime.free_cached(lease)
                raise DeviceOutOfMemory(f"GPU {lease.device} is out of memory: {exc}") from None

    # ------------------------------------------------------------ observation --

    def snapshot(self) -> list[dict[str, Any]]:
        """Per device: id, name, leases (total, in use, batch in use, granted so far),
        waiters (pool-wide), memory used by and cap of CuPy's pool, in bytes."""
        with self._cond:
            waiting = len(self._waiters)
            rows = [
                (d.id, d.name, d.total_memory, len(d.leases), d.in_use, d.batch_in_use, d.granted)
                for d in self._devices.values()
            ]
        out = []
        for device, name, total, leases, in_use, batch, granted in rows:
            used, cap = self.runtime.memory(device)
            out.append(
                {
                    "device": device,
                    "name": name,
                    "leases": leases,
                    "leases_in_use": in_use,
                    "batch_leases_in_use": batch,
                    "leases_granted": granted,
                    "waiting": waiting,
                    "memory_used_bytes": used,
                    "memory_cap_bytes": cap or total,
                    "memory_total_bytes": total,
                }
            )
        return out


_default_pool: DevicePool | None = None
_default_lock = threading.Lock()


def default_pool() -> DevicePool:
    """The process-wide pool of every visible device (4 leases each), made on first use:
    for callers that have no pool of their own (the CLI, tests, benchmarks)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = DevicePool()
        return _default_pool
