"""Fixtures of the job system's tests: `receiver`, a webhook receiver."""

from tests.jobs.webhook_receiver import receiver  # noqa: F401 (a fixture)
