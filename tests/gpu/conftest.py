"""Fixtures of the CUDA tests (each such module skips itself without a device; these import
CuPy only when used): `poison`, gpu.kernels.POISON on for the module; `pool`, a DevicePool
per module, built with the keyword arguments of the module's `pool` mark (default: every
device, 4 streams each); `lease`, one of its leases held for a test, with its device and
stream current."""

from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "pool(**kwargs): gpu.pool.DevicePool arguments of the module's `pool` fixture")


@pytest.fixture(scope="module")
def poison():
    from gpu import kernels

    kernels.POISON = True
    yield
    kernels.POISON = False


@pytest.fixture(scope="module")
def pool(request):
    from gpu.pool import DevicePool

    mark = request.node.get_closest_marker("pool")
    return DevicePool(**(mark.kwargs if mark else {}))


@pytest.fixture
def lease(pool):
    import cupy

    with pool.lease() as held, cupy.cuda.Device(held.device), held.stream:
        yield held
        held.stream.synchronize()
