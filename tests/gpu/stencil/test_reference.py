"""The NumPy reference of the stencil job (gpu/stencil/reference.py): the Ricker source,
the 4th-order Laplacian, the sponge's profile, energy conservation and boundedness at the
CFL limit (on the reference's propagator), the coefficients by slab and the check of the
initial fields. The physics of a whole shot runs on both backends in test_backends.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu.stencil import reference as ref
from gpu.stencil.params import CFL_LIMIT, ConstantModel, StencilParams
from tests.gpu.stencil.fields import random_fields

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
