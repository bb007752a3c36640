"""POST /jobs/cs256: a weight matrix pruned and converted to CS256 (Lasby, Zimmer, Pokutta &
Schultheis), its memory against dense, CSR, COO and a bitmask, and y = A x by the CS256
kernel timed against dense cuBLAS and cuSPARSE CSR in the same job on the same GPU (on
the CPU backend the NumPy reference against NumPy and SciPy).

Input: a multipart upload (file `matrix`: a 2-D .npy, or a .safetensors with `tensor` in
the options naming the weight; optional file `x`, a .npy; the options as JSON in the
field `params`) or a JSON body with a random `spec` {m, n, dtype, seed}, the options and
an optional `x`. What it takes and gives is gpu/cs256/params.py's CS256_SPEC.
"""

from __future__ import annotations

from fastapi import Request

from app.config import Settings
from app.jobs.requests import receive
from app.jobs.route import JobRoute
from gpu import cs256
from gpu.cs256.params import CS256_SPEC
from jobs.kinds import JobKind, Submission


async def parse(request: Request, settings: Settings) -> Submission:
    limit = settings.max_cs256_elements
    job = await (await receive(request, CS256_SPEC)).job(
        lambda body: cs256.Cs256Job.from_request(body, limit),
        lambda options, files: cs256.Cs256Job.from_upload(options, files, limit),
    )
    return Submission.of(job)


CS256_JOB = JobRoute(JobKind(CS256_SPEC.name, cs256.Cs256Job, cs256.run), CS256_SPEC, parse)
