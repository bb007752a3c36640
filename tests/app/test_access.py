"""app/access.py: API keys of /sketch and /live (401 in the error shape, for /live the
handshake's answer; the key in a header, the query string or a subprotocol), the token of
/metrics, per-client rate limits (429 with Retry-After, one client's limit leaving another
full service), fair shares of the live slots, and keys kept out of the logs."""

from __future__ import annotations

import logging
import secrets

import pytest
from pencil_testkit import assert_api_error, metric_value, photo_bytes, sketch_files
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

ALICE, BOB = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
KEYS = f"alice:{ALICE},bob:{BOB}"


@pytest.fixture(scope="module")
def image() -> bytes:
    return photo_bytes(width=64)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_without_keys_everything_is_open_as_in_the_quick_start(client, image):
    assert client.post("/sketch", files=sketch_files(image)).status_code == 200
    with client.websocket_connect("/live") as ws:
        assert ws.receive_json()["type"] == "ready"
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("headers", [{}, _bearer("not-a-key-0123456789"), {"Authorization": f"Basic {ALICE}"}])
def test_sketch_without_a_known_key_is_401(make_client, image, headers):
    client = make_client(api_keys=KEYS)
    response = client.post("/sketch", files=sketch_files(image), headers=headers)
    body = assert_api_error(response, 401, "unauthorized", client)
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "Authorization: Bearer <key>" in body["detail"]
    assert metric_value(client.get("/metrics").text, "pencil_rejected_requests_total", code="unauthorized") == 1


def test_sketch_with_either_key_draws(make_client, image):
    client = make_client(api_keys=KEYS)
    for key in (ALICE, BOB):
        response = client.post("/sketch", files=sketch_files(image), headers=_bearer(key))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "image/png"


def test_the_401_comes_before_the_upload_is_read(make_client):
    """Not a byte of an unauthorised upload is parsed: a 25 MiB body of junk still gets 401."""
    client = make_client(api_keys=KEYS)
    response = client.post("/sketch", content=b"\0" * (1 << 20), headers={"Content-Type": "image/jpeg"})
    assert_api_error(response, 401, "unauthorized")


def test_live_without_a_known_key_is_refused_at_the_handshake(make_client):
    client = make_client(api_keys=KEYS)
    for url, protocols in (("/live", None), ("/live?api_key=wrong-key-0123456789", None), ("/live", ["pencil"])):
        with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect(url, subprotocols=protocols):
            pass
        assert denied.value.status_code == 401
        assert denied.value.json()["error"] == "unauthorized"
        assert "api_key" in denied.value.json()["detail"]


def test_live_takes_the_key_as_header_query_parameter_or_subprotocol(make_client):
    client = make_client(api_keys=KEYS)
    with client.websocket_connect("/live?texture=fast", headers=_bearer(ALICE)) as ws:
        assert ws.receive_json()["options"]["texture"] == "fast"
    with client.websocket_connect(f"/live?api_key={ALICE}&texture=fast") as ws:
        assert ws.receive_json()["options"]["texture"] == "fast"
    with client.websocket_connect("/live", subprotocols=["pencil", f"pencil-key.{BOB}"]) as ws:
        assert ws.accepted_subprotocol == "pencil"  # what the page offered beside its key
        assert ws.receive_json()["type"] == "ready"


def test_the_live_key_is_taken_out_of_what_the_route_sees(make_client, monkeypatch):
    from app import live

    seen = []
    parse = live.Options.parse
    monkeypatch.setattr(live.Options, "parse", classmethod(lambda cls, raw: seen.append(raw) or parse(raw)))
    client = make_client(api_keys=KEYS)
    with client.websocket_connect(f"/live?api_key={ALICE}&mode=color") as ws:
        assert ws.receive_json()["options"]["mode"] == "color"
    assert seen == [{"mode": "color"}]


def test_metrics_behind_its_token(make_client):
    token = secrets.token_urlsafe(16)
    client = make_client(metrics_token=token, api_keys=KEYS)
    response = client.get("/metrics")
    assert_api_error(response, 401, "unauthorized")
    assert "PENCIL_METRICS_TOKEN" in response.json()["detail"]
    assert_api_error(client.get("/metrics", headers=_bearer(ALICE)), 401, "unauthorized")  # an API key is not it
    assert client.get("/metrics", headers=_bearer(token)).status_code == 200
    assert client.get("/healthz").status_code == 200  # the probes stay open


def test_a_client_over_its_rate_gets_429_while_another_keeps_full_service(make_client, image):
    client = make_client(api_keys=KEYS, rate_limit=0.5, rate_limit_burst=3)
    statuses = [client.post("/sketch", files=sketch_files(image), headers=_bearer(ALICE)).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    refused = client.post("/sketch", files=sketch_files(image), headers=_bearer(ALICE))
    body = assert_api_error(refused, 429, "rate_limited")
    assert 1 <= int(refused.headers["Retry-After"]) <= 2  # a token every 2 s
    assert "0.5 requests a second" in body["detail"]
    for _ in range(3):  # bob's bucket is his own
        assert client.post("/sketch", files=sketch_files(image), headers=_bearer(BOB)).status_code == 200
    with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect("/live", headers=_bearer(ALICE)):
        pass  # /live counts in the same bucket
    assert denied.value.status_code == 429 and denied.value.headers["retry-after"]
    text = client.get("/metrics").text
    assert metric_value(text, "pencil_rejected_requests_total", code="rate_limited") == 3


def test_without_keys_the_rate_is_by_address(make_client, image):
    client = make_client(rate_limit=0.1, rate_limit_burst=1)
    assert client.post("/sketch", files=sketch_files(image)).status_code == 200
    assert_api_error(client.post("/sketch", files=sketch_files(image)), 429, "rate_limited")
    assert client.get("/healthz").status_code == 200  # only /sketch and /live are limited


def test_a_client_holds_at_most_its_share_of_the_live_slots(make_client):
    client = make_client(api_keys=KEYS, max_live_sessions=4, live_sessions_per_client=2)
    with (
        client.websocket_connect("/live", headers=_bearer(ALICE)) as first,
        client.websocket_connect("/live", headers=_bearer(ALICE)) as second,
    ):
        first.receive_json(), second.receive_json()
        with client.websocket_connect("/live", headers=_bearer(ALICE)) as third:
            with pytest.raises(WebSocketDisconnect) as closed:
                third.receive_json()
        assert closed.value.code == 1013 and "its share" in closed.value.reason
        with client.websocket_connect("/live", headers=_bearer(BOB)) as other:
            assert other.receive_json()["type"] == "ready"  # the slots alice cannot take are bob's
        assert client.get("/healthz").json()["live"]["sessions"] == 2
    with client.websocket_connect("/live", headers=_bearer(ALICE)) as again:  # her places came back
        assert again.receive_json()["type"] == "ready"
    assert metric_value(client.get("/metrics").text, "pencil_rejected_requests_total", code="live_share_used") == 1


def test_keys_never_reach_the_logs(make_client, image, caplog):
    caplog.set_level(logging.DEBUG)
    client = make_client(api_keys=KEYS, metrics_token=BOB[:20], rate_limit=100, log_level="debug")
    client.post("/sketch", files=sketch_files(image), headers=_bearer(ALICE))
    client.post("/sketch", files=sketch_files(image), headers=_bearer(ALICE[:-2]))
    with client.websocket_connect(f"/live?api_key={BOB}") as ws:
        ws.receive_json()
    with client.websocket_connect("/live", subprotocols=["pencil", f"pencil-key.{ALICE}"]) as ws:
        ws.receive_json()
    with pytest.raises(WebSocketDenialResponse), client.websocket_connect(f"/live?api_key={ALICE}x"):
        pass
    client.get("/metrics", headers=_bearer(BOB[:20]))
    assert caplog.records, "nothing was logged: the test would prove nothing"
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    for secret in (ALICE, BOB, ALICE[:-2], BOB[:20]):
        assert secret not in logged
