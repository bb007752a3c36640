"""What a kind of batch job provides to the job system: a parser that validates a request
completely (4xx now, never a job that fails later for its input) and a function that runs
the job on a worker thread, on a GPU lease when there is one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from app.config import Settings
from app.jobs.store import Job


@dataclass(frozen=True)
class Submission:
    """A validated request: JSON parameters and the input files to store (name -> bytes)."""

    params: dict[str, Any]
    inputs: dict[str, bytes] = field(default_factory=dict)

    def digest(self, kind: str) -> str:
        """Identifies the request for Idempotency-Key: the kind, the parameters and the
        content of every input (not the multipart framing, which differs per retry)."""
        h = hashlib.sha256(kind.encode())
        h.update(json.dumps(self.params, sort_keys=True).encode())
        for name in sorted(self.inputs):
            h.update(name.encode())
            h.update(hashlib.sha256(self.inputs[name]).digest())
        return h.hexdigest()


class JobCanceled(Exception):
    """Raised at a checkpoint of a job whose cancel was asked for."""


@dataclass
class JobContext:
    """What a running job sees: its row, its input and result folders, the service's data
    directory (data shared between jobs, such as corpora), the backend and, on CUDA, its
    GPU lease (a gpu.pool.Lease), and a checkpoint to report progress."""

    job: Job
    inputs: Path
    results: Path
    data_dir: Path
    backend: str
    lease: Any | None
    report: Callable[[float], bool]

    def progress(self, fraction: float) -> None:
        """Record progress (0..1); raises JobCanceled when the job was canceled."""
        if not self.report(fraction):
            raise JobCanceled()


@dataclass(frozen=True)
class JobKind:
    name: str
    summary: str
    parse: Callable[[Request, Settings], Awaitable[Submission]]
    run: Callable[[JobContext], Mapping[str, Any]]
    openapi: dict[str, Any] = field(default_factory=dict)  # request body and result docs for POST /jobs/<name>


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its nested models written in place: a schema inside an
    OpenAPI document cannot resolve pydantic's "#/$defs/..." references."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {"$ref"}:
                return inline(definitions[node["$ref"].rsplit("/", 1)[-1]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return inline(schema)


def validation_detail(exc: ValidationError) -> str:
    """A pydantic error as one line a client can act on: "field.sub[2]: message; ..."."""
    parts = []
    for error in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)
