"""The convolutional PML (CPML) of the stencil job, for the second-order acoustic equation
in pressure form (after Pasalic & McGarry 2010; the profile of Komatitsch & Martin 2007).

Inside a layer of W cells along an axis, d/dx becomes (1 / s_x) d/dx with the complex
frequency-shifted stretch s_x = 1 + d_x / (alpha_x + i omega). Applied twice and written with
recursive convolutions, per axis:

    psi^n  = b psi^(n-1)  + a D1 p^n                      (the inner 1 / s_x)
    zeta^n = b zeta^(n-1) + a (D2 p^n + D1 psi^n)         (the outer one)
    p^(n+1) = 2 p^n - p^(n-1) + c (h^2 Lap4 p^n + sum over the axes of (D1 psi^n + zeta^n))

with, along the axis, D1 f = (8 (f[+1] - f[-1]) - (f[+2] - f[-2])) / 12 (h df/dx, 4th order)
and D2 p = -5/2 p + 4/3 (p[-1] + p[+1]) - 1/12 (p[-2] + p[+2]) (h^2 d2p/dx2, the Laplacian's
own term of that axis). psi and zeta are scaled by h and h^2 (dimensionless D1, D2; no
division by h anywhere). Both are 0 outside the axis's layers (a = 0 there: nothing is
computed); D1 psi reads 0 beyond them.

Profile: a cell at distance d (cells) from the first interior cell lies in the layer when
d < W, at depth f = (W - d) / W (1 at the Dirichlet border, 1 / W at the inner edge):
damping d(f) = d0 f^3 with d0 = 4 v_max ln(1 / R) / (2 W h) (R = CPML_REFLECTION, the
reflection of the continuous layer at normal incidence; the cubic onset and R = 1e-3
reflect least: BENCHMARKS.md, "Absorbing boundaries"), alpha(f) = pi f0 (1 - f) (a
frequency shift that keeps the layer absorbing at low frequencies, largest at the inner
edge), b = exp(-(d + alpha) dt), a = d (b - 1) / (d + alpha). Computed in float64, rounded
once to float32.

Arithmetic is float32, operation by operation as written below and in stencil.cu (no
fused multiply-add), so that the CUDA kernels agree with this bit for bit. psi and zeta
are kept from one step to the next as bfloat16 (rounded to nearest, ties to even:
`to_bfloat16`): a step uses its own psi^n and zeta^n in float32 and stores them rounded.
Two bytes a value halve what the layers add to a step's memory traffic (BENCHMARKS.md);
the reflection stays far under the target (tests/gpu/stencil/test_cpml.py). This module
holds psi and zeta as whole-grid float32 arrays of bfloat16 values (the readable
definition; the CPU backend's grids are small); the CUDA path keeps them only in the
layers, both of a cell in one 32-bit word (cuda.py, StencilParams.cpml_slabs).
"""

from __future__ import annotations

import math

import numpy as np

from gpu.stencil.params import RADIUS, StencilParams

CPML_REFLECTION = 1e-3  # reflection of the continuous layer at normal incidence (d0's target)
PROFILE_POWER = 3  # d(f) = d0 f^3
D1_EIGHT = np.float32(8.0)
D1_SCALE = np.float32(1.0 / 12.0)
D2_CENTRE = np.float32(-2.5)
D2_ONE = np.float32(4.0 / 3.0)
D2_TWO = np.float32(-1.0 / 12.0)
AXES = ("x", "y", "z")
ARRAY_AXIS = {"x": 2, "y": 1, "z": 0}  # (nz, ny, nx) arrays


def to_bfloat16(values):
    """float32 array -> float32 array of the nearest bfloat16 values (ties to even), by
    the bit arithmetic of stencil.cu's `bfloat16`: keep the top 16 bits after adding
    0x7fff plus the lowest kept bit; a NaN keeps its top bits, made quiet. Works on NumPy
    and CuPy arrays."""
    bits = values.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
    return np.where(nan, quiet, rounded).view(np.float32)  # np.where dispatches to CuPy for CuPy arrays


def depth(n: int, width: int) -> np.ndarray:
    """(n,) float64: the depth f = (W - d) / W in the layer of each cell along an axis of n
    points (d: cells from the first interior cell, the nearer face), 0 outside the layers
    and on the Dirichlet border."""
    f = np.zeros(n)
    if width == 0:
        return f
    i = np.arange(RADIUS, n - RADIUS)
    d = np.minimum(i - RADIUS, n - 1 - RADIUS - i)
    near = d < width
    f[i[near]] = (width - d[near]) / width
    return f


def axis_profile(n: int, params: StencilParams) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) along an axis of n points, each (n,) float32; a = b = 0 outside the layers."""
    width = params.cpml
    f = depth(n, width)
    inside = f > 0
    d0 = (PROFILE_POWER + 1) * params.v_max * math.log(1.0 / CPML_REFLECTION) / (2.0 * width * params.h)
    damping = d0 * f**PROFILE_POWER
    alpha = math.pi * params.f0 * (1.0 - f)
    b = np.where(inside, np.exp(-(damping + alpha) * params.dt), 0.0)
    a = np.where(inside, damping * (b - 1.0) / np.where(inside, damping + alpha, 1.0), 0.0)
    return a.astype(np.float32), b.astype(np.float32)


def profile_table(params: StencilParams) -> np.ndarray:
    """The CUDA kernels' profile, float32 (a, b) pairs: of x (nx pairs), y (ny), z (nz)
    (axis_profile, so bit-identical with the reference)."""
    profiles = [axis_profile(n, params) for n in (params.nx, params.ny, params.nz)]
    return np.concatenate([np.column_stack(pair).ravel() for pair in profiles])


def layers(n: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two layers along an axis of n points: [lo, hi) cell ranges at either face."""
    return (RADIUS, RADIUS + width), (n - RADIUS - width, n - RADIUS)


def _shifted(region: tuple[slice, ...], dim: int, k: int) -> tuple[slice, ...]:
    out = list(region)
    out[dim] = slice(region[dim].start + k, region[dim].stop + k)
    return tuple(out)


def d1(f: np.ndarray, region: tuple[slice, ...], dim: int) -> np.ndarray:
    """D1 f on `region` along array dimension `dim`: (8 (f[+1] - f[-1]) - (f[+2] - f[-2])) / 12."""
    near = f[_shifted(region, dim, 1)] - f[_shifted(region, dim, -1)]
    far = f[_shifted(region, dim, 2)] - f[_shifted(region, dim, -2)]
    return (D1_EIGHT * near - far) * D1_SCALE


def d2(p: np.ndarray, region: tuple[slice, ...], dim: int) -> np.ndarray:
    """D2 p on `region` along `dim`: (-5/2 p + 4/3 (p[-1] + p[+1])) - 1/12 (p[-2] + p[+2])."""
    one = p[_shifted(region, dim, -1)] + p[_shifted(region, dim, 1)]
    two = p[_shifted(region, dim, -2)] + p[_shifted(region, dim, 2)]
    return (D2_CENTRE * p[region] + D2_ONE * one) + D2_TWO * two


class CpmlLayers:
    """The memory variables psi and zeta of the three axes, whole-grid (nz, ny, nx)
    float32 arrays of module xp holding bfloat16 values between steps (0 outside each
    axis's layers), and the profile."""

    def __init__(self, params: StencilParams, xp=np):
        self.xp = xp
        shape = params.shape
        interior = tuple(slice(RADIUS, n - RADIUS) for n in shape)
        self.parts = []  # (dim, region, a, b) per axis and face, in the order x, y, z
        for axis, n in zip(AXES, (params.nx, params.ny, params.nz), strict=True):
            dim = ARRAY_AXIS[axis]
            a, b = axis_profile(n, params)
            broadcast: list[slice | None] = [None, None, None]
            broadcast[dim] = slice(None)
            for lo, hi in layers(n, params.cpml):
                region = list(interior)
                region[dim] = slice(lo, hi)
                self.parts.append(
                    (dim, tuple(region), xp.asarray(a[lo:hi][tuple(broadcast)]), xp.asarray(b[lo:hi][tuple(broadcast)]))
                )
        self.psi = [xp.zeros(shape, np.float32) for _ in AXES]
        self.zeta = [xp.zeros(shape, np.float32) for _ in AXES]

    def update_psi(self, p: np.ndarray) -> None:
        """psi^n = b psi^(n-1) + a D1 p^n in every layer, in float32 (p: p^n, (nz, ny, nx))."""
        for dim, region, a, b in self.parts:
            psi = self.psi[2 - dim]
            psi[region] = b * psi[region] + a * d1(p, region, dim)

    def add_terms(self, p: np.ndarray, out: np.ndarray) -> None:
        """zeta^n = b zeta^(n-1) + a (D2 p + D1 psi^n), and out = (e_x + e_y) + e_z with
        e = D1 psi^n + zeta^n in the axis's layers (0 elsewhere), all in float32; then psi^n
        and zeta^n are kept as bfloat16. out: (nz, ny, nx) float32, left 0 outside the
        layers; call update_psi first."""
        for _, region, _, _ in self.parts:
            out[region] = 0
        for dim, region, a, b in self.parts:
            psi, zeta = self.psi[2 - dim], self.zeta[2 - dim]
            g = d1(psi, region, dim)
            z = b * zeta[region] + a * (d2(p, region, dim) + g)
            zeta[region] = to_bfloat16(z)
            out[region] += g + z
        for k, psi in enumerate(self.psi):
            self.psi[k] = to_bfloat16(psi)
