"""/live (app/live.py): frames in, drawings out, latest frame wins, options mid-stream,
errors that keep the session, the session limit across processes (docs/live.md)."""

from __future__ import annotations

import io
import json
import multiprocessing
import time

import cv2
import numpy as np
import pytest
import skimage.data
from PIL import Image
from starlette.websockets import WebSocketDisconnect

from app.live_slots import LiveSlots
from gpu.pencil import reference
from gpu.pencil.params import PencilParams


def _jpeg(pixels: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def frames() -> list[bytes]:
    """Six frames of a pan across the astronaut photograph, 192x128 JPEGs."""
    photo = skimage.data.astronaut()
    return [_jpeg(np.ascontiguousarray(photo[100:356:2, 40 * i : 40 * i + 384 : 2])) for i in range(6)]


def _next_drawing(ws) -> tuple[dict, bytes]:
    """The next frame header and its drawing (error messages are returned as (header, b''))."""
    header = ws.receive_json()
    if header["type"] != "frame":
        return header, b""
    return header, ws.receive_bytes()


def test_ready_names_the_resolved_options_and_the_limits(client):
    with client.websocket_connect("/live?texture=fast&stroke_width=2") as ws:
        ready = ws.receive_json()
    assert ready["type"] == "ready" and ready["backend"] == "cpu"
    assert ready["options"]["texture"] == "fast" and ready["options"]["stroke_width"] == 2
    assert ready["options"]["format"] == "jpeg" and ready["options"]["tone"] == "auto"
    assert ready["max_pixels"] == 1920 * 1080 and ready["max_bytes"] == 25 * 1024 * 1024


def test_a_frame_comes_back_drawn_as_the_pipeline_draws_it(client, frames):
    with client.websocket_connect("/live?texture=fast&quality=95") as ws:
        ws.receive_json()
        ws.send_bytes(frames[0])
        header, drawing = _next_drawing(ws)
    assert header["frame"] == 1 and header["dropped"] == 0
    assert (header["width"], header["height"]) == (192, 128)
    assert header["codecs"] == "decode cpu, encode cpu"
    assert header["latency_ms"] >= header["render_ms"] > 0
    got = np.asarray(Image.open(io.BytesIO(drawing)))
    assert got.shape == (128, 192)
    photo = np.asarray(Image.open(io.BytesIO(frames[0])).convert("RGB"))
    expected = reference.render(photo, PencilParams(texture="fast")).astype(int)
    assert np.abs(got.astype(int) - expected).mean() < 2  # JPEG q95 of the same drawing


def test_the_latest_frame_wins_when_the_client_sends_faster(client, frames):
    sent = 12
    with client.websocket_connect("/live?texture=fast") as ws:
        ws.receive_json()
        for i in range(sent):
            ws.send_bytes(frames[i % len(frames)])
        drawn = []
        while not drawn or drawn[-1]["frame"] < sent:
            header, _ = _next_drawing(ws)
            drawn.append(header)
    numbers = [h["frame"] for h in drawn]
    assert numbers == sorted(set(numbers)) and numbers[-1] == sent
    assert len(drawn) < sent  # sent all at once: frames waiting behind a newer one were dropped
    assert drawn[-1]["dropped"] == sent - len(drawn)


def test_options_change_mid_stream_for_the_frames_after_them(client, frames):
    with client.websocket_connect("/live?texture=fast") as ws:
        ws.receive_json()
        ws.send_bytes(frames[1])
        _, gray = _next_drawing(ws)
        ws.send_text(json.dumps({"type": "options", "options": {"mode": "color", "format": "webp"}}))
        answer = ws.receive_json()
        ws.send_bytes(frames[1])
        header, color = _next_drawing(ws)
    assert answer == {"type": "options", "options": {**answer["options"], "mode": "color", "format": "webp"}}
    assert answer["options"]["texture"] == "fast"  # what the message did not name stays
    assert Image.open(io.BytesIO(gray)).mode == "L"
    picture = Image.open(io.BytesIO(color))
    assert picture.format == "WEBP" and picture.mode == "RGB"
    rgb = np.asarray(picture).astype(int)
    assert np.abs(rgb[..., 0] - rgb[..., 2]).mean() > 2  # the photo's colour is kept


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"type": "options", "options": {"texture": "charcoal"}}, "invalid_parameter"),
        ({"type": "options", "options": {"format": "png"}}, "invalid_parameter"),
        ({"type": "options", "options": {"stroke_width": True}}, "bad_message"),
        ({"type": "hello"}, "bad_message"),
        ("not json", "bad_message"),
    ],
)
def test_a_bad_text_message_is_answered_and_the_session_goes_on(client, frames, message, code):
    with client.websocket_connect("/live?texture=fast") as ws:
        ws.receive_json()
        ws.send_text(message if isinstance(message, str) else json.dumps(message))
        error = ws.receive_json()
        ws.send_bytes(frames[2])
        header, drawing = _next_drawing(ws)
    assert error["type"] == "error" and error["error"] == code and error["detail"]
    assert header["type"] == "frame" and Image.open(io.BytesIO(drawing)).mode == "L"  # options unchanged: gray


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"not an image at all", "unsupported_format"),
        (b"\xff\xd8\xff\xe0 truncated jpeg", "corrupt_image"),
        (_jpeg(np.full((8, 8, 3), 120, np.uint8)), "image_too_small"),
    ],
)
def test_a_bad_frame_is_answered_with_its_number_and_the_session_goes_on(client, frames, frame, code):
    with client.websocket_connect("/live") as ws:
        ws.receive_json()
        ws.send_bytes(frame)
        error = ws.receive_json()
        ws.send_bytes(frames[3])
        header, _ = _next_drawing(ws)
    assert error == {"type": "error", "error": code, "detail": error["detail"], "frame": 1}
    assert header["type"] == "frame" and header["frame"] == 2


def test_a_frame_over_the_live_pixel_limit_is_refused(make_client, frames):
    client = make_client(max_live_pixels=100 * 100)
    with client.websocket_connect("/live") as ws:
        assert ws.receive_json()["max_pixels"] == 10_000
        ws.send_bytes(frames[0])
        error = ws.receive_json()
    assert error["error"] == "too_many_pixels" and error["frame"] == 1


def test_a_frame_over_the_byte_limit_closes_with_1009(make_client, frames):
    client = make_client(max_upload_bytes=2048)
    with client.websocket_connect("/live") as ws:
        ws.receive_json()
        ws.send_bytes(frames[0])  # several kB
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 1009 and "2,048" in closed.value.reason


@pytest.mark.parametrize("query", ["format=png", "texture=charcoal", "stroke_width=9", "quality=0"])
def test_bad_options_in_the_url_close_with_4422(client, query):
    with client.websocket_connect(f"/live?{query}") as ws:
        error = ws.receive_json()
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert error["type"] == "error" and error["error"] == "invalid_parameter"
    assert closed.value.code == 4422 and closed.value.reason


def _live_count(client) -> int:
    return client.get("/healthz").json()["live"]["sessions"]


def test_sessions_past_the_limit_close_with_1013_and_closing_frees_a_place(make_client):
    client = make_client(max_live_sessions=2)
    first = client.websocket_connect("/live")
    second = client.websocket_connect("/live")
    for ws in (first, second):
        ws.__enter__()
        ws.receive_json()
    assert _live_count(client) == 2
    with client.websocket_connect("/live") as third:
        with pytest.raises(WebSocketDisconnect) as closed:
            third.receive_json()
    assert closed.value.code == 1013 and "2 live sessions" in closed.value.reason
    first.__exit__(None, None, None)
    deadline = time.monotonic() + 5
    while _live_count(client) != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _live_count(client) == 1
    with client.websocket_connect("/live") as again:
        assert again.receive_json()["type"] == "ready"
    second.__exit__(None, None, None)
    metrics = client.get("/metrics").text
    assert 'pencil_rejected_requests_total{code="too_many_live_sessions"} 1.0' in metrics
    assert "pencil_live_sessions_limit 2.0" in metrics


def test_live_off_refuses_every_session(make_client):
    client = make_client(max_live_sessions=0)
    with client.websocket_connect("/live") as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 1013


def test_a_page_on_another_site_is_refused_and_logged(client, caplog):
    with (
        pytest.raises(WebSocketDisconnect),
        client.websocket_connect("/live", headers={"origin": "https://evil.example"}),
    ):
        pass
    assert "refused a /live session from the web page at https://evil.example" in caplog.text
    assert 'pencil_rejected_requests_total{code="origin_not_allowed"} 1.0' in client.get("/metrics").text


@pytest.mark.parametrize(
    ("setting", "origin"),
    [
        ("", None),  # no Origin header: not a browser page
        ("", "http://testserver"),  # the server's own page (TestClient's Host is testserver)
        ("https://app.example.com, http://localhost:5173", "http://localhost:5173"),
        ("*", "https://anywhere.example"),
    ],
)
def test_the_servers_own_pages_listed_origins_and_clients_without_one_are_let_in(make_client, setting, origin):
    client = make_client(live_origins=setting)
    headers = {"origin": origin} if origin else {}
    with client.websocket_connect("/live", headers=headers) as ws:
        assert ws.receive_json()["type"] == "ready"


def test_an_origin_off_the_list_is_refused(make_client):
    client = make_client(live_origins="https://app.example.com")
    with (
        pytest.raises(WebSocketDisconnect),
        client.websocket_connect("/live", headers={"origin": "https://app.example.org"}),
    ):
        pass


def _hold_a_slot(directory: str, ready) -> None:
    slots = LiveSlots(__import__("pathlib").Path(directory), 3)
    assert slots.acquire() is not None
    ready.set()
    time.sleep(60)


def test_slots_are_shared_by_processes_and_freed_when_one_dies(tmp_path):
    slots = LiveSlots(tmp_path, 3)
    mine = slots.acquire()
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    other = spawn.Process(target=_hold_a_slot, args=(str(tmp_path), ready))
    other.start()
    try:
        assert ready.wait(30)
        assert slots.held() == 2
        third = slots.acquire()
        assert third is not None and slots.acquire() is None and slots.held() == 3
        slots.release(third)
    finally:
        other.kill()
        other.join()
    assert slots.held() == 1  # the killed process's slot is free again
    slots.release(mine)
    assert slots.held() == 0


def test_a_drawn_frame_matches_sketch_for_the_same_photo_and_options(client, frames):
    """The same pipeline as POST /sketch: same bytes out for the same frame and options."""
    with client.websocket_connect("/live?texture=fast&quality=90") as ws:
        ws.receive_json()
        ws.send_bytes(frames[4])
        _, drawing = _next_drawing(ws)
    response = client.post(
        "/sketch", files={"image": ("f.jpg", frames[4], "image/jpeg")}, data={"texture": "fast", "format": "jpeg"}
    )
    assert response.status_code == 200
    ours = cv2.imdecode(np.frombuffer(drawing, np.uint8), cv2.IMREAD_GRAYSCALE).astype(int)
    theirs = cv2.imdecode(np.frombuffer(response.content, np.uint8), cv2.IMREAD_GRAYSCALE).astype(int)
    assert np.abs(ours - theirs).mean() < 1.0
