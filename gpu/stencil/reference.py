"""Isotropic acoustic waves with constant density in a 3D box (Pavan et al. 2018), in
NumPy: the definition of correct, and the CPU backend of the stencil job.

    p(t + dt) = 2 p(t) - p(t - dt) + (v dt)^2 Lap4 p(t) + dt^2 v^2 w(t) at the source

Lap4 is the 4th-order 13-point Laplacian, along each axis (-1/12, 4/3, -5/2, 4/3, -1/12) / h^2.
p = 0 on the outer 2 cells of every face (Dirichlet; never updated). The source is a
Ricker wavelet w(t) = (1 - 2 r^2) exp(-r^2), r = pi f0 (t - 1/f0). An optional sponge of
W cells inside the border solves p_tt + 2 sigma p_t = v^2 Lap p there (central
differences), with eta = sigma dt growing quadratically towards the border. Or, instead,
a convolutional PML of W cells (gpu/stencil/cpml.py): memory variables psi, zeta per axis
in its layers add sum_axes (D1 psi + zeta) to h^2 Lap4 p there.

Time: p^0 = p^-1 = 0; step n (0-based) makes p^(n+1), the field at time (n + 1) dt, from
w(n dt). Row n of the shot record is p^(n+1) at the receivers.

Arithmetic is float32, each operation rounded as written (no fused multiply-add), in
the order of gpu/stencil/stencil.cu, so that the CUDA kernels agree with this bit for bit
(on normal floats; the GPU flushes subnormals: gpu/stencil/cuda.py):

    s1  = ((((p[x-1] + p[x+1]) + p[y-1]) + p[y+1]) + p[z-1]) + p[z+1]     (s2: distance 2)
    lap = (C0 p + C1 s1) + C2 s2              C0 = -15/2, C1 = 4/3, C2 = -1/12   (= h^2 Lap4 p)
    num = (2 p - (1 - eta) p_prev) + c lap    c = (v dt / h)^2 per point
    num = num + a_n at the source             a_n = float32(dt^2 v_src^2 w(n dt))
    p_next = num / (1 + eta)                  (num itself where eta = 0)
    eta = eta_max ((fx^2 + fy^2) + fz^2),     f = (W - d) / W for d < W cells from the border, else 0
    CPML: num = (2 p - p_prev) + c (lap + e),  e = (e_x + e_y) + e_z  (cpml.py; 0 outside its layers)

The stepping works on flat arrays: every neighbour of the interior points is a constant
offset (1, nx, nx ny), so each term is one contiguous slice. The border cells inside that
flat range are computed too, and stay exactly 0 because their coefficient c is 0.
`Propagator` takes an array module, so the same code on CuPy arrays is the benchmark's
"CuPy slicing" anchor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpu.stencil.cpml import CpmlLayers
from gpu.stencil.params import RADIUS, StencilParams

C0 = np.float32(-7.5)  # 3 axes x (-5/2)
C1 = np.float32(4.0 / 3.0)
C2 = np.float32(-1.0 / 12.0)
WEIGHTS = (-1.0 / 12.0, 4.0 / 3.0, -5.0 / 2.0, 4.0 / 3.0, -1.0 / 12.0)  # per axis, offsets -2..2


def ricker(t, f0: float):
    """The Ricker wavelet (1 - 2 r^2) exp(-r^2), r = pi f0 (t - 1/f0): peak 1 at t = 1/f0,
    zero mean, spectrum peaking at f0. t in s (scalar or array), float64."""
    r2 = (math.pi * f0 * (np.asarray(t, np.float64) - 1.0 / f0)) ** 2
    return (1.0 - 2.0 * r2) * np.exp(-r2)


def laplacian4(p: np.ndarray, h: float) -> np.ndarray:
    """Lap4 p (1/m^2 times p's unit) on the interior, as a (nz-4, ny-4, nx-4) float64
    array: the readable definition, per axis sum_k WEIGHTS[k] p[i + k - 2] / h^2."""
    p = np.asarray(p, np.float64)
    nz, ny, nx = p.shape
    inner = (slice(RADIUS, nz - RADIUS), slice(RADIUS, ny - RADIUS), slice(RADIUS, nx - RADIUS))
    out = np.zeros(tuple(n - 2 * RADIUS for n in p.shape))
    for axis in range(3):
        for k, weight in enumerate(WEIGHTS):
            index = list(inner)
            n = p.shape[axis]
            index[axis] = slice(k, n - 2 * RADIUS + k)
            out += weight * p[tuple(index)]
    return out / (h * h)


def coefficients(velocity: np.ndarray, dt: float, h: float, z0: int = 0, nz: int | None = None) -> np.ndarray:
    """c = (v dt / h)^2 per point, float32 of velocity's shape (computed in float64 and
    rounded once, a plane at a time); 0 on the Dirichlet border, which is what keeps the
    border at 0. `velocity` may be planes z0 .. of a grid of nz planes (default: all)."""
    velocity = np.asarray(velocity)
    planes = velocity.shape[0]
    nz = planes if nz is None else nz
    c = np.empty(velocity.shape, np.float32)
    scale = dt / h
    for k in range(planes):
        c[k] = (velocity[k].astype(np.float64) * scale) ** 2
        if not RADIUS <= z0 + k < nz - RADIUS:
            c[k] = 0
    c[:, :RADIUS] = 0
    c[:, -RADIUS:] = 0
    c[:, :, :RADIUS] = 0
    c[:, :, -RADIUS:] = 0
    return c


def source_amplitudes(params: StencilParams) -> np.ndarray:
    """a_n = dt^2 v_src^2 w(n dt) for n = 0 .. steps-1, (steps,) float32 (v_src: the
    model's float32 velocity at the source)."""
    v = params.model.velocity_at(*params.source, params.h)
    return (params.dt**2 * v**2 * ricker(np.arange(params.steps) * params.dt, params.f0)).astype(np.float32)


def axis_ramp(n: int, width: int) -> np.ndarray:
    """(n,) float32: (W - d) / W for the interior cells within W of the border (d = 0 at
    the first interior cell), 0 elsewhere (deeper inside, and on the border itself)."""
    ramp = np.zeros(n, np.float32)
    if width == 0:
        return ramp
    i = np.arange(RADIUS, n - RADIUS)
    d = np.minimum(i - RADIUS, n - 1 - RADIUS - i)
    near = d < width
    ramp[i[near]] = np.float32(width) - d[near].astype(np.float32)
    ramp[i[near]] /= np.float32(width)
    return ramp


def ramp_table(nx: int, ny: int, nz: int, width: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """The CUDA kernels' sponge profile, float32: axis_ramp of x (nx values), of y (ny) and of
    the z planes [lo, hi) (default all), concatenated. The kernels read fx, fy, fz from it
    (bit-identical with damping below, and no division on the GPU)."""
    return np.concatenate(
        [axis_ramp(nx, width), axis_ramp(ny, width), axis_ramp(nz, width)[lo : nz if hi is None else hi]]
    )


def damping(params: StencilParams) -> np.ndarray | None:
    """eta = sigma dt of the sponge, (nz, ny, nx) float32, or None without a sponge."""
    if params.sponge == 0:
        return None
    fx, fy, fz = (axis_ramp(n, params.sponge) for n in (params.nx, params.ny, params.nz))
    fx2, fy2, fz2 = fx * fx, fy * fy, fz * fz
    return np.float32(params.eta_max) * ((fx2[None, None, :] + fy2[None, :, None]) + fz2[:, None, None])


@dataclass
class Snapshot:
    step: int  # the field at time step * dt
    xz: np.ndarray  # (nz, nx) float32: the vertical section through the source
    xy: np.ndarray  # (ny, nx) float32: the horizontal section at the source's depth


@dataclass
class Shot:
    record: np.ndarray  # (steps, receivers) float32: row n is p at time (n + 1) dt
    snapshots: list[Snapshot] = field(default_factory=list)
    field: np.ndarray | None = None  # (nz, ny, nx) float32: p at the last step
    previous: np.ndarray | None = None  # (nz, ny, nx) float32: p one step before


def flat_range(params: StencilParams) -> tuple[int, int]:
    """[lo, hi): the flat indices from the first interior point to the last."""
    nx, ny, nz = params.nx, params.ny, params.nz
    plane = nx * ny
    lo = RADIUS * plane + RADIUS * nx + RADIUS
    hi = (nz - 1 - RADIUS) * plane + (ny - 1 - RADIUS) * nx + (nx - 1 - RADIUS) + 1
    return lo, hi


def check_initial(p: np.ndarray, shape: tuple[int, int, int], name: str) -> np.ndarray:
    """An initial field: (nz, ny, nx) float32, finite, exactly 0 on the Dirichlet border."""
    p = np.asarray(p)
    if p.shape != shape or p.dtype != np.float32:
        raise ValueError(f"{name} must be a {shape} float32 array, got {p.shape} {p.dtype}")
    if not np.isfinite(np.sum(p, dtype=np.float64)):  # a NaN or infinity anywhere (float32 cannot overflow it)
        raise ValueError(f"{name} must be finite")
    # the six border slabs, as views: comparing sums over the whole and the inside would
    # differ by rounding (summed in other orders) with a border of exact zeros
    r = RADIUS
    slabs = (p[:r], p[-r:], p[:, :r], p[:, -r:], p[:, :, :r], p[:, :, -r:])
    if any(np.any(slab) for slab in slabs):
        raise ValueError(f"{name} must be 0 on the {RADIUS}-cell Dirichlet border")
    return np.ascontiguousarray(p)


class Propagator:
    """The leapfrog state of one shot on flat arrays of the array module `xp` (NumPy; CuPy
    for the benchmark's slicing anchor): p (now) and pp (previous), swapped each step.

    initial: optional (p^0, p^-1), each (nz, ny, nx) float32 with a zero border (tests
    start from random fields); default zeros. c: optional flat coefficients (v dt / h)^2
    of module xp (0 on the border) instead of those of the velocity (benchmarks).
    """

    def __init__(
        self,
        params: StencilParams,
        velocity: np.ndarray | None = None,
        xp=np,
        initial: tuple[np.ndarray, np.ndarray] | None = None,
        c=None,
    ):
        self.params, self.xp = params, xp
        nx, ny = params.nx, params.ny
        self.offsets = (1, nx, nx * ny)
        self.lo, self.hi = flat_range(params)
        length = self.hi - self.lo
        if c is None:
            velocity = params.velocity() if velocity is None else velocity
            c = xp.asarray(coefficients(velocity, params.dt, params.h).ravel())
        self.c = c
        self.amplitudes = source_amplitudes(params)
        x, y, z = params.source
        self.source = (z * ny + y) * nx + x - self.lo
        self.receivers = xp.asarray(np.array([(z * ny + y) * nx + x for x, y, z in params.receivers], np.int64))
        eta = damping(params)
        self.one_minus_eta = self.one_plus_eta = None
        if eta is not None:
            self.one_minus_eta = xp.asarray((np.float32(1) - eta).ravel()[self.lo : self.hi])
            self.one_plus_eta = xp.asarray((np.float32(1) + eta).ravel()[self.lo : self.hi])
        self.cpml = CpmlLayers(params, xp) if params.cpml else None
        self.cpml_terms = xp.zeros(params.points, np.float32) if params.cpml else None  # e, whole-grid
        if initial is None:
            self.p = xp.zeros(params.points, np.float32)
            self.pp = xp.zeros(params.points, np.float32)
        else:
            self.p = xp.asarray(check_initial(initial[0], params.shape, "p^0").ravel().copy())
            self.pp = xp.asarray(check_initial(initial[1], params.shape, "p^-1").ravel().copy())
        self.s1 = xp.empty(length, np.float32)
        self.s2 = xp.empty(length, np.float32)
        self.t = xp.empty(length, np.float32)

    def step(self, n: int) -> None:
        """p^(n+1) from p^n and p^(n-1), with the source term a_n; then swap."""
        xp, p, pp, lo, hi = self.xp, self.p, self.pp, self.lo, self.hi
        s1, s2, t = self.s1, self.s2, self.t
        for ring, out in ((1, s1), (2, s2)):
            first = True
            for offset in self.offsets:
                d = ring * offset
                if first:
                    xp.add(p[lo - d : hi - d], p[lo + d : hi + d], out=out)
                    first = False
                else:
                    xp.add(out, p[lo - d : hi - d], out=out)
                    xp.add(out, p[lo + d : hi + d], out=out)
        centre, prev = p[lo:hi], pp[lo:hi]
        xp.multiply(centre, C0, out=t)
        xp.multiply(s1, C1, out=s1)
        xp.add(t, s1, out=t)
        xp.multiply(s2, C2, out=s2)
        xp.add(t, s2, out=t)  # h^2 Lap4 p
        if self.cpml is not None and self.cpml_terms is not None:  # both with a CPML
            shape = self.params.shape
            self.cpml.update_psi(p.reshape(shape))
            self.cpml.add_terms(p.reshape(shape), self.cpml_terms.reshape(shape))
            xp.add(t, self.cpml_terms[lo:hi], out=t)  # + 0 outside the layers: lap unchanged
        xp.multiply(t, self.c[lo:hi], out=t)
        xp.add(centre, centre, out=s1)
        if self.one_minus_eta is not None:
            xp.multiply(self.one_minus_eta, prev, out=s2)
            xp.subtract(s1, s2, out=s1)
        else:
            xp.subtract(s1, prev, out=s1)
        xp.add(s1, t, out=prev)  # p^(n+1) overwrites p^(n-1)
        k = self.source
        prev[k : k + 1] += self.amplitudes[n]
        if self.one_plus_eta is not None:
            xp.divide(prev, self.one_plus_eta, out=prev)
        self.p, self.pp = pp, p

    def sample(self):
        """p at the receivers, (receivers,) float32 array of module xp."""
        return self.p[self.receivers]

    def field(self):
        """p as a (nz, ny, nx) view."""
        return self.p.reshape(self.params.shape)


def simulate(
    params: StencilParams,
    velocity: np.ndarray | None = None,
    checkpoint: Callable[[int], None] | None = None,
    initial: tuple[np.ndarray, np.ndarray] | None = None,
) -> Shot:
    """Run the shot on the CPU. `checkpoint(steps_done)` is called after every step (it
    may raise to stop the run). Returns the record, the snapshots at params.snapshot_steps
    and the last two fields."""
    prop = Propagator(params, velocity, np, initial)
    record = np.empty((params.steps, len(params.receivers)), np.float32)
    snapshots: list[Snapshot] = []
    at = set(params.snapshot_steps)
    _, y, z = params.source
    for n in range(params.steps):
        prop.step(n)
        record[n] = prop.sample()
        if n + 1 in at:
            f = prop.field()
            snapshots.append(Snapshot(n + 1, f[:, y, :].copy(), f[z, :, :].copy()))
        if checkpoint is not None:
            checkpoint(n + 1)
    return Shot(record, snapshots, prop.field().copy(), prop.pp.reshape(params.shape).copy())
