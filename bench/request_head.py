"""The cost of bounding the request head and of the connection cap (app/request_head.py)
against uvicorn's plain httptools protocol, per request: the same keep-alive GET fed to each
protocol on an event loop, with a fake transport and a trivial ASGI app, so that only the
protocols differ.

    python bench/request_head.py [--requests 20000] [--rounds 7]

Prints the median microseconds a request takes in each, and the differences.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.request_head import bounded_protocol

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"


async def tiny_app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class NullTransport(asyncio.Transport):
    """Takes the answers and drops them."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = False

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


async def microseconds_per_request(protocol_class, requests: int) -> float:
    config = Config(app=tiny_app, lifespan="off", log_level="warning")
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    protocol.connection_made(NullTransport())
    started = time.perf_counter()
    for _ in range(requests):
        protocol.data_received(REQUEST)
        await asyncio.sleep(0)  # the request's task answers
    return (time.perf_counter() - started) / requests * 1e6


async def measure(requests: int, rounds: int) -> dict[str, list[float]]:
    variants = {
        "uvicorn httptools": HttpToolsProtocol,
        "bounded head": bounded_protocol(65536, 30.0),
        "bounded head + cap": bounded_protocol(65536, 30.0, 1000),
    }
    for protocol_class in variants.values():  # warm-up
        await microseconds_per_request(protocol_class, requests // 10)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):  # alternated, so that drift hits both
        for name, protocol_class in variants.items():
            times[name].append(await microseconds_per_request(protocol_class, requests))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    times = asyncio.run(measure(args.requests, args.rounds))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name:<22} {median:7.2f} us/request  (rounds: {', '.join(f'{v:.2f}' for v in times[name])})")
    plain = next(iter(medians.values()))
    for name, median in list(medians.items())[1:]:
        print(f"{name}: {median - plain:+.2f} us/request against plain ({median / plain:.3f}x)")


if __name__ == "__main__":
    main()
