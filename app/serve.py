"""`pencil-gpu serve`: one uvicorn process, or several sharing the port and the GPUs.

One Python process tops out near 100 renders a second whatever its threads do (the GIL,
host codecs, kernel launches), so the server runs PENCIL_PROCESSES processes. Each binds
the port with SO_REUSEPORT, so the kernel spreads new connections evenly over them
(a shared listening socket lets whichever process wakes first accept a whole burst, and
answer 503 while others idle). A supervisor restarts a process that dies and stops them
all on SIGTERM.

With several GPUs, process i renders on GPU i mod n (one CUDA context each: processes
pooling every GPU were several times slower on an idle request). The batch jobs run on the
GPU of the process that runs them.

With CUDA and several processes, CUDA MPS lets their kernels run side by side instead of
time-sliced. Each of these choices with its figures: BENCHMARKS.md, "POST /sketch end to
end".
PENCIL_MPS=auto starts a private MPS control daemon when `nvidia-cuda-mps-control` is on
PATH and none is configured (CUDA_MPS_PIPE_DIRECTORY unset), and stops it on exit.

The first process starts alone and the others once it serves (or after FIRST_WAIT_S): warm-
ups side by side share the GPU, MPS, the driver and the cores, so the first of equals would
be ready last (docs/design.md, start-up). A process listens only once warm, so the server is
ready, at full speed, when the first one is, and the others join one by one.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from app.config import Settings, get_settings
from app.logs import configure_logging
from app.request_head import bounded_protocol

log = logging.getLogger("pencil.serve")

RESTART_PAUSE_S = 1.0  # between a process's death and its replacement, doubling while they die young
RESTART_BACKOFF_MAX_S = 30.0
STOP_WAIT_S = 20.0  # for the processes to finish their requests on SIGTERM
MAX_PROCESSES_PER_GPU = 16  # well under CUDA MPS's limit of clients per device
CRASH_LOOP = (5, 60.0)  # this many deaths within this many seconds of their start: give up
FIRST_WAIT_S = 300.0  # the other processes start when the first serves, or after this long


def available_cores() -> int:
    """Cores this process may run on: its CPU affinity, bounded by a cgroup CPU quota
    (a container limited with --cpus) where one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def uvicorn_options(settings: Settings, log_level: str) -> dict[str, Any]:
    """uvicorn's options for the app, whether one process or several run it."""
    max_connections = open_files_for(settings.max_connections)
    return {
        "app": "app.main:create_app",
        "factory": True,
        "log_level": log_level,
        "proxy_headers": True,
        "log_config": None,  # uvicorn leaves logging to app/logs.py
        "access_log": False,  # AccessLogMiddleware writes it
        "ws_max_size": settings.max_upload_bytes,  # a larger /live frame closes its connection with 1009
        # /live sends JPEG and WebP, which deflate cannot shrink: compressing them took most of a
        # busy process's time, on its event loop (docs/live.md), so it is never negotiated.
        "ws_per_message_deflate": False,
        # app/request_head.py: the head's size and time, and the connection cap
        "http": bounded_protocol(settings.max_header_bytes, settings.header_timeout_s, max_connections),
        "timeout_keep_alive": settings.keep_alive_s,  # an idle kept-alive connection is closed after this
    }


FILES_BESIDE_CONNECTIONS = 256  # descriptors a process needs besides its connections (files, database, GPU)


def open_files_for(connections: int) -> int:
    """The connection cap this process can keep: its soft limit of open files is raised towards
    the hard limit to hold `connections` sockets and FILES_BESIDE_CONNECTIONS more (a container's
    soft limit is often 1024); when the hard limit is lower, the cap is lowered to fit, with a
    warning (past the limit uvicorn could accept no connection at all, probes included)."""
    try:
        import resource
    except ImportError:  # not on Linux or macOS: leave it to the system
        return connections
    needed = connections + FILES_BESIDE_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < needed:
        fitted = max(16, soft - FILES_BESIDE_CONNECTIONS)
        log.warning(
            "PENCIL_MAX_CONNECTIONS=%d does not fit this process's limit of %d open files: at most %d connections",
            connections,
            soft,
            fitted,
        )
        return fitted
    return connections


def resolve_processes(settings: Settings, backend: str, gpus: int = 1) -> int:
    """PENCIL_PROCESSES, with 0 meaning: on CUDA three for every four available cores (12
    on 16 cores: BENCHMARKS.md, "POST /sketch end to end"), at most
    MAX_PROCESSES_PER_GPU a GPU; on the CPU one (its renders use every core already)."""
    if settings.processes:
        return settings.processes
    if backend != "cuda":
        return 1
    return max(1, min(available_cores() * 3 // 4, MAX_PROCESSES_PER_GPU * max(1, gpus)))


def _bind(host: str, port: int, share: bool = True) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if share:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM when the supervisor dies (even by kill -9), so
    no orphaned server keeps the port and the GPU."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return


def _serve_one(host: str, port: int, log_level: str, index: int, supervisor: int, serving: Any = None) -> None:
    """Child number `index`: uvicorn on its own SO_REUSEPORT socket; sets the event `serving`
    (when given) once it listens, its warm-up done."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and serving is not None:
                serving.set()

        def handle_exit(self, sig: int, frame: Any) -> None:
            from app.jobs.events import stop_streams  # loaded by the app already

            stop_streams()  # job event streams would hold the graceful stop until their jobs end
            super().handle_exit(sig, frame)

    _die_with_parent()
    if os.getppid() != supervisor:  # it died before prctl took effect
        return
    os.environ["PENCIL_PROCESS_INDEX"] = str(index)  # its home GPU: app.main.home_devices
    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)  # a spawned process starts with none
    # log_config=None: uvicorn leaves logging to app/logs.py; no access log: AccessLogMiddleware writes it.
    config = uvicorn.Config(**uvicorn_options(settings, log_level))
    Server(config).run(sockets=[_bind(host, port)])


class MpsDaemon:
    """A private CUDA MPS control daemon for this server's processes (pipe and log
    directories of its own, so other CUDA users of the host are not drawn in)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pencil-mps-"))
        self.environment = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.directory / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(self.directory / "log"),
        }

    def start(self) -> None:
        """Start the daemon and check that a CUDA client gets through it (a daemon that
        starts but cannot serve, in a container without the IPC it needs for instance,
        would otherwise leave every process without its GPU)."""
        for path in self.environment.values():
            Path(path).mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, **self.environment}
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=environment, check=True, capture_output=True, timeout=30)
        # A context, a memset and a copy back through the daemon; no kernel, which a fresh
        # machine would first have to compile.
        probe = "import cupy; assert not cupy.zeros(4, cupy.uint8).get().any()"
        subprocess.run([sys.executable, "-c", probe], env=environment, check=True, capture_output=True, timeout=120)
        os.environ.update(self.environment)  # the server processes, spawned next, inherit it

    def stop(self) -> None:
        try:
            subprocess.run(
                ["nvidia-cuda-mps-control"],
                input=b"quit\n",
                env={**os.environ, **self.environment},
                capture_output=True,
                timeout=30,
            )
        finally:
            for key in self.environment:
                os.environ.pop(key, None)
            shutil.rmtree(self.directory, ignore_errors=True)


def start_mps(settings: Settings, processes: int, backend: str) -> MpsDaemon | None:
    """The MPS daemon PENCIL_MPS asks for, started; None when not wanted or not possible
    (with PENCIL_MPS=on, a failure to start raises)."""
    if settings.mps == "off" or backend != "cuda" or processes < 2:
        return None
    if "CUDA_MPS_PIPE_DIRECTORY" in os.environ:
        log.info("CUDA MPS: using the daemon at %s", os.environ["CUDA_MPS_PIPE_DIRECTORY"])
        return None
    if shutil.which("nvidia-cuda-mps-control") is None:
        if settings.mps == "on":
            raise RuntimeError("PENCIL_MPS=on but nvidia-cuda-mps-control is not on PATH")
        log.warning(
            "CUDA MPS is not available (no nvidia-cuda-mps-control): the %d processes time-slice the GPU", processes
        )
        return None
    daemon = MpsDaemon()
    try:
        daemon.start()
    except (subprocess.SubprocessError, OSError) as exc:
        daemon.stop()
        if settings.mps == "on":
            raise RuntimeError(f"PENCIL_MPS=on but the MPS daemon did not start: {exc}") from exc
        log.warning("CUDA MPS did not start (%s): the %d processes time-slice the GPU", exc, processes)
        return None
    log.info("CUDA MPS: started a daemon for the %d server processes", processes)
    return daemon


def run_processes(host: str, port: int, processes: int, log_level: str) -> int:
    """Run `processes` server processes on host:port until SIGTERM or SIGINT; a process that
    dies is replaced, after a pause that doubles while they keep dying young. Returns the
    exit status: 0 after a stop, 1 when the processes die in a loop (CRASH_LOOP)."""
    # The port must be free: a probe bound without SO_REUSEPORT fails when anything,
    # a second pencil-gpu included, listens there. Closed again before the children bind.
    _bind(host, port, share=False).close()
    spawn = multiprocessing.get_context("spawn")
    # The processes count /live sessions together (app/live.py LiveSlots); spawned children inherit it.
    live_slots = tempfile.mkdtemp(prefix="pencil-gpu-live-")
    os.environ["PENCIL_LIVE_SLOTS_DIR"] = live_slots
    stopping = False
    supervisor = os.getpid()

    first_serving = spawn.Event()

    def start(index: int) -> tuple[multiprocessing.process.BaseProcess, float]:
        serving = first_serving if index == 0 else None
        process = spawn.Process(
            target=_serve_one, args=(host, port, log_level, index, supervisor, serving), daemon=False
        )
        process.start()
        return process, time.monotonic()

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    children = [start(0)]
    first, started = children[0]
    while processes > 1 and not stopping and first.is_alive() and time.monotonic() - started < FIRST_WAIT_S:
        if first_serving.wait(0.1):
            log.info(
                "server process %d serves after %.1f s; starting %d more",
                first.pid,
                time.monotonic() - started,
                processes - 1,
            )
            break
    if not stopping:
        children += [start(index) for index in range(1, processes)]
    log.info(
        "serving on http://%s:%d with %d processes (pids %s)",
        host,
        port,
        processes,
        ", ".join(str(c.pid) for c, _ in children),
    )
    deaths: list[float] = []  # when young processes died
    pause = RESTART_PAUSE_S
    status = 0
    try:
        while not stopping:
            time.sleep(0.2)
            for index, (child, started) in enumerate(children):
                if child.is_alive() or stopping:
                    continue
                now = time.monotonic()
                log.warning(
                    "server process %d exited with %s; starting another in %.0f s", child.pid, child.exitcode, pause
                )
                if now - started < CRASH_LOOP[1]:
                    deaths = [t for t in deaths if now - t < CRASH_LOOP[1]] + [now]
                    if len(deaths) >= CRASH_LOOP[0]:
                        log.error(
                            "%d server processes died within %.0f s of starting; giving up (see the errors above)",
                            len(deaths),
                            CRASH_LOOP[1],
                        )
                        stopping, status = True, 1
                        break
                    time.sleep(pause)
                    pause = min(2 * pause, RESTART_BACKOFF_MAX_S)
                else:
                    pause = RESTART_PAUSE_S
                if not stopping:
                    children[index] = start(index)
    finally:
        for child, _ in children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)  # uvicorn finishes its requests, then exits
        deadline = time.monotonic() + STOP_WAIT_S
        for child, _ in children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(live_slots, ignore_errors=True)
    return status
