"""GPU energy over a window of work, from NVML through pynvml (the `nvidia-ml-py`
package), imported only when a meter starts: without it, or without a driver, every
reading is None with a note saying why, and nothing fails.

Two sources, both read for every window:
- the device's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the
  driver loaded; Volta and newer data-centre GPUs), read at start and stop;
- the board power (nvmlDeviceGetPowerUsage, mW) sampled on a thread every `interval_s`
  and integrated with the trapezoid rule over the window.
The counter is the answer when the device has it and it moved during the window (it
updates every few tens of ms, so very short windows fall back to the samples).

The reading is the whole GPU's: work of other processes or streams on the same device
during the window is included.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Self


@dataclass
class EnergyReading:
    joules: float | None  # energy of the window, J (None: not measured)
    seconds: float  # length of the window, s
    average_watts: float | None  # joules / seconds
    method: str | None  # "total_energy_counter", "power_samples" or None
    samples: int = 0  # power samples taken
    note: str | None = None  # why there is no reading, or a caveat

    def as_dict(self) -> dict:
        out = asdict(self)
        for key in ("joules", "average_watts"):
            if out[key] is not None:
                out[key] = round(out[key], 6)
        out["seconds"] = round(out["seconds"], 6)
        return out


def unmeasured(seconds: float, note: str) -> EnergyReading:
    return EnergyReading(None, seconds, None, None, 0, note)


def _bus_key(bus_id) -> tuple[int, int, int, int] | None:
    """'0000:18:00.0' or '00000000:18:00.0' (str or bytes) -> (domain, bus, device, function)."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    try:
        domain, bus, rest = str(bus_id).strip().lower().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


class EnergyMeter:
    """Energy of one device between start() and stop() (also a context manager; the
    reading is then in `.reading`). The device is found by its PCI bus id (as CUDA and
    cupy.cuda.Device(i).pci_bus_id give it), else by `index` in NVML's order."""

    def __init__(self, pci_bus_id: str | None = None, index: int | None = None, interval_s: float = 0.01):
        self.pci_bus_id, self.index, self.interval_s = pci_bus_id, index, interval_s
        self.reading: EnergyReading | None = None
        self._nvml: Any = None  # the pynvml module once NVML started
        self._handle: Any = None
        self._note: str | None = None
        self._counter_start: int | None = None
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ NVML --

    def _open(self) -> None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            self._note = "pynvml is not installed (pip install nvidia-ml-py): no energy reading"
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # no driver, no library: no reading
            self._note = f"NVML could not start: {exc}"
            return
        self._nvml = nvml
        try:
            self._handle = self._find(nvml)
        except Exception as exc:
            self._note = f"NVML could not find the device: {exc}"
        if self._handle is None:
            self._note = self._note or f"no NVML device has PCI bus id {self.pci_bus_id!r}"
            self._close()

    def _find(self, nvml):
        wanted = _bus_key(self.pci_bus_id) if self.pci_bus_id else None
        if wanted is not None:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                if _bus_key(nvml.nvmlDeviceGetPciInfo(handle).busId) == wanted:
                    return handle
            return None
        return nvml.nvmlDeviceGetHandleByIndex(self.index or 0)

    def _close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # shutting down a broken NVML: nothing left to do
                self._nvml.nvmlShutdown()
        self._nvml = self._handle = None

    def _counter(self) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # NVMLError_NotSupported on devices without the counter
            return None

    def _power_w(self) -> float | None:
        try:
            return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except Exception:
            return None

    def _sample(self) -> None:
        watts = self._power_w()
        if watts is not None:
            self._samples.append((time.perf_counter(), watts))

    def _sampler(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    # ---------------------------------------------------------------- window --

    def start(self) -> None:
        self._open()
        if self._handle is not None:
            self._counter_start = self._counter()
            self._sample()
            self._thread = threading.Thread(target=self._sampler, name="nvml-power", daemon=True)
            self._thread.start()
        self._t0 = time.perf_counter()

    def stop(self) -> EnergyReading:
        seconds = time.perf_counter() - self._t0
        if self._handle is None:
            self.reading = unmeasured(seconds, self._note or "no NVML device")
            return self.reading
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        counter_end = self._counter() if self._counter_start is not None else None
        self._sample()
        self._close()
        self.reading = self._result(seconds, counter_end)
        return self.reading

    def _result(self, seconds: float, counter_end: int | None) -> EnergyReading:
        samples = len(self._samples)
        if self._counter_start is not None and counter_end is not None and counter_end > self._counter_start:
            joules = (counter_end - self._counter_start) / 1000.0
            return EnergyReading(
                joules, seconds, joules / seconds if seconds > 0 else None, "total_energy_counter", samples
            )
        if samples >= 2:
            times = [t for t, _ in self._samples]
            watts = [w for _, w in self._samples]
            joules = sum((times[i + 1] - times[i]) * (watts[i + 1] + watts[i]) / 2 for i in range(samples - 1))
            span = times[-1] - times[0]
            note = None
            if self._counter_start is not None:
                note = "the energy counter did not move during this short window: integrated power samples instead"
            return EnergyReading(joules, span, joules / span if span > 0 else None, "power_samples", samples, note)
        return unmeasured(seconds, "the device reports neither an energy counter nor its power")
