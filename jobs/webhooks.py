"""Webhooks: a job submitted with a webhook URL is POSTed there once it has finished
(succeeded, failed or canceled), signed, and retried until the receiver answers 2xx.

The request: `Content-Type: application/json`, the body {"event": "job.finished", "job":
<the job as GET /jobs/{id} shows it>}, and the headers
    Pencil-Delivery:   <job id>.<attempt number>  (the same job id: the same event, retried)
    Pencil-Timestamp:  Unix seconds when it was sent
    Pencil-Signature:  sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed by
                       PENCIL_WEBHOOK_SECRET>
so a receiver checks the signature over the exact bytes it received and refuses old
timestamps (a replay). Any 2xx is a delivery; anything else (another status, a refused
connection, no answer within TIMEOUT_S) is tried again after RETRY_AFTER_S[attempt], at
most MAX_ATTEMPTS times in all, then given up (logged, and kept in the table with the
last error).

Deliveries live in the job database (table `webhooks`, written with the job in one
transaction), so none is lost on a restart; they are sent by the process that runs the
jobs of a replica, and a delivery is claimed (its `due` moved CLAIM_S ahead) before it is
sent, so replicas sharing PostgreSQL send each attempt once. Delivery is at least once: a
sender that dies (or hangs past CLAIM_S) mid-send leaves its attempt to be made again, so
a receiver dedupes by the job id of Pencil-Delivery. A job rebuilt from its folder (a
repaired SQLite database) comes back without its webhook.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from jobs.store import FINISHED, JobStore, job_body

log = logging.getLogger("pencil.webhooks")

MAX_URL = 2048
TIMEOUT_S = 10.0  # for each step of the exchange with the receiver (connect, send, each read)
RETRY_AFTER_S = (1.0, 5.0, 30.0, 120.0, 600.0)  # after the 1st, 2nd, ... failed attempt
MAX_ATTEMPTS = len(RETRY_AFTER_S) + 1
POLL_S = 0.5  # the sender looks for due deliveries this often
CLAIM_S = 300.0  # a claimed delivery is due again after this long (its sender died or is stuck)
SWEEP_S = 3600.0  # deliveries of purged jobs are forgotten this often
USER_AGENT = "pencil-gpu-webhook/1"


def check_url(url: str) -> str | None:
    """Why `url` cannot be a webhook (None: it can): an absolute http(s) URL with a host and
    a valid port, no blanks or control characters, at most MAX_URL characters."""
    if len(url) > MAX_URL:
        return f"at most {MAX_URL} characters"
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return "a URL without blanks or control characters (percent-encode them)"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is no number or out of range)
    except ValueError as exc:
        return f"a well-formed URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an absolute http:// or https:// URL with a host"
    return None


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The Pencil-Signature header value of a delivery."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


@dataclass(frozen=True)
class Delivery:
    job_id: str
    url: str
    attempt: int  # 1 for the first try


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer like any other non-2xx: urllib would follow it with a GET that
    carries no payload, and count that as a delivery."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class WebhookSender:
    """Sends the due deliveries of `store` on a thread of its own, signed with `secret`."""

    def __init__(self, store: JobStore, secret: str):
        self.store, self.secret = store, secret
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="webhooks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait_s: float = 1.0) -> None:
        """Stop sending; a send in flight finishes on the daemon thread (or, if the process
        exits first, is claimed again after CLAIM_S)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=wait_s)

    def _loop(self) -> None:
        swept = 0.0
        store_errors: tuple[type[BaseException], ...] = (*self.store.dialect.errors, OSError)
        while not self._stopping.is_set():
            try:
                if time.monotonic() - swept > SWEEP_S:
                    self.sweep()
                    swept = time.monotonic()
                while (delivery := self.claim()) is not None and not self._stopping.is_set():
                    self.send(delivery)
            except store_errors as exc:
                log.warning("webhooks: the job store failed (%s); trying again in %.1f s", exc, POLL_S)
            except Exception:  # the sender must outlive anything
                log.exception("webhooks: the sender failed; it carries on")
            self._stopping.wait(POLL_S)

    def sweep(self) -> None:
        """Forget the deliveries of jobs the retention sweep removed."""
        with self.store.session(write=True) as session:
            session.run("DELETE FROM webhooks WHERE job_id NOT IN (SELECT id FROM jobs)")

    def claim(self) -> Delivery | None:
        """The next due delivery of a finished job, its attempt counted and its `due` moved
        CLAIM_S ahead (so that no other sender takes it meanwhile); None if there is none."""
        db = self.store.dialect
        finished = ", ".join(f"'{status}'" for status in FINISHED)
        sql = (
            f"UPDATE webhooks SET attempts = attempts + 1, due = {db.NOW} + ? WHERE job_id = ("
            "SELECT w.job_id FROM webhooks w JOIN jobs j ON j.id = w.job_id "
            f"WHERE w.delivered IS NULL AND w.gave_up IS NULL AND w.due <= {db.NOW} AND j.status IN ({finished}) "
            f"ORDER BY w.due LIMIT 1{db.SKIP_LOCKED.replace('FOR UPDATE', 'FOR UPDATE OF w')}) "
            "AND delivered IS NULL AND gave_up IS NULL "
            "RETURNING job_id, url, attempts"
        )
        with self.store.session(write=True) as session:
            row = session.one(sql, (CLAIM_S,))
        return Delivery(row["job_id"], row["url"], row["attempts"]) if row else None

    def send(self, delivery: Delivery) -> bool:
        """POST the finished job to its webhook once; record the outcome. True: delivered."""
        job = self.store.get(delivery.job_id)
        if job is None:  # purged meanwhile
            self._record(delivery, delivered=False, error="the job no longer exists", final=True)
            return False
        body = json.dumps({"event": "job.finished", "job": job_body(job)}).encode()
        timestamp = str(int(time.time()))
        request = urllib.request.Request(
            delivery.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "Pencil-Delivery": f"{delivery.job_id}.{delivery.attempt}",
                "Pencil-Timestamp": timestamp,
                "Pencil-Signature": signature(self.secret, timestamp, body),
            },
        )
        try:
            with _OPENER.open(request, timeout=TIMEOUT_S) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            moved = exc.headers.get("Location") if 300 <= exc.code < 400 else None
            status, error = exc.code, f"the receiver answered {exc.code}" + (f" (Location {moved})" if moved else "")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            status, error = 0, f"could not reach the receiver ({getattr(exc, 'reason', exc)})"
        else:
            error = f"the receiver answered {status}"
        delivered = 200 <= status < 300
        final = delivered or delivery.attempt >= MAX_ATTEMPTS
        self._record(delivery, delivered, None if delivered else error, final)
        fields: dict[str, Any] = {"job_id": delivery.job_id, "attempt": delivery.attempt}
        if delivered:
            log.info("job %s: webhook delivered (attempt %d)", delivery.job_id, delivery.attempt, extra=fields)
        elif final:
            log.warning(
                "job %s: webhook given up after %d attempts: %s", delivery.job_id, delivery.attempt, error, extra=fields
            )
        else:
            log.info(
                "job %s: webhook attempt %d failed (%s); trying again in %.0f s",
                delivery.job_id,
                delivery.attempt,
                error,
                RETRY_AFTER_S[delivery.attempt - 1],
                extra=fields,
            )
        return delivered

    def _record(self, delivery: Delivery, delivered: bool, error: str | None, final: bool) -> None:
        """The outcome of this attempt, written only while the delivery still holds it (a
        sender slower than CLAIM_S finds another attempt recorded and writes nothing)."""
        now = time.time()
        fence = "WHERE job_id = ? AND attempts = ? AND delivered IS NULL AND gave_up IS NULL"
        with self.store.session(write=True) as session:
            if delivered:
                session.run(f"UPDATE webhooks SET delivered = ?, error = NULL {fence}", (now, *self._key(delivery)))
            elif final:
                session.run(f"UPDATE webhooks SET gave_up = ?, error = ? {fence}", (now, error, *self._key(delivery)))
            else:
                wait = RETRY_AFTER_S[delivery.attempt - 1]
                session.run(
                    f"UPDATE webhooks SET due = {self.store.dialect.NOW} + ?, error = ? {fence}",
                    (wait, error, *self._key(delivery)),
                )

    @staticmethod
    def _key(delivery: Delivery) -> tuple[str, int]:
        return delivery.job_id, delivery.attempt


def delivery_state(store: JobStore, job_id: str) -> dict[str, Any] | None:
    """The webhook of a job as GET /jobs/{id} shows it: url, attempts, delivered (bool),
    gave_up (bool), error; None when the job has none."""
    with store.session() as session:
        row = session.one("SELECT url, attempts, delivered, gave_up, error FROM webhooks WHERE job_id = ?", (job_id,))
    if row is None:
        return None
    return {
        "url": row["url"],
        "attempts": row["attempts"],
        "delivered": row["delivered"] is not None,
        "gave_up": row["gave_up"] is not None,
        "error": row["error"],
    }
