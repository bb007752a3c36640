"""`pencil-gpu serve`: one uvicorn process, or several sharing the port and the GPUs.

One Python process tops out near 100 renders a second whatever its threads do (the GIL,
host codecs, kernel launches), so the server runs PENCIL_PROCESSES processes. Each binds
the port with SO_REUSEPORT, so the kernel spreads new connections evenly over them
(a shared listening socket lets whichever process wakes first accept a whole burst:
measured on an H200, 64 connections left 5,000 503s from one overloaded process while
others idled). A supervisor restarts a process that dies and stops them all on SIGTERM.

With several GPUs, process i renders on GPU i mod n (one CUDA context each; measured on
two H200s: processes pooling both GPUs took 28-52 ms for an idle 1080p request that one
GPU each serves in 4-5 ms). The batch jobs run on the GPU of the process that runs them.

With CUDA and several processes, CUDA MPS lets their kernels run side by side instead of
time-sliced (measured, 1080p JPEG, 12 processes on one H200: `lu` 423 -> 777 req/s,
`fast` 806 -> 2231).
PENCIL_MPS=auto starts a private MPS control daemon when `nvidia-cuda-mps-control` is on
PATH and none is configured (CUDA_MPS_PIPE_DIRECTORY unset), and stops it on exit.
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

from app.config import Settings

log = logging.getLogger("pencil.serve")

RESTART_PAUSE_S = 1.0  # between a process's death and its replacement
STOP_WAIT_S = 20.0  # for the processes to finish their requests on SIGTERM


def resolve_processes(settings: Settings, backend: str) -> int:
    """PENCIL_PROCESSES, with 0 meaning: on CUDA three for every four host cores (12 on
    16 cores, the best of 8 and 12 measured on an H200), on the CPU one (its renders use
    every core already)."""
    if settings.processes:
        return settings.processes
    return max(1, (os.cpu_count() or 1) * 3 // 4) if backend == "cuda" else 1


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _serve_one(host: str, port: int, log_level: str, index: int) -> None:
    """Child number `index`: uvicorn on its own SO_REUSEPORT socket."""
    import uvicorn

    os.environ["PENCIL_PROCESS_INDEX"] = str(index)  # its home GPU: app.main.home_devices

    config = uvicorn.Config("app.main:create_app", factory=True, log_level=log_level, proxy_headers=True)
    uvicorn.Server(config).run(sockets=[_bind(host, port)])


class MpsDaemon:
    """A private CUDA MPS control daemon for this server's processes (pipe and log
    directories of its own, so other CUDA users of the host are not drawn in)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="pencil-mps-"))
        self.environment = {"CUDA_MPS_PIPE_DIRECTORY": str(self.directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(self.directory / "log")}

    def start(self) -> None:
        """Start the daemon and check that a CUDA client gets through it (a daemon that
        starts but cannot serve, in a container without the IPC it needs for instance,
        would otherwise leave every process without its GPU)."""
        for path in self.environment.values():
            Path(path).mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, **self.environment}
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=environment, check=True, capture_output=True, timeout=30)
        probe = "import cupy; cupy.zeros(1).sum().item()"
        subprocess.run([sys.executable, "-c", probe], env=environment, check=True, capture_output=True, timeout=120)
        os.environ.update(self.environment)  # the server processes, spawned next, inherit it

    def stop(self) -> None:
        try:
            subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env={**os.environ, **self.environment}, capture_output=True, timeout=30)
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
        log.warning("CUDA MPS is not available (no nvidia-cuda-mps-control): the %d processes time-slice the GPU", processes)
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
    dies is replaced. Returns the exit status."""
    probe = _bind(host, port)  # fails here, clearly, when the port is taken; never listens
    spawn = multiprocessing.get_context("spawn")
    stopping = False

    def start(index: int) -> multiprocessing.process.BaseProcess:
        process = spawn.Process(target=_serve_one, args=(host, port, log_level, index), daemon=False)
        process.start()
        return process

    def stop(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    children = [start(index) for index in range(processes)]
    log.info("serving on http://%s:%d with %d processes (pids %s)", host, port, processes, ", ".join(str(c.pid) for c in children))
    try:
        while not stopping:
            time.sleep(0.2)
            for index, child in enumerate(children):
                if not child.is_alive() and not stopping:
                    log.warning("server process %d exited with %s; starting another", child.pid, child.exitcode)
                    time.sleep(RESTART_PAUSE_S)
                    children[index] = start(index)
    finally:
        for child in children:
            if child.is_alive():
                os.kill(child.pid, signal.SIGTERM)  # uvicorn finishes its requests, then exits
        deadline = time.monotonic() + STOP_WAIT_S
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join()
        probe.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
