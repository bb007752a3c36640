"""Replica scaling of POST /sketch on one host: R replicas of the server, one GPU each, behind
nginx with the shipped proxy config (deploy/nginx/pencil.conf), driven by bench/loadgen.py;
the target: two replicas serve at least 1.8x one replica through the proxy.

    python bench/scale.py [--replicas 1,2] [--backend cuda] [--processes-per-replica 8] [--textures fast] \\
        [--e2e-size 1920x1080] [--duration 15] [--warmup 3] [--client-processes 4] [--connections-per-worker 2] \\
        [--nginx .ngx/nginx] [--nginx-workers 8] [--pin visible] [--env KEY=VALUE ...] [--out DIR]
    (on the GPU machine: bash bench/gpu_session.sh scale, carrying .whl/ and .ngx/ from bench/prepare_nginx.sh)

Replica i is `python -m app.cli serve` (bench/e2e.py's start_server: ready once GET /readyz
answers 200 and every process has answered /healthz) on a port of its own with the shipped
defaults plus PENCIL_PROCESSES=--processes-per-replica, PENCIL_BACKEND=--backend, --env, its own
PENCIL_DATA_DIR and, with CUDA, GPU i: --pin visible (default) sets CUDA_VISIBLE_DEVICES to GPU
i's UUID, so the replica and its private MPS daemon see that GPU alone, as in compose's one-GPU
containers (a UUID, not an index: MPS renumbers the devices its clients see); --pin devices sets
PENCIL_DEVICES=i with every GPU visible. Replicas start in turn and keep running: for R in
--replicas, replicas 0..R-1 serve, and nginx is started afresh in front of them with the
shipped config, its upstream servers replaced by the replicas' addresses, `listen` by a free
local port and its access log moved to a temporary file, read for the requests each replica
answered (all else as shipped: least_conn, keepalive 32, no request buffering, timeouts,
retries), inside an http {} block like the nginx image's.
At R=1 the replica is also driven directly, without the proxy, for the proxy's own cost.

Each run is a saturated closed loop of POST /sketch (the photo as JPEG q90, answer JPEG) on
--connections-per-worker x the replicas' render workers (/healthz: workers x processes)
connections from --client-processes processes, --warmup s then --duration s measured, while
GPU utilisation (NVML, if pynvml imports), the CPU time of each replica's process tree, of
nginx and of the whole host are sampled every 0.1 s: the CPU columns show whether the
servers, the proxy or the load generator ran out of cores. One markdown table, the ratio
R/1 through the proxy against the target, and all figures as JSON in --out: one file, with the
nginx configs, nginx's error logs and the replicas' warnings and MPS lines (their whole logs,
a line a request, stay in a temporary directory unless --keep-logs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import cv2

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e
import loadgen

ROOT = e2e.ROOT
SHIPPED_CONF = ROOT / "deploy" / "nginx" / "pencil.conf"
TARGET = 1.8  # two replicas over one, through the proxy


# ------------------------------------------------------------------ replicas --


def gpu_uuids(handles: list) -> list[str]:
    """The GPUs' UUIDs in NVML (PCI bus) order, from NVML `handles` (e2e.nvml_devices) or
    else nvidia-smi; [] without either."""
    if handles:
        import pynvml

        return [u if isinstance(u, str) else u.decode() for u in map(pynvml.nvmlDeviceGetUUID, handles)]
    try:
        listing = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return []
    return listing.stdout.split()


def replica_env(args, index: int, uuids: list[str], data_dir: Path) -> dict[str, str]:
    """Replica `index`'s environment: the shipped defaults plus the bench's settings and its GPU."""
    env = {
        **os.environ,
        "PENCIL_DATA_DIR": str(data_dir),
        "PENCIL_PROCESSES": str(args.processes_per_replica),
        "PENCIL_BACKEND": args.backend,
        "PENCIL_REPLICA_ID": f"replica-{index}",
        "FORWARDED_ALLOW_IPS": "*",  # as in compose: the replicas trust the proxy's X-Forwarded-For
        **dict(pair.split("=", 1) for pair in args.env),
    }
    if uuids:  # a GPU each (none on the CPU backend)
        if args.pin == "visible":
            env["CUDA_VISIBLE_DEVICES"] = uuids[index]
        else:
            env["PENCIL_DEVICES"] = str(index)
    return env


@dataclasses.dataclass
class Replica:
    index: int
    port: int
    server: subprocess.Popen
    health: dict
    log: Path

    @property
    def workers(self) -> int:
        """Renders it runs at once: render workers of one process x its processes."""
        return self.health["workers"] * self.health["processes"]


def start_replica(args, index: int, uuids: list[str], scratch: Path, stamp: str) -> Replica:
    port = e2e.free_port()
    log = (args.out if args.keep_logs else scratch) / f"scale-replica{index}-{stamp}.log"
    env = replica_env(args, index, uuids, scratch / f"replica{index}")
    server = e2e.start_server(env, port, log, args.ready_timeout)
    health = json.loads(e2e.get(port, "/healthz")[1])
    pinned = " ".join(f"{k}={env[k]}" for k in ("CUDA_VISIBLE_DEVICES", "PENCIL_DEVICES") if k in env)
    print(
        f"# replica {index}: port {port}, {' '.join([health['backend'], *health['devices']])}"
        f"{f' ({pinned})' if pinned else ''}, "
        f"{health['processes']} processes x {health['workers']} workers, queue limit {health['queue']['limit']}",
        flush=True,
    )
    return Replica(index, port, server, health, log)


# ------------------------------------------------------------------ proxy --


def proxy_conf(shipped: str, upstreams: list[int], port: int, access_log: Path) -> str:
    """The shipped server config with its upstream servers replaced by 127.0.0.1:`upstreams`
    (the first line's parameters kept), `listen` by 127.0.0.1:`port` and the access log by
    `access_log`; any `resolver` (Docker's DNS) commented out."""
    servers = list(re.finditer(r"^([ \t]*)server\s+[\w.-]+:\d+([^;]*);[ \t]*\n", shipped, re.M))
    listens = re.findall(r"^[ \t]*listen\s+[^;]+;", shipped, re.M)
    if not servers or len(listens) != 1:
        raise ValueError(f"{SHIPPED_CONF}: expected upstream `server host:port` lines and one `listen`")
    indent, params = servers[0].group(1), servers[0].group(2)
    lines = "".join(f"{indent}server 127.0.0.1:{p}{params};\n" for p in upstreams)
    conf = shipped[: servers[0].start()] + lines + shipped[servers[-1].end() :]
    conf = re.sub(r"^([ \t]*)listen\s+[^;]+;", rf"\g<1>listen 127.0.0.1:{port};", conf, flags=re.M)
    conf = re.sub(r"^([ \t]*)access_log\s+/\S+", rf"\g<1>access_log {access_log}", conf, flags=re.M)
    return re.sub(r"^([ \t]*)(resolver\s)", r"\1# (not outside compose) \2", conf, flags=re.M)


def nginx_conf(site: str, prefix: Path, error_log: Path, workers: int, connections: int) -> str:
    """A whole nginx.conf around `site`: what the nginx image's nginx.conf sets around its
    conf.d (the compose proxy), with the worker count, paths in `prefix` and no daemon."""
    temps = "\n".join(
        f"    {kind}_temp_path {prefix / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""# bench/scale.py: {SHIPPED_CONF.relative_to(ROOT)} in the http {{}} block of the nginx image's nginx.conf
daemon off;
worker_processes {workers};
pid {prefix / "nginx.pid"};
error_log {error_log} warn;
events {{
    worker_connections {max(1024, 4 * connections)};
}}
http {{
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 65;
{temps}

{site}
}}
"""


def stop_replica(replica: Replica, entry: dict) -> None:
    """Stop it; its log's warnings, errors and MPS lines (at most 40) into `entry`."""
    e2e.stop_server(replica.server)
    with replica.log.open(errors="replace") as lines:
        notable = [line.rstrip() for line in lines if re.search(r"WARNING|ERROR|CRITICAL|Traceback|MPS", line)]
    entry["log_notable"] = notable[:40] + ([f"... {len(notable) - 40} more"] if len(notable) > 40 else [])


def start_nginx(binary: str, conf: Path, prefix: Path, error_log: Path, port: int) -> subprocess.Popen:
    """nginx in the foreground (`daemon off`) with `conf`; returns once it accepts on `port`."""
    nginx = subprocess.Popen(
        [binary, "-p", str(prefix), "-e", str(error_log), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if nginx.poll() is not None:
            said = error_log.read_text()[-2000:] if error_log.exists() else "(no error log)"
            raise RuntimeError(f"nginx exited with status {nginx.returncode}:\n{said}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return nginx
        time.sleep(0.1)
    e2e.stop_server(nginx)
    raise TimeoutError(f"nginx did not listen on {port} within 15 s; see {error_log}")


def nginx_version(binary: str) -> str:
    done = subprocess.run([binary, "-v"], capture_output=True, text=True)
    return (done.stderr or done.stdout).strip().removeprefix("nginx version: ")


def upstream_split(access_log: Path, replicas: list[Replica]) -> list[int]:
    """Requests each replica answered according to the proxy's access log (warm-up included)."""
    counts: Counter[str] = Counter()
    if access_log.exists():
        with access_log.open() as lines:
            for line in lines:
                counts.update(re.findall(r"127\.0\.0\.1:(\d+)", line.partition("upstream=")[2].partition(" ")[0]))
    return [counts[str(r.port)] for r in replicas]


# ------------------------------------------------------------------ sampling --


class HostCpu(e2e.Periodic):
    """Busy cores of the whole host (/proc/stat), sampled every e2e.SAMPLE_S in a thread."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[tuple[float, float]] = []

    def sample(self) -> None:
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:]]
        busy = sum(ticks[:8]) - ticks[3] - ticks[4]  # user..steal, less idle and iowait
        self.samples.append((time.time(), busy / e2e.CLOCK_TICKS))

    def window(self, start: float, end: float) -> float:
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return math.nan
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


# ------------------------------------------------------------------ runs --


@dataclasses.dataclass
class Bench:
    """What every run shares."""

    args: argparse.Namespace
    gpus: list  # NVML handles
    jpeg: bytes
    scratch: Path
    stamp: str

    def connections(self, replicas: list[Replica]) -> int:
        args = self.args
        wanted = args.connections or round(args.connections_per_worker * sum(r.workers for r in replicas))
        return max(args.client_processes, wanted)


def drive(bench: Bench, replicas: list[Replica], port: int, nginx: subprocess.Popen | None = None) -> list[dict]:
    """Per texture, a saturated closed-loop run on 127.0.0.1:`port` (`nginx`'s, or the lone
    replica's when None), with the CPU of `replicas`, nginx and the host and the GPUs'
    utilisation over its measured window."""
    args, path = bench.args, "proxy" if nginx else "direct"
    runs = []
    for texture in [t for t in args.textures.split(",") if t]:
        with contextlib.ExitStack() as stack:
            host = stack.enter_context(HostCpu())
            # The first replica's sampler reads the GPUs too, all of them.
            servers = [
                stack.enter_context(e2e.Sampler(r.server.pid, bench.gpus if i == 0 else []))
                for i, r in enumerate(replicas)
            ]
            proxy = stack.enter_context(e2e.Sampler(nginx.pid, [])) if nginx else None
            result = loadgen.run(
                f"http://127.0.0.1:{port}/sketch",
                bench.jpeg,
                "photo.jpg",
                {"format": "jpeg", "texture": texture},
                processes=args.client_processes,
                connections=bench.connections(replicas),
                duration=args.duration,
                warmup=args.warmup,
            )
        print(f"R={len(replicas)} {path} {texture}: {loadgen.summary(result)}", flush=True)
        windows = [s.window(*result.window) for s in servers]
        cores = [w["server_cpu_cores"] for w in windows]
        answered = result.ok + sum(result.non_200.values())
        runs.append(
            {
                "replicas": len(replicas),
                "path": path,
                "texture": texture,
                **dataclasses.asdict(result),
                "gpu_util_pct": windows[0]["gpu_util_pct"],
                "gpu_mem_max_mib": windows[0]["gpu_mem_max_mib"],
                "replica_cpu_cores": cores,
                "server_cpu_cores": sum(cores),
                "nginx_cpu_cores": proxy.window(*result.window)["server_cpu_cores"] if proxy else None,
                "client_cpu_cores": result.client_cpu_ms_per_request * answered / result.duration_s / 1000,
                "host_cpu_cores": host.window(*result.window),
            }
        )
    return runs


def through_proxy(bench: Bench, replicas: list[Replica]) -> tuple[list[dict], dict]:
    """nginx, fresh, with the shipped config in front of `replicas`: the runs through it, with
    the requests each replica answered (from the access log, warm-ups and all textures), and
    nginx's config and error log."""
    args, count = bench.args, len(replicas)
    port, prefix = e2e.free_port(), bench.scratch / f"nginx-r{count}"
    prefix.mkdir()
    conf, error_log, access_log = prefix / "nginx.conf", prefix / "error.log", prefix / "access.log"
    site = proxy_conf(SHIPPED_CONF.read_text(), [r.port for r in replicas], port, access_log)
    conf.write_text(nginx_conf(site, prefix, error_log, args.nginx_workers, bench.connections(replicas)))
    nginx = start_nginx(args.nginx, conf, prefix, error_log, port)
    try:
        runs = drive(bench, replicas, port, nginx)
    finally:
        e2e.stop_server(nginx)
    split = upstream_split(access_log, replicas)
    for run in runs:
        run["upstream_split"] = split
    errors = error_log.read_text(errors="replace").splitlines() if error_log.exists() else []
    return runs, {"replicas": count, "conf": conf.read_text(), "error_log": errors[-40:]}


# ------------------------------------------------------------------ report --


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(runs: list[dict]) -> str:
    head = (
        "| replicas | path | texture | connections | req/s | p50 ms | p99 ms | non-200 / errors | GPU util % "
        "| server CPU cores | nginx CPU cores | client CPU cores | host CPU busy cores | requests per replica |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in runs:
        util = "/".join(f"{u:.0f}" for u in run["gpu_util_pct"]) or "-"
        per_replica = "/".join(f"{c:.1f}" for c in run["replica_cpu_cores"])
        split = "/".join(map(str, run.get("upstream_split", []))) or "-"
        rows.append(
            f"| {run['replicas']} | {run['path']} | {run['texture']} | {run['connections']} | {run['rps']:.1f} "
            f"| {fmt(run['p50_ms'])} | {fmt(run['p99_ms'])} | {e2e.failures(run)} | {util} "
            f"| {fmt(run['server_cpu_cores'])} ({per_replica}) | {fmt(run['nginx_cpu_cores'])} "
            f"| {fmt(run['client_cpu_cores'])} | {fmt(run['host_cpu_cores'])} | {split} |"
        )
    return "\n".join(rows)


def ratios(runs: list[dict]) -> list[dict]:
    """Per texture: each R over R=1 through the proxy (R=2 against the target), and the proxy's
    cost at R=1 (proxy over direct)."""
    found = []
    for texture in dict.fromkeys(r["texture"] for r in runs):
        of = {(r["replicas"], r["path"]): r["rps"] for r in runs if r["texture"] == texture}
        base = of.get((1, "proxy"))
        for (count, path), rps in sorted(of.items()):
            if path == "proxy" and count > 1 and base:
                found.append(
                    {"texture": texture, "kind": f"R={count}/R=1 proxy", "ratio": rps / base, "of": (rps, base)}
                )
        if base and of.get((1, "direct")):
            found.append(
                {
                    "texture": texture,
                    "kind": "proxy/direct R=1",
                    "ratio": base / of[(1, "direct")],
                    "of": (base, of[(1, "direct")]),
                }
            )
    return found


def ratio_line(entry: dict) -> str:
    (top, bottom), ratio, kind = entry["of"], entry["ratio"], entry["kind"]
    line = f"{entry['texture']}, {kind}: {top:.1f} / {bottom:.1f} = {ratio:.2f}x"
    if kind == "R=2/R=1 proxy":
        line += f" (target >= {TARGET}x: {'met' if ratio >= TARGET else 'NOT met'})"
    elif kind.startswith("R="):
        line += f" (linear: {kind[2:].split('/')[0]}x)"
    else:
        line += f" (through the proxy: {100 * (ratio - 1):+.1f}% of the direct rate)"
    return line


# ------------------------------------------------------------------ main --


def default_nginx() -> str | None:
    carried = ROOT / ".ngx" / "nginx"
    return str(carried) if carried.exists() else shutil.which("nginx")


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--replicas", default="1,2", help="replica counts to measure, comma-separated [1,2]")
    parser.add_argument("--backend", choices=("cuda", "cpu", "auto"), default="cuda", help="PENCIL_BACKEND [cuda]")
    parser.add_argument("--processes-per-replica", type=int, default=8, help="PENCIL_PROCESSES of each replica [8]")
    parser.add_argument(
        "--pin",
        choices=("visible", "devices"),
        default="visible",
        help="GPU i for replica i: CUDA_VISIBLE_DEVICES=<its UUID> or PENCIL_DEVICES=i [visible]",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="a variable for every replica (repeatable)"
    )
    parser.add_argument("--textures", default="fast", help="textures to drive, in order [fast]")
    parser.add_argument("--e2e-size", default="1920x1080", help="WxH of the photo sent [1920x1080]")
    parser.add_argument("--photo", choices=("astronaut", "coffee"), default="astronaut", help="scikit-image photograph")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per run [15]")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each run [3]")
    parser.add_argument("--client-processes", type=int, default=4, help="load generator processes [4]")
    parser.add_argument(
        "--connections-per-worker",
        type=float,
        default=2.0,
        help="connections per render worker of the replicas driven (/healthz: workers x processes) [2]",
    )
    parser.add_argument("--connections", type=int, default=None, help="fixed connections for every run instead")
    parser.add_argument("--no-direct", action="store_true", help="skip the R=1 run without the proxy")
    parser.add_argument(
        "--nginx", default=default_nginx(), help="nginx executable [.ngx/nginx (bench/prepare_nginx.sh), else PATH]"
    )
    parser.add_argument("--nginx-workers", type=int, default=8, help="nginx worker_processes [8]")
    parser.add_argument(
        "--keep-logs", action="store_true", help="write the replicas' logs (a line a request) to --out too"
    )
    parser.add_argument("--ready-timeout", type=float, default=600.0, help="seconds for a replica to be ready [600]")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or tempfile.gettempdir()),
        help="directory for the JSON [$OUT or /tmp]",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    counts = sorted({int(r) for r in args.replicas.split(",") if r})
    if not args.nginx:
        sys.exit("no nginx: run bench/prepare_nginx.sh (builds .ngx/) or pass --nginx")
    gpus = e2e.nvml_devices()
    uuids = gpu_uuids(gpus) if args.backend != "cpu" else []
    if args.backend == "cuda" and counts[-1] > len(uuids):
        sys.exit(f"{counts[-1]} replicas need as many GPUs; found {len(uuids)} (NVML or nvidia-smi)")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    width, height = (int(v) for v in args.e2e_size.lower().split("x"))
    jpeg = cv2.imencode(".jpg", e2e.photo(args.photo, width, height), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
    print(
        f"# POST /sketch, replicas behind nginx: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; GPUs: {', '.join(map(e2e.gpu_name, gpus)) or 'not measured (no NVML)'}"
    )
    nginx_release = nginx_version(args.nginx)
    print(
        f"# nginx {nginx_release} ({args.nginx}), {args.nginx_workers} workers, "
        f"config {SHIPPED_CONF.relative_to(ROOT)} (upstream servers, listen and access_log replaced)"
    )
    print(
        f"# photo {args.photo} {width}x{height} JPEG q90 {len(jpeg):,} bytes; replicas {counts}, "
        f"{args.processes_per_replica} processes each, backend {args.backend}; {args.warmup:g} s warm-up + "
        f"{args.duration:g} s per run; {args.client_processes} client processes, "
        f"{args.connections or f'{args.connections_per_worker:g} x the render workers'} connections",
        flush=True,
    )
    report = {
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "gpus": [e2e.gpu_name(h) for h in gpus]},
        "args": {k: str(v) for k, v in vars(args).items()},
        "nginx": nginx_release,
        "photo": {"name": args.photo, "width": width, "height": height, "jpeg_bytes": len(jpeg)},
        "replicas": [],
        "proxies": [],
        "runs": [],
    }
    path = args.out / f"scale-{stamp}.json"
    replicas: list[Replica] = []
    with tempfile.TemporaryDirectory(prefix="pencil-scale-") as scratch, contextlib.ExitStack() as stack:
        bench = Bench(args, gpus, jpeg, Path(scratch), stamp)
        for count in counts:
            while len(replicas) < count:
                replica = start_replica(args, len(replicas), uuids, bench.scratch, stamp)
                entry = {"index": replica.index, "port": replica.port, "health": replica.health}
                stack.callback(stop_replica, replica, entry)
                replicas.append(replica)
                report["replicas"].append(entry)
            if count == 1 and not args.no_direct:
                report["runs"] += drive(bench, replicas[:1], replicas[0].port)
            runs, proxy = through_proxy(bench, replicas[:count])
            report["runs"] += runs
            report["proxies"].append(proxy)
            path.write_text(json.dumps(report, indent=2, default=str))  # after each count: a failure keeps these
    report["ratios"] = ratios(report["runs"])
    path.write_text(json.dumps(report, indent=2, default=str))
    print()
    print(table(report["runs"]))
    print(
        f"(CPU in cores busy over the measured window: servers (each replica's process tree), nginx, the "
        f"{args.client_processes} load generator processes (at most 1 core each) and the whole host of "
        f"{os.cpu_count()} cores; requests per replica from nginx's access log, warm-ups included)"
    )
    print()
    for entry in report["ratios"]:
        print(ratio_line(entry))
    for entry in report["replicas"]:  # MPS started or not, and anything the replicas complained of
        for line in entry["log_notable"][:5]:
            print(f"# replica {entry['index']} log: {line[:300]}")
    for proxy in report["proxies"]:
        for line in proxy["error_log"][:5]:
            print(f"# nginx (R={proxy['replicas']}) error log: {line[:300]}")
    print(f"\n# figures: {path}")


if __name__ == "__main__":
    main()
