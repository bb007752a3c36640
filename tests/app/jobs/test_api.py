"""The batch-job HTTP API (app/jobs/api.py, app/jobs/svd.py) through the whole app on the CPU
backend: Bearer auth, SVD jobs from a JSON spec and from an uploaded .npy (values checked
against NumPy, result files downloaded), input errors answered at once without a job,
Idempotency-Key, listing and paging, cancel of queued and running jobs (a test job kind
that runs until released), restart recovery on the same data directory, SVD jobs under
/sketch load, and the job metrics."""

from __future__ import annotations

import io
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pencil_testkit import (
    admin_client,
    assert_api_error,
    fetch_npy,
    metric_value,
    photo_bytes,
    sketch_files,
    wait_for_job,
)

from gpu.svd.params import make_matrix
from jobs.runner import JobRunner

TOKEN = "test-admin-token-0123"
WAIT_S = 30.0
FINISHED = ("succeeded", "failed", "canceled")


# ------------------------------------------------------------------ helpers --


def admin(make_client, **overrides):
    """A started client of an app with jobs enabled, sending the right Bearer token."""
    return admin_client(make_client, TOKEN, **overrides)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def upload(data: bytes, **options) -> dict:
    """Keyword arguments of client.post for a multipart upload of `data` as `matrix`, with
    the options as JSON in the field `params`."""
    return {
        "files": {"matrix": ("a.npy", data, "application/octet-stream")},
        "data": {"params": json.dumps(options)} if options else {},
    }


def spec(m=24, n=16, dtype="float64", seed=0, kind="gaussian", **extra) -> dict:
    return {"m": m, "n": n, "dtype": dtype, "seed": seed, "kind": kind, **extra}


def submit(client, path="/jobs/svd", **request) -> str:
    response = client.post(path, **request)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert response.headers["location"] == f"/jobs/{job_id}"
    return job_id


def wait(client, job_id: str, until=FINISHED) -> dict:
    return wait_for_job(client, job_id, until, WAIT_S)


def finished_ok(client, job_id: str) -> dict:
    body = wait(client, job_id)
    assert body["status"] == "succeeded", body
    return body


def result_of(client, job_id: str) -> dict:
    finished_ok(client, job_id)
    response = client.get(f"/jobs/{job_id}/result")
    assert response.status_code == 200, response.text
    return response.json()


def job_ids(client, **query) -> list[str]:
    response = client.get("/jobs", params=query)
    assert response.status_code == 200, response.text
    return [job["id"] for job in response.json()["jobs"]]


@pytest.fixture
def no_runner(monkeypatch):
    """Apps made after this fixture never run a job (their worker threads return at once)."""
    monkeypatch.setattr(JobRunner, "_work", lambda self: None)


# --------------------------------------------------------------------- auth --


def test_jobs_are_disabled_without_an_admin_token(make_client):
    client = make_client(admin_token=None)  # explicit: an environment variable must not enable it
    for response in (
        client.post("/jobs/svd", json={"spec": spec()}),
        client.get("/jobs"),
        client.get("/jobs/anything", headers={"Authorization": "Bearer "}),
        client.delete("/jobs/anything", headers={"Authorization": f"Bearer {TOKEN}"}),
    ):
        assert_api_error(response, 503, "admin_disabled")


@pytest.mark.parametrize(
    "authorization",
    [None, f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer", "Bearer ", f"Basic {TOKEN}", f"Token {TOKEN}", TOKEN],
)
def test_a_wrong_or_missing_token_is_401(make_client, authorization):
    client = make_client(admin_token=TOKEN)
    headers = {} if authorization is None else {"Authorization": authorization}
    for response in (
        client.get("/jobs", headers=headers),
        client.post("/jobs/svd", json={"spec": spec()}, headers=headers),
        client.post("/jobs/nope", headers=headers),
    ):
        assert_api_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).json()["jobs"] == []  # nothing was created


def test_the_right_token_is_accepted_whatever_the_case_of_the_scheme(make_client):
    client = make_client(admin_token=TOKEN)
    for scheme in ("Bearer", "bearer", "BEARER"):
        response = client.get("/jobs", headers={"Authorization": f"{scheme} {TOKEN}"})
        assert response.status_code == 200, response.text
        assert response.json() == {"jobs": [], "next_page_token": None}


# ---------------------------------------------------------------- SVD jobs --


@pytest.mark.parametrize(
    ("method", "dtype", "m", "n", "rtol"),
    [
        ("lapack", "float64", 64, 40, 1e-6),
        ("golub_reinsch", "float32", 40, 24, 1e-4),
        ("golub_reinsch", "float64", 20, 36, 1e-8),
    ],
)
def test_svd_of_a_generated_matrix(make_client, rng, method, dtype, m, n, rtol):
    client = admin(make_client)
    seed = int(rng.integers(0, 2**31))
    the_spec = spec(m, n, dtype, seed, "ill_conditioned", cond=1e3)
    response = client.post("/jobs/svd", json={"spec": the_spec, "method": method})
    assert response.status_code == 202, response.text
    queued = response.json()
    assert response.headers["location"] == f"/jobs/{queued['id']}"
    assert int(response.headers["retry-after"]) > 0
    assert queued["status"] == "queued" and queued["kind"] == "svd" and queued["result_url"] is None
    assert queued["params"]["spec"]["seed"] == seed and queued["params"]["method"] == method

    done = finished_ok(client, queued["id"])
    assert done["progress"] == 1.0 and done["error"] is None and done["result_url"] == f"/jobs/{queued['id']}/result"
    assert done["created"] <= done["started"] <= done["finished"]
    assert "retry-after" not in client.get(f"/jobs/{queued['id']}").headers

    body = client.get(done["result_url"]).json()
    result = body["result"]
    a = make_matrix(m, n, np.dtype(dtype), seed, "ill_conditioned", cond=1e3)
    expected = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    k = min(m, n)
    assert (result["m"], result["n"], result["dtype"], result["method"]) == (m, n, dtype, method)
    assert result["singular_values_count"] == k
    np.testing.assert_allclose(result["singular_values"], expected, rtol=rtol, atol=rtol * expected[0])
    assert result["condition_number"] == pytest.approx(1e3, rel=1e-2)
    assert set(result["accuracy"]) == {"resid", "orth_u", "orth_v"}
    assert all(0 <= ratio <= 35 for ratio in result["accuracy"].values()), result["accuracy"]

    assert body["files"] == {name: f"/jobs/{queued['id']}/files/{name}" for name in ("s.npy", "u.npy", "vt.npy")}
    s, u, vt = (fetch_npy(client, body["files"][name]) for name in ("s.npy", "u.npy", "vt.npy"))
    assert s.dtype == u.dtype == vt.dtype == np.dtype(dtype)
    assert u.shape == (m, k) and vt.shape == (k, n)
    np.testing.assert_array_equal(s, np.asarray(result["singular_values"], dtype))
    np.testing.assert_allclose((u.astype(np.float64) * s) @ vt, a, atol=50 * np.finfo(dtype).eps * max(m, n))


@pytest.mark.parametrize(
    ("shape", "fields"),
    [
        ((24, 24), {"compute_uv": False}),
        ((48, 12), {"method": "golub_reinsch"}),
        ((12, 48), {"method": "auto", "full_matrices": True}),
    ],
    ids=["square-values-only", "tall-golub-reinsch", "wide-full-matrices"],
)
def test_svd_of_an_uploaded_matrix(make_client, rng, shape, fields):
    client = admin(make_client)
    a = (rng.standard_normal(shape) + 0.5).astype(np.float32)
    job_id = submit(client, **upload(npy(a), **fields))
    params = client.get(f"/jobs/{job_id}").json()["params"]
    compute_uv = fields.get("compute_uv", True)
    assert params["source"] == "upload" and (params["m"], params["n"], params["dtype"]) == (*shape, "float32")
    assert params["compute_uv"] is compute_uv and params["full_matrices"] is fields.get("full_matrices", False)

    body = result_of(client, job_id)
    result = body["result"]
    expected = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    np.testing.assert_allclose(result["singular_values"], expected, rtol=1e-4, atol=1e-5 * expected[0])
    assert result["method"] == ("lapack" if fields.get("method", "auto") == "auto" else fields["method"])
    m, n = shape
    if not compute_uv:
        assert set(body["files"]) == {"s.npy"} and result["accuracy"] is None
        assert client.get(f"/jobs/{job_id}/files/u.npy").status_code == 404
        return
    assert set(body["files"]) == {"s.npy", "u.npy", "vt.npy"}
    assert all(0 <= ratio <= 35 for ratio in result["accuracy"].values()), result["accuracy"]
    u, s, vt = (fetch_npy(client, body["files"][name]) for name in ("u.npy", "s.npy", "vt.npy"))
    k = min(shape)
    assert (u.shape, vt.shape) == (((m, m), (n, n)) if fields.get("full_matrices") else ((m, k), (k, n)))
    np.testing.assert_allclose((u[:, :k].astype(np.float64) * s) @ vt[:k], a, atol=1e-4 * expected[0])


@pytest.mark.parametrize(
    "layout",
    [
        ">f8",
        "fortran",
    ],
)
def test_uploads_in_any_byte_order_and_memory_layout_succeed(make_client, rng, layout):
    """A big-endian or Fortran-ordered .npy is accepted at submission; it must also run."""
    client = admin(make_client)
    a = rng.standard_normal((16, 10))
    sent = a.astype(">f8") if layout == ">f8" else np.asfortranarray(a)
    job_id = submit(client, **upload(npy(sent), method="golub_reinsch"))
    done = wait(client, job_id)
    assert done["status"] == "succeeded", done
    values = client.get(f"/jobs/{job_id}/result").json()["result"]["singular_values"]
    np.testing.assert_allclose(values, np.linalg.svd(a, compute_uv=False), rtol=1e-9)


# --------------------------------------------------------------- bad input --

GOOD = np.arange(1.0, 13.0).reshape(4, 3)
WITH_NAN = GOOD.copy()
WITH_NAN[2, 1] = np.nan
WITH_INF = GOOD.copy()
WITH_INF[0, 0] = -np.inf
MAX_ELEMENTS = 10_000

BAD_REQUESTS = [
    pytest.param(upload(b"these bytes are no .npy file"), 400, "malformed_npy", id="garbage-bytes"),
    pytest.param(upload(npy(GOOD)[:-20]), 400, "malformed_npy", id="truncated-npy"),
    pytest.param(upload(b""), 400, "empty_file", id="empty-file"),
    pytest.param(upload(npy(np.ones((2, 3, 4)))), 422, "not_a_matrix", id="3-d"),
    pytest.param(upload(npy(np.ones(5))), 422, "not_a_matrix", id="1-d"),
    pytest.param(upload(npy(GOOD.astype(np.int32))), 422, "unsupported_dtype", id="int32"),
    pytest.param(upload(npy(GOOD.astype(np.float16))), 422, "unsupported_dtype", id="float16"),
    pytest.param(upload(npy(GOOD.astype(np.complex64))), 422, "unsupported_dtype", id="complex64"),
    pytest.param(upload(npy(WITH_NAN)), 422, "invalid_matrix", id="nan"),
    pytest.param(upload(npy(WITH_INF.astype(np.float32))), 422, "invalid_matrix", id="inf"),
    pytest.param(upload(npy(np.ones((0, 3)))), 422, "invalid_matrix", id="empty-matrix"),
    pytest.param(upload(npy(np.ones((101, 100), np.float32))), 413, "too_many_elements", id="upload-too-large"),
    pytest.param({"json": {"spec": spec(101, 100)}}, 413, "too_many_elements", id="spec-too-large"),
    pytest.param(
        {"files": {"other": ("a.npy", npy(GOOD), "application/octet-stream")}},
        400,
        "missing_matrix",
        id="no-matrix-field",
    ),
    pytest.param(
        {"files": {"x": ("x", b"1")}, "data": {"matrix": "not a file"}}, 400, "missing_matrix", id="matrix-not-a-file"
    ),
    pytest.param(
        {"content": b"1 2 3", "headers": {"Content-Type": "text/plain"}}, 415, "unsupported_media_type", id="text-plain"
    ),
    pytest.param(
        {"content": b"{'spec': ", "headers": {"Content-Type": "application/json"}}, 400, "bad_request", id="not-json"
    ),
    pytest.param({"json": [1, 2]}, 422, "invalid_parameter", id="json-array"),
    pytest.param({"json": {"method": "lapack"}}, 422, "invalid_parameter", id="no-spec"),
    pytest.param({"json": {"spec": spec(m=0)}}, 422, "invalid_parameter", id="m-zero"),
    pytest.param({"json": {"spec": spec(kind="hilbert")}}, 422, "invalid_parameter", id="unknown-kind"),
    pytest.param({"json": {"spec": spec(dtype="int8")}}, 422, "invalid_parameter", id="spec-dtype"),
    pytest.param(
        {"json": {"spec": spec(kind="ill_conditioned", cond=0.5)}}, 422, "invalid_parameter", id="cond-below-1"
    ),
    pytest.param({"json": {"spec": spec(), "method": "cusolver"}}, 422, "invalid_parameter", id="spec-cusolver-on-cpu"),
    pytest.param(upload(npy(GOOD), method="cusolver"), 422, "invalid_parameter", id="upload-cusolver-on-cpu"),
    pytest.param(upload(npy(GOOD), method="jacobi"), 422, "invalid_parameter", id="unknown-method"),
    pytest.param(upload(npy(GOOD), compute_uv="maybe"), 422, "invalid_parameter", id="compute-uv-not-bool"),
    pytest.param(
        {**upload(npy(GOOD)), "data": {"method": "lapack"}}, 422, "use_params_field", id="options-as-separate-fields"
    ),
    pytest.param(
        {**upload(npy(GOOD)), "data": {"params": "{method: lapack}"}}, 400, "bad_request", id="params-not-json"
    ),
    pytest.param({**upload(npy(GOOD)), "data": {"params": "[1]"}}, 422, "invalid_parameter", id="params-not-an-object"),
    pytest.param(
        {"json": {"spec": spec()}, "headers": {"Idempotency-Key": "k" * 201}},
        400,
        "bad_idempotency_key",
        id="idempotency-key-too-long",
    ),
]


@pytest.mark.parametrize(("request_kwargs", "status", "code"), BAD_REQUESTS)
def test_bad_input_is_refused_at_once_and_creates_no_job(make_client, tmp_path, request_kwargs, status, code):
    client = admin(make_client, max_matrix_elements=MAX_ELEMENTS)
    assert_api_error(client.post("/jobs/svd", **request_kwargs), status, code, client)
    assert job_ids(client) == []
    assert list((tmp_path / "data" / "jobs").iterdir()) == []  # no input files left behind


@pytest.mark.parametrize(
    "body",
    [
        b'{"spec": {"m": 8, "n": 6, "kind": "low_rank", "rank": 7}}',
        b'{"spec": {"m": 8, "n": 6, "kind": "ill_conditioned", "cond": Infinity}}',
        b'{"spec": {"m": 8, "n": 6, "kind": "gaussian", "cond": Infinity}}',
        b'{"spec": {"m": true, "n": 6}}',
        b'{"spec": {"m": 8, "n": 6, "seed": false}}',
        b'{"spec": {"m": 8, "n": 6}, "compute_uv": 1}',
    ],
    ids=["rank-above-min", "cond-infinity", "cond-infinity-unused", "m-boolean", "seed-boolean", "compute-uv-number"],
)
def test_a_spec_the_generator_would_refuse_is_422_at_once(make_client, body):
    client = admin(make_client, raise_server_exceptions=False)
    response = client.post("/jobs/svd", content=body, headers={"Content-Type": "application/json"})
    assert_api_error(response, 422, "invalid_parameter")
    assert job_ids(client) == []


def test_unknown_kinds_jobs_and_files_are_404(make_client, tmp_path):
    client = admin(make_client)
    assert_api_error(client.post("/jobs/nope", json={}), 404, "unknown_job_kind")
    for response in (
        client.get("/jobs/0123abcd"),
        client.get("/jobs/0123abcd/result"),
        client.get("/jobs/0123abcd/files/s.npy"),
        client.delete("/jobs/0123abcd"),
    ):
        assert_api_error(response, 404, "job_not_found")

    job_id = submit(client, json={"spec": spec(8, 6)})
    finished_ok(client, job_id)
    assert (tmp_path / "data" / "jobs.sqlite3").is_file()
    assert_api_error(client.get(f"/jobs/{job_id}/files/nope.npy"), 404, "file_not_found")
    for name in (
        "%2E%2E",
        "..%2Fjobs.sqlite3",
        "..%2F..%2Fjobs.sqlite3",
        "%2E%2E%2F%2E%2E%2Fjobs.sqlite3",
        "..%5C..%5Cjobs.sqlite3",
        "%2E",
    ):
        response = client.get(f"/jobs/{job_id}/files/{name}")
        assert response.status_code == 404, (name, response.status_code, response.content[:64])
        assert b"SQLite format" not in response.content


# ------------------------------------------------------------ idempotency --


def test_idempotency_key_replays_the_job_and_refuses_another_body(make_client, rng):
    client = admin(make_client)
    body = {"spec": spec(12, 8, seed=3)}
    first = client.post("/jobs/svd", json=body, headers={"Idempotency-Key": "spec-1"})
    again = client.post("/jobs/svd", json=body, headers={"Idempotency-Key": "spec-1"})
    assert first.status_code == 202 and again.status_code == 200, (first.text, again.text)
    assert again.json()["id"] == first.json()["id"] and again.headers["location"] == first.headers["location"]

    changed = client.post("/jobs/svd", json={"spec": spec(12, 8, seed=4)}, headers={"Idempotency-Key": "spec-1"})
    assert_api_error(changed, 409, "idempotency_conflict")
    other_key = client.post("/jobs/svd", json=body, headers={"Idempotency-Key": "spec-2"})
    assert other_key.status_code == 202 and other_key.json()["id"] != first.json()["id"]

    a = npy(rng.standard_normal((6, 5)).astype(np.float32))  # the multipart boundary differs per request
    uploads = [
        client.post("/jobs/svd", **upload(a, compute_uv=False), headers={"Idempotency-Key": "up"}) for _ in range(2)
    ]
    assert [r.status_code for r in uploads] == [202, 200] and uploads[0].json()["id"] == uploads[1].json()["id"]
    assert_api_error(
        client.post("/jobs/svd", **upload(a, compute_uv=True), headers={"Idempotency-Key": "up"}),
        409,
        "idempotency_conflict",
    )
    other_matrix = npy(rng.standard_normal((6, 5)).astype(np.float32))  # same shape, dtype and options
    assert_api_error(
        client.post("/jobs/svd", **upload(other_matrix, compute_uv=False), headers={"Idempotency-Key": "up"}),
        409,
        "idempotency_conflict",
    )

    assert sorted(job_ids(client)) == sorted({first.json()["id"], other_key.json()["id"], uploads[0].json()["id"]})
    finished_ok(client, first.json()["id"])
    late = client.post("/jobs/svd", json=body, headers={"Idempotency-Key": "spec-1"})  # a retry after the job ended
    assert late.status_code == 200 and late.json()["status"] == "succeeded" and "retry-after" not in late.headers


# ------------------------------------------------------------------ listing --


def test_listing_is_newest_first_pages_and_filters(make_client, no_runner):
    client = admin(make_client)
    submitted = [submit(client, json={"spec": spec(4, 4, seed=i)}) for i in range(7)]
    newest_first = submitted[::-1]
    for job_id in submitted[1:5:2]:
        assert client.delete(f"/jobs/{job_id}").json()["status"] == "canceled"
    canceled = submitted[1:5:2]

    assert job_ids(client) == newest_first
    seen, token, pages = [], None, 0
    while True:
        page = client.get("/jobs", params={"page_size": 3, **({"page_token": token} if token else {})}).json()
        assert len(page["jobs"]) <= 3
        seen += [job["id"] for job in page["jobs"]]
        token, pages = page["next_page_token"], pages + 1
        if token is None:
            break
    assert seen == newest_first and pages == 3

    assert job_ids(client, status="canceled") == canceled[::-1]
    exact = client.get("/jobs", params={"status": "canceled", "page_size": len(canceled)}).json()
    assert len(exact["jobs"]) == len(canceled) and exact["next_page_token"] is None  # no empty last page
    assert job_ids(client, status="queued") == [j for j in newest_first if j not in canceled]
    first = client.get("/jobs", params={"status": "queued", "page_size": 4}).json()
    rest = job_ids(client, status="queued", page_size=4, page_token=first["next_page_token"])
    assert [job["id"] for job in first["jobs"]] + rest == [j for j in newest_first if j not in canceled]
    assert job_ids(client, kind="svd") == newest_first and job_ids(client, kind="other") == []
    assert job_ids(client, status="succeeded") == []

    assert_api_error(client.get("/jobs", params={"page_token": "not-a-job"}), 400, "bad_page_token")
    assert_api_error(client.get("/jobs", params={"status": "done"}), 422, "invalid_parameter")
    for size in (0, 501, "x"):
        assert_api_error(client.get("/jobs", params={"page_size": size}), 422, "invalid_parameter")


# ------------------------------------------------------------------- cancel --


def test_cancel_of_queued_and_running_jobs(make_client, slow_kind):
    client = admin(make_client, job_streams=1)
    running = submit(client, "/jobs/slow")
    wait(client, running, until=("running",))
    queued = submit(client, "/jobs/slow")
    time.sleep(0.2)
    status = client.get(f"/jobs/{running}").json()
    assert status["status"] == "running" and 0 < status["progress"] < 1 and status["started"] is not None
    assert client.get(f"/jobs/{queued}").json()["status"] == "queued"  # one job stream: it waits
    not_yet = client.get(f"/jobs/{running}/result")
    assert_api_error(not_yet, 409, "job_not_finished")
    assert int(not_yet.headers["retry-after"]) > 0

    response = client.delete(f"/jobs/{queued}")
    assert response.status_code == 200, response.text
    assert (
        response.json()["status"] == "canceled"
        and response.json()["finished"] is not None
        and "retry-after" not in response.headers
    )

    response = client.delete(f"/jobs/{running}")
    assert response.status_code == 202, response.text
    assert response.json()["cancel_requested"] is True and response.json()["status"] == "running"
    assert int(response.headers["retry-after"]) > 0
    ended = wait(client, running)
    assert ended["status"] == "canceled" and ended["result_url"] is None and ended["error"]

    for job_id in (running, queued):
        assert_api_error(client.get(f"/jobs/{job_id}/result"), 409, "job_canceled")
        assert_api_error(client.delete(f"/jobs/{job_id}"), 409, "job_finished")

    last = submit(client, "/jobs/slow")  # the worker is free again
    wait(client, last, until=("running",))
    slow_kind.set()
    assert result_of(client, last)["result"]["steps"] >= 0
    assert_api_error(client.delete(f"/jobs/{last}"), 409, "job_finished")
    metrics = client.get("/metrics").text
    assert metric_value(metrics, "pencil_jobs", kind="slow", status="canceled") == 2
    assert metric_value(metrics, "pencil_jobs_finished_total", kind="slow", status="canceled") >= 1


# ------------------------------------------------------------------ restart --


def test_a_restart_on_the_same_data_dir_loses_no_job(make_client, monkeypatch):
    monkeypatch.setattr(JobRunner, "_work", lambda self: None)
    first = admin(make_client)
    ids = [submit(first, json={"spec": spec(10, 8, seed=i)}) for i in range(3)]
    for _ in range(2):  # the oldest two were running when the process died...
        assert first.app.state.jobs.claim_next().id in ids[:2]
    response = first.delete(f"/jobs/{ids[1]}")  # ...and a cancel of the second was asked for
    assert response.status_code == 202 and response.json()["cancel_requested"] is True
    assert [first.get(f"/jobs/{i}").json()["status"] for i in ids] == ["running", "running", "queued"]
    first.__exit__(None, None, None)
    monkeypatch.undo()

    second = admin(make_client)
    assert [wait(second, i)["status"] for i in ids] == ["succeeded", "canceled", "succeeded"]
    assert result_of(second, ids[0])["result"]["singular_values_count"] == 8


# --------------------------------------------------------- load and metrics --


def test_svd_jobs_alongside_sketches(make_client, rng):
    client = admin(make_client, job_streams=2, workers=2)
    image = photo_bytes("coffee", "jpeg", 96, rng=rng)
    barrier = threading.Barrier(28)

    def submit_job(i: int):
        barrier.wait(timeout=WAIT_S)
        return client.post(
            "/jobs/svd", json={"spec": spec(32, 24, seed=i), "method": "golub_reinsch" if i % 4 == 0 else "lapack"}
        )

    def sketch(_):
        barrier.wait(timeout=WAIT_S)
        return client.post("/sketch", files=sketch_files(image))

    with ThreadPoolExecutor(28) as pool:  # all at once: 20 submissions and 8 renders
        job_futures = [pool.submit(submit_job, i) for i in range(20)]
        sketch_futures = [pool.submit(sketch, i) for i in range(8)]
        jobs = [future.result(timeout=WAIT_S) for future in job_futures]
        sketches = [future.result(timeout=WAIT_S) for future in sketch_futures]
    assert [r.status_code for r in sketches] == [200] * 8, [r.text[:200] for r in sketches]
    assert [r.status_code for r in jobs] == [202] * 20
    ids = {r.json()["id"] for r in jobs}
    assert len(ids) == 20 and set(job_ids(client, page_size=500)) == ids
    for job_id in ids:
        accuracy = result_of(client, job_id)["result"]["accuracy"]
        assert max(accuracy.values()) <= 35, accuracy

    metrics = client.get("/metrics").text
    assert metric_value(metrics, "pencil_jobs", kind="svd", status="succeeded") == 20
    assert metric_value(metrics, "pencil_jobs_finished_total", kind="svd", status="succeeded") >= 20
    assert metric_value(metrics, "pencil_job_run_seconds_count", kind="svd") >= 20
    assert metric_value(metrics, "pencil_jobs", kind="svd", status="failed") is None


def test_golub_reinsch_is_limited_to_what_the_numpy_reference_finishes(make_client):
    client = admin(make_client)
    refused = client.post("/jobs/svd", json={"spec": spec(600, 520), "method": "golub_reinsch"})
    assert_api_error(refused, 422, "invalid_parameter", client)
    assert "golub_reinsch" in refused.json()["detail"] and job_ids(client) == []
    assert client.post("/jobs/svd", json={"spec": spec(600, 520), "method": "lapack"}).status_code == 202


def test_the_api_docs_show_the_svd_job_schema_and_an_example(make_client):
    client = make_client()
    document = client.get("/openapi.json").json()
    post = document["paths"]["/jobs/svd"]["post"]
    body = post["requestBody"]["content"]
    spec_schema = body["application/json"]["schema"]["properties"]["spec"]
    assert {"m", "n", "dtype", "seed", "kind", "cond", "rank"} <= set(
        spec_schema["properties"]
    )  # written in place, no dangling $ref
    assert "$ref" not in str(body)
    assert body["application/json"]["example"]["spec"]["kind"] == "ill_conditioned"
    assert body["multipart/form-data"]["schema"]["required"] == ["matrix"]
    assert {"401", "404", "409", "503"} <= set(post["responses"])
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/result", "/jobs/{job_id}/files/{name}"} <= set(document["paths"])


def test_result_files_carry_their_media_type(make_client, tmp_path):
    """.npy files are attachments of bytes; a PNG result is an inline image/png."""
    client = admin(make_client)
    job_id = submit(client, json={"spec": spec(), "method": "lapack"})
    finished_ok(client, job_id)
    response = client.get(f"/jobs/{job_id}/files/s.npy")
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"].startswith("attachment")
    folder = client.app.state.jobs.result_dir(client.app.state.jobs.get(job_id))
    (folder / "picture.png").write_bytes(photo_bytes("coffee", "png", 32))
    response = client.get(f"/jobs/{job_id}/files/picture.png")
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    assert response.headers["content-disposition"].startswith("inline")


def test_the_svd_auto_text_names_the_thresholds_the_code_uses(make_client):
    """The OpenAPI's words on `auto` come from the constants auto_gpu_method reads."""
    from gpu.svd.params import AUTO_GOLUB_REINSCH_MIN_SIDE, AUTO_VALUES_ONLY_MIN_SIDE, auto_gpu_method

    document = make_client().get("/openapi.json").json()
    body = document["paths"]["/jobs/svd"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    text = body["properties"]["method"]["description"]
    assert f"min(m, n) = {AUTO_GOLUB_REINSCH_MIN_SIDE}" in text and f"from {AUTO_VALUES_ONLY_MIN_SIDE}" in text
    assert "4096" not in text
    side = AUTO_GOLUB_REINSCH_MIN_SIDE
    assert auto_gpu_method(side, side, "float32") == "golub_reinsch" != auto_gpu_method(side - 1, side, "float32")
    values = AUTO_VALUES_ONLY_MIN_SIDE
    assert auto_gpu_method(values, values, "float32", compute_uv=False) == "golub_reinsch"
    assert auto_gpu_method(values - 1, values, "float32", compute_uv=False) == "cusolver"
