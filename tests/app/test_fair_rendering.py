"""Fair rendering over HTTP (issue 24), on the CPU backend with real renders: three huge
solid-colour PNGs in flight, then a small photo. The small one starts at once on the
worker the large lane leaves free, instead of queueing behind them (the issue saw it wait
40.7 s). The huge ones are a few megapixels so CI renders them in seconds; the threshold
of a large render is lowered to match. Bounds are relative to the huge renders' own
times, so a slow machine slows both sides."""

from __future__ import annotations

import threading
import time

import httpx
from pencil_testkit import encode, photo_bytes, sketch_files
from PIL import Image

REQUEST_TIMEOUT = 120.0
HUGE_SIDE = 2400  # 5.8 MP: about 1 s a render on 2 cores


def test_a_small_photo_does_not_wait_behind_huge_ones(make_client):
    client = make_client(workers=2, large_render_pixels=1_000_000)
    huge = encode(Image.new("RGB", (HUGE_SIDE, HUGE_SIDE), (120, 140, 160)), "png")
    small = photo_bytes("coffee", "jpeg", 320)
    responses: dict[str, httpx.Response] = {}
    finished: dict[str, float] = {}

    def send(name: str, data: bytes, filename: str, content_type: str) -> None:
        responses[name] = client.post("/sketch", files=sketch_files(data, filename, content_type))
        finished[name] = time.monotonic()

    threads = []
    for i in range(3):
        thread = threading.Thread(target=send, args=(f"huge{i}", huge, "huge.png", "image/png"), daemon=True)
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + REQUEST_TIMEOUT
    while True:  # all three admitted: one renders in the large lane, two wait for it
        queue = client.get("/healthz").json()["queue"]
        if queue["running"] + queue["waiting"] == 3 and not finished:
            break
        assert not finished, "a huge render finished before the test could send the small one"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert (queue["running"], queue["waiting"]) == (1, 2)

    send("small", small, "small.jpg", "image/jpeg")
    for thread in threads:
        thread.join(timeout=REQUEST_TIMEOUT)
        assert not thread.is_alive()

    assert all(response.status_code == 200 for response in responses.values()), responses
    assert responses["small"].headers["x-image-size"] == "320x213"
    small_queue_ms = float(responses["small"].headers["x-queue-ms"])
    huge_render_ms = [float(responses[f"huge{i}"].headers["x-render-ms"]) for i in range(3)]
    huge_queue_ms = sorted(float(responses[f"huge{i}"].headers["x-queue-ms"]) for i in range(3))
    # Behind the huge ones it would have waited for at least one of them to finish. (Not a
    # finer bound: on CI's two cores, shared with another test worker, a free worker thread
    # was seen to start 1.5 s late beside 3 s renders.)
    assert small_queue_ms < min(huge_render_ms), (small_queue_ms, huge_render_ms)
    assert finished["small"] < max(finished[f"huge{i}"] for i in range(3))
    # The huge ones took turns: the last waited for the two before it.
    assert huge_queue_ms[2] > min(huge_render_ms)
