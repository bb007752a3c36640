"""What a kind of batch job provides to the job system: the job object's type (stored with
`to_json` and `input_files`, rehydrated with `from_json`) and the kind's front door in
gpu/<kind> that runs it on a worker thread, on a GPU lease when there is one (see
gpu/jobs.py). How a request becomes a job is the HTTP layer's (app/jobs/route.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpu.jobs import JobResult, Progress
from gpu.pool import Lease


class StoredJob(Protocol):
    """A kind's job object (gpu/<kind>/params.py), as the job store sees it."""

    def to_json(self) -> dict[str, Any]: ...

    def input_files(self) -> dict[str, bytes]: ...


@dataclass(frozen=True)
class Submission:
    """A validated request: JSON parameters and the input files to store (name -> bytes)."""

    params: dict[str, Any]
    inputs: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, job: StoredJob) -> Submission:
        return cls(job.to_json(), job.input_files())

    def digest(self, kind: str, webhook: str | None = None) -> str:
        """Identifies the request for Idempotency-Key: the kind, the parameters, the
        content of every input (not the multipart framing, which differs per retry) and
        the webhook it asks for."""
        h = hashlib.sha256(kind.encode())
        if webhook is not None:
            h.update(b"webhook:" + webhook.encode())
        h.update(json.dumps(self.params, sort_keys=True).encode())
        for name in sorted(self.inputs):
            h.update(name.encode())
            h.update(hashlib.sha256(self.inputs[name]).digest())
        return h.hexdigest()


class JobCanceled(Exception):
    """Raised at a checkpoint of a job whose cancel was asked for."""


@dataclass(frozen=True)
class JobKind:
    """One kind of batch job as the runner sees it: `job_type` rehydrates a stored job
    (`from_json(stored, files)`, files: input name -> path); `run` is the kind's front
    door, gpu.<kind>.run(job, lease, progress) -> JobResult."""

    name: str
    job_type: Any  # a class with from_json(stored: Mapping, files: Mapping[str, Path])
    run: Callable[[Any, Lease | None, Progress], JobResult]

    def load(self, stored: Mapping[str, Any], files: Mapping[str, Path]) -> Any:
        """The job object of a stored job."""
        return self.job_type.from_json(stored, files)
