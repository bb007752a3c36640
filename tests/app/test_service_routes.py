"""The service routes of app/main.py: /healthz, /readyz, /metrics, the page and its
static files, /docs and /openapi.json (which must document every option of /sketch)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from pencil_testkit import metric_value, photo_bytes, sketch_files

from app.main import VERSION
from gpu.codec.encode import ENCODE_OPTIONS
from gpu.pencil.params import PENCIL_OPTIONS, PencilParams

ALL_OPTIONS = PENCIL_OPTIONS + ENCODE_OPTIONS


def test_healthz(make_client):
    client = make_client(workers=3, max_queue=5)
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["backend"] == "cpu"
    assert body["devices"] == []
    assert isinstance(body["version"], str) and body["version"] == VERSION
    assert body["workers"] == 3
    assert body["queue"] == {"waiting": 0, "running": 0, "limit": 5}
    # the page selects these: the drawing options' defaults, as PencilParams() has them
    assert body["defaults"] == {k: v for k, v in dataclasses.asdict(PencilParams()).items() if v is not None}


def test_readyz(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"ready": True}


def test_readyz_without_data_dir_is_503_when_jobs_are_on(make_client, tmp_path):
    client = make_client(data_dir=tmp_path / "store", admin_token="jobs-on")
    assert (tmp_path / "store").is_dir()  # created at start-up: the job store lives there
    assert client.get("/readyz").status_code == 200
    shutil.rmtree(tmp_path / "store")
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False and any("data directory" in p for p in body["problems"])
    assert int(response.headers["retry-after"]) > 0
    assert client.get("/healthz").status_code == 200  # alive, just not ready


def test_lifespan_creates_nested_data_dir_when_jobs_are_on(make_client, tmp_path):
    make_client(data_dir=tmp_path / "a" / "b" / "c", admin_token="jobs-on")
    assert (tmp_path / "a" / "b" / "c").is_dir()


def test_jobs_off_stores_nothing(tmp_path):
    """Without PENCIL_ADMIN_TOKEN the server draws and is ready, and no data directory
    appears: not at start-up, not after a sketch or a refused job or corpus, not at the stop."""
    from fastapi.testclient import TestClient

    from app.config import Settings
    from app.main import create_app

    data_dir = tmp_path / "never" / "data"
    settings = Settings(backend="cpu", workers=2, data_dir=data_dir, log_level="warning", admin_token=None)
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 200
        assert client.get("/readyz").json() == {"ready": True}
        response = client.post("/sketch", files=sketch_files(photo_bytes("chelsea", "jpeg", 96)))
        assert response.status_code == 200 and response.headers["content-type"] == "image/png"
        assert client.get("/healthz").json()["runs_jobs"] is False
        assert client.post("/jobs/svd", json={"spec": {"m": 8, "n": 8}}).status_code == 503
        assert client.post("/corpora", content=b"text", headers={"Authorization": "Bearer x"}).status_code == 503
        assert "pencil_jobs{" not in client.get("/metrics").text
        assert not (tmp_path / "never").exists()
    assert not (tmp_path / "never").exists()


def test_metrics_after_a_sketch(client):
    assert client.post("/sketch", files=sketch_files(photo_bytes("coffee", "jpeg", 96))).status_code == 200
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "# TYPE pencil_http_requests_total counter" in text
    assert metric_value(text, "pencil_http_requests_total", route="/sketch", method="POST", status="200") == 1
    assert metric_value(text, "pencil_render_queue_wait_seconds_count") == 1
    assert metric_value(text, "pencil_render_seconds_count", backend="cpu") == 1
    assert metric_value(text, "pencil_render_seconds_sum", backend="cpu") > 0
    assert metric_value(text, "pencil_http_request_seconds_count", route="/sketch", method="POST") == 1
    assert metric_value(text, "pencil_http_in_flight") == 1  # this very /metrics request
    assert metric_value(text, "pencil_render_queue_depth") == 0
    assert metric_value(text, "pencil_renders_running") == 0


def test_metrics_count_rejections(make_client):
    client = make_client(max_upload_bytes=4096)
    image = photo_bytes("chelsea", "jpeg", 64)
    client.post("/sketch", files=sketch_files(b"", "empty.jpg"))  # 400 empty_file
    client.post("/sketch", files=sketch_files(b"GIF89a" + b"\x01" * 64, "x.gif", "image/gif"))  # 415
    client.post("/sketch", files=sketch_files(image), data={"tone": "neon"})  # 422
    client.post("/sketch", files=sketch_files(image), data={"tone": "neon"})  # 422 again
    client.post("/sketch", content=b"\xff" * 200_000, headers={"content-type": "image/jpeg"})  # 413 (declared)
    client.post("/sketch", content=iter([b"\xff" * 100_000]), headers={"content-type": "image/jpeg"})  # 413 (streamed)
    client.get("/sketch")  # 405
    client.get("/definitely-not-here")  # 404
    text = client.get("/metrics").text

    assert metric_value(text, "pencil_http_requests_total", route="/sketch", status="400") == 1
    assert metric_value(text, "pencil_http_requests_total", route="/sketch", status="415") == 1
    assert metric_value(text, "pencil_http_requests_total", route="/sketch", status="422") == 2
    assert metric_value(text, "pencil_http_requests_total", status="413") == 2
    assert metric_value(text, "pencil_http_requests_total", route="/sketch", method="GET", status="405") == 1
    assert metric_value(text, "pencil_http_requests_total", route="unmatched", status="404") == 1
    assert metric_value(text, "pencil_http_requests_total", route="/sketch", status="200") is None

    assert metric_value(text, "pencil_rejected_requests_total", code="empty_file") == 1
    assert metric_value(text, "pencil_rejected_requests_total", code="unsupported_format") == 1
    assert metric_value(text, "pencil_rejected_requests_total", code="invalid_parameter") == 2
    assert metric_value(text, "pencil_rejected_requests_total", code="too_large") == 2
    assert metric_value(text, "pencil_rejected_requests_total", code="method_not_allowed") == 1
    assert metric_value(text, "pencil_rejected_requests_total", code="not_found") == 1
    assert metric_value(text, "pencil_rejected_requests_total") == 8
    assert metric_value(text, "pencil_render_seconds_count", backend="cpu") in (None, 0)


def test_metrics_are_per_app(make_client):
    first, second = make_client(), make_client()
    first.post("/sketch", files=sketch_files(photo_bytes("coffee", "jpeg", 64)))
    assert metric_value(first.get("/metrics").text, "pencil_http_requests_total", route="/sketch") == 1
    assert metric_value(second.get("/metrics").text, "pencil_http_requests_total", route="/sketch") is None


def test_page_serves_the_upload_form(client):
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "<form" in html
    assert 'type="file"' in html and 'name="image"' in html
    for option in ("mode", "tone", "texture", "format"):
        assert f'name="{option}"' in html
    assert "/static/app.js" in html or "static/app.js" in html


@pytest.mark.parametrize(
    ("path", "media"),
    [("/static/app.js", "javascript"), ("/static/style.css", "text/css"), ("/favicon.ico", "image/svg+xml")],
)
def test_static_files(client, path, media):
    response = client.get(path)
    assert response.status_code == 200
    assert media in response.headers["content-type"]
    assert len(response.content) > 100


def test_page_script_posts_to_sketch(client):
    assert "/sketch" in client.get("/static/app.js").text


def test_docs(client):
    response = client.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "swagger" in response.text.lower()
    assert "/openapi.json" in response.text


@pytest.fixture
def sketch_operation(client) -> dict:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    spec = response.json()
    assert spec["info"]["version"] == VERSION
    return spec["paths"]["/sketch"]["post"]


def test_openapi_documents_every_option_as_query_parameter(sketch_operation):
    parameters = {p["name"]: p for p in sketch_operation["parameters"]}
    assert set(parameters) == {o.name for o in ALL_OPTIONS}
    for option in ALL_OPTIONS:
        schema = parameters[option.name]["schema"]
        assert parameters[option.name]["in"] == "query"
        assert schema["type"] == {str: "string", int: "integer", float: "number"}[option.type]
        assert schema["description"]
        if option.choices:
            assert schema["enum"] == list(option.choices)
        if option.minimum is not None:
            assert schema["minimum"] == option.minimum
        if option.maximum is not None:
            assert schema["maximum"] == option.maximum
        if option.default is not None:
            assert (
                schema["default"] == pytest.approx(option.default)
                if option.type is float
                else schema["default"] == option.default
            )


def test_openapi_documents_the_form(sketch_operation):
    content = sketch_operation["requestBody"]["content"]
    form = content["multipart/form-data"]["schema"]
    assert form["required"] == ["image"]
    assert form["properties"]["image"]["format"] == "binary"
    assert set(form["properties"]) == {"image"} | {o.name for o in ALL_OPTIONS}
    assert any(media.startswith("image/") for media in content)


def test_openapi_documents_responses(sketch_operation):
    responses = sketch_operation["responses"]
    assert {"200", "400", "413", "415", "422", "503"} <= set(responses)
    assert set(responses["200"]["content"]) == {"image/png", "image/jpeg", "image/webp"}
    assert {"X-Backend", "X-Render-Ms", "X-Image-Size"} <= set(responses["200"]["headers"])
    for status in ("400", "413", "415", "422", "503"):
        schema = responses[status]["content"]["application/json"]["schema"]
        assert schema["required"] == ["error", "detail"]
        assert responses[status]["description"]


def test_openapi_lists_service_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/sketch", "/healthz", "/readyz", "/metrics"} <= set(paths)
    assert "/" not in paths and "/favicon.ico" not in paths
