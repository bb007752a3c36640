"""The physics of a shot, each test written once and run on both backends of the stencil
job: the NumPy reference (gpu/stencil/reference.py, the CPU backend) and the CUDA kernels
(gpu/stencil/cuda.py, the variant a job runs by default; marker `gpu`, skipped without a
device). One step against the formula in float64, arrival times at d / v, reflections at
2 z / v with the sign of the reflection coefficient, a shot at the CFL limit stays bounded,
the sponge, snapshots and record, the initial fields' border. Fresh random seeds (printed).

The CUDA kernels against the reference on the same inputs, variant by variant, are in
test_cuda.py (and on an emulation of the kernels, on the CPU, in test_emulated.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu.backend import cuda_devices
from gpu.stencil import reference as ref
from gpu.stencil.params import CFL_LIMIT, ConstantModel, LayeredModel, StencilParams
from tests.gpu.stencil.fields import random_fields

pytestmark = pytest.mark.pool(streams_per_device=2)

ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]


@pytest.fixture(params=["numpy", pytest.param("cuda", marks=ON_CUDA)])
def simulate(request):
    """simulate(params, initial=None) -> reference.Shot on the backend of the test's id:
    `numpy`, reference.simulate; `cuda`, cuda.simulate on a lease (params.variant)."""
    if request.param == "numpy":
        return ref.simulate
    from gpu.stencil import cuda

    lease = request.getfixturevalue("lease")

    def on_the_gpu(params: StencilParams, initial: tuple[np.ndarray, np.ndarray] | None = None) -> ref.Shot:
        return cuda.simulate(lease, params, initial=initial, measure_energy=False).shot

    return on_the_gpu


def peak_time(trace: np.ndarray, dt: float) -> float:
    """Time (s) of the trace's largest value, parabolically interpolated; row n is (n+1) dt."""
    k = int(np.argmax(trace))
    assert 0 < k < trace.size - 1, "the peak is at the end of the trace"
    y0, y1, y2 = (float(v) for v in trace[k - 1 : k + 2])
    return (k + 1 + 0.5 * (y0 - y2) / (y0 - 2 * y1 + y2)) * dt


def test_one_step_is_the_formula(simulate, rng):
    """A step from random fields, with the source and a sponge, against the formula in float64."""
    params = StencilParams(
        nx=17, ny=13, nz=11, h=10.0, steps=1, f0=12.0, model=LayeredModel((0.0, 45.0), (1800.0, 2600.0)), sponge=3
    )
    p0, p_prev = random_fields(rng, params.shape)
    shot = simulate(params, initial=(p0, p_prev))
    inner = (slice(2, -2),) * 3
    c = ref.coefficients(params.velocity(), params.dt, params.h).astype(np.float64)[inner]
    eta = ref.damping(params).astype(np.float64)[inner]
    num = 2 * p0[inner] - (1 - eta) * p_prev[inner] + c * ref.laplacian4(p0, params.h) * params.h**2
    x, y, z = params.source
    num[z - 2, y - 2, x - 2] += ref.source_amplitudes(params)[0]
    expected = num / (1 + eta)
    np.testing.assert_allclose(shot.field[inner], expected, rtol=0, atol=2e-6 * np.abs(expected).max())
    border = shot.field.copy()
    border[inner] = 0
    assert not border.any(), "the Dirichlet border changed"
    np.testing.assert_array_equal(shot.previous, p0)
    receivers = np.array(params.receivers)
    np.testing.assert_array_equal(shot.record[0], shot.field[receivers[:, 2], receivers[:, 1], receivers[:, 0]])


def test_first_arrival_comes_at_d_over_v_within_a_cell(simulate, rng):
    v = float(rng.uniform(1500, 3000))
    h = 10.0
    f0 = v / (2.5 * 6 * h)  # 6 points per shortest wavelength
    n = 64
    centre = n // 2
    offsets = [
        (15, 0, 0),
        (0, -14, 0),
        (0, 0, 13),
        (-9, 9, -9),
        (int(rng.integers(6, 12)), int(rng.integers(-8, 8)), 0),
    ]
    receivers = [(centre + dx, centre + dy, centre + dz) for dx, dy, dz in offsets]
    distances = [h * math.dist(r, (centre,) * 3) for r in receivers]
    dt = 0.4 * h / v
    steps = int((1 / f0 + max(distances) / v + 0.6 / f0) / dt) + 1
    params = StencilParams(
        nx=n,
        ny=n,
        nz=n,
        h=h,
        steps=steps,
        f0=f0,
        model=ConstantModel(v),
        dt=dt,
        source=(centre,) * 3,
        receivers=receivers,
        snapshot_every=0,
    )
    record = simulate(params).record
    for j, d in enumerate(distances):
        arrival = peak_time(record[:, j], dt) - 1 / f0  # the Ricker peaks 1/f0 after t = 0
        assert abs(arrival - d / v) <= h / v, (
            f"receiver {receivers[j]} at {d:.0f} m: arrival {arrival:.5f} s, d / v = {d / v:.5f} s"
        )


@pytest.mark.parametrize("v2", [3000.0, 1200.0])
def test_a_reflection_arrives_at_two_way_time_with_the_sign_of_r(simulate, v2):
    """Layered minus constant medium leaves the reflection from the interface: a Ricker of
    sign R = (v2 - v1) / (v2 + v1) peaking at the two-way time, within a cell."""
    v1, h, f0, dt = 2000.0, 10.0, 10.0, 0.0015
    source, receiver, interface = (24, 24, 16), (28, 24, 16), 355.0  # planes z >= 36 are below

    def record(model):
        params = StencilParams(
            nx=48,
            ny=48,
            nz=64,
            h=h,
            steps=220,
            f0=f0,
            model=model,
            dt=dt,
            source=source,
            receivers=[receiver],
            snapshot_every=0,
        )
        return simulate(params).record[:, 0]

    constant = record(ConstantModel(v1))
    reflection = record(LayeredModel((0.0, interface), (v1, v2))) - constant
    sign = np.sign(v2 - v1)
    path = math.hypot(
        2 * (35.5 * h - source[2] * h), (receiver[0] - source[0]) * h
    )  # the interface lies between planes 35 and 36
    arrival = peak_time(sign * reflection, dt) - 1 / f0
    assert abs(arrival - path / v1) <= h / v1, f"reflection at {arrival:.4f} s, two-way time {path / v1:.4f} s"
    r = (v2 - v1) / (v2 + v1)
    expected = abs(r) * constant.max() * (h * 4) / path  # image source: R / path against the direct wave's 1 / 40 m
    strongest = reflection[np.argmax(np.abs(reflection))]
    assert np.sign(strongest) == sign
    assert 0.7 * expected <= abs(strongest) <= 1.3 * expected


def test_a_shot_at_the_cfl_limit_stays_bounded(simulate):
    params = StencilParams(
        nx=24,
        ny=22,
        nz=20,
        h=10.0,
        steps=1000,
        f0=25.0,
        model=LayeredModel((0.0, 100.0), (1500.0, 3000.0)),
        dt=CFL_LIMIT * 10.0 / 3000.0,
        snapshot_every=0,
    )
    shot = simulate(params)
    assert np.isfinite(shot.record).all() and np.isfinite(shot.field).all()
    loudest = np.abs(shot.record).max()
    assert 0 < np.abs(shot.record[-200:]).max() <= loudest


def test_the_sponge_absorbs_what_dirichlet_walls_reflect(simulate):
    def shot(width):
        params = StencilParams(
            nx=48,
            ny=44,
            nz=40,
            h=10.0,
            steps=300,
            f0=10.0,
            model=ConstantModel(2000.0),
            source=(24, 22, 20),
            receivers=[(29, 22, 20)],
            sponge=width,
            snapshot_every=0,
        )
        result = simulate(params)
        t = (np.arange(params.steps) + 1) * params.dt
        late = t > 1 / params.f0 + 50.0 / 2000.0 + 0.08  # after the direct wavelet has passed the receiver
        trace = result.record[:, 0].astype(np.float64)
        return (result.field.astype(np.float64) ** 2).sum(), (trace[late] ** 2).sum(), (trace[~late] ** 2).sum()

    walls, sponge = shot(0), shot(10)
    assert sponge[0] < 0.05 * walls[0], "energy left in the box after the wave reached the walls"
    assert sponge[1] < 0.3 * walls[1], "reflected energy at the receiver"
    assert sponge[2] == pytest.approx(walls[2], rel=0.1), "the direct wave must be untouched"


def test_snapshots_and_record_are_the_field(simulate, rng):
    params = StencilParams(
        nx=15, ny=13, nz=12, h=10.0, steps=9, f0=20.0, model=ConstantModel(2000.0), snapshot_every=4, source=(7, 6, 5)
    )
    p0, p_prev = random_fields(rng, params.shape)
    shot = simulate(params, initial=(p0, p_prev))
    assert [s.step for s in shot.snapshots] == [4, 8]
    again = simulate(
        StencilParams(
            nx=15,
            ny=13,
            nz=12,
            h=10.0,
            steps=8,
            f0=20.0,
            model=ConstantModel(2000.0),
            snapshot_every=0,
            source=(7, 6, 5),
        ),
        initial=(p0, p_prev),
    )
    np.testing.assert_array_equal(shot.snapshots[1].xz, again.field[:, 6, :])
    np.testing.assert_array_equal(shot.snapshots[1].xy, again.field[5, :, :])
    np.testing.assert_array_equal(shot.record[:8], again.record)


def test_initial_fields_must_have_a_zero_border(simulate, rng):
    params = StencilParams(nx=9, ny=9, nz=9, h=1.0, steps=1, f0=1.0, model=ConstantModel(1.0))
    p0, p_prev = random_fields(rng, params.shape)
    p0[0, 4, 4] = 1
    with pytest.raises(ValueError, match="border"):
        simulate(params, initial=(p0, p_prev))
    with pytest.raises(ValueError, match="float32"):
        simulate(params, initial=(p_prev.astype(np.float64), p_prev))
