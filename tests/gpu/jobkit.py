"""Helpers for the tests of the job kinds' front doors (gpu/<kind>/__init__.py): store a job
as the service does and rehydrate it, write a result's files."""

from __future__ import annotations

from pathlib import Path

from gpu.jobs import JobResult


def stored_and_back(job, folder: Path, extra_files: dict[str, Path] | None = None):
    """`job` through what the job store keeps: to_json and input_files written to
    `folder`, then from_json. Returns the rehydrated job."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, data in job.input_files().items():
        (folder / name).write_bytes(data)
        files[name] = folder / name
    return type(job).from_json(job.to_json(), {**files, **(extra_files or {})})


def written(result: JobResult, folder: Path) -> dict[str, Path]:
    """Every result file written to `folder`; name -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, write in result.files.items():
        with open(folder / name, "wb") as handle:
            write(handle)
        paths[name] = folder / name
    return paths
