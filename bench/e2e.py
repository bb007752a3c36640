"""End-to-end load test of POST /sketch: the server as a separate process, driven by
bench/loadgen.py, with cv2.pencilSketch on all host cores as the anchor of the same run.

    python bench/pencil.py --e2e [--backend cuda] [--e2e-size 1920x1080] [--duration 15] [--rates 300] \\
        [--setting 'procs8:PENCIL_PROCESSES=8' ...] [--env KEY=VALUE ...] [--profile] [--out DIR]
    (python bench/e2e.py takes the same options)

First the anchor: the photo decoded (cv2.imdecode), drawn (cv2.pencilSketch) and encoded
(JPEG q90) in a loop by os.cpu_count() processes of one OpenCV thread each; requests a second.
Then, per setting, the server is started afresh (`python -m app.cli serve`) with the shipped
defaults plus --env plus the setting's variables, and once GET /readyz answers 200:
- idle: 20 requests one after another, JPEG in and out, then PNG in and out; median X-Render-Ms;
- per texture: a saturated closed loop (connections = the server's workers + queue limit
  unless --connections), then an open loop at each of --rates;
while GPU utilisation and memory (NVML, if pynvml imports and a GPU answers) and the CPU time
of the server's process tree are sampled every 0.1 s. --profile records the server with
py-spy during the saturated lu run. One markdown table per setting, ratios ours/anchor,
and all figures as JSON in --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import io
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import skimage.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from timing import median_ms

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_S = 0.1  # sampling period of GPU utilisation, GPU memory and server CPU time
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

try:
    import psutil
except ImportError:
    psutil = None


# ------------------------------------------------------------------ inputs --


def photo(name: str, width: int, height: int) -> np.ndarray:
    """scikit-image's photograph `name`, resized (cubic) to width x height, BGR uint8."""
    image = getattr(skimage.data, name)()
    return cv2.resize(cv2.cvtColor(image, cv2.COLOR_RGB2BGR), (width, height), interpolation=cv2.INTER_CUBIC)


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    """'name:KEY=V,KEY=V' -> (name, {KEY: V}); values cannot hold commas."""
    name, _, assignments = text.partition(":")
    return name, dict(pair.split("=", 1) for pair in assignments.split(",") if pair)


# ------------------------------------------------------------- codec floors --


def host_codec_floors(jpeg: bytes, png: bytes, small_png: bytes, repeats: int = 15) -> str:
    """One core's time for the host codec work a request may need (median ms): the floor
    under the idle PNG figures, which no GPU path removes (no GPU PNG decoder exists)."""
    from PIL import Image

    from gpu.codec.png import encode_png

    cv2.setNumThreads(1)
    gray = cv2.cvtColor(cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2GRAY)
    rows = [
        ("JPEG decode, cv2", lambda: cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)),
        ("PNG decode, Pillow (the service's)", lambda: Image.open(io.BytesIO(png)).load()),
        ("PNG decode, cv2", lambda: cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)),
        ("PNG 1000x872 decode, Pillow", lambda: Image.open(io.BytesIO(small_png)).load()),
        ("PNG 1000x872 decode, cv2", lambda: cv2.imdecode(np.frombuffer(small_png, np.uint8), cv2.IMREAD_UNCHANGED)),
        ("PNG encode of the gray image, ours", lambda: encode_png(gray)),
    ]
    lines = ["# host codecs, one core, median ms:"]
    lines += [f"#   {name}: {median_ms(work, repeats):.1f}" for name, work in rows]
    cv2.setNumThreads(-1)
    return "\n".join(lines)


# ------------------------------------------------------------------ anchor --


def _anchor_worker(jpeg: bytes, seconds: float, gate) -> tuple[int, float]:
    """One anchor process: decode, cv2.pencilSketch, JPEG q90 encode, for `seconds` from the
    gate on; (count, elapsed s)."""
    cv2.setNumThreads(1)
    data = np.frombuffer(jpeg, np.uint8)

    def once() -> None:
        gray, _ = cv2.pencilSketch(cv2.imdecode(data, cv2.IMREAD_COLOR))
        cv2.imencode(".jpg", gray, [cv2.IMWRITE_JPEG_QUALITY, 90])

    once()  # warm-up, outside the clock
    gate()
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        once()
        count += 1
    return count, elapsed


def anchor_rate(jpeg: bytes, processes: int, seconds: float) -> float:
    """Requests a second of the anchor on `processes` processes together."""
    counts = loadgen.spawn_together(_anchor_worker, [(jpeg, seconds)] * processes, 180 + seconds)
    return sum(count / elapsed for count, elapsed in counts)


# ------------------------------------------------------------------ sampling --


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and its live descendants."""
    if psutil is not None:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return math.nan
        total = 0.0
        for process in tree:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:  # gone since the listing
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # from field 3 (state) on: ppid, ..., utime (14), stime (15)
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    if pid not in cpu:
        return math.nan
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, of in parents.items() if of == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(cpu[p] for p in tree)


def gpu_name(handle) -> str:
    import pynvml

    name = pynvml.nvmlDeviceGetName(handle)
    return name if isinstance(name, str) else name.decode()  # bytes before nvidia-ml-py 11.515


def nvml_devices() -> list:
    """NVML handles of every GPU, or [] without pynvml or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no library, no driver, no device: no GPU figures
        return []


class Periodic:
    """Calls `sample()` every SAMPLE_S in a thread, from entering the block to leaving it."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(SAMPLE_S):
                return

    def sample(self) -> None:
        raise NotImplementedError


class Sampler(Periodic):
    """Every SAMPLE_S, in a thread: (Unix time s, per-GPU utilisation %, per-GPU memory used
    bytes, server tree CPU s)."""

    def __init__(self, pid: int, gpus: list):
        super().__init__()
        self.pid, self.gpus = pid, gpus
        self.samples: list[tuple[float, list[float], list[int], float]] = []

    def sample(self) -> None:
        util: list[float] = []
        memory: list[int] = []
        if self.gpus:
            import pynvml

            util = [float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.gpus]
            memory = [int(pynvml.nvmlDeviceGetMemoryInfo(h).used) for h in self.gpus]
        self.samples.append((time.time(), util, memory, tree_cpu_seconds(self.pid)))

    def window(self, start: float, end: float) -> dict:
        """Per-GPU mean utilisation % and peak memory MiB, and server CPU cores busy, between
        Unix times start and end."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {"gpu_util_pct": [], "gpu_mem_max_mib": [], "server_cpu_cores": math.nan}
        (t0, *_, c0), (t1, *_, c1) = inside[0], inside[-1]
        return {
            "gpu_util_pct": [statistics.fmean(s[1][i] for s in inside) for i in range(len(self.gpus))],
            "gpu_mem_max_mib": [max(s[2][i] for s in inside) / 2**20 for i in range(len(self.gpus))],
            "server_cpu_cores": (c1 - c0) / (t1 - t0),
        }


# ------------------------------------------------------------------ server --


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def start_server(env: dict[str, str], port: int, log_path: Path, ready_timeout: float) -> subprocess.Popen:
    """`python -m app.cli serve --port port` with `env`, output to log_path; returns once
    GET /readyz answers 200 and every server process (PENCIL_PROCESSES) has answered
    /healthz, so that no load lands on the first process alone while the others still warm
    up (raises if it exits or `ready_timeout` s pass first)."""
    server = spawn_server(env, port, log_path)
    wait_until_served(server, port, log_path, ready_timeout)
    return server


def spawn_server(env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen:
    """`python -m app.cli serve --port port` with `env`, output to log_path, not waited for."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_until_served(
    server: subprocess.Popen, port: int, log_path: Path, timeout: float, poll_s: float = 0.5
) -> tuple[float, float]:
    """Wait until GET /readyz answers 200 and every server process has answered /healthz;
    returns (seconds to the first 200, seconds to the last process), from the call. Raises
    when the server exits, or stops it and raises when `timeout` s pass first."""
    started = time.monotonic()
    ready = None
    processes = 1  # until a process says how many there are
    seen: set[int] = set()
    while time.monotonic() - started < timeout:
        if server.poll() is not None:
            raise RuntimeError(
                f"the server exited with status {server.returncode}; its log:\n{log_path.read_text()[-3000:]}"
            )
        try:
            if get(port, "/readyz")[0] == 200:
                ready = ready or time.monotonic() - started
                health = json.loads(get(port, "/healthz")[1])  # a new connection each time
                seen.add(health["pid"])
                processes = max(processes, health.get("processes") or 1)
                if len(seen) >= processes:
                    return ready, time.monotonic() - started
                continue
        except OSError:  # not listening yet
            pass
        time.sleep(poll_s)
    stop_server(server)
    raise TimeoutError(f"the server was not ready within {timeout:g} s; see {log_path}")


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def sequential(port: int, content_type: str, body: bytes, count: int = 20) -> tuple[float, float]:
    """(median X-Render-Ms, median latency ms) of `count` requests sent one after another on
    one connection, after 2 unmeasured ones."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    render_ms, latency_ms = [], []
    try:
        for i in range(count + 2):
            start = time.perf_counter()
            connection.request("POST", "/sketch", body, {"Content-Type": content_type})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"POST /sketch answered {response.status} with the server idle")
            if i >= 2:
                latency_ms.append((time.perf_counter() - start) * 1000)
                render_ms.append(float(response.getheader("X-Render-Ms")))
    finally:
        connection.close()
    return statistics.median(render_ms), statistics.median(latency_ms)


# ------------------------------------------------------------------ profile --


def start_profile(pyspy: str, pid: int, seconds: int, out_dir: Path, name: str) -> list[tuple[subprocess.Popen, Path]]:
    """Two recorders (`pyspy`, the py-spy executable) of the server tree for `seconds`: a flame
    graph (SVG) and the collapsed stacks (text). Non-blocking: the server is not paused to be
    sampled."""
    common = [pyspy, "record", "--subprocesses", "--nonblocking", "--pid", str(pid), "-d", str(seconds)]
    recorders = []
    for suffix, extra in (("svg", []), ("txt", ["--format", "raw"])):
        path = out_dir / f"pyspy-{name}.{suffix}"
        recorders.append(
            (
                subprocess.Popen([*common, *extra, "-o", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
                path,
            )
        )
    return recorders


def finish_profile(recorders: list[tuple[subprocess.Popen, Path]]) -> list[str]:
    """Wait for the recorders; the paths written, with py-spy's complaint when one failed."""
    written = []
    for recorder, path in recorders:
        output, _ = recorder.communicate(timeout=120)
        if recorder.returncode == 0 and path.exists():
            written.append(str(path))
        else:
            print(f"py-spy failed ({recorder.returncode}) for {path.name}:\n{output.decode(errors='replace')[-1500:]}")
    return written


def profile_summary(raw: Path, top: int = 12) -> str:
    """The frames holding most samples in py-spy's collapsed stacks, in % of the active
    samples, line numbers dropped: self (on top of the stack; a C event loop shows as its
    Python caller) and, for the service's own code (app/, gpu/), total (anywhere on it)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [
            frame.rsplit(":", 1)[0] + ")" if frame.endswith(")") and ":" in frame else frame
            for frame in stack.split(";")
        ]
        samples += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            if frame.split(" (", 1)[-1].startswith(("app/", "gpu/")):
                total[frame] += int(count)
    if not samples:
        return "no samples"
    lines = [f"{samples} active samples; self %:"]
    lines += [f"  {100 * n / samples:5.1f}  {frame}" for frame, n in own.most_common(top)]
    lines.append("total % (anywhere on the stack), app/ and gpu/ frames:")
    lines += [f"  {100 * n / samples:5.1f}  {frame}" for frame, n in total.most_common(top)]
    return "\n".join(lines)


# ------------------------------------------------------------------ report --


def failures(run: dict) -> str:
    """Non-200 statuses and client-side errors of a run, e.g. '503x12 EOFErrorx1', or 0."""
    parts = [f"{status}x{n}" for status, n in run["non_200"].items()] + [
        f"{name}x{n}" for name, n in run["errors"].items()
    ]
    return " ".join(parts) or "0"


def table(name: str, runs: list[dict]) -> str:
    head = (
        "| setting | texture | mode | offered | req/s | p50 ms | p99 ms | mean X-Render-Ms | GPU util % | non-200 "
        "| server CPU ms/req | client CPU ms/req |"
    )
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for run in runs:
        offered = "-" if run["offered_rps"] is None else f"{run['offered_rps']:g}"
        util = "/".join(f"{u:.0f}" for u in run["gpu_util_pct"]) or "-"
        server_ms = run["server_cpu_cores"] * 1000 / run["rps"] if run["rps"] else math.nan
        rows.append(
            f"| {name} | {run['texture']} | {run['mode']} | {offered} | {run['rps']:.1f} "
            f"| {run['p50_ms']:.1f} | {run['p99_ms']:.1f} | {run['mean_render_ms']:.1f} | {util} | {failures(run)} "
            f"| {server_ms:.2f} | {run['client_cpu_ms_per_request']:.3f} |"
        )
    return "\n".join(rows)


# ------------------------------------------------------------------ main --


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "cpu", "cuda"),
        default=None,
        help="PENCIL_BACKEND of the server [the shipped default, auto]",
    )
    parser.add_argument("--e2e-size", default="1920x1080", help="WxH of the photo sent [1920x1080]")
    parser.add_argument(
        "--photo", choices=("astronaut", "coffee"), default="astronaut", help="scikit-image photograph [astronaut]"
    )
    parser.add_argument("--textures", default="lu,fast", help="textures to load-test, in order [lu,fast]")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per run, and of the anchor [15]")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each run [3]")
    parser.add_argument(
        "--rates", default="300", help="open-loop offered rates, req/s, comma-separated; '' for none [300]"
    )
    parser.add_argument("--processes", type=int, default=2, help="client processes [2]")
    parser.add_argument(
        "--connections",
        type=int,
        default=None,
        help="closed-loop connections [the server's workers + queue limit, from /healthz]",
    )
    parser.add_argument("--open-connections", type=int, default=128, help="open-loop connections [128]")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME:KEY=V,KEY=V",
        help="a server setting to measure (repeatable; each restarts the server) [default: no extra variables]",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a variable for the server in every setting (repeatable)",
    )
    parser.add_argument(
        "--anchor-processes",
        type=int,
        default=os.cpu_count(),
        help=f"processes of the cv2.pencilSketch anchor [{os.cpu_count()}, the host's cores]",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=600.0, help="seconds to wait for GET /readyz == 200 [600]"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy the server during the saturated lu run")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or tempfile.gettempdir()),
        help="directory for the JSON, server logs and profiles [$OUT or /tmp]",
    )
    args = parser.parse_args(argv)

    width, height = (int(v) for v in args.e2e_size.lower().split("x"))
    textures = [t for t in args.textures.split(",") if t]
    rates = [float(r) for r in args.rates.split(",") if r]
    settings = [parse_setting(s) for s in args.setting] or [("default", {})]
    shared_env = dict(pair.split("=", 1) for pair in args.env)
    if args.backend:
        shared_env.setdefault("PENCIL_BACKEND", args.backend)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    image = photo(args.photo, width, height)
    jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    png = cv2.imencode(".png", image)[1].tobytes()
    # The single-request PNG figure of issue 18 was taken on a 1000x872 photo: measured too.
    small_png = cv2.imencode(".png", photo(args.photo, 1000, 872))[1].tobytes()
    gpus = nvml_devices()
    pyspy = shutil.which("py-spy") or shutil.which(
        "py-spy", path=str(Path(sys.executable).parent)
    )  # pip puts it beside python

    print(
        f"# POST /sketch end to end: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, OpenCV {cv2.__version__}"
    )
    if gpus:
        print(f"# GPUs (NVML): {', '.join(gpu_name(h) for h in gpus)}")
    else:
        print("# GPU utilisation: not measured (no pynvml or no GPU)")
    print(
        f"# photo: {args.photo} {width}x{height}, JPEG q90 {len(jpeg):,} bytes, PNG {len(png):,} bytes; "
        f"{args.warmup:g} s warm-up + {args.duration:g} s per run; {args.processes} client processes"
    )
    if args.profile and not pyspy:
        print("# --profile: py-spy is not on PATH; no profile")

    print(host_codec_floors(jpeg, png, small_png))
    anchor = anchor_rate(jpeg, args.anchor_processes, args.duration)
    print(
        "# anchor: cv2.pencilSketch with imdecode + JPEG q90 imencode on "
        f"{args.anchor_processes} processes x 1 thread: {anchor:.1f} req/s"
    )

    report = {
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "opencv": cv2.__version__,
            "gpus": [gpu_name(h) for h in gpus],
        },
        "args": {k: str(v) for k, v in vars(args).items()},
        "photo": {"name": args.photo, "width": width, "height": height, "jpeg_bytes": len(jpeg), "png_bytes": len(png)},
        "anchor_rps": anchor,
        "settings": [],
    }
    path = args.out / f"e2e-{stamp}.json"
    with tempfile.TemporaryDirectory(prefix="pencil-e2e-") as scratch:
        for name, setting_env in settings:
            env = {
                **os.environ,
                "PENCIL_DATA_DIR": str(Path(scratch) / name),
                **shared_env,
                **setting_env,
            }  # no data/ left in the tree
            port = free_port()
            log_path = args.out / f"server-{name}-{stamp}.log"
            server = start_server(env, port, log_path, args.ready_timeout)
            try:
                entry = measure(
                    args,
                    name,
                    {**shared_env, **setting_env},
                    server,
                    port,
                    gpus,
                    jpeg,
                    png,
                    small_png,
                    textures,
                    rates,
                    pyspy,
                    anchor,
                )
            finally:
                stop_server(server)
            entry["server_log"] = str(log_path)
            report["settings"].append(entry)
            path.write_text(
                json.dumps(report, indent=2, default=str)
            )  # after each setting: a later failure keeps these
    print(f"\n# figures: {path}")


def measure(
    args,
    name: str,
    env: dict[str, str],
    server: subprocess.Popen,
    port: int,
    gpus: list,
    jpeg: bytes,
    png: bytes,
    small_png: bytes,
    textures: list[str],
    rates: list[float],
    pyspy: str | None,
    anchor: float,
) -> dict:
    """One setting (`env`: its variables beyond the shipped defaults) against its running
    server: idle figures, then the loaded runs; prints its tables, returns its figures."""
    health = json.loads(get(port, "/healthz")[1])
    connections = args.connections or max(args.processes, health["workers"] + health["queue"]["limit"])
    url = f"http://127.0.0.1:{port}/sketch"
    print(f"\n## setting {name}: {' '.join(f'{k}={v}' for k, v in env.items()) or 'shipped defaults'}")
    print(
        f"backend {' '.join([health['backend'], *health['devices']])}, {health['workers']} workers, "
        f"queue limit {health['queue']['limit']}; "
        f"closed loop on {connections} connections, open loop on {args.open_connections}"
    )

    idle = []
    for texture in textures:
        for label, data, filename, fmt in (
            ("jpeg -> jpeg", jpeg, "photo.jpg", "jpeg"),
            ("png -> png", png, "photo.png", "png"),
            ("png -> png, 1000x872", small_png, "photo.png", "png"),
        ):
            content_type, body = loadgen.multipart(data, filename, {"format": fmt, "texture": texture})
            render_ms, latency_ms = sequential(port, content_type, body)
            idle.append(
                {"texture": texture, "formats": label, "median_render_ms": render_ms, "median_latency_ms": latency_ms}
            )
    print("\n| setting | texture | in -> out | median X-Render-Ms | median latency ms |\n|---|---|---|---|---|")
    for row in idle:
        print(
            f"| {name} | {row['texture']} | {row['formats']} | {row['median_render_ms']:.1f} | "
            f"{row['median_latency_ms']:.1f} |"
        )

    runs, profile = [], []
    with Sampler(server.pid, gpus) as sampler:
        for texture in textures:
            fields = {"format": "jpeg", "texture": texture}
            for rate in [None, *rates]:
                profiled = bool(args.profile and pyspy and texture == "lu" and rate is None)
                recorders: list[tuple[subprocess.Popen, Path]] = []
                timer = threading.Timer(
                    args.warmup,
                    lambda into=recorders: into.extend(
                        start_profile(pyspy, server.pid, min(10, math.ceil(args.duration)), args.out, name)
                    ),
                )
                result = loadgen.run(
                    url,
                    jpeg,
                    "photo.jpg",
                    fields,
                    processes=args.processes,
                    connections=connections if rate is None else args.open_connections,
                    duration=args.duration,
                    warmup=args.warmup,
                    rate=rate,
                    started=timer.start if profiled else None,
                )
                if profiled:
                    timer.join()
                    profile = finish_profile(recorders)
                runs.append({"texture": texture, **dataclasses.asdict(result), **sampler.window(*result.window)})
                print(f"{texture}: {loadgen.summary(result)}", flush=True)
    print()
    print(table(name, runs))
    for texture in textures:
        saturated = next(r for r in runs if r["texture"] == texture and r["mode"] == "closed")
        print(
            f"ours/anchor, {texture} saturated: {saturated['rps']:.1f} / {anchor:.1f} = {saturated['rps'] / anchor:.2f}"
        )
    for path in profile:
        if path.endswith(".txt"):
            print(f"\n### py-spy, saturated lu ({path}; flame graph beside it)\n{profile_summary(Path(path))}")
    return {
        "name": name,
        "env": env,
        "health": health,
        "connections": connections,
        "idle": idle,
        "runs": runs,
        "profile": profile,
    }


if __name__ == "__main__":
    main()
