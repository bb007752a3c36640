"""The GPU pool as the service sees it, without a GPU: the pool gauges of
`Metrics.watch_pool` (directly and on GET /metrics), PoolBusy and DeviceOutOfMemory
answered as 503 JSON with Retry-After by POST /sketch, /healthz's "gpus" and "workers",
and create_app's wiring of a (fake-runtime) DevicePool for the CUDA backend."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest
from pencil_testkit import assert_api_error, metric_value, photo_bytes, sketch_files
from prometheus_client import generate_latest

import app.main
import gpu
import gpu.pencil
from app.config import Settings
from app.metrics import Metrics
from gpu.backend import Backend, BackendUnavailable
from gpu.pool import DeviceOutOfMemory, DevicePool, PoolBusy


class FakeOutOfMemory(Exception):
    pass


class FakeStream:
    def synchronize(self) -> None:
        pass


class FakeRuntime:
    """CupyRuntime's calls on `count` pretend 8 GiB devices, `used` bytes in use each."""

    OutOfMemoryError = FakeOutOfMemory

    def __init__(self, count: int = 1, used: int = 0):
        self.count, self.used = count, used

    def device_count(self):
        return self.count

    def describe(self, device):
        return f"Fake GPU {device}", 8 << 30

    def new_stream(self, device, urgent=False):
        return FakeStream()

    def cap_memory(self, device, fraction):
        pass

    def memory(self, device):
        return self.used, 0

    def free_cached(self, lease):
        pass


def scrape(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


# ------------------------------------------------------------------------ metrics --


def test_pool_gauges_follow_the_pool():
    pool = DevicePool(streams_per_device=2, runtime=FakeRuntime(count=2, used=4096))
    metrics = Metrics()
    metrics.watch_pool(pool)
    text = scrape(metrics)
    for device in ("0", "1"):
        assert metric_value(text, "pencil_gpu_leases", device=device) == 2
        assert metric_value(text, "pencil_gpu_leases_in_use", device=device) == 0
        assert metric_value(text, "pencil_gpu_memory_used_bytes", device=device) == 4096
        assert metric_value(text, "pencil_gpu_memory_cap_bytes", device=device) == 8 << 30
        assert metric_value(text, "pencil_gpu_leases_granted_total", device=device) == 0
    assert metric_value(text, "pencil_gpu_lease_waiting") == 0

    leases = [pool.acquire(timeout=0) for _ in range(4)]
    waiter_done = threading.Event()

    def wait_for_a_lease():
        pool.release(pool.acquire(timeout=2))
        waiter_done.set()

    waiter = threading.Thread(target=wait_for_a_lease)
    waiter.start()
    try:
        deadline = time.monotonic() + 2
        text = scrape(metrics)
        while metric_value(text, "pencil_gpu_lease_waiting") == 0:
            assert not waiter_done.is_set(), "the waiter got a lease that was not free"
            assert time.monotonic() < deadline, "the waiter never showed in the gauge"
            text = scrape(metrics)
        assert metric_value(text, "pencil_gpu_lease_waiting") == 1
        assert metric_value(text, "pencil_gpu_leases_in_use", device="0") == 2
        assert metric_value(text, "pencil_gpu_leases_granted_total") == 4
    finally:
        for lease in leases:
            pool.release(lease)
        waiter.join(2)
    text = scrape(metrics)
    assert metric_value(text, "pencil_gpu_lease_waiting") == 0
    assert metric_value(text, "pencil_gpu_leases_in_use") == 0
    assert metric_value(text, "pencil_gpu_leases_granted_total") == 5


# ------------------------------------------------------------------ error mapping --


@pytest.mark.parametrize(
    ("error", "code"),
    [(PoolBusy("x"), "overloaded"), (DeviceOutOfMemory("x"), "gpu_out_of_memory")],
)
def test_pool_errors_answer_503_and_the_server_keeps_serving(make_client, monkeypatch, error, code):
    client = make_client(raise_server_exceptions=False)

    def failing_draw(data, photo, params, fmt, quality, backend="cpu", pool=None):
        raise error

    monkeypatch.setattr(gpu.pencil, "draw_bytes", failing_draw)
    files = sketch_files(photo_bytes(width=64))
    response = client.post("/sketch", files=files)
    detail = assert_api_error(response, 503, code, client)["detail"]
    assert "GPU" in detail  # the pool's answer, not the render queue's
    assert int(response.headers["retry-after"]) >= 1
    text = client.get("/metrics").text
    assert metric_value(text, "pencil_rejected_requests_total", code=code) == 1

    monkeypatch.undo()
    response = client.post("/sketch", files=files)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/png"


# ------------------------------------------------------------------------ healthz --


def test_healthz_on_the_cpu_backend(make_client):
    body = make_client(workers=3).get("/healthz").json()
    assert body["backend"] == "cpu"
    assert body["gpus"] == []
    assert body["workers"] == 3


# ------------------------------------------------ create_app with a CUDA backend --


@pytest.fixture
def fake_cuda(monkeypatch) -> list[int]:
    """create_app sees two CUDA devices; its DevicePool runs on a FakeRuntime; and
    renders run on a pool lease but compute on the CPU. Returns the devices whose kernels
    were loaded (gpu.kernels.load_all, stubbed: there is no CuPy)."""
    backend = Backend("cuda", ["0: Fake GPU 0", "1: Fake GPU 1"])
    monkeypatch.setattr(app.main, "select_backend", lambda requested: backend)
    monkeypatch.setattr(
        app.main,
        "DevicePool",
        lambda *args, **kwargs: DevicePool(*args, runtime=FakeRuntime(2), **kwargs),
    )
    monkeypatch.setattr(gpu.pencil, "warm_up", lambda backend="cpu", pool=None: None)
    cpu_draw = gpu.pencil.draw_bytes

    def draw_on_a_lease(data, photo, params, fmt, quality, backend="cpu", pool=None):
        return pool.run(lambda lease: cpu_draw(data, photo, params, fmt, quality, "cpu"))

    monkeypatch.setattr(gpu.pencil, "draw_bytes", draw_on_a_lease)
    loaded: list[int] = []
    kernels = types.ModuleType("gpu.kernels")
    kernels.load_all = lambda device: loaded.append(device) or 0.01  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpu.kernels", kernels)
    monkeypatch.setattr(gpu, "kernels", kernels, raising=False)
    return loaded


def settings(tmp_path, **values) -> Settings:
    """Settings without `workers` unless given (as if PENCIL_WORKERS were not set)."""
    return Settings(data_dir=tmp_path / "data", log_level="warning", **values)


def test_cuda_app_builds_the_pool_of_the_chosen_devices(fake_cuda, tmp_path):
    application = app.main.create_app(settings(tmp_path, backend="cuda", devices="1", streams=3))
    assert application.state.pool.device_ids == [1]
    assert application.state.backend.devices == ["1: Fake GPU 1"]
    assert application.state.workers == 3  # one render thread per lease


@pytest.mark.parametrize(("index", "home"), [(0, 0), (1, 1), (2, 0), (5, 1)])
def test_each_of_several_processes_renders_on_its_home_gpu(fake_cuda, tmp_path, index, home):
    application = app.main.create_app(settings(tmp_path, backend="cuda", processes=4, process_index=index))
    assert application.state.pool.device_ids == [home]
    assert application.state.backend.devices == [f"{home}: Fake GPU {home}"]


def test_the_process_running_the_jobs_takes_the_jobs_memory_share(fake_cuda, tmp_path):
    from fastapi.testclient import TestClient

    application = app.main.create_app(
        settings(tmp_path, backend="cuda", processes=4, process_index=1, admin_token="jobs-on")
    )
    assert application.state.pool.memory_fraction == pytest.approx(0.9 * 0.5 / 2)  # 2 processes render on each card
    with TestClient(application):
        assert application.state.job_runner.leading
        assert application.state.pool.memory_fraction == pytest.approx(0.9 * 0.5)


def test_the_process_running_the_jobs_loads_every_kernel_on_each_gpu_in_the_background(fake_cuda, tmp_path):
    from fastapi.testclient import TestClient

    loaded = fake_cuda
    application = app.main.create_app(settings(tmp_path, backend="cuda", processes=1, admin_token="jobs-on"))
    with TestClient(application):
        deadline = time.monotonic() + 10
        while len(loaded) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert application.state.job_runner.leading and loaded == [0, 1]


def test_a_lone_process_pools_every_gpu(fake_cuda, tmp_path):
    assert app.main.create_app(
        settings(tmp_path, backend="cuda", processes=1, process_index=0)
    ).state.pool.device_ids == [0, 1]
    assert app.main.home_devices(Settings(devices="1", processes=4, process_index=3), 2) == ([1], 4)
    assert app.main.home_devices(Settings(processes=6, process_index=3), 2) == ([1], 3)


def test_cuda_app_reports_the_pool(fake_cuda, make_client):
    client = make_client(backend="cuda", streams=2, workers=5)
    health = client.get("/healthz").json()
    assert health["workers"] == 5  # an explicit PENCIL_WORKERS wins
    assert [row["device"] for row in health["gpus"]] == [0, 1]
    assert health["gpus"][0]["leases"] == 2

    response = client.post("/sketch", files=sketch_files(photo_bytes(width=64)))
    assert response.status_code == 200, response.text
    assert response.headers["x-backend"] == "cuda"
    text = client.get("/metrics").text
    assert metric_value(text, "pencil_gpu_leases", device="1") == 2
    assert metric_value(text, "pencil_gpu_leases_granted_total") == 1
    assert metric_value(text, "pencil_gpu_leases_in_use") == 0


def test_pool_that_cannot_be_built(fake_cuda, tmp_path):
    with pytest.raises(BackendUnavailable, match="pool"):
        app.main.create_app(settings(tmp_path, backend="cuda", devices="5"))
    fallback = app.main.create_app(settings(tmp_path, backend="auto", devices="5"))
    assert fallback.state.backend.name == "cpu"
    assert fallback.state.pool is None
