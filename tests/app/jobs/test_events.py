"""GET /jobs/{id}/events (app/jobs/events.py): a job's changes as server-sent events, every
state in order and within a second, through the real job runner on the CPU backend."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest
from pencil_testkit import admin_client, assert_api_error, wait_for_job

from app.jobs.events import passed_through
from jobs.store import Job

TOKEN = "events-test-token"


def read_events(response, on_event=None) -> list[tuple[str, dict, float]]:
    """(name, data, monotonic time) of each event of a streaming response, until it ends."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: ")), time.monotonic()))
            if on_event is not None:
                on_event(events[-1])
    return events


def test_a_stream_sees_every_state_of_a_job_within_a_second(make_client, slow_kind):
    client = admin_client(make_client, TOKEN, job_streams=1)
    job_id = client.post("/jobs/slow").json()["id"]
    wait_for_job(client, job_id, until=("running",))
    released, seen = {}, []

    def release_after_some_progress(event) -> None:
        name, data, _ = event
        if name == "progress":
            seen.append(data["progress"])
        if len(seen) == 3 and not released:
            released["at"] = time.monotonic()
            slow_kind.set()

    with client.stream("GET", f"/jobs/{job_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_events(response, release_after_some_progress)
    names = [name for name, _, _ in events]
    assert names[0] == "job" and events[0][1]["status"] == "running"
    assert names[-2:] == ["status", "job"] and events[-1][1]["status"] == "succeeded"
    assert events[-2][1] == {"id": job_id, "status": "succeeded", "attempt": 1}
    progress = [data["progress"] for name, data, _ in events if name == "progress"]
    assert progress == sorted(progress) and len(progress) >= 3
    assert events[-1][2] - released["at"] < 1.0  # the end seen within a second of it


def test_a_job_that_runs_and_ends_between_two_reads_still_shows_each_state(make_client, slow_kind):
    client = admin_client(make_client, TOKEN, job_streams=1)
    first = client.post("/jobs/slow").json()["id"]  # holds the only worker
    second = client.post("/jobs/slow").json()["id"]  # waits in the queue
    wait_for_job(client, first, until=("running",))
    statuses = []

    def release_once_watching(event) -> None:
        name, data, _ = event
        if name == "job" and data["status"] == "queued":
            slow_kind.set()  # both jobs finish at once: the second runs and ends within one poll
        if name == "status":
            statuses.append(data["status"])

    with client.stream("GET", f"/jobs/{second}/events") as response:
        read_events(response, release_once_watching)
    assert statuses == ["running", "succeeded"]


def test_a_finished_job_gives_its_state_and_the_stream_ends(make_client, slow_kind):
    client = admin_client(make_client, TOKEN)
    slow_kind.set()
    job_id = client.post("/jobs/slow").json()["id"]
    wait_for_job(client, job_id)
    with client.stream("GET", f"/jobs/{job_id}/events") as response:
        lines = list(response.iter_lines())
    assert "id: finished" in lines  # what an EventSource sends back as Last-Event-ID
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [event["status"] for event in events] == ["succeeded"]
    again = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "finished"})
    assert again.status_code == 204  # it saw the end: an EventSource stops reconnecting


def test_a_stopping_server_ends_its_streams(make_client, slow_kind, monkeypatch):
    from app.jobs import events

    monkeypatch.setattr(events, "_stopping", threading.Event())
    client = admin_client(make_client, TOKEN, job_streams=1)
    job_id = client.post("/jobs/slow").json()["id"]
    wait_for_job(client, job_id, until=("running",))
    threading.Timer(0.5, events.stop_streams).start()
    began = time.monotonic()
    with client.stream("GET", f"/jobs/{job_id}/events") as response:
        read_events(response)
    assert time.monotonic() - began < 3  # ended with the server, not with the job
    assert client.get(f"/jobs/{job_id}").json()["status"] == "running"


def test_unknown_jobs_and_a_full_house_are_refused(make_client, slow_kind):
    client = admin_client(make_client, TOKEN, max_event_streams=1)
    assert_api_error(client.get("/jobs/0123456789abcdef0123456789abcdef/events"), 404, "job_not_found")
    job_id = client.post("/jobs/slow").json()["id"]
    opened = threading.Event()
    done = threading.Event()

    def hold_one_stream() -> None:
        with client.stream("GET", f"/jobs/{job_id}/events") as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    opened.set()
        done.set()

    holder = threading.Thread(target=hold_one_stream)
    holder.start()
    try:
        assert opened.wait(10)
        assert_api_error(client.get(f"/jobs/{job_id}/events"), 503, "too_many_streams")
    finally:
        slow_kind.set()
        holder.join(10)
    assert done.is_set()
    assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401


def job(status: str, attempt: int) -> Job:
    return Job("j", "svd", status, {}, 0.0, None, None, 0.0, None, None, False, None, None, attempt=attempt)


@pytest.mark.parametrize(
    ("before", "after", "states"),
    [
        (("queued", 0), ("queued", 0), []),
        (("queued", 0), ("running", 1), [("running", 1)]),
        (("queued", 0), ("succeeded", 1), [("running", 1), ("succeeded", 1)]),
        (("queued", 0), ("canceled", 0), [("canceled", 0)]),
        (("running", 1), ("queued", 1), [("queued", 1)]),  # its replica lost, back in the queue
        (("running", 1), ("running", 2), [("queued", 1), ("running", 2)]),
        (("running", 1), ("failed", 3), [("queued", 1), ("running", 2), ("queued", 2), ("running", 3), ("failed", 3)]),
    ],
)
def test_the_states_passed_through_between_two_reads(before, after, states):
    assert passed_through(job(*before), job(*after)) == states
    assert passed_through(job(*after), replace(job(*after), progress=0.5)) == []
