"""Fixtures of the job route tests: `slow_kind`, a job kind whose runs the test releases;
`receiver`, a webhook receiver (tests/jobs/webhook_receiver.py)."""

from __future__ import annotations

import threading

import pytest

import app.main
from app.jobs.route import JobRoute
from gpu.jobs import JobResult
from gpu.spec import JobSpec, Result
from jobs.kinds import JobKind, Submission
from tests.jobs.webhook_receiver import receiver  # noqa: F401 (a fixture)


@pytest.fixture
def slow_kind(monkeypatch):
    """A job kind "slow" (added to the app's kinds) that reports progress every 10 ms until
    the returned Event is set (at most 30 s); its result is {"steps": n}."""
    release = threading.Event()

    async def parse(request, settings):
        return Submission({"note": "slow"})

    class SlowJob:
        @classmethod
        def from_json(cls, stored, files):
            return cls()

    def run(job, lease, progress):
        steps = 3000
        for i in range(steps):
            progress(i / steps)
            if release.wait(0.01):
                return JobResult({"steps": i})
        raise RuntimeError("the test never released the slow job")

    class SlowResult(Result):
        steps: int

    spec = JobSpec("slow", "a test job", body=None, options=None, files=(), result=SlowResult, example={})
    route = JobRoute(JobKind("slow", SlowJob, run), spec, parse)
    monkeypatch.setattr(app.main, "JOB_ROUTES", {**app.main.JOB_ROUTES, "slow": route})
    yield release
    release.set()
