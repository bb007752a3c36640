"""Batch jobs: the store, the runner, the HTTP API and the job kinds."""
