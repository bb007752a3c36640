"""Live drawing end to end: N clients each stream a clip at a fixed frame rate to /live.

    python bench/live.py --backend cuda --clients 1,8 --seconds 10 [--video]

Starts `pencil-gpu serve` (bench/e2e.py's start_server, the shipped settings unless
--setting KEY=V), then for each client count runs that many client processes (spawned, one
websocket each). A client sends the frames of a 1280x720 clip (scikit-image photographs
panned, JPEG q80, made once) at --fps on a fixed schedule from a sender thread, whatever
comes back, and reads the drawings on its main thread. Per client, over the measured window
(after --warmup s): delivered frames a second, the share of sent frames dropped, the server's
latency (a frame's arrival to the start of sending its drawing, the header's latency_ms) p50
and p99, and the age of each delivered drawing at the client (its frame's send to its
drawing's arrival) p50, p99 and max.

Then /sketch's latency beside the live clients: sequential POST /sketch of a 1920x1080 JPEG
(the e2e photo), p50 and p99 with the server otherwise idle, then with the largest client
count streaming. With --video, bench/video.py's run in the same invocation (the video job's
frames a second against the CPU pipeline).
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e  # bench/ is not a package

ROOT = Path(__file__).resolve().parent.parent


def clip_frames(width: int, height: int, count: int = 60) -> list[bytes]:
    """`count` JPEG q80 frames (width x height) panning across two photographs."""
    import cv2
    from PIL import Image
    from skimage import data

    side = int(height * 1.25)
    photos = [cv2.resize(p, (side * p.shape[1] // p.shape[0], side)) for p in (data.astronaut(), data.chelsea())]
    scene = np.concatenate(photos, axis=1)
    span = scene.shape[1] - width
    frames = []
    for i in range(count):
        x = int(span * i / max(1, count - 1))
        crop = np.ascontiguousarray(scene[:height, x : x + width])
        buffer = io.BytesIO()
        Image.fromarray(crop).save(buffer, "JPEG", quality=80)
        frames.append(buffer.getvalue())
    return frames


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def client(url: str, frames: list[bytes], fps: float, warmup: float, seconds: float, start_at: float, out) -> None:
    """One streaming client (a spawned process): sends on schedule, reads the drawings,
    puts its figures on `out`."""
    from websockets.sync.client import connect

    sent_at: dict[int, float] = {}
    send_ms: list[float] = []  # how long ws.send took: the client's share of a frame's age
    with connect(url, max_size=None, open_timeout=30) as ws:
        ready = json.loads(ws.recv())
        assert ready["type"] == "ready", ready
        stop_at = start_at + warmup + seconds

        def send() -> None:
            number = 0
            while True:
                due = start_at + number / fps
                if due >= stop_at:
                    return
                time.sleep(max(0.0, due - time.time()))
                number += 1
                sent_at[number] = time.time()
                ws.send(frames[(number - 1) % len(frames)])
                send_ms.append((time.time() - sent_at[number]) * 1000)

        time.sleep(max(0.0, start_at - time.time()))
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        window = (start_at + warmup, stop_at)
        delivered, latency, age, errors = 0, [], [], 0
        last_dropped = 0
        while True:
            try:
                message = ws.recv(timeout=max(0.5, stop_at + 1.0 - time.time()))
            except TimeoutError:
                break
            header = json.loads(message)
            if header["type"] != "frame":
                errors += 1
                continue
            ws.recv()  # the drawing
            arrived = time.time()
            last_dropped = header["dropped"]
            if window[0] <= sent_at[header["frame"]] < window[1]:
                delivered += 1
                latency.append(header["latency_ms"])
                age.append((arrived - sent_at[header["frame"]]) * 1000)
            if arrived > stop_at + 1.0:
                break
        sender.join()
    measured_sent = sum(1 for t in sent_at.values() if window[0] <= t < window[1])
    out.put(
        {
            "sent": measured_sent,
            "delivered": delivered,
            "fps": delivered / seconds,
            "drop_rate": 1 - delivered / measured_sent if measured_sent else float("nan"),
            "dropped_total": last_dropped,
            "errors": errors,
            "latency_p50": percentile(latency, 50),
            "latency_p99": percentile(latency, 99),
            "age_p50": percentile(age, 50),
            "age_p99": percentile(age, 99),
            "age_max": max(age) if age else float("nan"),
            "send_p99": percentile(send_ms, 99),
        }
    )


def run_clients(port: int, count: int, args, frames: list[bytes]) -> list[dict]:
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    url = f"ws://127.0.0.1:{port}/live?texture={args.texture}&format=jpeg&quality=80"
    start_at = time.time() + 3.0  # every process connected and its frames loaded by then
    processes = [
        spawn.Process(target=client, args=(url, frames, args.fps, args.warmup, args.seconds, start_at, out))
        for _ in range(count)
    ]
    for p in processes:
        p.start()
    results = [out.get(timeout=args.warmup + args.seconds + 120) for _ in processes]
    for p in processes:
        p.join()
    return results


def sketch_latencies(port: int, jpeg: bytes, seconds: float) -> dict[str, list[float]]:
    """Sequential POST /sketch of `jpeg` (texture fast) for `seconds`: the latencies (ms) and
    the server's X-Queue-Ms and X-Render-Ms of each."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    figures: dict[str, list[float]] = {"latency": [], "queue": [], "render": []}
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            start = time.perf_counter()
            connection.request("POST", "/sketch?texture=fast&format=jpeg", jpeg, {"Content-Type": "image/jpeg"})
            response = connection.getresponse()
            response.read()
            if response.status == 200:
                figures["latency"].append((time.perf_counter() - start) * 1000)
                figures["queue"].append(float(response.getheader("X-Queue-Ms")))
                figures["render"].append(float(response.getheader("X-Render-Ms")))
    finally:
        connection.close()
    return {name: values[2:] for name, values in figures.items()}


def sketch_line(name: str, figures: dict[str, list[float]]) -> str:
    p = {k: (percentile(v, 50), percentile(v, 99)) for k, v in figures.items()}
    return (
        f"{name}: latency p50 {p['latency'][0]:.1f} p99 {p['latency'][1]:.1f} ms, X-Queue-Ms p50 {p['queue'][0]:.1f} "
        f"p99 {p['queue'][1]:.1f}, X-Render-Ms p50 {p['render'][0]:.1f} p99 {p['render'][1]:.1f} "
        f"({len(figures['latency'])} requests)"
    )


def _probe(port: int, jpeg: bytes, seconds: float, out) -> None:
    out.put(sketch_latencies(port, jpeg, seconds))


def client_table(count: int, results: list[dict]) -> str:
    lines = [
        f"{count} client(s), {len(results)} reporting:",
        "| client | sent | delivered fps | drop rate | server latency p50 / p99 ms | age p50 / p99 / max ms "
        "| send p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results):
        lines.append(
            f"| {i + 1} | {r['sent']} | {r['fps']:.1f} | {r['drop_rate']:.1%} | {r['latency_p50']:.2f} / "
            f"{r['latency_p99']:.2f} | {r['age_p50']:.1f} / {r['age_p99']:.1f} / {r['age_max']:.1f} | "
            f"{r['send_p99']:.1f} | {r['errors']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--clients", default="1,8", help="client counts to run, comma-separated")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--texture", default="fast")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--setting", action="append", default=[], help="KEY=V, a PENCIL_ setting of the server")
    parser.add_argument("--video", action="store_true", help="also run bench/video.py")
    parser.add_argument("--profile", action="store_true", help="py-spy the server during the largest client count")
    parser.add_argument("--out", type=Path, default=Path("/tmp/pencil-live"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in args.size.split("x"))
    counts = [int(c) for c in args.clients.split(",") if c]

    frames = clip_frames(width, height)
    import cv2

    photo = e2e.photo("astronaut", 1920, 1080)
    jpeg = cv2.imencode(".jpg", cv2.cvtColor(photo, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    port = e2e.free_port()
    env = {**os.environ, "PENCIL_BACKEND": args.backend, "PENCIL_LOG_LEVEL": "warning"}
    env.update({f"PENCIL_{k.upper()}": v for k, v in (s.split("=", 1) for s in args.setting)})
    print(
        f"# /live end to end: {width}x{height} JPEG q80 frames ({statistics.mean(map(len, frames)) / 1e3:.0f} KB), "
        f"{args.fps:g} fps a client, texture {args.texture}, backend {args.backend}; {args.warmup:g} s warm-up + "
        f"{args.seconds:g} s measured; clients in their own processes"
    )
    server = e2e.start_server(env, port, args.out / "server.log", ready_timeout=300)
    try:
        health = json.loads(e2e.get(port, "/healthz")[1])
        print(f"# server: {health['processes']} processes, devices {health['devices'] or 'none'}\n")
        for count in counts:
            recorders = []
            if args.profile and count == max(counts) and shutil.which("py-spy"):
                span = int(args.warmup + args.seconds + 3)
                recorders = e2e.start_profile(shutil.which("py-spy"), server.pid, span, args.out, f"live-{count}")
            print(client_table(count, run_clients(port, count, args, frames)) + "\n")
            for path in e2e.finish_profile(recorders):
                if path.endswith(".txt"):
                    print(e2e.profile_summary(Path(path), top=25) + "\n")
        idle = sketch_latencies(port, jpeg, args.seconds)
        spawn = multiprocessing.get_context("spawn")
        out = spawn.Queue()
        probe = spawn.Process(target=_probe, args=(port, jpeg, args.warmup + args.seconds, out))
        probe.start()
        busy_clients = run_clients(port, max(counts), args, frames)
        busy = out.get(timeout=120)
        probe.join()
        print("POST /sketch 1920x1080 JPEG, texture fast, sequential on one connection:")
        print(sketch_line("- idle", idle))
        print(sketch_line(f"- beside {max(counts)} live clients", busy))
        slowest = min(r["fps"] for r in busy_clients)
        ratio = percentile(busy["latency"], 99) / percentile(idle["latency"], 99)
        print(f"- p99 ratio {ratio:.2f}; the live clients meanwhile delivered at least {slowest:.1f} fps")
    finally:
        e2e.stop_server(server)
    if args.video:
        import video

        print()
        video.main(["--backend", args.backend])


if __name__ == "__main__":
    main()
