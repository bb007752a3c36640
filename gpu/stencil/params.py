"""Parameters of the stencil job (3D acoustic waves, Pavan et al. 2018), validated once and
shared by the NumPy reference and the CUDA kernels.

The grid has nx x ny x nz points at spacing h (m). Arrays are (nz, ny, nx) float32, x the
fastest axis; z is depth. Points (source, receivers) are (x, y, z) grid indices. The
outer RADIUS = 2 cells of every face are the Dirichlet border (p = 0 there, never
updated), so a source or receiver must lie in [2, n - 3] on each axis.

Velocity models: `ConstantModel`, `LayeredModel` (depths in m of the top of each layer,
the first at 0, and their velocities) or `ArrayModel` (an uploaded (nz, ny, nx) array of
m/s). Stability: the leapfrog scheme with the 4th-order Laplacian is stable for
v_max dt / h <= 0.5 (the CFL number); larger dt is refused, naming the largest stable dt.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import numpy as np
from pydantic import Field

from gpu.errors import InputError, ParamError
from gpu.jobs import npy_bytes
from gpu.npy import load_npy
from gpu.spec import InputFile, JobSpec, Result, check_int, spec, to_json

RADIUS = 2  # half-width of the 13-point stencil, and the Dirichlet border in cells
MIN_SIDE = 2 * RADIUS + 1  # one interior point
MAX_INDEX = 1 << 62  # grid indices given by a client: beyond any grid, within int64 arithmetic
CFL_LIMIT = 0.5  # v_max dt / h: leapfrog needs CFL^2 * max|h^2 Lap4 symbol| = CFL^2 * 3 * 16/3 <= 4
DEFAULT_CFL = 0.4  # dt when none is given: 0.8 of the largest stable step
MEMORIES = ("naive", "shared", "readonly")
MARCHES = ("", "_int_z", "_int_z_reg")
VARIANTS = tuple(memory + march for memory in MEMORIES for march in MARCHES)
Variant = Literal[
    "auto",
    "naive",
    "naive_int_z",
    "naive_int_z_reg",
    "shared",
    "shared_int_z",
    "shared_int_z_reg",
    "readonly",
    "readonly_int_z",
    "readonly_int_z_reg",
]
VARIANT_CHOICES: tuple[str, ...] = get_args(Variant)
assert VARIANT_CHOICES == ("auto", *VARIANTS)
MAX_STEPS = 1_000_000
MAX_RECEIVERS = 65_536
MAX_RECORD_VALUES = 1 << 27  # steps x receivers in the shot record (512 MiB of float32)
MAX_SNAPSHOTS = 100
MAX_LAYERS = 1024
MAX_VELOCITY = 100_000.0  # m/s: anything faster is a unit mistake
MIN_VELOCITY = 1.0  # m/s: anything slower too
MIN_SPACING, MAX_SPACING = 1e-6, 1e6  # h in m: from ultrasound cells to continental grids
MAX_F0 = 1e9  # Hz
MIN_PERIOD_STEPS, MAX_PERIOD_STEPS = (
    2.0,
    1e7,
)  # the Ricker period 1 / f0 in time steps: Nyquist, and a source that ever rises
MAX_INTERIOR_Z = 65_535  # one CUDA block row per interior plane (grid.z limit)
MAX_PLANE = ((1 << 31) - 1) // 5  # nx * ny: the kernels index a launch's planes (at least 5) with 32-bit integers
SPONGE_REFLECTION = 1e-3  # amplitude a wave keeps after crossing the sponge twice
Boundary = Literal["none", "sponge", "cpml"]
BOUNDARIES: tuple[str, ...] = get_args(Boundary)  # the request's `boundary`
ABSORBING_DEFAULT = "cpml"  # the layer a request gets from `boundary_width` alone (it reflects less: BENCHMARKS.md)
DEFAULT_BOUNDARY_WIDTH = 20  # cells, when `boundary` names a layer without a width (at most what the grid holds)
KERNEL_INDEX_MAX = (1 << 31) - 1  # the kernels index a launch's points and the CPML's layer cells with 32-bit ints
RICKER_BANDWIDTH = 2.5  # the Ricker spectrum is negligible above ~2.5 f0
GPU_BYTES_PER_POINT = 12  # p, p_prev (ping-pong) and the coefficient (v dt / h)^2, fp32
CPU_BYTES_PER_POINT = 28  # the same plus three flat work buffers and, with a sponge, 1 -+ eta
CPU_CPML_BYTES_PER_POINT = 28  # the reference's CPML: psi and zeta of 3 axes and the sum of its terms, whole-grid


def _positive(
    name: str,
    value,
    maximum: float | None = None,
    code: str = "invalid_parameter",
    minimum: float | None = None,
    unit: str = "",
) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ParamError(name, f"expected a finite number, got {value!r}", code)
    value = float(value)
    if value <= 0:
        raise ParamError(name, f"must be > 0; got {value}", code)
    if minimum is not None and value < minimum:
        raise ParamError(name, f"must be >= {minimum:g}{unit}; got {value:g}", code)
    if maximum is not None and value > maximum:
        raise ParamError(name, f"must be <= {maximum:g}{unit}; got {value:g}", code)
    return value


def _point(name: str, value, shape_xyz: tuple[int, int, int], code: str) -> tuple[int, int, int]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3:
        raise ParamError(name, f"expected [x, y, z] grid indices, got {value!r}")
    point = tuple(check_int(f"{name}[{axis}]", v, -MAX_INDEX, MAX_INDEX) for axis, v in zip("xyz", value, strict=True))
    for axis, v, n in zip("xyz", point, shape_xyz, strict=True):
        if not RADIUS <= v <= n - 1 - RADIUS:
            raise ParamError(
                name,
                f"{axis} = {v} is outside the grid's interior: {axis} must be in [{RADIUS}, {n - 1 - RADIUS}] "
                f"(the outer {RADIUS} cells are the Dirichlet border, n{axis} = {n})",
                code,
            )
    return point  # type: ignore[return-value]


# ------------------------------------------------------------------ velocity models --


@dataclass(frozen=True)
class ConstantModel:
    """One velocity (m/s) everywhere."""

    velocity: float

    def __post_init__(self) -> None:
        _positive("model.velocity", self.velocity, MAX_VELOCITY, "invalid_model", MIN_VELOCITY, " m/s")

    def v_range(self, nz: int, h: float) -> tuple[float, float]:
        return float(self.velocity), float(self.velocity)

    def build(self, nx: int, ny: int, nz: int, h: float, z0: int = 0, z1: int | None = None) -> np.ndarray:
        """(z1 - z0, ny, nx) float32: planes z0 .. z1-1 (default all nz)."""
        return np.full(((nz if z1 is None else z1) - z0, ny, nx), self.velocity, np.float32)

    def velocity_at(self, x: int, y: int, z: int, h: float) -> float:
        """The float32 velocity of point (x, y, z), as `build` holds it."""
        return float(np.float32(self.velocity))


@dataclass(frozen=True)
class LayeredModel:
    """Horizontal layers: layer i spans depths [depths[i], depths[i+1]) m with velocity
    velocities[i] m/s; depths[0] = 0 and depths increase. Plane z lies at depth z * h."""

    depths: tuple[float, ...]
    velocities: tuple[float, ...]

    def __post_init__(self) -> None:
        for name in ("depths", "velocities"):
            values = getattr(self, name)
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
                raise ParamError(f"model.{name}", f"expected a list of numbers, got {values!r}", "invalid_model")
            object.__setattr__(self, name, tuple(values))
        if not 1 <= len(self.depths) <= MAX_LAYERS:
            raise ParamError(
                "model.depths", f"expected 1 to {MAX_LAYERS} layer tops, got {len(self.depths)}", "invalid_model"
            )
        if len(self.velocities) != len(self.depths):
            raise ParamError(
                "model",
                f"{len(self.depths)} depths but {len(self.velocities)} velocities: give one velocity per layer",
                "invalid_model",
            )
        for i, depth in enumerate(self.depths):
            if isinstance(depth, bool) or not isinstance(depth, numbers.Real) or not math.isfinite(depth):
                raise ParamError(f"model.depths[{i}]", f"expected a finite number, got {depth!r}", "invalid_model")
        if self.depths[0] != 0:
            raise ParamError(
                "model.depths[0]", f"the first layer must start at depth 0, got {self.depths[0]}", "invalid_model"
            )
        for i in range(1, len(self.depths)):
            if not self.depths[i] > self.depths[i - 1]:
                raise ParamError(
                    f"model.depths[{i}]",
                    f"depths must increase: {self.depths[i]} follows {self.depths[i - 1]}",
                    "invalid_model",
                )
        for i, v in enumerate(self.velocities):
            _positive(f"model.velocities[{i}]", v, MAX_VELOCITY, "invalid_model", MIN_VELOCITY, " m/s")

    def _present(self, nz: int, h: float) -> tuple[float, ...]:
        """Velocities of the layers that reach into the grid (depths up to (nz - 1) h)."""
        bottom = (nz - 1) * h
        return tuple(v for d, v in zip(self.depths, self.velocities, strict=True) if d <= bottom)

    def v_range(self, nz: int, h: float) -> tuple[float, float]:
        present = self._present(nz, h)
        return float(min(present)), float(max(present))

    def layer_of_planes(self, nz: int, h: float) -> np.ndarray:
        """(nz,) index of the layer each plane z (depth z h) lies in."""
        return np.searchsorted(np.asarray(self.depths, np.float64), np.arange(nz) * h, side="right") - 1

    def build(self, nx: int, ny: int, nz: int, h: float, z0: int = 0, z1: int | None = None) -> np.ndarray:
        per_plane = np.asarray(self.velocities, np.float32)[self.layer_of_planes(nz, h)[z0:z1]]
        return np.ascontiguousarray(np.broadcast_to(per_plane[:, None, None], (per_plane.size, ny, nx)))

    def velocity_at(self, x: int, y: int, z: int, h: float) -> float:
        return float(np.float32(self.velocities[int(self.layer_of_planes(z + 1, h)[z])]))


@dataclass(frozen=True, eq=False)
class ArrayModel:
    """An uploaded velocity array (nz, ny, nx) in m/s; see `check_velocity_array`."""

    values: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", check_velocity_array(self.values))

    def v_range(self, nz: int, h: float) -> tuple[float, float]:
        return float(self.values.min()), float(self.values.max())

    def build(self, nx: int, ny: int, nz: int, h: float, z0: int = 0, z1: int | None = None) -> np.ndarray:
        return self.values[z0:z1]

    def velocity_at(self, x: int, y: int, z: int, h: float) -> float:
        return float(self.values[z, y, x])


def check_velocity_array(values) -> np.ndarray:
    """The model as a C-contiguous float32 (nz, ny, nx) array, or ParamError
    (code invalid_model): 3-D, float32 or float64, every value finite, > 0 and <= MAX_VELOCITY."""
    values = np.asarray(values)
    if values.ndim != 3:
        raise ParamError(
            "model", f"expected a 3-D array (nz, ny, nx) of velocities, got shape {values.shape}", "invalid_model"
        )
    if values.dtype.kind != "f" or values.dtype.itemsize not in (4, 8):
        raise ParamError("model", f"the array is {values.dtype}; send float32 velocities in m/s", "invalid_model")
    if any(n < MIN_SIDE for n in values.shape):
        raise ParamError(
            "model", f"shape {values.shape} (nz, ny, nx): every side needs at least {MIN_SIDE} points", "invalid_model"
        )
    values = np.ascontiguousarray(values, dtype=np.float32)
    finite = np.isfinite(values)
    if not finite.all():
        raise ParamError(
            "model", f"{values.size - int(np.count_nonzero(finite))} velocities are NaN or infinite", "invalid_model"
        )
    low, high = float(values.min()), float(values.max())
    if low < MIN_VELOCITY:
        raise ParamError(
            "model",
            f"{int(np.count_nonzero(values < MIN_VELOCITY))} velocities are below {MIN_VELOCITY:g} m/s "
            f"(smallest {low:g}); velocities are in m/s and positive",
            "invalid_model",
        )
    if high > MAX_VELOCITY:
        raise ParamError(
            "model",
            f"the largest velocity is {high:g} m/s, more than {MAX_VELOCITY:g}: are the units m/s?",
            "invalid_model",
        )
    return values


VelocityModel = ConstantModel | LayeredModel | ArrayModel


def receiver_line(start, end, count: int) -> tuple[tuple[int, int, int], ...]:
    """`count` receivers evenly spaced from `start` to `end` ([x, y, z] each, inclusive),
    rounded to the nearest grid point (duplicates kept: one trace each)."""
    count = check_int("receivers.count", count, 1, MAX_RECEIVERS)
    for name, point in (("receivers.start", start), ("receivers.end", end)):
        if isinstance(point, (str, bytes)) or not hasattr(point, "__len__") or len(point) != 3:
            raise ParamError(name, f"expected [x, y, z] grid indices, got {point!r}")
        for axis, v in zip("xyz", point, strict=True):
            check_int(f"{name}[{axis}]", v, -MAX_INDEX, MAX_INDEX)
    a, b = np.asarray(start, np.float64), np.asarray(end, np.float64)
    fractions = np.linspace(0.0, 1.0, count) if count > 1 else np.zeros(1)
    points = np.rint(a + fractions[:, None] * (b - a)).astype(np.int64)
    return tuple((int(x), int(y), int(z)) for x, y, z in points)


# ------------------------------------------------------------------------ the run --


@dataclass(frozen=True)
class StencilParams:
    """One shot, validated on construction (raises ParamError).

    nx, ny, nz: grid points; h: spacing (m); steps: time steps; f0: Ricker peak frequency
    (Hz); model: the velocities; dt: time step (s; default DEFAULT_CFL h / v_max);
    source: [x, y, z] (default the grid's centre); receivers: [x, y, z] points (default
    every interior x on the line through the source, thinned to MAX_RECEIVERS evenly
    spaced); sponge: width in cells of the damping sponge inside the Dirichlet border (0:
    none); cpml: width in cells of the convolutional PML there instead (gpu/stencil/cpml.py;
    0: none; not both); snapshot_every: wavefield
    snapshots every this many steps (default: 4 over the run; 0: none); variant: the CUDA
    kernel, or "auto" (the fastest on the device; the CPU runs the reference).
    """

    nx: int
    ny: int
    nz: int
    h: float
    steps: int
    f0: float
    model: VelocityModel
    # None asks for the default; __post_init__ resolves each, so a built StencilParams has them all.
    dt: float = None  # type: ignore[assignment]
    source: tuple[int, int, int] = None  # type: ignore[assignment]
    receivers: tuple[tuple[int, int, int], ...] = None  # type: ignore[assignment]
    sponge: int = 0
    cpml: int = 0
    snapshot_every: int | None = None
    variant: str = "auto"
    v_min: float = field(init=False, default=0.0)
    v_max: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        for name in ("nx", "ny", "nz"):
            check_int(name, getattr(self, name), MIN_SIDE)
        if self.nz - 2 * RADIUS > MAX_INTERIOR_Z:
            raise ParamError(
                "nz", f"must be <= {MAX_INTERIOR_Z + 2 * RADIUS}; got {self.nz} (put the longest axis in x)"
            )
        if self.nx * self.ny > MAX_PLANE:
            raise ParamError(
                "nx",
                f"nx * ny must be at most {MAX_PLANE} (5 planes within 2^31 points); got {self.nx} * {self.ny} "
                f"= {self.nx * self.ny}",
            )
        _positive("h", self.h, MAX_SPACING, minimum=MIN_SPACING, unit=" m")
        check_int("steps", self.steps, 1, MAX_STEPS)
        _positive("f0", self.f0, MAX_F0, unit=" Hz")
        if not isinstance(self.model, (ConstantModel, LayeredModel, ArrayModel)):
            raise ParamError(
                "model",
                f"expected a constant, layered or array model, got {type(self.model).__name__}",
                "invalid_model",
            )
        if isinstance(self.model, ArrayModel) and self.model.values.shape != self.shape:
            raise ParamError(
                "model",
                f"the array has shape {self.model.values.shape} (nz, ny, nx) but the grid is nz, ny, nx = {self.shape}",
                "invalid_model",
            )
        v_min, v_max = self.model.v_range(self.nz, self.h)
        object.__setattr__(self, "v_min", v_min)
        object.__setattr__(self, "v_max", v_max)
        if self.dt is None:
            object.__setattr__(self, "dt", DEFAULT_CFL * self.h / v_max)
        dt = _positive("dt", self.dt)
        per_step = self.f0 * dt  # periods of the source per time step
        if not 1.0 / MAX_PERIOD_STEPS <= per_step <= 1.0 / MIN_PERIOD_STEPS:
            period_steps = 1.0 / per_step if per_step > 0 else math.inf
            raise ParamError(
                "f0",
                f"the source's period 1 / f0 is {period_steps:.3g} time steps of dt = {dt:g} s; it must span "
                f"{MIN_PERIOD_STEPS:g} to {MAX_PERIOD_STEPS:g} steps (f0 from "
                f"{1 / (MAX_PERIOD_STEPS * dt):.3g} to {1 / (MIN_PERIOD_STEPS * dt):.3g} Hz at this dt)",
            )
        if self.cfl > CFL_LIMIT:
            raise ParamError(
                "dt",
                f"dt = {self.dt:g} s is unstable: v_max dt / h = {v_max:g} * {self.dt:g} / {self.h:g} = "
                f"{self.cfl:.4g} > {CFL_LIMIT}; the largest stable dt is {self.dt_max:.6g} s",
                "cfl_violation",
            )
        shape_xyz = (self.nx, self.ny, self.nz)
        source = (self.nx // 2, self.ny // 2, self.nz // 2) if self.source is None else self.source
        source = _point("source", source, shape_xyz, "source_outside_grid")
        object.__setattr__(self, "source", source)
        if self.receivers is None:  # every interior x on the source's line, at most MAX_RECEIVERS evenly spread
            interior = self.nx - 2 * RADIUS
            xs = (
                range(RADIUS, self.nx - RADIUS)
                if interior <= MAX_RECEIVERS
                else np.linspace(RADIUS, self.nx - 1 - RADIUS, MAX_RECEIVERS).round().astype(int).tolist()
            )
            receivers = tuple((x, source[1], source[2]) for x in xs)
        else:
            if isinstance(self.receivers, (str, bytes)) or not hasattr(self.receivers, "__len__"):
                raise ParamError("receivers", f"expected a list of [x, y, z] points, got {self.receivers!r}")
            if not 1 <= len(self.receivers) <= MAX_RECEIVERS:
                raise ParamError("receivers", f"expected 1 to {MAX_RECEIVERS} receivers, got {len(self.receivers)}")
            receivers = tuple(
                _point(f"receivers[{i}]", r, shape_xyz, "receiver_outside_grid") for i, r in enumerate(self.receivers)
            )
        object.__setattr__(self, "receivers", receivers)
        if self.steps * len(receivers) > MAX_RECORD_VALUES:
            raise ParamError(
                "receivers",
                f"the shot record would hold steps x receivers = {self.steps} x {len(receivers)} values, more "
                f"than {MAX_RECORD_VALUES:,}",
            )
        max_layer = self.max_boundary_width
        check_int("sponge", self.sponge, 0, max_layer)
        check_int("boundary_width", self.cpml, 0, max_layer)  # the request's name for the CPML's width
        if self.sponge and self.cpml:
            raise ParamError("boundary", f"a sponge ({self.sponge} cells) or a CPML ({self.cpml} cells), not both")
        if self.cpml and self.points > KERNEL_INDEX_MAX:  # the CPML's kernels run without z slabs
            raise ParamError(
                "boundary",
                f"the CPML runs grids of at most {KERNEL_INDEX_MAX:,} points; this one has {self.points:,} "
                "(use the sponge)",
            )
        if self.cpml and sum(self.cpml_slabs) > KERNEL_INDEX_MAX:
            raise ParamError(
                "boundary_width",
                f"a CPML of {self.cpml} cells keeps {sum(self.cpml_slabs):,} memory cells, more than the kernels "
                f"index ({KERNEL_INDEX_MAX:,}): use a narrower layer",
            )
        if self.snapshot_every is None:
            object.__setattr__(self, "snapshot_every", -(-self.steps // 4))
        check_int("snapshot_every", self.snapshot_every, 0)
        if len(self.snapshot_steps) > MAX_SNAPSHOTS:
            raise ParamError(
                "snapshot_every",
                f"{self.snapshot_every} gives {len(self.snapshot_steps)} snapshots over {self.steps} steps; at "
                f"most {MAX_SNAPSHOTS} (use >= {-(-self.steps // MAX_SNAPSHOTS)})",
            )
        if not isinstance(self.variant, str) or self.variant not in VARIANT_CHOICES:
            raise ParamError("variant", f"must be one of {', '.join(VARIANT_CHOICES)}; got {self.variant!r}")

    # ------------------------------------------------------------- derived values --

    @property
    def shape(self) -> tuple[int, int, int]:
        """Array shape (nz, ny, nx)."""
        return (self.nz, self.ny, self.nx)

    @property
    def points(self) -> int:
        return self.nx * self.ny * self.nz

    @property
    def interior_points(self) -> int:
        """Points updated each step (all but the Dirichlet border)."""
        return (self.nx - 2 * RADIUS) * (self.ny - 2 * RADIUS) * (self.nz - 2 * RADIUS)

    @property
    def max_boundary_width(self) -> int:
        """The widest absorbing layer the grid holds: half the interior of its shortest axis."""
        return (min(self.nx, self.ny, self.nz) - 2 * RADIUS) // 2

    @property
    def cpml_slabs(self) -> tuple[int, int, int]:
        """Cells of the CUDA path's CPML memory (psi, and zeta alike) per axis, kept only in
        the layers: x as (nz-4, ny-4, 2W), y as (nz-4, 2W, nx-4), z as (2W, ny-4, nx-4),
        stored one after the other; (0, 0, 0) without a CPML."""
        two_w = 2 * self.cpml
        ix, iy, iz = (n - 2 * RADIUS for n in (self.nx, self.ny, self.nz))
        return iz * iy * two_w, iz * two_w * ix, two_w * iy * ix

    @property
    def boundary(self) -> str:
        """'sponge', 'cpml' or 'none'."""
        return "sponge" if self.sponge else "cpml" if self.cpml else "none"

    @property
    def boundary_width(self) -> int:
        """Cells of the absorbing layer inside the Dirichlet border (0: none)."""
        return self.sponge or self.cpml

    @property
    def cfl(self) -> float:
        """The Courant number v_max dt / h (stable up to CFL_LIMIT)."""
        return self.v_max * self.dt / self.h

    @property
    def dt_max(self) -> float:
        """The largest stable time step, s."""
        return CFL_LIMIT * self.h / self.v_max

    @property
    def points_per_wavelength(self) -> float:
        """Grid points per shortest wavelength (v_min / (2.5 f0)); below ~5 the 4th-order
        stencil disperses visibly."""
        return self.v_min / (RICKER_BANDWIDTH * self.f0 * self.h)

    @property
    def snapshot_steps(self) -> tuple[int, ...]:
        """Steps n (1-based: the field at time n dt) at which snapshots are taken."""
        if not self.snapshot_every:
            return ()
        return tuple(range(self.snapshot_every, self.steps + 1, self.snapshot_every))

    @property
    def eta_max(self) -> float:
        """Damping sigma dt at the outer edge of the sponge: a quadratic profile of width W
        cells with sigma_max = 3 v_max ln(1 / R) / (2 W h) (R = SPONGE_REFLECTION)."""
        if self.sponge == 0:
            return 0.0
        return 1.5 * math.log(1.0 / SPONGE_REFLECTION) * self.cfl / self.sponge

    def velocity(self, z0: int = 0, z1: int | None = None) -> np.ndarray:
        """The model on the grid: (nz, ny, nx) float32 m/s, or planes z0 .. z1-1 of it."""
        return self.model.build(self.nx, self.ny, self.nz, self.h, z0, z1)

    def velocity_xz(self, y: int) -> np.ndarray:
        """The vertical section at y: (nz, nx) float32, without building the whole grid."""
        if isinstance(self.model, ArrayModel):
            return self.model.values[:, y, :]
        return self.model.build(self.nx, 1, self.nz, self.h)[:, 0, :]

    def velocity_xy(self, z: int) -> np.ndarray:
        """The horizontal section at depth z: (ny, nx) float32."""
        return self.velocity(z, z + 1)[0]

    def gpu_bytes(self) -> int:
        """Device memory a CUDA run holds: fields and coefficients, the CPML's psi and zeta
        (in its layers only), record, snapshots."""
        snapshots = len(self.snapshot_steps) * (self.nx * self.nz + self.nx * self.ny) * 4
        interior = [n - 2 * RADIUS for n in (self.nx, self.ny, self.nz)]
        layer_cells = (
            2 * self.cpml * (interior[0] * interior[1] + interior[1] * interior[2] + interior[0] * interior[2])
        )
        return (
            GPU_BYTES_PER_POINT * self.points
            + 2 * 4 * layer_cells
            + self.steps * len(self.receivers) * 4
            + len(self.receivers) * 8
            + snapshots
        )

    def cpu_bytes(self) -> int:
        """Host memory a CPU (NumPy) run holds at its peak."""
        snapshots = len(self.snapshot_steps) * (self.nx * self.nz + self.nx * self.ny) * 4
        per_point = CPU_BYTES_PER_POINT + (CPU_CPML_BYTES_PER_POINT if self.cpml else 0)
        return per_point * self.points + self.steps * len(self.receivers) * 4 + snapshots


# ------------------------------------------------------------------------ the job --

MODEL_FILE = "model.npy"
MODEL_CHOICES = (
    '{"type": "constant", "velocity": ...}, {"type": "layered", "depths": [...], "velocities": [...]}, or a .npy upload'
)


def velocity_model(spec: Mapping[str, Any] | None, array: np.ndarray | None = None) -> VelocityModel:
    """The velocity model of a request's `model` object ({"type": "constant" | "layered" |
    "upload", ...}), with the uploaded (nz, ny, nx) `array` for "upload"."""
    kind = spec.get("type") if isinstance(spec, Mapping) else None
    if array is not None and kind in (None, "upload"):
        return ArrayModel(array)
    if kind == "constant":
        return ConstantModel(spec["velocity"])  # type: ignore[index]
    if kind == "layered":
        return LayeredModel(tuple(spec["depths"]), tuple(spec["velocities"]))  # type: ignore[index]
    if kind == "upload":
        raise ParamError(
            "model",
            """{"type": "upload"} needs a multipart request with the .npy file in the field 'model' and this """
            "JSON in the field 'params'",
        )
    raise ParamError("model", f"required: {MODEL_CHOICES}")


def boundary_widths(request: Mapping[str, Any]) -> tuple[int, int]:
    """(sponge, cpml) widths in cells of a request's absorbing layer.

    `boundary` ("none", "sponge" or "cpml") with `boundary_width` (cells) is the way to ask;
    `sponge: N` alone (older requests and stored jobs) keeps meaning a sponge of N cells.
    When `boundary` is given it wins over `sponge` (which then only supplies the width if
    `boundary_width` is absent). `boundary_width` alone asks for ABSORBING_DEFAULT; a named
    layer without a width gets DEFAULT_BOUNDARY_WIDTH cells, or as many as the grid holds."""
    kind, width, sponge = request.get("boundary"), request.get("boundary_width"), request.get("sponge")
    if kind is None:
        if width is None:
            return (sponge or 0), 0
        kind = ABSORBING_DEFAULT if width else "none"
    if kind not in BOUNDARIES:
        raise ParamError("boundary", f"must be one of {', '.join(BOUNDARIES)}; got {kind!r}")
    if kind == "none":
        if width:
            raise ParamError("boundary_width", f"boundary none has no layer; got boundary_width {width}")
        return 0, 0
    if width is None:
        width = sponge or min(DEFAULT_BOUNDARY_WIDTH, max(1, _layer_room(request)))
    width = check_int("boundary_width", width, 1)  # a named layer has at least one cell
    return (width, 0) if kind == "sponge" else (0, width)


def _layer_room(request: Mapping[str, Any]) -> int:
    """The widest layer the request's grid holds (0 if its sizes are not yet valid: the
    grid's own checks then name the problem)."""
    sides = []
    for name in ("nx", "ny", "nz"):
        n = request.get(name)
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            return 0
        sides.append(int(n))
    return (min(sides) - 2 * RADIUS) // 2


@dataclass(frozen=True)
class StencilJob:
    """One shot as a job: `request`, the JSON request (model and receivers as the client
    gave them, defaults resolved: grid, dt, source, snapshots) and its validated `params`
    (with the uploaded velocity array, if any)."""

    request: Mapping[str, Any]
    params: StencilParams

    @classmethod
    def from_request(cls, request: Mapping[str, Any], model: np.ndarray | None = None) -> StencilJob:
        """Validate a request (types already checked: numbers, lists, objects) into a job;
        ParamError naming the field otherwise."""
        velocity = velocity_model(request.get("model"), model)
        for name in ("nx", "ny", "nz"):
            if request.get(name) is None:
                raise ParamError(name, "required (the grid's size in points)")
        receivers = request.get("receivers")
        if isinstance(receivers, Mapping):
            receivers = receiver_line(receivers["start"], receivers["end"], receivers["count"])
        elif receivers is not None:
            receivers = tuple(tuple(point) for point in receivers)
        source = request.get("source")
        defaults_or_given: dict[str, Any] = {
            "dt": request.get("dt"),
            "source": tuple(source) if source is not None else None,
            "receivers": receivers,
        }
        sponge, cpml = boundary_widths(request)
        params = StencilParams(
            nx=request["nx"],
            ny=request["ny"],
            nz=request["nz"],
            h=request["h"],
            steps=request["steps"],
            f0=request["f0"],
            model=velocity,
            sponge=sponge,
            cpml=cpml,
            snapshot_every=request.get("snapshot_every"),
            variant=request.get("variant", "auto"),
            **defaults_or_given,
        )
        resolved = {
            **request,
            "nx": params.nx,
            "ny": params.ny,
            "nz": params.nz,
            "dt": params.dt,
            "source": list(params.source),
            "snapshot_every": params.snapshot_every,
            "boundary": params.boundary,  # stored resolved: a later ABSORBING_DEFAULT does not change the job
            "boundary_width": params.boundary_width,
        }
        if isinstance(velocity, ArrayModel):
            resolved["model"] = {"type": "upload"}
        return cls(resolved, params)

    @classmethod
    def from_spec(cls, request: StencilRequest, model: np.ndarray | None = None) -> StencilJob:
        """The job of a validated request, with the uploaded (nz, ny, nx) velocities if any."""
        body = to_json(request)
        if model is not None:
            if request.model is not None and not isinstance(request.model, UploadSpec):
                raise ParamError(
                    "model", f"a model file was uploaded and params also gives a {request.model.type} model; send one"
                )
            nz, ny, nx = model.shape
            for name, actual in (("nx", nx), ("ny", ny), ("nz", nz)):
                if body[name] is not None and body[name] != actual:
                    raise ParamError(
                        name,
                        f"{name} = {body[name]} but the uploaded model's shape (nz, ny, nx) is {model.shape}",
                        "invalid_model",
                    )
            body.update(nx=nx, ny=ny, nz=nz)
        return cls.from_request(body, model)

    def check_fits(self, limits: StencilLimits, on_cpu: bool, device_bytes: int | None) -> None:
        """InputError when the run cannot be taken: over the grid or work limits (the CPU's
        on the CPU backend), or larger than `device_bytes` of GPU memory; ParamError for a
        CUDA variant asked of the CPU backend."""
        params = self.params
        limits.check_grid(params.points, f"{params.nx} x {params.ny} x {params.nz}", on_cpu)
        work = params.interior_points * params.steps
        limit, variable = (
            (limits.cpu_point_steps, "PENCIL_MAX_STENCIL_CPU_POINT_STEPS")
            if on_cpu
            else (limits.point_steps, "PENCIL_MAX_STENCIL_POINT_STEPS")
        )
        if work > limit:
            raise InputError(
                "run_too_long",
                (
                    f"{params.steps:,} steps of {params.interior_points:,} interior points are {work:,} point "
                    f"updates; stencil jobs{' on the CPU backend' if on_cpu else ''} run at most {limit:,} "
                    f"({variable}): fewer steps or a smaller grid"
                ),
            )
        if device_bytes is not None and params.gpu_bytes() > device_bytes:
            raise InputError(
                "too_large_for_device",
                (
                    f"the grid {params.nx} x {params.ny} x {params.nz} with its record and snapshots needs "
                    f"{params.gpu_bytes() / 2**30:.2f} GiB of GPU memory; a device may hold "
                    f"{device_bytes / 2**30:.2f} GiB (PENCIL_GPU_MEMORY_FRACTION)"
                ),
            )
        if on_cpu and params.variant != "auto":
            raise ParamError(
                "variant",
                f"{params.variant} is a CUDA kernel and this server runs on the CPU backend; use auto (the NumPy "
                "reference)",
            )

    def to_json(self) -> dict[str, Any]:
        return dict(self.request)

    def input_files(self) -> dict[str, bytes]:
        model = self.params.model
        return {MODEL_FILE: npy_bytes(model.values)} if isinstance(model, ArrayModel) else {}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], files: Mapping[str, Path]) -> StencilJob:
        model = (
            np.load(files[MODEL_FILE], allow_pickle=False)
            if (stored.get("model") or {}).get("type") == "upload"
            else None
        )
        return cls.from_request(stored, model)


def read_model(data: bytes, limits: StencilLimits, on_cpu: bool) -> np.ndarray:
    """An uploaded velocity model (.npy), checked: header first (shape and dtype before the
    data is read), then finite, positive values."""

    def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
        if len(shape) != 3:
            raise ParamError(
                "model",
                f"the model has shape {shape}; expected a 3-D (nz, ny, nx) array of velocities",
                "invalid_model",
            )
        limits.check_grid(math.prod(shape), " x ".join(str(n) for n in reversed(shape)), on_cpu)
        if dtype.kind != "f" or dtype.itemsize not in (4, 8):
            raise ParamError("model", f"the model is {dtype}; send float32 velocities in m/s", "invalid_model")

    return check_velocity_array(load_npy(data, "model", check))


@dataclass(frozen=True)
class StencilLimits:
    """The service's limits on stencil jobs (PENCIL_MAX_STENCIL_*): grid points, and point
    updates (interior points x steps), each on a GPU and on the CPU backend."""

    points: int
    cpu_points: int
    point_steps: int
    cpu_point_steps: int

    def check_grid(self, points: int, shape: str, on_cpu: bool) -> None:
        """InputError grid_too_large for a grid of `points` over the backend's limit."""
        if points > self.points:
            raise InputError(
                "grid_too_large",
                (
                    f"the grid {shape} has {points:,} points; stencil jobs take at most {self.points:,} "
                    "(PENCIL_MAX_STENCIL_POINTS)"
                ),
            )
        if on_cpu and points > self.cpu_points:
            raise InputError(
                "grid_too_large",
                (
                    f"the grid {shape} has {points:,} points; on the CPU backend stencil jobs take at most "
                    f"{self.cpu_points:,} (PENCIL_MAX_STENCIL_CPU_POINTS)"
                ),
            )


# ----------------------------------------------------------------- the job's contract --

Point = Annotated[
    list[int], Field(min_length=3, max_length=3, description="[x, y, z] grid indices, each in [2, n - 3]")
]


@spec
class ConstantSpec:
    type: Literal["constant"]
    velocity: float = Field(allow_inf_nan=False, description="m/s")


@spec
class LayeredSpec:
    type: Literal["layered"]
    depths: list[float] = Field(
        description="depth in m of the top of each layer: the first 0, increasing (plane z lies at depth z h)"
    )
    velocities: list[float] = Field(description="m/s of each layer")


@spec
class UploadSpec:
    type: Literal["upload"]


@spec
class ReceiverLine:
    start: Point
    end: Point
    count: int = Field(
        ge=1, le=MAX_RECEIVERS, description="receivers evenly spaced from start to end, rounded to grid points"
    )


@spec
class StencilRequest:
    """One shot: the grid, the time stepping, the source and receivers, the velocity model,
    the absorbing boundary and the kernel."""

    _: KW_ONLY
    nx: int | None = Field(
        default=None,
        ge=MIN_SIDE,
        description="grid points along x (fastest axis); with an uploaded model, taken from its shape",
    )
    ny: int | None = Field(default=None, ge=MIN_SIDE, description="grid points along y")
    nz: int | None = Field(default=None, ge=MIN_SIDE, description="grid points along z (depth)")
    h: float = Field(allow_inf_nan=False, description="grid spacing, m")
    dt: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description=(
            "time step, s; default 0.8 of the largest stable one (v_max dt / h = 0.4); above v_max dt / h = 0.5: 422"
        ),
    )
    steps: int = Field(ge=1, le=MAX_STEPS, description="time steps")
    f0: float = Field(allow_inf_nan=False, description="peak frequency of the Ricker source, Hz")
    source: Point | None = Field(default=None, description="source point; default the grid's centre")
    receivers: list[Point] | ReceiverLine | None = Field(
        default=None,
        description=(
            "a list of points, or a line {start, end, count}; default every interior x on the line "
            "through the source (at most 65536, evenly spaced)"
        ),
    )
    model: Annotated[ConstantSpec | LayeredSpec | UploadSpec, Field(discriminator="type")] | None = Field(
        default=None, description="velocity model: constant, layered, or upload (multipart field 'model')"
    )
    variant: Variant = Field(
        default="auto",
        description=(
            "CUDA kernel: naive|shared|readonly x plain|_int_z|_int_z_reg; auto: the fastest on the "
            "device (the CPU backend runs the NumPy reference)"
        ),
    )
    snapshot_every: int | None = Field(
        default=None,
        ge=0,
        description="wavefield snapshot every this many steps (at most 100); default 4 over the run; 0: none",
    )
    boundary: Boundary | None = Field(
        default=None,
        description=(
            "what lies inside the 2-cell Dirichlet border: none (reflecting walls), sponge (a damping layer) or "
            "cpml (a convolutional PML: reflects about 100x less, costs GPts/s; BENCHMARKS.md); given, it wins "
            "over sponge"
        ),
    )
    boundary_width: int | None = Field(
        default=None,
        ge=0,
        description=(
            f"cells of the absorbing layer; alone it asks for {ABSORBING_DEFAULT}; default with a boundary "
            f"named: sponge's value, else {DEFAULT_BOUNDARY_WIDTH} (at most what the grid holds)"
        ),
    )
    sponge: int = Field(
        default=0,
        ge=0,
        description=(
            "the older form: a damping sponge of this many cells ({boundary: sponge, boundary_width: N}); "
            "0: reflecting walls. Ignored (with a warning) when boundary is given"
        ),
    )


class StencilResult(Result):
    backend: str
    grid: dict[str, float] = Field(description="nx, ny, nz, h (m), points, interior_points")
    steps: int
    dt: float = Field(description="s")
    dt_max: float = Field(description="the largest stable dt, s")
    cfl: float = Field(description="v_max dt / h")
    f0: float = Field(description="Hz")
    points_per_wavelength: float
    model: dict[str, Any] = Field(description="type, v_min, v_max (m/s)")
    source: list[int]
    receivers: int
    boundary: str = Field(description="none, sponge or cpml")
    boundary_width: int = Field(description="cells of the absorbing layer (0: none)")
    sponge: int = Field(description="the sponge's width (0 unless boundary is sponge)")
    eta_max: float
    variant: str = Field(description="the kernel that ran (reference on the CPU)")
    variant_requested: str
    variant_note: str | None
    variant_trial_ms: dict[str, float] | None = Field(description="auto's trial: ms per step of each variant")
    zchunk: int | None
    seconds: float = Field(description="time of the steps (GPU: kernels)")
    wall_seconds: float
    gpts_per_s: float | None
    effective_gb_per_s: float | None = Field(description="16 B a point a step")
    energy: dict[str, Any] = Field(description="joules, average_watts, method (NVML on a GPU)")
    energy_j: float | None
    average_power_w: float | None
    gpts_per_j: float | None
    record: dict[str, Any] = Field(description="shape, first_time_s, dt, max_abs of the shot record")
    snapshot_steps: list[int]
    files: list[str]
    warnings: list[str]


STENCIL_SPEC = JobSpec(
    name="stencil",
    summary="A seismic shot: 3D acoustic wave propagation with a 13-point stencil (nine CUDA variants, NVML energy)",
    body=StencilRequest,
    options=StencilRequest,
    files=(
        InputFile(
            "model", "velocities in m/s: a (nz, ny, nx) float32 .npy file (numpy.save), every value finite and > 0"
        ),
    ),
    result=StencilResult,
    example={
        "nx": 200,
        "ny": 100,
        "nz": 100,
        "h": 10.0,
        "dt": 0.001,
        "steps": 1000,
        "f0": 10.0,
        "source": [100, 50, 16],
        "receivers": {"start": [16, 50, 16], "end": [183, 50, 16], "count": 168},
        "model": {"type": "layered", "depths": [0, 400, 700], "velocities": [1500, 2500, 3200]},
        "boundary": "cpml",
        "boundary_width": 12,
        "snapshot_every": 250,
        "variant": "auto",
    },
    result_files=(
        "shot_record.npy (steps x receivers float32, row n = time (n+1) dt), shot_record.png, receivers.npy, "
        "velocity_xz.png, snapshot_<step>_xz.png and _xy.png"
    ),
    form_example="curl -F model=@v.npy -F params='{...}'",
)
