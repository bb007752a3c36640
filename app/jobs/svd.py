"""POST /jobs/svd: the singular value decomposition of an uploaded matrix (multipart file
`matrix`, a .npy file, and the options as JSON in the field `params`) or of a generated one
(JSON body with a `spec`). What it takes and gives is gpu/svd/params.py's SVD_SPEC; the
decomposition itself is gpu.svd's front door.
"""

from __future__ import annotations

from fastapi import Request

from app.config import Settings
from app.jobs.requests import receive
from app.jobs.route import JobRoute
from gpu import svd
from gpu.svd.params import SVD_SPEC
from jobs.kinds import JobKind, Submission


async def parse(request: Request, settings: Settings) -> Submission:
    limit = settings.max_matrix_elements
    job = await (await receive(request, SVD_SPEC)).job(
        lambda body: svd.SvdJob.from_request(body, limit),
        lambda options, files: svd.SvdJob.from_upload(options, files, limit),
    )
    job.check_backend(request.app.state.backend.name)
    return Submission.of(job)


SVD = JobRoute(JobKind(SVD_SPEC.name, svd.SvdJob, svd.run), SVD_SPEC, parse)
