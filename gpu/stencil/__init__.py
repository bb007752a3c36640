"""3D acoustic wave propagation with a 13-point stencil (Pavan et al. 2018): one seismic shot.

Front door: `run(job, lease=None, progress=None)` runs a `StencilJob` (gpu/stencil/params.py)
on a GPU lease with one of the nine CUDA kernel variants (gpu/stencil/cuda.py; `auto`: the
fastest on this device for this grid, from a short timed trial), or on the CPU with the
NumPy reference (gpu/stencil/reference.py), and draws its pictures (gpu/stencil/images.py).
"""

from __future__ import annotations

import time

import numpy as np

from gpu.jobs import JobResult, Progress, backend_name, no_progress, npy_file, png_file
from gpu.pool import Lease
from gpu.stencil import geometry
from gpu.stencil.params import StencilJob, StencilParams

__all__ = ["StencilJob", "StencilParams", "run"]

BYTES_PER_POINT_STEP = 16  # p, p_prev, c read and p_next written, fp32: the roofline's unit
PROGRESS_EVERY_S = 0.2
MIN_POINTS_PER_WAVELENGTH = 5.0


class _StepProgress:
    """The run's checkpoint: progress from 2% to 92% over the steps, reported at most every
    PROGRESS_EVERY_S (a GPU run calls it once per batch of steps)."""

    def __init__(self, progress: Progress, steps: int):
        self.progress, self.steps, self.last = progress, steps, 0.0

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if done >= self.steps or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.progress(0.02 + 0.9 * done / self.steps)


def run(job: StencilJob, lease: Lease | None = None, progress: Progress = no_progress) -> JobResult:
    """One shot. Summary: grid, steps, dt, dt_max, cfl, the variant (and the auto trial's
    ms per step), seconds, gpts_per_s, effective_gb_per_s (16 B a point a step), NVML
    energy, gpts_per_j, warnings. Files: shot_record.npy ((steps, receivers) float32, row
    n at time (n + 1) dt), receivers.npy, shot_record.png, velocity_xz.png and
    snapshot_<step>_xz.png / _xy.png."""
    from gpu.stencil import reference
    from gpu.stencil.energy import unmeasured

    params = job.params
    progress(0.01)
    steps = _StepProgress(progress, params.steps)
    trial, zchunk, note = None, None, None
    if lease is None:
        start = time.perf_counter()
        shot = reference.simulate(params, None, steps)
        seconds = wall = time.perf_counter() - start
        variant, note = "reference", "the CPU backend runs the NumPy reference (gpu/stencil/reference.py)"
        energy = unmeasured(seconds, "energy is measured on GPUs (NVML); this job ran on the CPU backend")
    else:
        from gpu.stencil import cuda

        gpu = cuda.simulate(lease, params, None, params.variant, steps)  # c is built on the host a slab at a time
        shot, variant, trial, zchunk = gpu.shot, gpu.variant, gpu.trial_ms, gpu.zchunk
        seconds, wall, energy = gpu.kernel_seconds, gpu.wall_seconds, gpu.energy
        if params.variant == "auto" and params.cpml and geometry.inner_box(params.shape, params.cpml) is None:
            note = (
                f"the CPML's shell kernel updates this whole grid: no inner box is left for a variant's kernel, "
                f"so {variant} did not run"
            )
        elif params.variant == "auto":
            note = f"auto picked {variant}: " + (
                "the fastest in a timed trial of the nine variants on this grid (variant_trial_ms)"
                if trial
                else "the cached choice of an earlier trial on this grid and device"
            )
    progress(0.93)
    files = _files(params, shot)
    updates = params.interior_points * params.steps
    gpts = updates / seconds / 1e9 if seconds > 0 else None
    x, y, z = params.source
    summary = {
        "backend": backend_name(lease),
        "grid": {
            "nx": params.nx,
            "ny": params.ny,
            "nz": params.nz,
            "h": params.h,
            "points": params.points,
            "interior_points": params.interior_points,
        },
        "steps": params.steps,
        "dt": params.dt,
        "dt_max": params.dt_max,
        "cfl": params.cfl,
        "f0": params.f0,
        "points_per_wavelength": round(params.points_per_wavelength, 3),
        "model": {
            "type": type(params.model).__name__.removesuffix("Model").lower(),
            "v_min": params.v_min,
            "v_max": params.v_max,
        },
        "source": [x, y, z],
        "receivers": len(params.receivers),
        "boundary": params.boundary,
        "boundary_width": params.boundary_width,
        "sponge": params.sponge,
        "eta_max": params.eta_max,
        "variant": variant,
        "variant_requested": params.variant,
        "variant_note": note,
        "variant_trial_ms": {key: round(value, 4) for key, value in trial.items()} if trial else None,
        "zchunk": zchunk,
        "seconds": seconds,
        "wall_seconds": wall,
        "gpts_per_s": gpts,
        "effective_gb_per_s": gpts * BYTES_PER_POINT_STEP if gpts is not None else None,
        "energy": energy.as_dict(),
        "energy_j": energy.joules,
        "average_power_w": energy.average_watts,
        "gpts_per_j": updates / energy.joules / 1e9 if energy.joules else None,
        "record": {
            "shape": list(shot.record.shape),
            "first_time_s": params.dt,
            "dt": params.dt,
            "max_abs": float(np.nanmax(np.abs(shot.record))) if shot.record.size else 0.0,
        },
        "snapshot_steps": [s.step for s in shot.snapshots],
        "files": sorted(files),
        "warnings": _warnings(params, shot, job.request),
    }
    return JobResult(summary, files)


def _warnings(params: StencilParams, shot, request) -> list[str]:
    warnings = []
    sponge = request.get("sponge")
    if sponge and (params.boundary != "sponge" or params.sponge != sponge):
        warnings.append(  # the width may have come from it (boundary without boundary_width): say what ran
            f"sponge: {sponge} asks for no sponge here: boundary {params.boundary}"
            + (f" of {params.boundary_width} cells" if params.boundary_width else "")
            + " was given and wins"
        )
    if params.points_per_wavelength < MIN_POINTS_PER_WAVELENGTH:
        warnings.append(
            f"{params.points_per_wavelength:.1f} grid points per shortest wavelength (v_min / 2.5 f0): fewer "
            f"than {MIN_POINTS_PER_WAVELENGTH:g}, expect numerical dispersion; lower f0 or h"
        )
    width = params.boundary_width
    inside = [
        name
        for name, points in (("the source", [params.source]), ("receivers", params.receivers))
        if width and any(_in_layer(point, params) for point in points)
    ]
    if inside:
        warnings.append(
            f"{' and '.join(inside)} lie inside the {width}-cell {params.boundary}, where waves are damped: place "
            f"them at least {2 + width} cells from every face"
        )
    if not np.isfinite(shot.record).all():
        warnings.append("the shot record has non-finite values")
    return warnings


def _in_layer(point: tuple[int, int, int], params: StencilParams) -> bool:
    return any(
        min(v - 2, n - 3 - v) < params.boundary_width
        for v, n in zip(point, (params.nx, params.ny, params.nz), strict=True)
    )


def _files(params: StencilParams, shot) -> dict:
    """The result files; the pictures are drawn here (on the job's thread), written later."""
    from gpu.stencil.images import agc_window, section_image, shot_record_image, velocity_image

    x, y, z = params.source
    section_xz, section_xy = params.velocity_xz(y), params.velocity_xy(z)
    files = {
        "shot_record.npy": npy_file(shot.record),
        "receivers.npy": npy_file(np.asarray(params.receivers, np.int32).reshape(-1, 3)),
        "shot_record.png": png_file(shot_record_image(shot.record, agc_window(params))),
        "velocity_xz.png": png_file(velocity_image(section_xz, (x, z))),
    }
    for snap in shot.snapshots:
        files[f"snapshot_{snap.step:07d}_xz.png"] = png_file(section_image(snap.xz, section_xz))
        files[f"snapshot_{snap.step:07d}_xy.png"] = png_file(section_image(snap.xy, section_xy))
    return files
