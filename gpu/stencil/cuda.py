"""The stencil on the GPU: the nine kernel variants of stencil.cu (naive / shared /
readonly x plain / int_z / int_z_reg), launched through CuPy on a lease's stream.

One shot, on the lease's main stream:

    upload c = (v dt / h)^2, zero p and pp (and the CPML's words) -> [auto: time each
       variant, once per grid and boundary]
    -> per step: [CPML: cpml_shell on the layers' shell] the variant's kernel on the
       interior (CPML: its inner box) (pp <- p^(n+1), then swap) -> gather the receivers
       into row n of the record [-> copy the snapshot slices]
    -> in batches of steps: wait for the previous batch's event, report progress (the
       cancel checkpoint), so the GPU always has a batch queued
    -> download record and snapshots.

Energy is read from NVML over the stepping loop (gpu/stencil/energy.py). The kernels
agree with gpu/stencil/reference.py bit for bit (same operations, same order, no FMA),
on normal floats: the GPU flushes subnormals to zero (BENCHMARKS.md, "Absorbing boundaries"), so a run from
rest whose wavefront's faint leading edge survives (walls, the CPML; not the sponge)
differs from the reference by a few ulps.

Importing this module needs CuPy; app code imports it inside the job's run.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, lru_cache, partial
from pathlib import Path

import cupy
import numpy as np

from gpu import kernels
from gpu.stencil import cpml as cpml_profile
from gpu.stencil import geometry, reference
from gpu.stencil.energy import EnergyMeter, EnergyReading
from gpu.stencil.params import RADIUS, VARIANTS, StencilParams

SOURCE = Path(__file__).with_name("stencil.cu")
_k = partial(kernels.kernel, SOURCE)
BLOCK = (geometry.BX, geometry.BY, 1)
GATHER_BLOCK = 256
BATCH_SECONDS = 0.2  # progress is reported (and cancel checked) about this often
TRIAL_MS = 2.0  # auto: each variant runs at least this long (and at least 3 launches)
UPLOAD_POINTS = 1 << 24  # host slab of c built and uploaded at once (64 MiB of float32)
RAMP_TABLES = 64  # sponge ramp tables kept on the devices (a few KB each)
UNUSED_VARIANT = "readonly"  # auto's answer where no variant's kernel runs (a CPML grid that is all shell)


kernel_name = geometry.kernel_name


@cache
def _resident(device: int, name: str) -> int:
    return kernels.blocks_per_sm(_k(name), geometry.THREADS)


def resident_blocks(name: str) -> int:
    """Blocks of kernel `name` the current device runs at once: per SM (threads, registers,
    shared memory) x SMs."""
    return _resident(cupy.cuda.Device().id, name) * kernels.device_attribute("MultiProcessorCount")


@lru_cache(maxsize=4096)
def _launches(
    device: int,
    variant: str,
    shape: tuple[int, int, int],
    source: tuple[int, int, int],
    sponge: int,
    zchunk: int | None,
    max_points: int,
    cpml: int,
) -> tuple[geometry.Launch, ...]:
    return tuple(geometry.launches(variant, shape, source, sponge, zchunk, resident_blocks, max_points, cpml))


def launches(
    variant: str,
    shape: tuple[int, int, int],
    source: tuple[int, int, int] = (RADIUS, RADIUS, RADIUS),
    sponge: int = 0,
    zchunk: int | None = None,
    cpml: int = 0,
) -> tuple[geometry.Launch, ...]:
    """The launches of one step on the current device (geometry.launches with this device's
    residency): one per z slab, each with its grid and, for the z-marching variants, its
    MarchPlan (zchunk planes per block for every tile if given)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    if zchunk is not None and zchunk < 1:
        raise ValueError(f"zchunk must be >= 1, got {zchunk}")
    return _launches(
        cupy.cuda.Device().id, variant, tuple(shape), tuple(source), sponge, zchunk, geometry.MAX_INDEX, cpml
    )


_ramps: OrderedDict[tuple, cupy.ndarray] = OrderedDict()
_ramps_lock = threading.Lock()


def ramp_table(nx: int, ny: int, nz: int, sponge: int, lo: int = 0, hi: int | None = None) -> cupy.ndarray:
    """The sponge's (W - d) / W per axis on the current device, float32: fx (nx values), fy
    (ny), fz of planes [lo, hi) (reference.axis_ramp, so bit-identical with the reference).
    Cached per device and grid."""
    hi = nz if hi is None else hi
    key = (cupy.cuda.Device().id, nx, ny, nz, sponge, lo, hi)
    with _ramps_lock:
        table = _ramps.get(key)
        if table is not None:
            _ramps.move_to_end(key)
            return table
    table = cupy.asarray(reference.ramp_table(nx, ny, nz, sponge, lo, hi))
    with _ramps_lock:
        _ramps[key] = table
        while len(_ramps) > RAMP_TABLES:
            _ramps.popitem(last=False)
    return table


@dataclass
class CpmlBuffers:
    """The CPML's state on the device (gpu/stencil/cpml.py): the words (psi and zeta as
    bfloat16 halves, uint32, the slab layout of StencilParams.cpml_slabs, zero at the
    start) of the last step (`state`) and of this one (`next`), the profile table ((a, b)
    of x, y, z), cpml_shell's chunks ((blocks, 4) int32, geometry.shell_chunks) and the
    width."""

    state: cupy.ndarray
    next: cupy.ndarray
    profile: cupy.ndarray
    chunks: cupy.ndarray
    width: int

    @classmethod
    def of(cls, params: StencilParams) -> CpmlBuffers | None:
        """Zeroed buffers for the shot's CPML, None without one."""
        if not params.cpml:
            return None
        cells = sum(params.cpml_slabs)
        profile = cupy.asarray(cpml_profile.profile_table(params))
        chunks = cupy.asarray(geometry.shell_chunks(params.shape, params.cpml))
        return cls(cupy.zeros(cells, np.uint32), cupy.zeros(cells, np.uint32), profile, chunks, params.cpml)

    def reset(self) -> None:
        self.state.fill(0)
        self.next.fill(0)

    def swap(self) -> None:
        self.state, self.next = self.next, self.state


def launch(
    variant: str,
    p: cupy.ndarray,
    pp: cupy.ndarray,
    c: cupy.ndarray,
    shape: tuple[int, int, int],
    source: tuple[int, int, int],
    amp: float = 0.0,
    sponge: int = 0,
    eta_max: float = 0.0,
    zchunk: int | None = None,
    cpml: CpmlBuffers | None = None,
) -> None:
    """One step on the current stream: pp (p^(n-1) in, p^(n+1) out) from p (p^n) and c.
    p, pp, c: flat float32 device arrays of nz ny nx points (shape = (nz, ny, nx));
    source (x, y, z) receives `amp`; sponge width in cells with eta_max (see params), or
    the CPML's buffers (cpml_shell on the layers' shell, the variant on the inner box;
    the words swapped after); zchunk: planes per block of the z-marching variants
    (default: march_plan's waves). Grids of 2^31 points or more run as z slabs
    (geometry.slabs), one launch each."""
    nz, ny, nx = shape
    plane = nx * ny
    width = cpml.width if cpml is not None else 0
    if cpml is not None:
        ints = (nx, ny, nz, width, *source)
        _k("cpml_shell")(
            (len(cpml.chunks),),
            BLOCK,
            (p, pp, c, cpml.chunks, cpml.profile, cpml.state, cpml.next, *(np.int32(v) for v in ints), np.float32(amp)),
        )
    for step in launches(variant, shape, source, sponge, zchunk, width):
        views = (
            (p, pp, c)
            if (step.lo, step.hi) == (0, nz)
            else tuple(a[step.lo * plane : step.hi * plane] for a in (p, pp, c))
        )
        ramps = ramp_table(nx, ny, nz, sponge, step.lo, step.hi) if sponge > 0 else views[2]  # unread without a sponge
        args = (*views, *(np.int32(v) for v in step.ints), np.float32(amp), np.float32(eta_max), ramps)
        _k(step.kernel)(step.grid, BLOCK, args)
    if cpml is not None:
        cpml.swap()


def march_plan(
    variant: str, shape: tuple[int, int, int], zchunk: int | None = None, sponge: int = 0, cpml: int = 0
) -> geometry.MarchPlan | None:
    """The blocks of a z-marching variant's (first) launch on this device, None for plain
    (or where a CPML leaves no inner box)."""
    found = launches(variant, shape, sponge=sponge, zchunk=zchunk, cpml=cpml)
    return found[0].plan if found else None


# ---------------------------------------------------------------------- a shot --


class GpuShot:
    """The state of one shot on the current device: c, p, pp (flat float32), the
    receivers' flat indices, the record (steps, receivers) on the device (NaN until
    written) and the per-step source amplitudes (host)."""

    def __init__(self, params: StencilParams, velocity: np.ndarray | None = None, zchunk: int | None = None):
        self.params = params
        self.shape = params.shape
        self.zchunk = zchunk  # None: each z-marching variant's own plan (march_plan)
        self.c = cupy.empty(params.points, np.float32)
        plane = params.nx * params.ny
        step = max(1, UPLOAD_POINTS // plane)  # c is built and uploaded a slab of planes at a time
        for z0 in range(0, params.nz, step):
            z1 = min(params.nz, z0 + step)
            slab = params.velocity(z0, z1) if velocity is None else velocity[z0:z1]
            self.c[z0 * plane : z1 * plane].set(
                reference.coefficients(slab, params.dt, params.h, z0, params.nz).ravel()
            )
        self.p = cupy.zeros(params.points, np.float32)
        self.pp = cupy.zeros(params.points, np.float32)
        self.amplitudes = reference.source_amplitudes(params)
        nx, ny = params.nx, params.ny
        self.receivers = cupy.asarray(np.array([(z * ny + y) * nx + x for x, y, z in params.receivers], np.int64))
        self.record = cupy.full((params.steps, len(params.receivers)), np.nan, np.float32)
        self.eta_max = float(np.float32(params.eta_max))
        self.cpml = CpmlBuffers.of(params)

    def set_fields(self, p0: np.ndarray, p_prev: np.ndarray) -> None:
        """Start from (p^0, p^-1) instead of zeros: (nz, ny, nx) float32, zero border."""
        self.p.set(reference.check_initial(p0, self.shape, "p^0").ravel())
        self.pp.set(reference.check_initial(p_prev, self.shape, "p^-1").ravel())

    def launch(self, variant: str, amp: float) -> None:
        launch(
            variant,
            self.p,
            self.pp,
            self.c,
            self.shape,
            self.params.source,
            amp,
            self.params.sponge,
            self.eta_max,
            self.zchunk,
            self.cpml,
        )

    def reset(self) -> None:
        """Zero fields (and CPML state): the start of a shot."""
        self.p.fill(0)
        self.pp.fill(0)
        if self.cpml is not None:
            self.cpml.reset()

    def step(self, variant: str, n: int) -> None:
        """Step n: p^(n+1), swap, and row n of the record."""
        self.launch(variant, float(self.amplitudes[n]))
        self.p, self.pp = self.pp, self.p
        count = self.receivers.size
        _k("gather_receivers")(
            (kernels.div_up(count, GATHER_BLOCK),),
            (GATHER_BLOCK,),
            (self.p, self.receivers, np.int32(count), self.record[n]),
        )

    def field(self) -> cupy.ndarray:
        return self.p.reshape(self.shape)


# ------------------------------------------------------------- auto selection --

_chosen: dict[tuple, tuple[str, dict[str, float]]] = {}
_chosen_lock = threading.Lock()


def time_variants(shot: GpuShot, variants=VARIANTS, min_ms: float = TRIAL_MS) -> dict[str, float]:
    """Milliseconds per step of each variant on this shot's buffers, with source amplitude
    0 (zero fields stay zero). Each runs once to warm up, then enough launches for
    `min_ms` (at least 3, at most 50), timed with events on the current stream. `shot`
    needs only a launch(variant, amp) method (the benchmark passes its own buffers)."""
    times = {}
    for variant in variants:
        shot.launch(variant, 0.0)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        shot.launch(variant, 0.0)
        stop.record()
        stop.synchronize()
        once = max(cupy.cuda.get_elapsed_time(start, stop), 1e-3)
        repeats = max(3, min(50, math.ceil(min_ms / once)))
        start.record()
        for _ in range(repeats):
            shot.launch(variant, 0.0)
        stop.record()
        stop.synchronize()
        times[variant] = cupy.cuda.get_elapsed_time(start, stop) / repeats
    return times


def choose_variant(shot: GpuShot) -> tuple[str, dict[str, float] | None]:
    """The fastest variant for this grid on this device: timed once per (device, grid,
    boundary and its width, zchunk) on the shot's (zero) buffers, then cached. Returns
    (variant, the trial's ms per step, or None when it came from the cache or when no
    variant's kernel runs: a CPML grid without an inner box, all shell)."""
    params = shot.params
    if params.cpml and geometry.inner_box(params.shape, params.cpml) is None:
        return UNUSED_VARIANT, None
    key = (cupy.cuda.Device().id, params.shape, params.boundary, params.boundary_width, shot.zchunk)
    with _chosen_lock:
        found = _chosen.get(key)
    if found is not None:
        return found[0], None
    times = time_variants(shot)
    best = min(times, key=lambda variant: times[variant])
    with _chosen_lock:
        _chosen.setdefault(key, (best, times))
    return best, times


def forget_choices() -> None:
    """Clear the cache of `auto` choices (tests, benchmarks)."""
    with _chosen_lock:
        _chosen.clear()


# -------------------------------------------------------------------- the job --


@dataclass
class GpuRun:
    shot: reference.Shot
    variant: str
    trial_ms: dict[str, float] | None  # auto's trial (None: a named variant, or cached)
    zchunk: int | None  # z-marching variants: planes per block of the chunked tiles (None: plain)
    plan: str | None  # z-marching variants: the blocks (MarchPlan.describe, first z slab)
    kernel_seconds: float  # GPU time of the stepping loop (events), with the recording
    wall_seconds: float
    energy: EnergyReading
    batches: int = 0
    timeline: list[tuple[int, float]] = field(default_factory=list)  # (steps done, s) per batch


def simulate(
    lease,
    params: StencilParams,
    velocity: np.ndarray | None = None,
    variant: str | None = None,
    checkpoint: Callable[[int], None] | None = None,
    initial: tuple[np.ndarray, np.ndarray] | None = None,
    zchunk: int | None = None,
    measure_energy: bool = True,
) -> GpuRun:
    """Run the shot on `lease` (a gpu.pool.Lease). variant: one of VARIANTS or "auto"
    (default params.variant). checkpoint(steps_done) is called between batches of steps
    (it may raise to cancel: the stream is drained first). initial: (p^0, p^-1) instead
    of zeros (tests). velocity: the model on the grid; default built from params a slab
    at a time (the host never holds the whole grid)."""
    variant = variant or params.variant
    with cupy.cuda.Device(lease.device), lease.stream:
        stream = lease.stream
        shot = GpuShot(params, velocity, zchunk)
        trial = None
        if variant == "auto":
            variant, trial = choose_variant(shot)
            shot.reset()
        elif variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}")
        if initial is not None:
            shot.set_fields(*initial)
        stream.synchronize()
        snapshot_at = set(params.snapshot_steps)
        _, y, z = params.source
        snapshots: list[tuple[int, cupy.ndarray, cupy.ndarray]] = []
        meter = EnergyMeter(cupy.cuda.Device(lease.device).pci_bus_id) if measure_energy else None
        timeline: list[tuple[int, float]] = []
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        try:
            if meter is not None:
                meter.start()
            wall = time.perf_counter()
            start.record()
            done, batch, pending = 0, min(8, params.steps), None
            while done < params.steps:
                first = done
                for n in range(first, min(first + batch, params.steps)):
                    shot.step(variant, n)
                    if n + 1 in snapshot_at:
                        f = shot.field()
                        snapshots.append((n + 1, f[:, y, :].copy(), f[z, :, :].copy()))
                done = min(first + batch, params.steps)
                queued = stream.record()
                if pending is not None:  # the GPU works on this batch while we wait for the last
                    pending_event, pending_done, pending_size = pending
                    pending_event.synchronize()
                    seconds = time.perf_counter() - wall
                    previous_seconds = timeline[-1][1] if timeline else 0.0
                    timeline.append((pending_done, seconds))
                    per_step = max((seconds - previous_seconds) / pending_size, 1e-7)
                    batch = max(1, min(int(BATCH_SECONDS / per_step), max(1, params.steps // 20)))
                    if checkpoint is not None:
                        checkpoint(pending_done)
                pending = (queued, done, done - first)
            stop.record()
            stop.synchronize()
            wall_seconds = time.perf_counter() - wall
            timeline.append((params.steps, wall_seconds))
            energy = meter.stop() if meter is not None else None
            meter = None
        finally:
            stream.synchronize()  # nothing of ours left running when the buffers go
            if meter is not None:
                meter.stop()
        if checkpoint is not None:
            checkpoint(params.steps)
        kernel_seconds = cupy.cuda.get_elapsed_time(start, stop) / 1000.0
        record = shot.record.get()
        final = shot.field().get()
        previous = shot.pp.reshape(shot.shape).get()
        shots = [reference.Snapshot(step, xz.get(), xy.get()) for step, xz, xy in snapshots]
        stream.synchronize()
        plan = march_plan(variant, params.shape, shot.zchunk, params.sponge, params.cpml)
    if energy is None:
        energy = EnergyReading(None, wall_seconds, None, None, 0, "energy not measured")
    zchunk = None if plan is None else (plan.zb if plan.tiles > plan.tiles_a else plan.za)
    return GpuRun(
        reference.Shot(record, shots, final, previous),
        variant,
        trial,
        zchunk,
        None if plan is None else plan.describe(),
        kernel_seconds,
        wall_seconds,
        energy,
        len(timeline),
        timeline,
    )
