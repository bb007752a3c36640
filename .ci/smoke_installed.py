"""The README's quick start, end to end, from the installed package: start `pencil-gpu
serve` outside the checkout (so nothing is imported from the source tree), then load the
page and its script and draw a real photo with the README's curl command."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import skimage.data
from PIL import Image


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="pencil-smoke-"))
    photo = workdir / "photo.jpg"
    Image.fromarray(skimage.data.chelsea()).save(photo, "JPEG")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PENCIL_")}
    server = subprocess.Popen(["pencil-gpu", "serve", "--port", str(port)], cwd=workdir, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                get(f"{base}/healthz")
                break
            except OSError:
                time.sleep(0.25)
        assert b"<html" in get(f"{base}/").lower(), "the page is not served"
        assert len(get(f"{base}/static/app.js")) > 1000, "the page's script is not served"
        sketch = workdir / "sketch.png"
        subprocess.run(
            ["curl", "-sf", "-F", f"image=@{photo}", f"localhost:{port}/sketch", "-o", str(sketch)],
            check=True,
            timeout=60,
        )
        drawing = Image.open(io.BytesIO(sketch.read_bytes()))
        assert drawing.format == "PNG" and drawing.size == (451, 300), (drawing.format, drawing.size)
        print(
            f"smoke: installed server on :{port} served the page and drew a {drawing.size[0]}x{drawing.size[1]} sketch"
        )
        return 0
    finally:
        server.terminate()
        server.wait(timeout=15)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
