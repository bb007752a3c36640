"""The NumPy reference of the stencil job (gpu/stencil/reference.py): the Ricker source,
the 4th-order Laplacian, one step against the formula in float64, and the physics:
arrival times at d / v, reflections at 2 z / v with the sign of the reflection
coefficient, energy conservation and boundedness at the CFL limit, the sponge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu.stencil import reference as ref
from gpu.stencil.params import CFL_LIMIT, ConstantModel, LayeredModel, StencilParams


def random_fields(rng: np.random.Generator, shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(p^0, p^-1): standard normal in the interior, 0 on the 2-cell border."""
    fields = []
    for _ in range(2):
        p = np.zeros(shape, np.float32)
        p[2:-2, 2:-2, 2:-2] = rng.standard_normal(tuple(n - 4 for n in shape))
        fields.append(p)
    return fields[0], fields[1]


def peak_time(trace: np.ndarray, dt: float) -> float:
    """Time (s) of the trace's largest value, parabolically interpolated; row n is (n+1) dt."""
    k = int(np.argmax(trace))
    assert 0 < k < trace.size - 1, "the peak is at the end of the trace"
    y0, y1, y2 = (float(v) for v in trace[k - 1 : k + 2])
    return (k + 1 + 0.5 * (y0 - y2) / (y0 - 2 * y1 + y2)) * dt


# ------------------------------------------------------------------ the source --


def test_ricker_shape(rng):
    f0 = float(rng.uniform(5, 40))
    peak = 1 / f0
    assert ref.ricker(peak, f0) == pytest.approx(1.0)
    zeros = peak + np.array([-1, 1]) / (math.pi * f0 * math.sqrt(2))
    np.testing.assert_allclose(ref.ricker(zeros, f0), 0, atol=1e-12)
    troughs = peak + np.array([-1, 1]) * math.sqrt(1.5) / (math.pi * f0)
    np.testing.assert_allclose(ref.ricker(troughs, f0), -2 * math.exp(-1.5), rtol=1e-12)
    dt = 1 / (200 * f0)
    t = np.arange(0, 6 / f0, dt)
    w = ref.ricker(t, f0)
    assert t[np.argmax(w)] == pytest.approx(peak, abs=dt)
    assert w.min() == pytest.approx(-2 * math.exp(-1.5), rel=1e-4)
    assert abs(w.sum()) < 1e-3 * np.abs(w).sum()  # zero mean (but for the tail before t = 0): no static offset
    spectrum = np.abs(np.fft.rfft(w, 64 * w.size))
    frequencies = np.fft.rfftfreq(64 * w.size, dt)
    assert frequencies[np.argmax(spectrum)] == pytest.approx(f0, rel=0.01)


def test_source_amplitudes_are_dt2_v2_ricker(rng):
    v = float(rng.uniform(1500, 4000))
    params = StencilParams(nx=9, ny=9, nz=9, h=10.0, steps=50, f0=15.0, model=ConstantModel(v))
    a = ref.source_amplitudes(params)
    assert a.dtype == np.float32 and a.shape == (50,)
    expected = params.dt**2 * v**2 * ref.ricker(np.arange(50) * params.dt, 15.0)
    np.testing.assert_allclose(a, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())


# ---------------------------------------------------------------- the operator --


def test_laplacian4_is_exact_on_quintics_and_fourth_order(rng):
    h = float(rng.uniform(0.5, 2))
    z, y, x = np.meshgrid(*(np.arange(n) * h for n in (9, 11, 13)), indexing="ij")
    coefficients = rng.standard_normal((3, 6)) / 10
    poly = sum(np.polyval(c, axis) for c, axis in zip(coefficients, (x, y, z), strict=True))
    exact = sum(np.polyval(np.polyder(c, 2), axis) for c, axis in zip(coefficients, (x, y, z), strict=True))
    np.testing.assert_allclose(
        ref.laplacian4(poly, h), exact[2:-2, 2:-2, 2:-2], rtol=1e-7, atol=1e-7 * np.abs(exact).max()
    )

    errors = []
    for n in (16, 32):  # sin(2 pi x) sin(2 pi y) sin(2 pi z) on [0, 1]^3: Lap = -12 pi^2 f
        grid_h = 1.0 / (n - 1)
        axis = np.arange(n) * grid_h
        f = (
            np.sin(2 * np.pi * axis)[:, None, None]
            * np.sin(2 * np.pi * axis)[None, :, None]
            * np.sin(2 * np.pi * axis)[None, None, :]
        )
        errors.append(np.abs(ref.laplacian4(f, grid_h) + 12 * np.pi**2 * f[2:-2, 2:-2, 2:-2]).max())
    assert 12 < errors[0] / errors[1] < 20  # ~16: 4th order


def test_one_step_is_the_formula(rng):
    """A step from random fields, with the source and a sponge, against the formula in float64."""
    params = StencilParams(
        nx=17, ny=13, nz=11, h=10.0, steps=1, f0=12.0, model=LayeredModel((0.0, 45.0), (1800.0, 2600.0)), sponge=3
    )
    p0, p_prev = random_fields(rng, params.shape)
    shot = ref.simulate(params, initial=(p0, p_prev))
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


def test_sponge_profile(rng):
    width = int(rng.integers(2, 6))
    params = StencilParams(nx=31, ny=27, nz=25, h=10.0, steps=1, f0=10.0, model=ConstantModel(2000.0), sponge=width)
    eta = ref.damping(params)
    inner = eta[2:-2, 2:-2, 2:-2]
    core = (slice(2 + width, -2 - width),) * 3
    assert not eta[core].any(), "damping beyond the sponge"
    assert inner.min() >= 0
    edge = eta[params.nz // 2, params.ny // 2, 2:-2]  # along x through the middle: one axis only
    assert edge[0] == pytest.approx(params.eta_max, rel=1e-6) and edge[-1] == edge[0]
    assert np.all(np.diff(edge[: width + 1]) < 0), "eta must fall towards the inside"
    np.testing.assert_array_equal(edge, edge[::-1])
    assert inner[0, 0, 0] == pytest.approx(3 * params.eta_max, rel=1e-6)  # a corner: three axes
    assert ref.damping(StencilParams(nx=9, ny=9, nz=9, h=1.0, steps=1, f0=1.0, model=ConstantModel(1.0))) is None


# ------------------------------------------------------------------- physics --


def test_first_arrival_comes_at_d_over_v_within_a_cell(rng):
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
    record = ref.simulate(params).record
    for j, d in enumerate(distances):
        arrival = peak_time(record[:, j], dt) - 1 / f0  # the Ricker peaks 1/f0 after t = 0
        assert abs(arrival - d / v) <= h / v, (
            f"receiver {receivers[j]} at {d:.0f} m: arrival {arrival:.5f} s, d / v = {d / v:.5f} s"
        )


@pytest.mark.parametrize("v2", [3000.0, 1200.0])
def test_a_reflection_arrives_at_two_way_time_with_the_sign_of_r(v2):
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
        return ref.simulate(params).record[:, 0]

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


def test_energy_is_conserved_and_bounded_at_the_cfl_limit(rng):
    """Dirichlet walls, no sponge, dt at exactly the largest stable step: 1000 steps from
    random fields keep the discrete energy (to rounding) and stay bounded; 10% more dt
    diverges (so the check can fail)."""
    shape = (16, 18, 20)
    params = StencilParams(
        nx=20,
        ny=18,
        nz=16,
        h=10.0,
        steps=1000,
        f0=10.0,
        model=ConstantModel(2000.0),
        dt=CFL_LIMIT * 10.0 / 2000.0,
        snapshot_every=0,
    )
    assert params.cfl == CFL_LIMIT
    p0, p_prev = random_fields(rng, shape)
    c = params.cfl**2
    inner = (slice(2, -2),) * 3

    def energy(now, before):
        now, before = now.astype(np.float64), before.astype(np.float64)
        return ((now - before) ** 2).sum() - c * (ref.laplacian4(now, 1.0) * before[inner]).sum()

    def run(scale: float) -> tuple[ref.Propagator, np.ndarray]:
        prop = ref.Propagator(params, initial=(p0, p_prev))
        prop.amplitudes[:] = 0
        prop.c *= np.float32(scale)
        peaks = np.empty(params.steps)
        with np.errstate(over="ignore", invalid="ignore"):
            for n in range(params.steps):
                prop.step(n)
                peaks[n] = np.abs(prop.p).max()
        return prop, peaks

    prop, peaks = run(1.0)
    start = energy(p0, p_prev)
    end = energy(prop.p.reshape(shape), prop.pp.reshape(shape))
    assert np.isfinite(peaks).all()
    assert abs(end - start) <= 1e-4 * start
    assert peaks[-500:].max() <= 2 * peaks[:100].max()
    _, unstable = run(1.1**2)
    assert not np.isfinite(unstable[-1]) or unstable[-1] > 1e6 * peaks.max()


def test_a_shot_at_the_cfl_limit_stays_bounded():
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
    shot = ref.simulate(params)
    assert np.isfinite(shot.record).all() and np.isfinite(shot.field).all()
    loudest = np.abs(shot.record).max()
    assert 0 < np.abs(shot.record[-200:]).max() <= loudest


def test_the_sponge_absorbs_what_dirichlet_walls_reflect():
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
        result = ref.simulate(params)
        t = (np.arange(params.steps) + 1) * params.dt
        late = t > 1 / params.f0 + 50.0 / 2000.0 + 0.08  # after the direct wavelet has passed the receiver
        trace = result.record[:, 0].astype(np.float64)
        return (result.field.astype(np.float64) ** 2).sum(), (trace[late] ** 2).sum(), (trace[~late] ** 2).sum()

    walls, sponge = shot(0), shot(10)
    assert sponge[0] < 0.05 * walls[0], "energy left in the box after the wave reached the walls"
    assert sponge[1] < 0.3 * walls[1], "reflected energy at the receiver"
    assert sponge[2] == pytest.approx(walls[2], rel=0.1), "the direct wave must be untouched"


def test_snapshots_and_record_are_the_field(rng):
    params = StencilParams(
        nx=15, ny=13, nz=12, h=10.0, steps=9, f0=20.0, model=ConstantModel(2000.0), snapshot_every=4, source=(7, 6, 5)
    )
    p0, p_prev = random_fields(rng, params.shape)
    shot = ref.simulate(params, initial=(p0, p_prev))
    assert [s.step for s in shot.snapshots] == [4, 8]
    again = ref.simulate(
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


def test_initial_fields_must_have_a_zero_border(rng):
    params = StencilParams(nx=9, ny=9, nz=9, h=1.0, steps=1, f0=1.0, model=ConstantModel(1.0))
    p0, p_prev = random_fields(rng, params.shape)
    p0[0, 4, 4] = 1
    with pytest.raises(ValueError, match="border"):
        ref.simulate(params, initial=(p0, p_prev))
    with pytest.raises(ValueError, match="float32"):
        ref.simulate(params, initial=(p_prev.astype(np.float64), p_prev))


def test_coefficients_by_slab_are_the_whole(rng):
    velocity = rng.uniform(1500, 4000, (13, 9, 10)).astype(np.float32)
    whole = ref.coefficients(velocity, 1e-3, 10.0)
    slabs = np.concatenate([ref.coefficients(velocity[z : z + 5], 1e-3, 10.0, z, 13) for z in range(0, 13, 5)])
    np.testing.assert_array_equal(slabs, whole)
    inner = (slice(2, -2),) * 3
    np.testing.assert_array_equal(whole[inner], ((velocity.astype(np.float64) * 1e-4) ** 2).astype(np.float32)[inner])
    whole[inner] = 0
    assert not whole.any()


def test_initial_fields_are_checked_border_by_border(rng):
    """A random interior with an exact zero border always passes (the check once compared
    sums over the whole field and its inside, which rounding could tell apart); a value on
    any border slab, or a NaN anywhere, does not."""
    shape = (19, 27, 45)
    r = ref.RADIUS
    for _ in range(50):
        p = np.zeros(shape, np.float32)
        p[r:-r, r:-r, r:-r] = rng.standard_normal((shape[0] - 2 * r, shape[1] - 2 * r, shape[2] - 2 * r))
        ref.check_initial(p, shape, "p")
    for index in [(0, 10, 10), (18, 10, 10), (10, 1, 10), (10, 25, 10), (10, 10, 0), (10, 10, 44)]:
        bad = np.zeros(shape, np.float32)
        bad[index] = 1e-30
        with pytest.raises(ValueError, match="Dirichlet border"):
            ref.check_initial(bad, shape, "p")
    nan = np.zeros(shape, np.float32)
    nan[9, 9, 9] = np.nan
    with pytest.raises(ValueError, match="finite"):
        ref.check_initial(nan, shape, "p")
