"""Helpers shared by the tests of the HTTP service (tests/app): real photographs from
`skimage.data` encoded with Pillow, hand-made hostile files, the error-shape check and
Prometheus text parsing. Imported by the test modules as `pencil_testkit` (conftest.py
puts this directory on sys.path)."""

from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

PHOTOS = ("astronaut", "chelsea", "coffee", "camera")  # camera is grayscale
PIL_FORMATS = {"jpeg": "JPEG", "jpg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP", "tiff": "TIFF"}
MAGIC = {
    "png": b"\x89PNG\r\n\x1a\n",
    "jpeg": b"\xff\xd8\xff",
}
MEDIA = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@cache
def _photo_full(name: str) -> np.ndarray:
    from skimage import data

    array = getattr(data, name)()
    array.setflags(write=False)
    return array


def photo(
    name: str = "astronaut", width: int = 128, height: int | None = None, rng: np.random.Generator | None = None
) -> np.ndarray:
    """A photograph from skimage.data as uint8 (H, W[, 3]) resized to `width` x `height`
    (height keeps the aspect when omitted). With `rng`, a random crop of at least 70 %
    of each side is taken first, so tests do not always see the same pixels."""
    full = _photo_full(name)
    h, w = full.shape[:2]
    if rng is not None:
        ch, cw = int(rng.integers(int(h * 0.7), h + 1)), int(rng.integers(int(w * 0.7), w + 1))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        full = full[y : y + ch, x : x + cw]
        h, w = full.shape[:2]
    if height is None:
        height = max(1, round(width * h / w))
    image = Image.fromarray(np.ascontiguousarray(full)).resize((width, height), Image.Resampling.LANCZOS)
    return np.asarray(image)


def smooth_random(rng: np.random.Generator, height: int, width: int, channels: int | None = 3) -> np.ndarray:
    """A random but smooth uint8 image (bilinear upscale of coarse noise) in 20..235,
    so it compresses like a picture and is never all zero."""
    shape = (max(2, height // 8), max(2, width // 8)) + ((channels,) if channels else ())
    coarse = rng.integers(20, 236, size=shape, dtype=np.uint8)
    mode = "RGB" if channels == 3 else "L"
    return np.asarray(Image.fromarray(coarse, mode).resize((width, height), Image.Resampling.BILINEAR))


def encode(image: np.ndarray | Image.Image, fmt: str = "jpeg", **kwargs) -> bytes:
    """Encode with Pillow; fmt is jpeg|png|webp|gif|bmp|tiff."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    if PIL_FORMATS[fmt] == "JPEG":
        kwargs.setdefault("quality", 90)
    image.save(buffer, PIL_FORMATS[fmt], **kwargs)
    return buffer.getvalue()


def photo_bytes(
    name: str = "astronaut", fmt: str = "jpeg", width: int = 128, height: int | None = None, rng=None
) -> bytes:
    return encode(photo(name, width, height, rng), fmt)


def open_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def decoded(data: bytes) -> np.ndarray:
    return np.asarray(open_image(data))


def png_chunk(tag: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload) & 0xFFFFFFFF)


def png_with_header(width: int, height: int, idat_bytes: int = 64) -> bytes:
    """A PNG whose IHDR (valid CRC) claims an 8-bit grayscale `width` x `height` image but
    whose IDAT holds only a tiny zlib stream: the classic decompression-bomb header."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * idat_bytes)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def sketch_files(data: bytes, filename: str = "photo.jpg", content_type: str = "image/jpeg") -> dict:
    return {"image": (filename, data, content_type)}


def assert_api_error(response, status: int, code: str, client=None) -> dict:
    """The response is our JSON error `{"error": code, "detail": <non-empty str>}` with
    `status`; when `client` is given, the server still answers GET /healthz afterwards."""
    assert response.status_code == status, (
        f"expected {status} {code}, got {response.status_code}: {response.text[:500]}"
    )
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) in ({"error", "detail"}, {"error", "detail", "field"}), body  # field: the parameter a 422 names
    assert isinstance(body.get("field", ""), str) and body.get("field", "x"), body
    assert body["error"] == code, body
    assert isinstance(body["detail"], str) and body["detail"].strip(), body
    if client is not None:
        health = client.get("/healthz")
        assert health.status_code == 200, health.text
        assert health.json()["status"] == "ok"
    return body


def metric_samples(text: str) -> list:
    """All samples of a Prometheus text exposition: (name, labels, value) tuples."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The sum of the samples called `name` whose labels include `labels`, or None."""
    found = [
        s.value for s in metric_samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(found) if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REPO = Path(__file__).resolve().parents[2]


def server_env(workdir: Path, **settings: str) -> dict[str, str]:
    """This process's environment without its PENCIL_* variables, plus the given settings
    (e.g. workers="1" -> PENCIL_WORKERS=1), the CPU backend and a data directory in
    `workdir` unless given, and the checkout on PYTHONPATH."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PENCIL_")}
    env.update({f"PENCIL_{key.upper()}": value for key, value in settings.items()})
    env.setdefault("PENCIL_BACKEND", "cpu")
    env.setdefault("PENCIL_DATA_DIR", str(workdir / "data"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


@contextmanager
def server_process(
    command: list[str],
    workdir: Path,
    env: dict[str, str],
    base: str,
    ready_path: str = "/healthz",
    startup_timeout_s: float = 60,
) -> Iterator[subprocess.Popen]:
    """`command` run in `workdir` (so that no .env file of the checkout is read), its output
    in workdir/server.log; yields the process once GET base+ready_path answers 200, and
    stops it afterwards (SIGTERM, then SIGKILL)."""
    log_path = workdir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)

    def server_log() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{server_log()}")
            try:
                if httpx.get(f"{base}{ready_path}", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer {ready_path} within {startup_timeout_s:.0f} s:\n{server_log()}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@contextmanager
def live_server(workdir: Path, startup_timeout_s: float = 60, **settings: str) -> Iterator[str]:
    """uvicorn serving app.main:create_app on a free port in a subprocess, with the given
    PENCIL_* settings (e.g. workers="1") and the others at their defaults; yields its
    base URL once GET /healthz answers 200, and stops the server afterwards."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "app.main:create_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    base = f"http://127.0.0.1:{port}"
    with server_process(command, workdir, server_env(workdir, **settings), base, startup_timeout_s=startup_timeout_s):
        yield base


def multipart_body(
    boundary: str, image: bytes, filename: str = "photo.jpg", fields: dict[str, str] | None = None
) -> bytes:
    """A multipart/form-data body built by hand (to stream it without a Content-Length)."""
    parts = []
    for name, value in (fields or {}).items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    parts.append(
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{filename}"\r\n'
            "Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + image
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts)


# ------------------------------------------------------------------ batch jobs --

JOB_FINISHED = ("succeeded", "failed", "canceled")


def admin_client(make_client, token: str, **overrides):
    """A started client of an app with jobs enabled (`token`), sending it as a Bearer token."""
    client = make_client(admin_token=token, **overrides)
    client.headers["Authorization"] = f"Bearer {token}"
    return client


def wait_for_job(client, job_id: str, until=JOB_FINISHED, timeout_s: float = 60.0) -> dict:
    """Poll GET /jobs/{id} until its status is in `until`; the last body."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/jobs/{job_id}").json()
        if body["status"] in until:
            return body
        assert time.monotonic() < deadline, f"job still {body['status']} after {timeout_s} s: {body}"
        time.sleep(0.02)


def fetch_npy(client, url: str) -> np.ndarray:
    """A result file of a job, loaded as an array."""
    response = client.get(url)
    assert response.status_code == 200, response.text
    return np.load(io.BytesIO(response.content), allow_pickle=False)
