"""The one error shape (app/errors.py) for every failure the HTTP layer produces on its
own: unknown paths, wrong methods, bodies over the limit (declared or streamed), the
validation and the catch-all handlers. The server keeps answering after each."""

from __future__ import annotations

import pytest
from pencil_testkit import assert_api_error, multipart_body, photo_bytes, sketch_files

from app.main import MULTIPART_OVERHEAD

SMALL_UPLOAD = 16384  # Settings.max_upload_bytes for these tests: the largest image
LIMIT = SMALL_UPLOAD + MULTIPART_OVERHEAD  # what the middleware enforces on the whole body


def chunks(data: bytes, size: int = 8192):
    """A generator body: httpx sends it chunked, without a Content-Length."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.fixture
def small_client(make_client):
    return make_client(max_upload_bytes=SMALL_UPLOAD)


@pytest.mark.parametrize("path", ["/nope", "/sketch/extra", "/static/missing.js", "/api/v1/sketch"])
def test_unknown_path_is_json_404(client, path):
    assert_api_error(client.get(path), 404, "not_found", client)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/sketch", "POST"),
        ("PUT", "/sketch", "POST"),
        ("DELETE", "/sketch", "POST"),
        ("POST", "/healthz", "GET"),
    ],
)
def test_wrong_method_is_json_405(client, method, path, allowed):
    response = client.request(method, path)
    assert_api_error(response, 405, "method_not_allowed", client)
    assert allowed in response.headers["allow"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("OPTIONS", "/corpora", "GET, POST"),  # two routes on one path: Starlette named only the first
        ("PATCH", "/corpora/c0ffee", "DELETE, GET"),
        ("PUT", "/jobs/0123abcd", "DELETE, GET, POST"),  # /jobs/{job_id} and POST /jobs/{kind}
        ("OPTIONS", "/jobs", "GET"),
        ("PUT", "/jobs/0123abcd/result", "GET"),
    ],
)
def test_allow_lists_every_method_of_the_path(make_client, method, path, allowed):
    client = make_client(admin_token="allow-test")
    response = client.request(method, path)
    assert_api_error(response, 405, "method_not_allowed", client)
    assert response.headers["allow"] == allowed


def test_declared_length_over_limit_is_413(small_client):
    body = b"\xff\xd8\xff" + b"\x00" * (LIMIT - 2)  # LIMIT + 1 bytes
    response = small_client.post("/sketch", content=body, headers={"content-type": "image/jpeg"})
    assert response.request.headers["content-length"] == str(LIMIT + 1)
    detail = assert_api_error(response, 413, "too_large", small_client)["detail"]
    assert f"{LIMIT + 1:,}" in detail


def test_image_of_exactly_the_upload_limit_reaches_the_decoder(small_client):
    body = b"\xff\xd8\xff" + b"\x00" * (SMALL_UPLOAD - 3)
    response = small_client.post("/sketch", content=body, headers={"content-type": "image/jpeg"})
    assert_api_error(response, 400, "corrupt_image", small_client)


def test_image_over_the_upload_limit_within_the_body_allowance_is_413(small_client):
    """The body may carry MULTIPART_OVERHEAD more for the form, the image itself may not."""
    body = b"\xff\xd8\xff" + b"\x00" * (SMALL_UPLOAD - 2)  # one byte over, far under LIMIT
    response = small_client.post("/sketch", content=body, headers={"content-type": "image/jpeg"})
    detail = assert_api_error(response, 413, "too_large", small_client)["detail"]
    assert f"{SMALL_UPLOAD:,}" in detail


def test_multipart_upload_over_limit_is_413(small_client, rng):
    image = photo_bytes("astronaut", "png", 320, rng=rng)
    assert len(image) > LIMIT
    response = small_client.post("/sketch", files=sketch_files(image, "big.png", "image/png"))
    assert_api_error(response, 413, "too_large", small_client)


def test_streamed_raw_body_over_limit_is_413(small_client):
    body = b"\xff\xd8\xff" + b"\x00" * (LIMIT - 2)
    response = small_client.post("/sketch", content=chunks(body), headers={"content-type": "image/jpeg"})
    assert "content-length" not in response.request.headers
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert_api_error(response, 413, "too_large", small_client)


def test_streamed_raw_body_at_limit_is_read(small_client):
    body = b"\xff\xd8\xff" + b"\x00" * (SMALL_UPLOAD - 3)
    response = small_client.post("/sketch", content=chunks(body), headers={"content-type": "image/jpeg"})
    assert_api_error(response, 400, "corrupt_image", small_client)


def test_streamed_multipart_over_limit_is_413(small_client, rng):
    image = photo_bytes("coffee", "png", 320, rng=rng)
    body = multipart_body("pencil-boundary-42", image, "big.png", {"mode": "gray"})
    assert len(body) > LIMIT
    headers = {"content-type": "multipart/form-data; boundary=pencil-boundary-42"}
    response = small_client.post("/sketch", content=chunks(body), headers=headers)
    assert "content-length" not in response.request.headers
    assert_api_error(response, 413, "too_large", small_client)


def test_streamed_multipart_under_limit_renders(small_client):
    image = photo_bytes("chelsea", "jpeg", 96)
    body = multipart_body("b0und", image, "cat.jpg", {"format": "jpeg", "mode": "color"})
    assert len(body) < LIMIT
    response = small_client.post(
        "/sketch", content=chunks(body, 1000), headers={"content-type": "multipart/form-data; boundary=b0und"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/jpeg"
    assert response.headers["content-disposition"] == 'inline; filename="cat-sketch.jpg"'


def test_oversize_does_not_break_following_requests(small_client):
    big = b"\xff\xd8\xff" + b"\x00" * (3 * LIMIT)
    for _ in range(3):
        assert (
            small_client.post("/sketch", content=chunks(big), headers={"content-type": "image/jpeg"}).status_code == 413
        )
        assert small_client.post("/sketch", content=big, headers={"content-type": "image/jpeg"}).status_code == 413
    response = small_client.post("/sketch", files=sketch_files(photo_bytes("coffee", "jpeg", 80)))
    assert response.status_code == 200, response.text


def test_unexpected_exception_is_json_500_without_traceback(make_client):
    client = make_client(raise_server_exceptions=False)

    @client.app.get("/boom-for-test")
    async def boom():
        raise RuntimeError("secret internals /etc/passwd")

    response = client.get("/boom-for-test")
    body = assert_api_error(response, 500, "internal_error", client)
    assert "secret" not in response.text and "Traceback" not in response.text
    assert body["detail"]


def test_validation_errors_use_the_error_shape(client):
    @client.app.get("/typed-for-test")
    async def typed(count: int):
        return {"count": count}

    assert client.get("/typed-for-test", params={"count": "3"}).json() == {"count": 3}
    body = assert_api_error(client.get("/typed-for-test", params={"count": "three"}), 422, "invalid_parameter", client)
    assert body["detail"].startswith("count:")
    body = assert_api_error(client.get("/typed-for-test"), 422, "invalid_parameter", client)
    assert "count" in body["detail"]


def test_client_leaving_mid_upload_is_499_not_a_500(client):
    """Drive the ASGI app directly: the body stops with http.disconnect half way."""
    import asyncio

    messages = [
        {"type": "http.request", "body": b"\xff\xd8\xff" + b"\x00" * 1000, "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/sketch",
        "raw_path": b"/sketch",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"image/jpeg"), (b"host", b"testserver")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    asyncio.run(client.app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 499
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert b"client_closed_request" in body
    assert client.get("/healthz").status_code == 200


def test_the_api_document_describes_every_error_as_the_error_shape(make_client):
    """Every 4xx/5xx the OpenAPI document describes has the {error, detail} body the server
    sends; FastAPI's default 422 (a list of pydantic errors) appears nowhere, and the job
    submissions and the cancel document what they answer."""
    import json

    client = make_client(admin_token="docs-token")
    document = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in json.dumps(document)
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                schema = response.get("content", {}).get("application/json", {}).get("schema")
                if int(status) >= 400 and schema is not None:
                    assert set(schema["required"]) == {"error", "detail"}, (method, path, status)
    for kind in ("svd", "stencil", "cs256", "search"):
        assert {"202", "400", "401", "413", "415", "422"} <= set(
            document["paths"][f"/jobs/{kind}"]["post"]["responses"]
        ), kind
    assert {"200", "202"} <= set(document["paths"]["/jobs/{job_id}"]["delete"]["responses"])
    assert "400" in document["paths"]["/jobs"]["get"]["responses"]
