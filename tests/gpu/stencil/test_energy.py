"""The NVML energy meter (gpu/stencil/energy.py) against a fake pynvml: the total-energy
counter when the device has it, integrated power samples when it has not (or when the
counter did not move), the device found by PCI bus id, and a None reading (never an
error) without pynvml or a driver."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from gpu.stencil.energy import EnergyMeter, _bus_key


class FakeNvml(types.ModuleType):
    """Two devices; the second one's counter and power are scripted by the test."""

    class NVMLError(Exception):
        pass

    def __init__(
        self, counter: bool = True, watts: float = 250.0, counter_step_mj: int = 1000, fail_init: bool = False
    ):
        super().__init__("pynvml")
        self.counter, self.watts, self.counter_step_mj, self.fail_init = counter, watts, counter_step_mj, fail_init
        self.energy_mj = 10_000_000
        self.calls: list[str] = []
        self.open = 0
        self.lock = threading.Lock()
        self.buses = [b"00000000:18:00.0", b"00000000:9A:00.0"]

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetCount(self):
        return len(self.buses)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, handle):
        return types.SimpleNamespace(busId=self.buses[handle])

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.calls.append(f"energy {handle}")
        if not self.counter:
            raise self.NVMLError("Not Supported")
        with self.lock:
            self.energy_mj += self.counter_step_mj
            return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle):
        self.calls.append(f"power {handle}")
        return int(self.watts * 1000)


@pytest.fixture
def fake(monkeypatch):
    def install(**options) -> FakeNvml:
        module = FakeNvml(**options)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def test_bus_ids_compare_across_formats():
    assert _bus_key("0000:9a:00.0") == _bus_key(b"00000000:9A:00.0") == (0, 0x9A, 0, 0)
    assert _bus_key("garbage") is None


def test_the_total_energy_counter(fake):
    nvml = fake(counter=True, counter_step_mj=7500)
    meter = EnergyMeter("0000:9a:00.0", interval_s=0.001)
    meter.start()
    reading = meter.stop()
    assert reading.method == "total_energy_counter" and reading.joules == pytest.approx(7.5)
    assert reading.average_watts == pytest.approx(7.5 / reading.seconds)
    assert "energy 1" in nvml.calls and "energy 0" not in nvml.calls  # the device of that bus id
    assert nvml.open == 0  # NVML shut down again


def test_power_samples_when_there_is_no_counter(fake):
    nvml = fake(counter=False, watts=312.5)
    with EnergyMeter("0000:18:00.0", interval_s=0.001) as meter:
        threading.Event().wait(0.03)
    reading = meter.reading
    assert reading.method == "power_samples" and reading.samples >= 2
    assert reading.average_watts == pytest.approx(312.5)
    assert reading.joules == pytest.approx(312.5 * reading.seconds)
    assert set(nvml.calls) == {"energy 0", "power 0"}
    assert nvml.open == 0


def test_a_counter_that_did_not_move_falls_back_to_samples(fake):
    fake(counter=True, counter_step_mj=0, watts=100.0)
    with EnergyMeter("0000:18:00.0", interval_s=0.001) as meter:
        threading.Event().wait(0.01)
    assert meter.reading.method == "power_samples" and "did not move" in meter.reading.note
    assert meter.reading.average_watts == pytest.approx(100.0)


def test_without_pynvml_the_reading_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    reading = EnergyMeter("0000:18:00.0").__enter__().stop()
    assert reading.joules is None and reading.method is None and "nvidia-ml-py" in reading.note
    assert reading.as_dict()["joules"] is None


def test_without_a_driver_or_device_the_reading_is_none(fake):
    fake(fail_init=True)
    reading = EnergyMeter("0000:18:00.0").__enter__().stop()
    assert reading.joules is None and "Driver Not Loaded" in reading.note
    nvml = fake()
    reading = EnergyMeter("0000:01:00.0").__enter__().stop()
    assert reading.joules is None and "0000:01:00.0" in reading.note
    assert nvml.open == 0
