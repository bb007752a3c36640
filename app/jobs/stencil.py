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
import io
import json
import math
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import Request
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from app.config import Settings
from app.errors import ApiError
from app.forms import read_form
from app.jobs.kinds import JobContext, JobKind, Submission, inline_schema, validation_detail
from app.jobs.npy import load_npy
from gpu.stencil import reference
from gpu.stencil.energy import unmeasured
from gpu.stencil.params import (
    MAX_RECEIVERS,
    MAX_STEPS,
    MIN_SIDE,
    VARIANT_CHOICES,
    ArrayModel,
    ConstantModel,
    LayeredModel,
    StencilParamError,
    StencilParams,
    check_velocity_array,
    receiver_line,
)

BYTES_PER_POINT_STEP = 16  # p, p_prev, c read and p_next written, fp32: the roofline's unit
PROGRESS_EVERY_S = 0.2
MIN_POINTS_PER_WAVELENGTH = 5.0

# ----------------------------------------------------------------- the request --

Point = Annotated[list[int], Field(min_length=3, max_length=3, description="[x, y, z] grid indices, each in [2, n - 3]")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # strict: true is no number, 2.0 no count


class ConstantSpec(_Strict):
    type: Literal["constant"]
    velocity: float = Field(..., allow_inf_nan=False, description="m/s")


class LayeredSpec(_Strict):
    type: Literal["layered"]
    depths: list[float] = Field(..., description="depth in m of the top of each layer: the first 0, increasing (plane z lies at depth z h)")
    velocities: list[float] = Field(..., description="m/s of each layer")


class UploadSpec(_Strict):
    type: Literal["upload"]


class ReceiverLine(_Strict):
    start: Point
    end: Point
    count: int = Field(..., ge=1, le=MAX_RECEIVERS, description="receivers evenly spaced from start to end, rounded to grid points")


class StencilRequest(_Strict):
    nx: int | None = Field(None, ge=MIN_SIDE, description="grid points along x (fastest axis); with an uploaded model, taken from its shape")
    ny: int | None = Field(None, ge=MIN_SIDE, description="grid points along y")
    nz: int | None = Field(None, ge=MIN_SIDE, description="grid points along z (depth)")
    h: float = Field(..., allow_inf_nan=False, description="grid spacing, m")
    dt: float | None = Field(None, allow_inf_nan=False, description="time step, s; default 0.8 of the largest stable one (v_max dt / h = 0.4); above v_max dt / h = 0.5: 422")
    steps: int = Field(..., ge=1, le=MAX_STEPS, description="time steps")
    f0: float = Field(..., allow_inf_nan=False, description="peak frequency of the Ricker source, Hz")
    source: Point | None = Field(None, description="source point; default the grid's centre")
    receivers: list[Point] | ReceiverLine | None = Field(None, description="a list of points, or a line {start, end, count}; default every interior x on the line through the source (at most 65536, evenly spaced)")
    model: Annotated[ConstantSpec | LayeredSpec | UploadSpec, Field(discriminator="type")] | None = Field(None, description="velocity model: constant, layered, or upload (multipart field 'model')")
    variant: Literal[VARIANT_CHOICES] = Field("auto", description="CUDA kernel: naive|shared|readonly x plain|_int_z|_int_z_reg; auto: the fastest on the device (the CPU backend runs the NumPy reference)")  # type: ignore[valid-type]
    snapshot_every: int | None = Field(None, ge=0, description="wavefield snapshot every this many steps (at most 100); default 4 over the run; 0: none")
    sponge: int = Field(0, ge=0, description="absorbing sponge width in cells inside the 2-cell Dirichlet border; 0: reflecting walls")




EXAMPLE = {
    "nx": 200, "ny": 100, "nz": 100, "h": 10.0, "dt": 0.001, "steps": 1000, "f0": 10.0,
    "source": [100, 50, 16], "receivers": {"start": [16, 50, 16], "end": [183, 50, 16], "count": 168},
    "model": {"type": "layered", "depths": [0, 400, 700], "velocities": [1500, 2500, 3200]},
    "sponge": 12, "snapshot_every": 250, "variant": "auto",
}

RESULT_DOC = (
    "the job, queued; poll its Location. The result: grid, steps, dt, dt_max, cfl, variant (and the auto trial's ms per step), "
    "seconds, gpts_per_s, effective_gb_per_s (16 B a point a step), energy {joules, average_watts, method}, gpts_per_j, "
    "and the files shot_record.npy (steps x receivers float32, row n = time (n+1) dt), shot_record.png, receivers.npy, "
    "velocity_xz.png, snapshot_<step>_xz.png and _xy.png"
)

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": inline_schema(StencilRequest), "example": EXAMPLE},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["model", "params"],
                    "properties": {
                        "model": {"type": "string", "format": "binary", "description": "velocities in m/s: a (nz, ny, nx) float32 .npy file (numpy.save), every value finite and > 0"},
                        "params": {"type": "string", "description": "the JSON request without 'model' (or with {\"type\": \"upload\"}); nx, ny, nz may be left out"},
                    },
                }
            },
        },
    },
    "responses": {"202": {"description": RESULT_DOC}},
}


# ------------------------------------------------------------------- parsing --




def _request(body: Any) -> StencilRequest:
    try:
        return StencilRequest.model_validate(body)
    except ValidationError as exc:
        raise ApiError(422, "invalid_parameter", validation_detail(exc)) from None


def build_params(request: StencilRequest, model: np.ndarray | None = None) -> StencilParams:
    """The validated StencilParams of a request (with the uploaded model array, if any);
    ApiError 422 naming the problem otherwise."""
    try:
        if model is not None:
            velocity = ArrayModel(model)
        elif isinstance(request.model, ConstantSpec):
            velocity = ConstantModel(request.model.velocity)
        elif isinstance(request.model, LayeredSpec):
            velocity = LayeredModel(tuple(request.model.depths), tuple(request.model.velocities))
        elif isinstance(request.model, UploadSpec):
            raise ApiError(422, "invalid_parameter", "model: {\"type\": \"upload\"} needs a multipart request with the .npy file in the field 'model' and this JSON in the field 'params'")
        else:
            raise ApiError(422, "invalid_parameter", "model: required: {\"type\": \"constant\", \"velocity\": ...}, {\"type\": \"layered\", \"depths\": [...], \"velocities\": [...]}, or a .npy upload (multipart field 'model')")
        for name in ("nx", "ny", "nz"):
            if getattr(request, name) is None:
                raise ApiError(422, "invalid_parameter", f"{name}: required (the grid's size in points)")
        receivers = request.receivers
        if isinstance(receivers, ReceiverLine):
            receivers = receiver_line(receivers.start, receivers.end, receivers.count)
        elif receivers is not None:
            receivers = tuple(tuple(point) for point in receivers)
        return StencilParams(
            nx=request.nx, ny=request.ny, nz=request.nz, h=request.h, steps=request.steps, f0=request.f0, model=velocity, dt=request.dt,
            source=tuple(request.source) if request.source is not None else None, receivers=receivers, sponge=request.sponge,
            snapshot_every=request.snapshot_every, variant=request.variant,
        )
    except StencilParamError as exc:
        raise ApiError(422, exc.code, str(exc)) from None


def _check_size(points: int, settings: Settings, request: Request, shape: str) -> None:
    if points > settings.max_stencil_points:
        raise ApiError(413, "grid_too_large", f"the grid {shape} has {points:,} points; stencil jobs take at most {settings.max_stencil_points:,} (PENCIL_MAX_STENCIL_POINTS)")
    if request.app.state.backend.name == "cpu" and points > settings.max_stencil_cpu_points:
        raise ApiError(413, "grid_too_large", f"the grid {shape} has {points:,} points; on the CPU backend stencil jobs take at most {settings.max_stencil_cpu_points:,} (PENCIL_MAX_STENCIL_CPU_POINTS)")


def _check_fits(params: StencilParams, settings: Settings, request: Request) -> None:
    """413 when the run cannot fit: grid size limits, and on CUDA the smallest device cap."""
    shape = f"{params.nx} x {params.ny} x {params.nz}"
    _check_size(params.points, settings, request, shape)
    state = request.app.state
    work = params.interior_points * params.steps
    on_cpu = state.backend.name == "cpu"
    limit, variable = (settings.max_stencil_cpu_point_steps, "PENCIL_MAX_STENCIL_CPU_POINT_STEPS") if on_cpu else (settings.max_stencil_point_steps, "PENCIL_MAX_STENCIL_POINT_STEPS")
    if work > limit:
        raise ApiError(413, "run_too_long", f"{params.steps:,} steps of {params.interior_points:,} interior points are {work:,} point updates; stencil jobs{' on the CPU backend' if on_cpu else ''} run at most {limit:,} ({variable}): fewer steps or a smaller grid")
    if state.backend.name == "cuda" and state.pool is not None:
        cap = min(device["memory_cap_bytes"] for device in state.pool.snapshot())
        needed = params.gpu_bytes()
        if needed > cap:
            raise ApiError(413, "too_large_for_device", f"the grid {shape} with its record and snapshots needs {needed / 2**30:.2f} GiB of GPU memory; a device may hold {cap / 2**30:.2f} GiB (PENCIL_GPU_MEMORY_FRACTION)")
    if on_cpu and params.variant != "auto":
        raise ApiError(422, "invalid_parameter", f"variant: {params.variant} is a CUDA kernel and this server runs on the CPU backend; use auto (the NumPy reference)")


def _stored(request: StencilRequest, params: StencilParams, upload: bool) -> dict[str, Any]:
    """What the job row keeps: the request with the defaults it resolved (grid, dt,
    source, snapshots), enough for run() to rebuild the same StencilParams."""
    stored = request.model_dump(mode="json")
    stored.update(nx=params.nx, ny=params.ny, nz=params.nz, dt=params.dt, source=list(params.source), snapshot_every=params.snapshot_every)
    if upload:
        stored["model"] = {"type": "upload"}
    return stored


async def parse(request: Request, settings: Settings) -> Submission:
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("application/json"):
        try:
            body = await request.json()
        except ValueError as exc:
            raise ApiError(400, "bad_request", f"the body is not JSON: {exc}") from None
        req = _request(body)
        params = build_params(req)
        _check_fits(params, settings, request)
        return Submission(_stored(req, params, upload=False))
    if content_type.startswith("multipart/form-data"):
        data, params_text = await _read_form(request)
        try:
            body = json.loads(params_text) if params_text.strip() else {}
        except ValueError as exc:
            raise ApiError(400, "bad_request", f"the field 'params' is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(422, "invalid_parameter", "params: expected a JSON object")
        req = _request(body)
        if req.model is not None and not isinstance(req.model, UploadSpec):
            raise ApiError(422, "invalid_parameter", f"model: a model file was uploaded and params also gives a {req.model.type} model; send one of them")
        model = await asyncio.to_thread(_load_model, data, settings, request)
        nz, ny, nx = model.shape
        for name, given, actual in (("nx", req.nx, nx), ("ny", req.ny, ny), ("nz", req.nz, nz)):
            if given is not None and given != actual:
                raise ApiError(422, "invalid_model", f"{name} = {given} but the uploaded model's shape (nz, ny, nx) is {model.shape}")
        req = req.model_copy(update={"nx": nx, "ny": ny, "nz": nz, "model": UploadSpec(type="upload")})
        params = await asyncio.to_thread(build_params, req, model)
        _check_fits(params, settings, request)
        buffer = io.BytesIO()
        np.save(buffer, params.model.values)  # float32, native order, C-contiguous: what run() reads
        return Submission(_stored(req, params, upload=True), {"model.npy": buffer.getvalue()})
    raise ApiError(415, "unsupported_media_type", "send the shot as JSON (Content-Type: application/json), or a multipart form with the velocity model as a .npy file in the field 'model' and the JSON in the field 'params' (curl -F model=@v.npy -F params='{...}')")


async def _read_form(request: Request) -> tuple[bytes, str]:
    form = await read_form(request, max_files=1, max_fields=4, hint="The model must be a file part: curl -F model=@v.npy -F params='{...}'")
    try:
        upload = form.get("model")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "missing_model", "the form needs a file field named 'model' holding a (nz, ny, nx) float32 .npy file (curl -F model=@v.npy -F params='{...}')")
        params = form.get("params", "")
        if not isinstance(params, str):
            raise ApiError(400, "bad_request", "the field 'params' must be a JSON string, not a file")
        extra = sorted(key for key in form if key not in ("model", "params"))
        if extra:
            raise ApiError(422, "invalid_parameter", f"unknown form field(s) {', '.join(extra)}: send 'model' (the .npy file) and 'params' (the JSON)")
        return await upload.read(), params
    finally:
        await form.close()


def _load_model(data: bytes, settings: Settings, request: Request) -> np.ndarray:
    """The uploaded velocity array, checked: header first (shape and dtype before the
    data is read), then finite, positive values. 400 malformed, 413 too big, 422 wrong."""
    def check(shape: tuple[int, ...], dtype: np.dtype) -> None:
        if len(shape) != 3:
            raise ApiError(422, "invalid_model", f"the model has shape {shape}; expected a 3-D (nz, ny, nx) array of velocities")
        _check_size(math.prod(shape), settings, request, " x ".join(str(n) for n in reversed(shape)))
        if dtype.kind != "f" or dtype.itemsize not in (4, 8):
            raise ApiError(422, "invalid_model", f"the model is {dtype}; send float32 velocities in m/s")

    array = load_npy(data, "model", check)
    try:
        return check_velocity_array(array)
    except StencilParamError as exc:
        raise ApiError(422, exc.code, str(exc)) from None


# --------------------------------------------------------------------- images --

RECORD_CLIP = 2.0  # after AGC a trace's RMS is 1: full scale at +-2, clipped beyond
AGC_PERIODS = 2.0  # AGC window: this many periods of the source's peak frequency
AGC_FLOOR = 1e-3  # windows quieter than this fraction of the trace's loudest stay grey
AGC_CHUNK_VALUES = 1 << 22  # samples gained at once (32 MiB of float64 per work array)
BLUE, WHITE, RED = np.array([5.0, 48.0, 97.0]), np.array([255.0, 255.0, 255.0]), np.array([103.0, 0.0, 31.0])


def _pick_rows(a: np.ndarray, max_rows: int) -> np.ndarray:
    """At most `max_rows` rows: each block of rows keeps, per column, its sample of largest
    magnitude (sign kept), so that no arrival disappears between pixels."""
    rows = a.shape[0]
    if rows <= max_rows:
        return a
    block = -(-rows // max_rows)
    padded = np.zeros((-(-rows // block) * block, a.shape[1]), a.dtype)
    padded[:rows] = a
    blocks = padded.reshape(-1, block, a.shape[1])
    index = np.abs(blocks).argmax(axis=1)
    return np.take_along_axis(blocks, index[:, None, :], axis=1)[:, 0, :]


def agc(record: np.ndarray, window: int) -> np.ndarray:
    """Automatic gain control, per trace: each sample divided by the RMS of its trace over
    `window` samples centred on it (float64, same shape). Windows quieter than AGC_FLOOR
    of the trace's loudest are not amplified further, so silence stays silent."""
    a = np.nan_to_num(np.asarray(record, np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    rows = a.shape[0]
    energy = np.concatenate([np.zeros((1, a.shape[1])), np.cumsum(a * a, axis=0)])
    centre = np.arange(rows)
    lo, hi = np.clip(centre - window // 2, 0, rows), np.clip(centre + window // 2 + 1, 0, rows)
    rms = np.sqrt(np.maximum(energy[hi] - energy[lo], 0.0) / (hi - lo)[:, None])
    floor = AGC_FLOOR * rms.max(axis=0, keepdims=True)
    return a / np.maximum(rms, np.where(floor > 0, floor, 1.0))


def shot_record_image(record: np.ndarray, window: int, max_rows: int = 2000, min_width: int = 256, max_width: int = 2048) -> Image.Image:
    """A seismic display of the record (steps, receivers): time runs down, one column per
    receiver, each trace under AGC over `window` samples (see `agc`) and clipped at
    RECORD_CLIP times its local RMS, so that the direct wave and the much weaker
    reflections show alike. Grey: positive black, negative white, zero mid-grey. Records
    wider than `max_width` keep every k-th trace, longer than `max_rows` keep each block's
    strongest sample; narrow ones are widened to `min_width` px. Works through the traces
    in chunks, so a record of any allowed size needs little memory."""
    record = np.asarray(record)
    rows, width = record.shape
    if width > max_width:
        record = record[:, :: -(-width // max_width)]
    chunk = max(1, AGC_CHUNK_VALUES // max(rows, 1))
    pieces = [_pick_rows(np.clip(agc(record[:, j : j + chunk], max(1, window)) / RECORD_CLIP, -1.0, 1.0), max_rows) for j in range(0, record.shape[1], chunk)]
    v = np.concatenate(pieces, axis=1)
    if v.shape[1] < min_width:
        v = np.repeat(v, -(-min_width // v.shape[1]), axis=1)
    return Image.fromarray(np.rint(127.5 - 127.5 * v).astype(np.uint8), mode="L")


def agc_window(params: StencilParams) -> int:
    """AGC window in samples: AGC_PERIODS periods of f0, at least 9 samples."""
    return max(9, round(AGC_PERIODS / (params.f0 * params.dt)))


def _fit_side(rgb: np.ndarray, min_side: int = 512, max_side: int = 2048) -> np.ndarray:
    """Small sections enlarged by a whole factor (nearest) to about `min_side` px on the
    longer side; large ones thinned to at most `max_side`."""
    longest = max(rgb.shape[:2])
    if longest < min_side:
        factor = min_side // longest
        return np.repeat(np.repeat(rgb, factor, axis=0), factor, axis=1)
    step = -(-longest // max_side)
    return rgb[::step, ::step]


def _diverging(v: np.ndarray) -> np.ndarray:
    """v in [-1, 1] -> RGB float: blue (negative) - white - red (positive)."""
    v = v[..., None]
    return np.where(v < 0, WHITE + (BLUE - WHITE) * -v, WHITE + (RED - WHITE) * v)


def section_image(values: np.ndarray, velocity: np.ndarray, max_side: int = 2048) -> Image.Image:
    """A wavefield section (rows: z or y, columns: x) in a diverging map clipped at the
    99.5th percentile of its non-zero |p|, shaded by the velocity section (faster is
    darker, up to 30%) so that the layers show under the waves. RGB image."""
    p = np.nan_to_num(np.asarray(values, np.float64))
    magnitude = np.abs(p[p != 0])
    clip = np.percentile(magnitude, 99.5) if magnitude.size else 1.0
    rgb = _diverging(np.clip(p / clip, -1.0, 1.0))
    v = np.asarray(velocity, np.float64)
    span = v.max() - v.min()
    shade = 1.0 - 0.3 * ((v - v.min()) / span if span > 0 else np.zeros_like(v))
    rgb = rgb * shade[..., None]
    return Image.fromarray(np.rint(_fit_side(rgb, max_side=max_side)).astype(np.uint8), mode="RGB")


def velocity_image(velocity: np.ndarray, source: tuple[int, int], max_side: int = 2048) -> Image.Image:
    """The velocity section (rows z, columns x) in grey (slow light, fast dark) with the
    source (x, z) marked in red."""
    v = np.asarray(velocity, np.float64)
    span = v.max() - v.min()
    grey = 230.0 - 180.0 * ((v - v.min()) / span if span > 0 else np.zeros_like(v))
    rgb = np.repeat(grey[..., None], 3, axis=2)
    x, z = source
    rgb[max(0, z - 1) : z + 2, max(0, x - 1) : x + 2] = (220.0, 30.0, 30.0)
    return Image.fromarray(np.rint(_fit_side(rgb, max_side=max_side)).astype(np.uint8), mode="RGB")


# --------------------------------------------------------------------- running --


class _Progress:
    """The run's checkpoint: progress from 2% to 92% over the steps, written at most every
    PROGRESS_EVERY_S (a GPU run calls it once per batch); raises JobCanceled."""

    def __init__(self, ctx: JobContext, steps: int):
        self.ctx, self.steps, self.last = ctx, steps, 0.0

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if done >= self.steps or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            self.ctx.progress(0.02 + 0.9 * done / self.steps)


def _save_png(image: Image.Image, path: Path) -> None:
    image.save(path, format="PNG", optimize=False)


def run(ctx: JobContext) -> dict[str, Any]:
    stored = ctx.job.params
    req = StencilRequest.model_validate(stored)
    model = np.load(ctx.inputs / "model.npy", allow_pickle=False) if isinstance(req.model, UploadSpec) else None
    params = build_params(req, model)
    ctx.progress(0.01)
    progress = _Progress(ctx, params.steps)
    trial, zchunk, note = None, None, None
    if ctx.lease is None:
        start = time.perf_counter()
        shot = reference.simulate(params, None, progress)
        seconds = wall = time.perf_counter() - start
        variant, note = "reference", "the CPU backend runs the NumPy reference (gpu/stencil/reference.py)"
        energy = unmeasured(seconds, "energy is measured on GPUs (NVML); this job ran on the CPU backend")
    else:
        from gpu.stencil import cuda

        gpu = cuda.simulate(ctx.lease, params, None, params.variant, progress)  # c is built on the host a slab at a time
        shot, variant, trial, zchunk = gpu.shot, gpu.variant, gpu.trial_ms, gpu.zchunk
        seconds, wall, energy = gpu.kernel_seconds, gpu.wall_seconds, gpu.energy
        if params.variant == "auto":
            note = f"auto picked {variant}: " + ("the fastest in a timed trial of the nine variants on this grid (variant_trial_ms)" if trial else "the cached choice of an earlier trial on this grid and device")
    ctx.progress(0.93)
    files = _write_files(ctx.results, params, shot)
    ctx.progress(0.99)
    updates = params.interior_points * params.steps
    gpts = updates / seconds / 1e9 if seconds > 0 else None
    warnings = []
    if params.points_per_wavelength < MIN_POINTS_PER_WAVELENGTH:
        warnings.append(f"{params.points_per_wavelength:.1f} grid points per shortest wavelength (v_min / 2.5 f0): fewer than {MIN_POINTS_PER_WAVELENGTH:g}, expect numerical dispersion; lower f0 or h")
    inside = [name for name, points in (("the source", [params.source]), ("receivers", params.receivers)) if params.sponge and any(_in_sponge(point, params) for point in points)]
    if inside:
        warnings.append(f"{' and '.join(inside)} lie inside the {params.sponge}-cell sponge, where waves are damped: place them at least {2 + params.sponge} cells from every face")
    if not np.isfinite(shot.record).all():
        warnings.append("the shot record has non-finite values")
    x, y, z = params.source
    return {
        "backend": ctx.backend,
        "grid": {"nx": params.nx, "ny": params.ny, "nz": params.nz, "h": params.h, "points": params.points, "interior_points": params.interior_points},
        "steps": params.steps, "dt": params.dt, "dt_max": params.dt_max, "cfl": params.cfl, "f0": params.f0,
        "points_per_wavelength": round(params.points_per_wavelength, 3),
        "model": {"type": type(params.model).__name__.removesuffix("Model").lower(), "v_min": params.v_min, "v_max": params.v_max},
        "source": [x, y, z], "receivers": len(params.receivers), "sponge": params.sponge, "eta_max": params.eta_max,
        "variant": variant, "variant_requested": params.variant, "variant_note": note,
        "variant_trial_ms": {key: round(value, 4) for key, value in trial.items()} if trial else None, "zchunk": zchunk,
        "seconds": seconds, "wall_seconds": wall,
        "gpts_per_s": gpts, "effective_gb_per_s": gpts * BYTES_PER_POINT_STEP if gpts is not None else None,
        "energy": energy.as_dict(), "energy_j": energy.joules, "average_power_w": energy.average_watts,
        "gpts_per_j": updates / energy.joules / 1e9 if energy.joules else None,
        "record": {"shape": list(shot.record.shape), "first_time_s": params.dt, "dt": params.dt, "max_abs": float(np.nanmax(np.abs(shot.record))) if shot.record.size else 0.0},
        "snapshot_steps": [s.step for s in shot.snapshots],
        "files": files, "warnings": warnings,
    }


def _in_sponge(point: tuple[int, int, int], params: StencilParams) -> bool:
    return any(min(v - 2, n - 3 - v) < params.sponge for v, n in zip(point, (params.nx, params.ny, params.nz), strict=True))


def _write_files(folder: Path, params: StencilParams, shot: reference.Shot) -> list[str]:
    x, y, z = params.source
    section_xz, section_xy = params.velocity_xz(y), params.velocity_xy(z)
    np.save(folder / "shot_record.npy", shot.record)
    np.save(folder / "receivers.npy", np.asarray(params.receivers, np.int32).reshape(-1, 3))
    _save_png(shot_record_image(shot.record, agc_window(params)), folder / "shot_record.png")
    _save_png(velocity_image(section_xz, (x, z)), folder / "velocity_xz.png")
    for snap in shot.snapshots:
        _save_png(section_image(snap.xz, section_xz), folder / f"snapshot_{snap.step:07d}_xz.png")
        _save_png(section_image(snap.xy, section_xy), folder / f"snapshot_{snap.step:07d}_xy.png")
    return sorted(path.name for path in folder.iterdir())


STENCIL = JobKind(name="stencil", summary="A seismic shot: 3D acoustic wave propagation with a 13-point stencil (nine CUDA variants, NVML energy)", parse=parse, run=run, openapi=OPENAPI)
