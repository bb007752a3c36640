"""One kind's POST /jobs/<name> as the HTTP layer serves it: the kind (jobs/kinds.py), its
spec (gpu/<kind>/params.py, which the request is read by and the OpenAPI derived from) and
`parse`, which validates a request completely into the kind's job (4xx now, never a job
that fails later for its input). The route modules of app/jobs/ each declare one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from app.config import Settings
from app.jobs.requests import openapi
from gpu.spec import JobSpec
from jobs.kinds import JobKind, Submission


@dataclass(frozen=True)
class JobRoute:
    """POST /jobs/<spec.name>: `parse(request, settings)` -> Submission; `responses`: the
    kind's own error statuses for the OpenAPI, beside the ones every job route has."""

    kind: JobKind
    spec: JobSpec
    parse: Callable[[Request, Settings], Awaitable[Submission]]
    responses: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def openapi(self) -> dict[str, Any]:
        return openapi(self.spec, self.responses)
