"""What the access checks (app/access.py: API keys, per-client rate limits) cost /sketch.

    python bench/rate_limit.py [--size 1920x1080] [--duration 20] [--rounds 2] [--keys 2]

1. In process: AccessGuard around an app that answers at once, per request in µs: the
   guard with everything off (the default), with `--keys` API keys on, and with keys and a
   rate limit (a bucket per key; never refusing, so every request does the whole check);
   the anchor is the same app without the guard.
2. Through the HTTP server: `python -m app.cli serve` (CPU backend unless --env says
   otherwise) under bench/loadgen.py, a closed loop of POST /sketch with a JPEG photo of
   --size (`texture=fast`, JPEG out), with the checks off and on, in alternating rounds
   (off, on, off, on, ...), each a fresh server; the throughput of each round and the
   ratio on/off of their medians. A second photo of 128x128 px shows the worst case: the
   smallest render, where a fixed cost per request weighs most.
Target (issue 39): the checks cost at most 2 % of /sketch's throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import skimage.data
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from e2e import free_port, start_server, stop_server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.access import AccessGuard  # noqa: E402  (after the checkout is on the path)
from app.config import Settings  # noqa: E402
from app.metrics import Metrics  # noqa: E402


def photo_jpeg(width: int, height: int) -> bytes:
    """scikit-image's astronaut resized to width x height, as a JPEG (quality 90)."""
    image = Image.fromarray(skimage.data.astronaut()).resize((width, height), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


# ---------------------------------------------------------------- in process --


async def _answer(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def guard_us(app, key: str | None, count: int) -> float:
    """Median over 5 batches of `count` calls of `app` on a POST /sketch scope, µs a call."""
    headers = [(b"host", b"localhost"), (b"content-type", b"image/jpeg")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message) -> None:
        pass

    async def batch() -> float:
        start = time.perf_counter()
        for _ in range(count):
            scope = {
                "type": "http",
                "method": "POST",
                "path": "/sketch",
                "headers": headers,
                "client": ("10.0.0.7", 50000),
                "state": {},
            }
            await app(scope, receive, send)
        return (time.perf_counter() - start) / count * 1e6

    async def batches() -> list[float]:
        await batch()  # warm-up
        return [await batch() for _ in range(5)]

    return statistics.median(asyncio.run(batches()))


def in_process(keys: int, count: int = 50_000) -> dict[str, float]:
    names = {f"client{n}": secrets.token_urlsafe(32) for n in range(keys)}
    last_key = list(names.values())[-1]  # every key is compared whichever matches
    table = ",".join(f"{name}:{key}" for name, key in names.items())
    configs = {
        "no guard (anchor)": (None, None),
        "guard, all off (default)": ({}, None),
        f"guard, {keys} API keys": ({"api_keys": table}, last_key),
        f"guard, {keys} API keys + rate limit": ({"api_keys": table, "rate_limit": 1e6}, last_key),
        "guard, rate limit by address": ({"rate_limit": 1e6}, None),
    }
    results = {}
    with tempfile.TemporaryDirectory() as shared:  # the host's rate buckets (app/rate_limit.py)
        for label, (settings, key) in configs.items():
            app = (
                _answer
                if settings is None
                else AccessGuard(_answer, Settings(**settings), Metrics(), shared_dir=Path(shared))
            )
            results[label] = guard_us(app, key, count)
    return results


# --------------------------------------------------------------- HTTP server --


def server_rps(
    image: bytes, checks: bool, duration: float, connections: int, env_extra: dict[str, str], key: str, workdir: Path
) -> tuple[float, float, dict]:
    """(requests a second, p50 ms, non-200 statuses) of one closed-loop run on a fresh server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PENCIL_")}
    env.update({"PENCIL_BACKEND": "cpu", "PENCIL_LOG_LEVEL": "warning", "PENCIL_DATA_DIR": str(workdir / "data")})
    env.update(env_extra)
    if checks:
        env.update({"PENCIL_API_KEYS": f"bench:{key},other:{secrets.token_urlsafe(32)}", "PENCIL_RATE_LIMIT": "1e6"})
    port = free_port()
    server = start_server(env, port, workdir / f"server-{port}.log", ready_timeout=180)
    try:
        result = loadgen.run(
            f"http://127.0.0.1:{port}/sketch",
            image,
            "photo.jpg",
            {"texture": "fast", "format": "jpeg"},
            processes=1,
            connections=connections,
            duration=duration,
            warmup=3.0,
            headers={"Authorization": f"Bearer {key}"},
        )
    finally:
        stop_server(server)
    return result.rps, result.p50_ms, result.non_200


def through_server(
    image: bytes, rounds: int, duration: float, connections: int, env_extra: dict[str, str]
) -> dict[str, list[float]]:
    key = secrets.token_urlsafe(32)
    runs: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="bench-rate-limit-") as tmp:
        for round_ in range(rounds):
            for label in ("off", "on"):
                rps, p50, non_200 = server_rps(image, label == "on", duration, connections, env_extra, key, Path(tmp))
                if non_200:
                    raise RuntimeError(f"round {round_ + 1} ({label}): answers other than 200: {non_200}")
                runs[label].append(rps)
                print(f"  round {round_ + 1}, checks {label:3}: {rps:8.2f} req/s, p50 {p50:.1f} ms", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1920x1080", help="the photo's WIDTHxHEIGHT [1920x1080]")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds of each server run [20]")
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs of server runs per photo [2]")
    parser.add_argument("--keys", type=int, default=2, help="API keys configured in the in-process figures [2]")
    parser.add_argument("--connections", type=int, default=4, help="loadgen connections [4]")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="a server setting for both (repeatable)"
    )
    parser.add_argument("--skip-server", action="store_true", help="only the in-process figures")
    args = parser.parse_args()
    env_extra = dict(item.split("=", 1) for item in args.env)
    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}")

    print("\nAccessGuard per request, in process (median of 5 batches of 50,000):")
    figures = in_process(args.keys)
    anchor = figures["no guard (anchor)"]
    for label, us in figures.items():
        extra = "" if label.startswith("no guard") else f"  (+{us - anchor:.2f} µs)"
        print(f"  {label:40} {us:7.2f} µs{extra}")

    if args.skip_server:
        return
    width, height = (int(v) for v in args.size.lower().split("x"))
    for w, h in ((width, height), (128, 128)):
        print(f"\nPOST /sketch through the server, {w}x{h} JPEG, texture=fast, JPEG out ({args.rounds} rounds):")
        runs = through_server(photo_jpeg(w, h), args.rounds, args.duration, args.connections, env_extra)
        off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
        spread = (max(runs["off"]) - min(runs["off"])) / off * 100 if off else float("nan")
        print(
            f"  median off {off:.2f} req/s, on {on:.2f} req/s: on/off {on / off:.4f} "
            f"({(1 - on / off) * 100:+.2f} % cost; the off runs spread {spread:.1f} %)"
        )
        per_request_ms = 1000 / off * max(1, int(env_extra.get("PENCIL_WORKERS", "2")))
        cost = figures[f"guard, {args.keys} API keys + rate limit"] - anchor
        print(f"  expected from the in-process figure: {cost:.2f} µs of ~{per_request_ms:.1f} ms a request per worker")


if __name__ == "__main__":
    main()
