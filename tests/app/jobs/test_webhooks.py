"""The `webhook` query parameter of POST /jobs/{kind} (app/jobs/api.py): a finished job is
POSTed there, signed; GET /jobs/{id} shows the delivery; no URL or no secret is a 422."""

from __future__ import annotations

import time

from pencil_testkit import admin_client, assert_api_error, wait_for_job

from tests.jobs.webhook_receiver import SECRET, verified

TOKEN = "webhook-test-token"


def test_a_submission_with_a_webhook_is_posted_when_it_finishes(make_client, receiver):
    hook = receiver()
    client = admin_client(make_client, TOKEN, webhook_secret=SECRET)
    spec = {"spec": {"m": 12, "n": 8, "dtype": "float64"}, "method": "lapack"}
    response = client.post("/jobs/svd", params={"webhook": hook.url}, json=spec)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    headers, body = hook.wait_for(1)[0]
    assert verified(headers, body)["job"]["status"] == "succeeded"
    deadline = time.monotonic() + 5
    while not (state := client.get(f"/jobs/{job_id}").json()["webhook"])["delivered"]:
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    assert state["attempts"] == 1 and state["url"] == hook.url
    plain = client.post("/jobs/svd", json=spec).json()["id"]
    assert "webhook" not in wait_for_job(client, plain)


def test_a_webhook_needs_a_url_and_a_secret(make_client):
    spec = {"spec": {"m": 4, "n": 4}}
    unsigned = admin_client(make_client, TOKEN)
    refused = unsigned.post("/jobs/svd", params={"webhook": "https://example.com/hook"}, json=spec)
    assert_api_error(refused, 422, "invalid_parameter")
    assert "PENCIL_WEBHOOK_SECRET" in refused.json()["detail"]
    signed = admin_client(make_client, TOKEN, webhook_secret=SECRET)
    for url in ("file:///etc/passwd", "http://[::1", "http://h:99999/", "https://h/a b"):
        assert_api_error(signed.post("/jobs/svd", params={"webhook": url}, json=spec), 422, "invalid_parameter")
    assert unsigned.get("/jobs").json()["jobs"] == [] and signed.get("/jobs").json()["jobs"] == []
