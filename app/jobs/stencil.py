"""POST /jobs/stencil: one seismic shot, 3D acoustic waves in a velocity model (Pavan et
al. 2018): a JSON body, or a multipart form with the velocity model as a .npy file (field
`model`) and the same JSON as the field `params`. What it takes and gives is
gpu/stencil/params.py's STENCIL_SPEC.

Validated before the job is stored: types and ranges, the CFL condition (422 naming the
largest stable dt), source and receivers inside the grid, the model, and the grid's size
against PENCIL_MAX_STENCIL_* and, on CUDA, the devices' memory caps (413).
"""

from __future__ import annotations

import asyncio

from fastapi import Request

from app.config import Settings
from app.jobs.requests import receive
from app.jobs.route import JobRoute
from gpu import stencil
from gpu.stencil.params import STENCIL_SPEC, StencilLimits, read_model
from jobs.kinds import JobKind, Submission


async def parse(request: Request, settings: Settings) -> Submission:
    received = await receive(request, STENCIL_SPEC)
    state = request.app.state
    on_cpu = state.backend.name == "cpu"
    limits = StencilLimits(
        settings.max_stencil_points,
        settings.max_stencil_cpu_points,
        settings.max_stencil_point_steps,
        settings.max_stencil_cpu_point_steps,
    )
    if received.body is not None:
        job = stencil.StencilJob.from_spec(received.body)
    else:
        assert received.files is not None
        model = await asyncio.to_thread(read_model, received.files["model"], limits, on_cpu)
        job = await asyncio.to_thread(stencil.StencilJob.from_spec, received.options, model)
    device_bytes = None
    if state.backend.name == "cuda" and state.pool is not None:
        device_bytes = min(device["memory_cap_bytes"] for device in state.pool.snapshot())
    job.check_fits(limits, on_cpu, device_bytes)
    return Submission.of(job)


STENCIL = JobRoute(JobKind(STENCIL_SPEC.name, stencil.StencilJob, stencil.run), STENCIL_SPEC, parse)
