"""POST /jobs/stencil: one seismic shot, 3D acoustic waves in a velocity model (Pavan et
al. 2018): a JSON body, or a multipart form with the velocity model as a .npy file
(field `model`) and the same JSON as the field `params`.

Validated before the job is stored: types and ranges, the CFL condition (422 naming the
largest stable dt), source and receivers inside the grid, the model, and the grid's size
against PENCIL_MAX_STENCIL_POINTS and, on CUDA, the devices' memory caps (413).

Runs on the job's GPU lease with one of the nine CUDA kernel variants (`auto`: the
fastest on this device for this grid, from a short timed trial cached per grid), or on
the CPU backend with the NumPy reference. Result files: the shot record (.npy and a
seismic-style PNG), wavefield snapshots (PNG sections through the source), the velocity
section; the JSON result holds GPts/s, the effective bandwidth, NVML energy, average
power, GPts/J, the CFL number and the variant used.
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from app.config import Settings
from app.errors import ApiError
from app.jobs.kinds import JobKind, ResultModel, Submission, inline_schema
from app.jobs.requests import form_schema, is_form, is_json, json_body, unsupported, upload_form, validated
from gpu import stencil
from gpu.npy import load_npy
from gpu.stencil.params import (
    ABSORBING_DEFAULT,
    BOUNDARIES,
    DEFAULT_BOUNDARY_WIDTH,
    MAX_RECEIVERS,
    MAX_STEPS,
    MIN_SIDE,
    VARIANT_CHOICES,
    StencilParams,
    check_velocity_array,
)

# Literal types of the choice tuples: pydantic reads the Literal at run time, mypy sees str.
if TYPE_CHECKING:
    VariantChoice = str
    BoundaryChoice = str
else:
    VariantChoice = Literal[VARIANT_CHOICES]
    BoundaryChoice = Literal[BOUNDARIES]


# ----------------------------------------------------------------- the request --

Point = Annotated[
    list[int], Field(min_length=3, max_length=3, description="[x, y, z] grid indices, each in [2, n - 3]")
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # strict: true is no number, 2.0 no count


class ConstantSpec(_Strict):
    type: Literal["constant"]
    velocity: float = Field(..., allow_inf_nan=False, description="m/s")


class LayeredSpec(_Strict):
    type: Literal["layered"]
    depths: list[float] = Field(
        ..., description="depth in m of the top of each layer: the first 0, increasing (plane z lies at depth z h)"
    )
    velocities: list[float] = Field(..., description="m/s of each layer")


class UploadSpec(_Strict):
    type: Literal["upload"]


class ReceiverLine(_Strict):
    start: Point
    end: Point
    count: int = Field(
        ..., ge=1, le=MAX_RECEIVERS, description="receivers evenly spaced from start to end, rounded to grid points"
    )


class StencilRequest(_Strict):
    nx: int | None = Field(
        None,
        ge=MIN_SIDE,
        description="grid points along x (fastest axis); with an uploaded model, taken from its shape",
    )
    ny: int | None = Field(None, ge=MIN_SIDE, description="grid points along y")
    nz: int | None = Field(None, ge=MIN_SIDE, description="grid points along z (depth)")
    h: float = Field(..., allow_inf_nan=False, description="grid spacing, m")
    dt: float | None = Field(
        None,
        allow_inf_nan=False,
        description=(
            "time step, s; default 0.8 of the largest stable one (v_max dt / h = 0.4); above v_max dt / h = 0.5: 422"
        ),
    )
    steps: int = Field(..., ge=1, le=MAX_STEPS, description="time steps")
    f0: float = Field(..., allow_inf_nan=False, description="peak frequency of the Ricker source, Hz")
    source: Point | None = Field(None, description="source point; default the grid's centre")
    receivers: list[Point] | ReceiverLine | None = Field(
        None,
        description=(
            "a list of points, or a line {start, end, count}; default every interior x on the line "
            "through the source (at most 65536, evenly spaced)"
        ),
    )
    model: Annotated[ConstantSpec | LayeredSpec | UploadSpec, Field(discriminator="type")] | None = Field(
        None, description="velocity model: constant, layered, or upload (multipart field 'model')"
    )
    variant: VariantChoice = Field(
        "auto",
        description=(
            "CUDA kernel: naive|shared|readonly x plain|_int_z|_int_z_reg; auto: the fastest on the "
            "device (the CPU backend runs the NumPy reference)"
        ),
    )
    snapshot_every: int | None = Field(
        None,
        ge=0,
        description="wavefield snapshot every this many steps (at most 100); default 4 over the run; 0: none",
    )
    boundary: BoundaryChoice | None = Field(
        None,
        description=(
            "what lies inside the 2-cell Dirichlet border: none (reflecting walls), sponge (a damping layer) or "
            "cpml (a convolutional PML: reflects about 100x less, costs GPts/s; BENCHMARKS.md); given, it wins "
            "over sponge"
        ),
    )
    boundary_width: int | None = Field(
        None,
        ge=0,
        description=(
            f"cells of the absorbing layer; alone it asks for {ABSORBING_DEFAULT}; default with a boundary "
            f"named: sponge's value, else {DEFAULT_BOUNDARY_WIDTH} (at most what the grid holds)"
        ),
    )
    sponge: int = Field(
        0,
        ge=0,
        description=(
            "the older form: a damping sponge of this many cells ({boundary: sponge, boundary_width: N}); "
            "0: reflecting walls. Ignored (with a warning) when boundary is given"
        ),
    )


class StencilResult(ResultModel):
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


EXAMPLE = {
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
}

RESULT_DOC = (
    "the job, queued; poll its Location. The result: grid, steps, dt, dt_max, cfl, variant "
    "(and the auto trial's ms per step), "
    "seconds, gpts_per_s, effective_gb_per_s (16 B a point a step), energy {joules, "
    "average_watts, method}, gpts_per_j, "
    "and the files shot_record.npy (steps x receivers float32, row n = time (n+1) dt), shot_record.png, receivers.npy, "
    "velocity_xz.png, snapshot_<step>_xz.png and _xy.png"
)

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": inline_schema(StencilRequest), "example": EXAMPLE},
            "multipart/form-data": {
                "schema": form_schema(
                    {
                        "model": (
                            "velocities in m/s: a (nz, ny, nx) float32 .npy file (numpy.save), every value finite and "
                            "> 0"
                        )
                    },
                    ("model",),
                    'the JSON request without \'model\' (or with {"type": "upload"}); nx, ny, nz may be left out',
                )
            },
        },
    },
    "responses": {"202": {"description": RESULT_DOC}},
}


# ------------------------------------------------------------------- parsing --

FORM_EXAMPLE = "curl -F model=@v.npy -F params='{...}'"


def _check_size(points: int, settings: Settings, request: Request, shape: str) -> None:
    if points > settings.max_stencil_points:
        raise ApiError(
            413,
            "grid_too_large",
            (
                f"the grid {shape} has {points:,} points; stencil jobs take at most "
                f"{settings.max_stencil_points:,} (PENCIL_MAX_STENCIL_POINTS)"
            ),
        )
    if request.app.state.backend.name == "cpu" and points > settings.max_stencil_cpu_points:
        raise ApiError(
            413,
            "grid_too_large",
            (
                f"the grid {shape} has {points:,} points; on the CPU backend stencil jobs take at most "
                f"{settings.max_stencil_cpu_points:,} (PENCIL_MAX_STENCIL_CPU_POINTS)"
            ),
        )


def _check_fits(params: StencilParams, settings: Settings, request: Request) -> None:
    """413 when the run cannot fit: grid size limits, and on CUDA the smallest device cap."""
    shape = f"{params.nx} x {params.ny} x {params.nz}"
    _check_size(params.points, settings, request, shape)
    state = request.app.state
    work = params.interior_points * params.steps
    on_cpu = state.backend.name == "cpu"
    limit, variable = (
        (settings.max_stencil_cpu_point_steps, "PENCIL_MAX_STENCIL_CPU_POINT_STEPS")
        if on_cpu
        else (settings.max_stencil_point_steps, "PENCIL_MAX_STENCIL_POINT_STEPS")
    )
    if work > limit:
        raise ApiError(
            413,
            "run_too_long",
            (
                f"{params.steps:,} steps of {params.interior_points:,} interior points are {work:,} point "
                f"updates; stencil jobs{' on the CPU backend' if on_cpu else ''} run at most {limit:,} "
                f"({variable}): fewer steps or a smaller grid"
            ),
        )
    if state.backend.name == "cuda" and state.pool is not None:
        cap = min(device["memory_cap_bytes"] for device in state.pool.snapshot())
        needed = params.gpu_bytes()
        if needed > cap:
            raise ApiError(
                413,
                "too_large_for_device",
                (
                    f"the grid {shape} with its record and snapshots needs {needed / 2**30:.2f} GiB of GPU "
                    f"memory; a device may hold {cap / 2**30:.2f} GiB (PENCIL_GPU_MEMORY_FRACTION)"
                ),
            )
    if on_cpu and params.variant != "auto":
        raise ApiError(
            422,
            "invalid_parameter",
            (
                f"variant: {params.variant} is a CUDA kernel and this server runs on the CPU backend; use "
                "auto (the NumPy reference)"
            ),
        )


async def parse(request: Request, settings: Settings) -> Submission:
    if is_json(request):
        req = await json_body(request, StencilRequest)
        job = stencil.StencilJob.from_request(req.model_dump(mode="json"))
    elif is_form(request):
        form = await upload_form(request, ("model",), example=FORM_EXAMPLE)
        req = validated(StencilRequest, form.params, "params.")
        if req.model is not None and not isinstance(req.model, UploadSpec):
            raise ApiError(
                422,
                "invalid_parameter",
                f"model: a model file was uploaded and params also gives a {req.model.type} model; send one of them",
            )
        model = await asyncio.to_thread(_load_model, form.files["model"], settings, request)
        nz, ny, nx = model.shape
        for name, given, actual in (("nx", req.nx, nx), ("ny", req.ny, ny), ("nz", req.nz, nz)):
            if given is not None and given != actual:
                raise ApiError(
                    422,
                    "invalid_model",
                    f"{name} = {given} but the uploaded model's shape (nz, ny, nx) is {model.shape}",
                )
        body = {**req.model_dump(mode="json"), "nx": nx, "ny": ny, "nz": nz}
        job = await asyncio.to_thread(stencil.StencilJob.from_request, body, model)
    else:
        raise unsupported(
            "send the shot as JSON (Content-Type: application/json), or a multipart form with the "
            "velocity model as a .npy file in the field 'model' and the JSON in the field 'params' "
            f"({FORM_EXAMPLE})"
        )
    _check_fits(job.params, settings, request)
    return Submission.of(job)


def _load_model(data: bytes, settings: Settings, request: Request) -> np.ndarray:
    """The uploaded velocity array, checked: header first (shape and dtype before the
    data is read), then finite, positive values. 400 malformed, 413 too big, 422 wrong."""

    def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
        if len(shape) != 3:
            raise ApiError(
                422, "invalid_model", f"the model has shape {shape}; expected a 3-D (nz, ny, nx) array of velocities"
            )
        _check_size(math.prod(shape), settings, request, " x ".join(str(n) for n in reversed(shape)))
        if dtype.kind != "f" or dtype.itemsize not in (4, 8):
            raise ApiError(422, "invalid_model", f"the model is {dtype}; send float32 velocities in m/s")

    return check_velocity_array(load_npy(data, "model", check))


STENCIL = JobKind(
    name="stencil",
    summary="A seismic shot: 3D acoustic wave propagation with a 13-point stencil (nine CUDA variants, NVML energy)",
    parse=parse,
    job_type=stencil.StencilJob,
    run=stencil.run,
    openapi=OPENAPI,
    result_model=StencilResult,
)
