"""app/origins.py: a page's Origin against the server's own and the allow-list; CORS for the
pages of PENCIL_CORS_ORIGINS (preflights answered, refusals in the error shape)."""

from __future__ import annotations

import pytest
from pencil_testkit import assert_api_error, photo_bytes, sketch_files

from app.origins import allowed_origins, origin_allowed, same_origin


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://localhost:8000", "localhost:8000", True),
        ("https://draw.example.com", "draw.example.com", True),  # 443 on both sides
        ("http://draw.example.com", "draw.example.com:80", True),
        ("https://draw.example.com", "draw.example.com:8443", False),
        ("http://localhost:8001", "localhost:8000", False),
        ("http://127.0.0.1:8000", "localhost:8000", False),  # another name is another origin
        ("https://evil.example", "draw.example.com", False),
        ("null", "localhost:8000", False),  # sandboxed frames and files
        ("ftp://localhost:8000", "localhost:8000", False),
        ("http://localhost:port", "localhost:8000", False),
    ],
)
def test_same_origin(origin, host, same):
    assert same_origin(origin, host) is same


def test_the_allow_list():
    allowed = allowed_origins(" https://App.example.com/ , http://localhost:5173,")
    assert allowed == {"https://app.example.com", "http://localhost:5173"}
    assert origin_allowed("https://app.example.com", "draw.example.com", allowed)
    assert not origin_allowed("https://app.example.org", "draw.example.com", allowed)
    assert origin_allowed("https://draw.example.com", "draw.example.com", frozenset())  # its own page
    assert origin_allowed(None, "draw.example.com", frozenset())  # no Origin: not a browser page
    assert origin_allowed("https://any.example", None, allowed_origins("*"))
    assert not origin_allowed("https://any.example", None, frozenset())


# ------------------------------------------------------------------------- CORS --

PAGE = "https://app.example.com"
PREFLIGHT = {"Origin": PAGE, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}


def test_no_cors_by_default(client):
    assert client.options("/sketch", headers=PREFLIGHT).status_code == 405
    response = client.get("/healthz", headers={"Origin": PAGE})
    assert "access-control-allow-origin" not in response.headers


def test_a_listed_origins_preflight_is_answered(make_client):
    client = make_client(cors_origins=f"{PAGE}, http://localhost:5173")
    response = client.options("/sketch", headers=PREFLIGHT)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == PAGE
    assert "POST" in response.headers["access-control-allow-methods"]
    assert "authorization" in response.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in response.headers  # keys, not cookies


def test_a_listed_origin_reads_the_drawing_its_headers_and_the_errors(make_client):
    client = make_client(cors_origins=PAGE, api_keys="page:" + "k" * 24)
    drawn = client.post(
        "/sketch",
        files=sketch_files(photo_bytes(width=64)),
        headers={"Origin": PAGE, "Authorization": "Bearer " + "k" * 24},
    )
    assert drawn.status_code == 200
    assert drawn.headers["access-control-allow-origin"] == PAGE
    assert "X-Image-Size" in drawn.headers["access-control-expose-headers"]
    refused = client.post("/sketch", files=sketch_files(photo_bytes(width=64)), headers={"Origin": PAGE})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == PAGE


def test_an_unlisted_origins_preflight_is_refused_in_the_error_shape(make_client):
    client = make_client(cors_origins=PAGE)
    response = client.options("/sketch", headers={**PREFLIGHT, "Origin": "https://evil.example"})
    body = assert_api_error(response, 400, "cors_refused")
    assert "origin" in body["detail"] and "PENCIL_CORS_ORIGINS" in body["detail"]
    assert "access-control-allow-origin" not in response.headers
    simple = client.get("/healthz", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in simple.headers  # the browser keeps the answer from the page
    bad_method = client.options("/sketch", headers={**PREFLIGHT, "Access-Control-Request-Method": "PUT"})
    assert_api_error(bad_method, 400, "cors_refused")


def test_any_origin_with_a_star(make_client):
    client = make_client(cors_origins="*")
    response = client.options("/sketch", headers={**PREFLIGHT, "Origin": "https://anywhere.example"})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] in (
        "*",
        "https://anywhere.example",
    )


def test_cors_origins_may_also_open_live(make_client):
    client = make_client(cors_origins=PAGE)
    with client.websocket_connect("/live", headers={"origin": PAGE}) as ws:
        assert ws.receive_json()["type"] == "ready"
