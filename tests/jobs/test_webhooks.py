"""jobs/webhooks.py: a finished job POSTed to its webhook, signed, retried after a failure,
given up after MAX_ATTEMPTS, sent once by replicas sharing PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest

import jobs.webhooks
from jobs.store import JobStore
from jobs.webhooks import MAX_ATTEMPTS, WebhookSender, check_url, delivery_state, signature
from tests.jobs.webhook_receiver import SECRET, verified


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(jobs.webhooks, "RETRY_AFTER_S", (0.05,) * (MAX_ATTEMPTS - 1))
    monkeypatch.setattr(jobs.webhooks, "POLL_S", 0.02)


def finished_job(store: JobStore, url: str) -> str:
    job, _ = store.create("svd", {"m": 3}, webhook=url)
    claimed = store.claim_next()
    assert claimed is not None and claimed.id == job.id
    assert store.succeed(claimed, {"answer": 42})
    return job.id


def test_a_failed_delivery_is_retried_and_the_second_is_signed_and_recorded(tmp_path, receiver, quick_retries):
    hook = receiver([503])
    store = JobStore(tmp_path)
    job_id = finished_job(store, hook.url)
    sender = WebhookSender(store, SECRET)
    sender.start()
    try:
        (first_headers, first_body), (headers, body) = hook.wait_for(2)
    finally:
        sender.stop()
    assert first_body == body and first_headers["Pencil-Delivery"] == f"{job_id}.1"
    assert headers["Pencil-Delivery"] == f"{job_id}.2" and headers["Content-Type"] == "application/json"
    sent = verified(headers, body)
    assert sent["event"] == "job.finished"
    assert sent["job"]["id"] == job_id and sent["job"]["status"] == "succeeded"
    assert sent["job"]["result_url"] == f"/jobs/{job_id}/result"
    state = delivery_state(store, job_id)
    assert state == {"url": hook.url, "attempts": 2, "delivered": True, "gave_up": False, "error": None}
    time.sleep(0.2)
    assert len(hook.requests) == 2  # delivered once: never again
    store.close()


def test_an_unfinished_job_is_not_sent_and_an_unreachable_receiver_is_given_up(tmp_path, receiver, quick_retries):
    store = JobStore(tmp_path)
    gone = receiver()
    gone.close()  # nothing listens there any more
    job_id = finished_job(store, gone.url)
    queued, _ = store.create("svd", {}, webhook=receiver().url)
    sender = WebhookSender(store, SECRET)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        delivery = None
        deadline = time.monotonic() + 5
        while delivery is None and time.monotonic() < deadline:
            delivery = sender.claim()
            time.sleep(0.01)
        assert delivery is not None and delivery.attempt == attempt and delivery.job_id == job_id
        assert not sender.send(delivery)
    state = delivery_state(store, job_id)
    assert state["gave_up"] and not state["delivered"] and state["attempts"] == MAX_ATTEMPTS
    assert "could not reach the receiver" in state["error"]
    time.sleep(0.1)
    assert sender.claim() is None
    assert delivery_state(store, queued.id)["attempts"] == 0
    store.close()


def test_replicas_sharing_postgresql_send_each_webhook_once(postgres_url, tmp_path, receiver, quick_retries):
    psycopg = pytest.importorskip("psycopg")
    del psycopg
    hook = receiver()
    stores = [JobStore(tmp_path, postgres_url, f"replica-{i}") for i in range(2)]
    job_ids = [finished_job(stores[0], hook.url) for _ in range(6)]
    senders = [WebhookSender(store, SECRET) for store in stores]
    for sender in senders:
        sender.start()
    try:
        hook.wait_for(6)
        time.sleep(0.3)
    finally:
        for sender in senders:
            sender.stop()
    delivered = sorted(json.loads(body)["job"]["id"] for _, body in hook.requests)
    assert delivered == sorted(job_ids)
    for store in stores:
        store.close()


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://example.com/hooks/pencil?x=1", True),
        ("http://10.0.0.5:8080/", True),
        ("ftp://example.com/", False),
        ("/relative/path", False),
        ("https://", False),
        ("https://example.com/" + "a" * 2100, False),
        ("http://[::1", False),  # not a URL at all (urlsplit raises)
        ("http://h:99999/", False),
        ("http://h:abc/", False),
        ("http://h/a b", False),
        ("http://h/\r\nX-Injected: 1", False),
    ],
)
def test_webhook_urls(url, ok):
    assert (check_url(url) is None) == ok


def test_the_signature_is_an_hmac_of_timestamp_and_body():
    body = b'{"event": "job.finished"}'
    assert signature(SECRET, "1700000000", body) == (
        "sha256=" + hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    )
    assert signature(SECRET, "1700000001", body) != signature(SECRET, "1700000000", body)


def test_a_redirect_is_no_delivery(tmp_path, receiver, quick_retries):
    """urllib would follow a 301 with a GET without the payload: a 3xx is retried instead."""
    hook = receiver([301, 200])
    store = JobStore(tmp_path)
    job_id = finished_job(store, hook.url)
    sender = WebhookSender(store, SECRET)
    first = sender.claim()
    assert first is not None and not sender.send(first)
    state = delivery_state(store, job_id)
    assert not state["delivered"] and "301" in state["error"]
    second = None
    while second is None:
        second = sender.claim()
    assert sender.send(second) and delivery_state(store, job_id)["delivered"]
    assert len(hook.requests) == 2 and all(body for _, body in hook.requests)
    store.close()


def test_a_late_sender_cannot_overwrite_a_newer_attempt(tmp_path, receiver):
    store = JobStore(tmp_path)
    job_id = finished_job(store, receiver().url)
    sender = WebhookSender(store, SECRET)
    stale = sender.claim()
    with store.session(write=True) as session:  # its claim ran out: another sender takes it
        session.run("UPDATE webhooks SET due = 0 WHERE job_id = ?", (job_id,))
    fresh = sender.claim()
    assert stale is not None and fresh is not None and (stale.attempt, fresh.attempt) == (1, 2)
    assert sender.send(fresh)
    sender._record(stale, delivered=False, error="too late", final=True)  # the first sender, at last
    assert delivery_state(store, job_id) == {
        "url": fresh.url,
        "attempts": 2,
        "delivered": True,
        "gave_up": False,
        "error": None,
    }
    store.close()
