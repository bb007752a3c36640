"""The OpenAPI document and the API docs: the Bearer scheme on the admin routes, one tag per
operation, the job status schemas, and /docs and /redoc served with assets of this server
only (so they work with no internet)."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest
from pencil_testkit import admin_client, assert_api_error, wait_for_job

from app.jobs.schemas import JobList, JobStatus
from jobs.store import STATUSES

TOKEN = "openapi-test-token"
TAGS = {"sketch", "jobs", "corpora", "operations"}
ADMIN_PREFIXES = ("/jobs", "/corpora")
ASSET_URL = re.compile(r'(?:src|href)="([^"]+)"')
SMALL_SVD = {"spec": {"m": 12, "n": 8, "dtype": "float64", "seed": 0, "kind": "gaussian"}, "method": "lapack"}


@pytest.fixture
def spec(client) -> dict:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def operations(spec: dict):
    """(path, method, operation) of every operation in the document."""
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def bearer_scheme(spec: dict) -> str:
    schemes = spec["components"]["securitySchemes"]
    names = [name for name, s in schemes.items() if s["type"] == "http" and s["scheme"].lower() == "bearer"]
    assert len(names) == 1, schemes
    return names[0]


def test_admin_routes_declare_the_bearer_scheme(spec):
    scheme = bearer_scheme(spec)
    admin = [(path, method, op) for path, method, op in operations(spec) if path.startswith(ADMIN_PREFIXES)]
    assert {"/jobs", "/jobs/{job_id}", "/corpora"} <= {path for path, _, _ in admin}
    for path, method, op in operations(spec):
        requirements = op.get("security", [])
        if path.startswith(ADMIN_PREFIXES):
            assert {scheme: []} in requirements, (method, path)
        else:
            assert not requirements, (method, path)


def test_every_operation_has_one_documented_tag(spec):
    assert {tag["name"] for tag in spec["tags"]} == TAGS
    assert all(tag["description"] for tag in spec["tags"])
    tags = {}
    for path, method, op in operations(spec):
        assert len(op.get("tags", [])) == 1 and op["tags"][0] in TAGS, (method, path, op.get("tags"))
        tags[path] = op["tags"][0]
    assert tags["/sketch"] == "sketch"
    assert tags["/healthz"] == tags["/readyz"] == tags["/metrics"] == "operations"
    assert all(tag == "jobs" for path, tag in tags.items() if path.startswith("/jobs"))
    assert all(tag == "corpora" for path, tag in tags.items() if path.startswith("/corpora"))


def response_schema(operation: dict, status: str) -> dict:
    return operation["responses"][status]["content"]["application/json"]["schema"]


def test_job_routes_reference_the_job_schemas(spec):
    job_status, job_list = "#/components/schemas/JobStatus", "#/components/schemas/JobList"
    paths = spec["paths"]
    assert response_schema(paths["/jobs"]["get"], "200") == {"$ref": job_list}
    assert response_schema(paths["/jobs/{job_id}"]["get"], "200") == {"$ref": job_status}
    assert response_schema(paths["/jobs/{job_id}"]["delete"], "202") == {"$ref": job_status}
    kinds = [path for path in paths if path.startswith("/jobs/") and "{" not in path]
    assert {"/jobs/svd", "/jobs/search"} <= set(kinds)
    for path in kinds:
        post = paths[path]["post"]
        assert response_schema(post, "202") == response_schema(post, "200") == {"$ref": job_status}, path
        assert "Location" in post["responses"]["202"]["headers"]
    schemas = spec["components"]["schemas"]
    assert schemas["JobStatus"]["properties"]["status"]["enum"] == list(STATUSES)
    assert schemas["JobList"]["properties"]["jobs"]["items"] == {"$ref": job_status}


def test_job_bodies_match_the_schemas(make_client):
    """What the routes answer (queued and finished) has exactly the fields of JobStatus."""
    client = admin_client(make_client, TOKEN)
    submitted = client.post("/jobs/svd", json=SMALL_SVD)
    assert submitted.status_code == 202, submitted.text
    fields = set(JobStatus.model_fields) - {"webhook"}  # only for a job submitted with one
    assert set(submitted.json()) == fields
    JobStatus.model_validate(submitted.json())
    finished = wait_for_job(client, submitted.json()["id"])
    assert finished["status"] == "succeeded" and set(finished) == fields
    JobStatus.model_validate(finished)
    listed = client.get("/jobs").json()
    assert set(listed) == set(JobList.model_fields)
    assert JobList.model_validate(listed).jobs[0].id == finished["id"]


@pytest.mark.parametrize("authorization", [f"bearer {TOKEN}", f"Bearer  {TOKEN} ", f"BEARER {TOKEN}"])
def test_the_bearer_scheme_is_read_as_before(make_client, authorization):
    client = make_client(admin_token=TOKEN)
    assert client.get("/jobs", headers={"Authorization": authorization}).status_code == 200
    assert_api_error(client.get("/corpora"), 401, "unauthorized")
    assert_api_error(make_client(admin_token=None).get("/corpora"), 503, "admin_disabled")


ASSET_TYPES = {".js": "javascript", ".css": "text/css"}


@pytest.mark.parametrize(("page", "script"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")])
def test_docs_pages_load_only_local_assets(client, page, script):
    response = client.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "/openapi.json" in html
    assert not re.search(r"https?://", html), "the page names another host"
    urls = ASSET_URL.findall(html)
    assert any(url.endswith(script) for url in urls), urls
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc and url.startswith("/"), url
        asset = client.get(url)
        assert asset.status_code == 200, url
        media = next((kind for ext, kind in ASSET_TYPES.items() if parts.path.endswith(ext)), None)
        if media:
            assert media in asset.headers["content-type"], (url, asset.headers["content-type"])
            assert len(asset.content) > 10_000, url


def test_the_limits_the_server_enforces_are_in_the_document(make_client):
    """Settings limits in each operation's description and x-limits, with the values this
    server runs with; fixed ones in the schemas (one text source of a search, no stray form
    field of an upload)."""
    client = make_client(admin_token="limits-token", max_matrix_elements=1234, max_pixels=777_000)
    paths = client.get("/openapi.json").json()["paths"]
    svd = paths["/jobs/svd"]["post"]
    assert {"setting": "PENCIL_MAX_MATRIX_ELEMENTS", "limit": "the matrix at most 1,234 elements (m x n)"} in svd[
        "x-limits"
    ]
    assert "at most 1,234 elements" in svd["description"]
    assert "777,000 pixels" in paths["/sketch"]["post"]["description"]
    for path in ("/jobs/cs256", "/jobs/stencil", "/jobs/search", "/corpora"):
        assert paths[path]["post"]["x-limits"], path
    search = paths["/jobs/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert search["oneOf"] == [{"required": ["corpus_id"]}, {"required": ["text"]}, {"required": ["text_base64"]}]
    form = paths["/jobs/svd"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["additionalProperties"] is False and form["maxProperties"] == 2 == len(form["properties"])


def _error_responses(spec: dict):
    """(path, method, status, response) of every error response in our error shape."""
    for path, method, operation in operations(spec):
        for status, response in operation.get("responses", {}).items():
            media = response.get("content", {}).get("application/json", {})
            if int(status) >= 400 and {"error", "detail"} <= set(media.get("schema", {}).get("properties", {})):
                yield path, method, int(status), response


def test_each_error_response_has_one_example_per_code_of_its_own_status(spec):
    from app.errors import ERROR_EXAMPLES

    seen = 0
    for path, method, status, response in _error_responses(spec):
        examples = response["content"]["application/json"].get("examples")
        assert examples, f"{method} {path} {status} has no example"
        for code, example in examples.items():
            assert example["value"]["error"] == code, (path, status, example)
            assert ERROR_EXAMPLES[code][0] == status, (
                f"{method} {path} {status} shows {code}, a {ERROR_EXAMPLES[code][0]}"
            )
            assert example["value"]["detail"] == ERROR_EXAMPLES[code][1]
        seen += 1
    assert seen > 50
    assert "example" not in json.dumps(
        spec["paths"]["/sketch"]["post"]["responses"]["401"]["content"]["application/json"]["schema"]
    )


def test_the_sketch_errors_show_each_of_their_codes(spec):
    responses = spec["paths"]["/sketch"]["post"]["responses"]
    for status, codes in {
        "400": {
            "missing_image",
            "empty_file",
            "corrupt_image",
            "image_too_small",
            "bad_request",
            "duplicate_field",
            "cors_refused",
        },
        "401": {"unauthorized"},
        "413": {"too_large", "too_many_pixels"},
        "429": {"rate_limited"},
        "503": {"overloaded", "shutting_down", "gpu_out_of_memory"},
    }.items():
        examples = responses[status]["content"]["application/json"]["examples"]
        assert set(examples) == codes, status
    missing = responses["400"]["content"]["application/json"]["examples"]["missing_image"]["value"]["detail"]
    assert "image" in missing and "JPEG" not in missing  # not another code's sample (issue 39)


def test_the_examples_word_the_codes_as_the_server_does(client):
    """The examples of codes a test can provoke here read like the server's own answers."""
    from pencil_testkit import photo_bytes, sketch_files

    from app.errors import ERROR_EXAMPLES

    answered = {
        "missing_image": client.post("/sketch", data={"mode": "gray", "tone": "auto"}, files={"x": ("a", b"1")}),
        "unsupported_media_type": client.post("/sketch", content=b"x", headers={"Content-Type": "text/plain"}),
        "unsupported_format": client.post("/sketch", files=sketch_files(b"GIF89a" + b"\0" * 64, "a.gif", "image/gif")),
        "invalid_parameter": client.post(
            "/sketch", files=sketch_files(photo_bytes(width=32)), data={"stroke_width": "9"}
        ),
    }
    for code, response in answered.items():
        assert response.json()["error"] == code, response.text
        words = set(re.findall(r"[a-z']{4,}", ERROR_EXAMPLES[code][1].lower()))
        said = set(re.findall(r"[a-z']{4,}", response.json()["detail"].lower()))
        assert len(words & said) >= min(3, len(words)), (code, ERROR_EXAMPLES[code][1], response.json()["detail"])


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_forbid_every_other_host(client, page):
    """ReDoc's bundle fetches its logo from cdn.redoc.ly; the page's policy refuses it, and
    anything else from another host (the browser test sees the request stopped)."""
    policy = client.get(page).headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'self'"
    for name in ("script-src", "style-src", "img-src", "font-src", "connect-src"):
        assert not re.search(r"https?:|\*", directives[name]), (name, directives[name])
    assert "content-security-policy" not in client.get("/healthz").headers  # the API's answers are left alone
