"""Benchmark of the string search (issue 5), with its anchors and floors measured in the same run.

    python bench/search.py [--size-mib 1024] [--repeats 5] [--rg PATH] [--skip-find]

The text: real English, the Python Language Reference's topics shipped with CPython
(pydoc_data.topics) and the Zen of Python, ~0.46 MB with each paragraph on one line,
repeated to --size-mib. Patterns of 4, 16, 64 and 256 bytes cut from it where
"exception" first starts a paragraph tail long enough: no newline inside, so that
ripgrep, which matches within lines, can find them too).

Rows:
- floors: the device copy bandwidth (a device-to-device copy of the text, read + write
  bytes over time) and the pinned host-to-device bandwidth; a scan must read each byte
  once, so text / copy bandwidth is the resident floor and text / H2D the upload floor;
- per pattern length, each algorithm x variant: `resident` (CUDA events, text already in
  device memory: count + prefix sum + write kernels) and `with upload` (wall time: pinned
  host -> device copy of the text, the search, positions back to the host), GB/s, and
  multiples of the floors;
- 8 patterns: one fused pass against 8 passes on 8 streams and on 1 stream;
- host anchors: a Python bytes.find loop (overlapping matches, as the CPU backend) and
  ripgrep (`rg -c -F`: lines with a match; `rg -o -b -F`: every match with its offset, non
  overlapping; one file is searched by one thread, so also over the text cut into one file
  per core with `-j cores`), when installed; skipped with a note when not.
Medians of --repeats after a warm-up. Times drift between machines: read the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import device_median_ms, median_ms  # (bench/timing.py)

from gpu.search import reference
from gpu.search.params import KERNEL_ALGORITHMS, VARIANTS, SearchParams

LENGTHS = (4, 16, 64, 256)
ANCHOR = b"exception"
GIB = 1 << 30


def english_text(size: int) -> bytes:
    """`size` bytes of CPython's pydoc topics and the Zen of Python, one paragraph per line
    (the source's wrapped lines joined, blank lines kept), repeated."""
    from pydoc_data.topics import topics

    with contextlib.redirect_stdout(io.StringIO()):
        import this
    zen = "".join(this.d.get(c, c) for c in this.s)
    source = zen + "\n" + "\n".join(topics[k] for k in sorted(topics))
    paragraphs = "\n\n".join(" ".join(line.strip() for line in block.splitlines()) for block in source.split("\n\n"))
    data = paragraphs.encode("utf-8")
    return (data * (size // len(data) + 1))[:size]


def window(text: bytes, anchor: bytes, length: int) -> bytes:
    """`length` bytes from the first occurrence of `anchor` that starts as many bytes
    without a newline (ripgrep matches within lines)."""
    start = text.find(anchor)
    while start != -1:
        piece = text[start : start + length]
        if len(piece) == length and b"\n" not in piece:
            return piece
        start = text.find(anchor, start + 1)
    raise SystemExit(f"no newline-free {length}-byte window starts at {anchor!r}")


def patterns_from(text: bytes, anchor: bytes = ANCHOR) -> list[bytes]:
    """The first 4, 16, 64 and 256 bytes of one window at `anchor`."""
    longest = window(text, anchor, max(LENGTHS))
    return [longest[:length] for length in LENGTHS]


def eight_patterns(text: bytes) -> list[bytes]:
    """Two of each length: at the anchor and at "iterator"."""
    return patterns_from(text) + patterns_from(text, b"iterator")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def gbps(n: int, ms: float) -> float:
    return n / (ms / 1000) / 1e9 if ms > 0 else float("nan")


# --------------------------------------------------------------------- host --


def find_loop_ms(text: bytes, pattern: bytes) -> tuple[float, int]:
    start = time.perf_counter()
    count = reference.find_all(text, pattern).size
    return (time.perf_counter() - start) * 1000, count


def ripgrep_ms(rg: str, args: list[str], pattern: bytes, target: str, count_lines: bool) -> tuple[float, int]:
    """Wall time of one rg run and its count (the -c sum, or the lines of -o -b output)."""
    start = time.perf_counter()
    done = subprocess.run([rg, *args, "-e", pattern.decode("utf-8"), target], capture_output=True, check=False)
    ms = (time.perf_counter() - start) * 1000
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{rg} failed: {done.stderr.decode(errors='replace')[:300]}")
    out = done.stdout
    if count_lines:
        return ms, out.count(b"\n")
    return ms, sum(int(line.rsplit(b":", 1)[-1]) for line in out.splitlines() if line)


# ---------------------------------------------------------------------- GPU --


class Gpu:
    def __init__(self, text: bytes):
        import cupy
        import cupyx

        from gpu.pool import DevicePool
        from gpu.search import cuda

        self.cupy, self.cuda = cupy, cuda
        self.pool = DevicePool([0], streams_per_device=2)
        self.lease = self.pool.acquire()
        self.n = len(text)
        self.name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        with cupy.cuda.Device(0), self.lease.stream:
            self.host = cupyx.empty_pinned(self.n, np.uint8)
            self.host[:] = np.frombuffer(text, np.uint8)
            data = cuda._allocate_text(self.n)
            cupy.cuda.runtime.memcpyAsync(
                data.data.ptr,
                self.host.ctypes.data,
                self.n,
                cupy.cuda.runtime.memcpyHostToDevice,
                self.lease.stream.ptr,
            )
            self.device_text = cuda.finish_text(data, self.n, self.lease)

    def copy_bandwidth(self, repeats: int) -> float:
        """Device copy rate, bytes/ms counting read + write."""
        cupy = self.cupy
        with cupy.cuda.Device(0), self.lease.stream:
            src = self.device_text.data[: self.n]
            dst = cupy.empty_like(src)
            ms = device_median_ms(lambda: cupy.copyto(dst, src), repeats)
        return 2 * self.n / ms

    def upload(self) -> None:
        cupy = self.cupy
        cupy.cuda.runtime.memcpyAsync(
            self.device_text.data.data.ptr,
            self.host.ctypes.data,
            self.n,
            cupy.cuda.runtime.memcpyHostToDevice,
            self.lease.stream.ptr,
        )

    def h2d_bandwidth(self, repeats: int) -> float:
        with self.cupy.cuda.Device(0), self.lease.stream:
            return self.n / device_median_ms(self.upload, repeats)

    def resident_ms(self, params: SearchParams, repeats: int) -> tuple[float, list[int]]:
        times, counts = [], []
        for i in range(repeats + 1):
            output = self.cuda.search_device(self.device_text, params, self.lease)
            counts = [r.positions.size for r in output.patterns]
            if i:
                times.append(output.times_ms["kernels"])
        return median(times), counts

    def count_kernel_ms(self, params: SearchParams, repeats: int) -> float:
        """The count kernel alone (no prefix sum, no write) of the first pattern's pass,
        or of the fused pass over all patterns."""
        patterns = list(params.patterns) if params.fused else [params.patterns[0]]
        with self.cupy.cuda.Device(0), self.lease.stream:
            one = self.cuda._Pass(
                self.device_text, params, patterns, params.algorithm_for(patterns[0]), self.lease.stream
            )
            one.upload()
            return device_median_ms(one.count_kernel, repeats)

    def with_upload_ms(self, params: SearchParams, repeats: int) -> float:
        def run() -> None:
            with self.cupy.cuda.Device(0), self.lease.stream:
                self.upload()
            self.cuda.search_device(self.device_text, params, self.lease)  # waits for its downloads

        return median_ms(run, repeats)


# --------------------------------------------------------------------- main --


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rg", default=shutil.which("rg"), help="ripgrep binary (default: rg on PATH)")
    parser.add_argument("--skip-find", action="store_true", help="skip the Python bytes.find loop")
    args = parser.parse_args()
    n = args.size_mib * 1024 * 1024
    text = english_text(n)
    patterns = patterns_from(text)
    cores = os.cpu_count() or 1
    try:
        gpu = Gpu(text)
        device = gpu.name
    except (ImportError, RuntimeError) as exc:  # no CuPy, or no device / driver (CUDARuntimeError): the host rows only
        gpu, device = None, f"no GPU ({type(exc).__name__}: {exc})"
    print(
        f"# String search: {n / GIB:.3f} GiB of English (CPython pydoc topics + Zen of Python, repeated); "
        f"{device}; {cores} CPU cores; medians of {args.repeats}"
    )

    copy_bw = h2d_bw = float("nan")
    if gpu is not None:
        copy_bw, h2d_bw = gpu.copy_bandwidth(args.repeats), gpu.h2d_bandwidth(args.repeats)
        print(
            f"floors: device copy {copy_bw * 1e3 / 1e12:.2f} TB/s (read + write) -> resident floor "
            f"{n / copy_bw:.3f} ms ({copy_bw * 1e3 / 1e12:.2f} TB/s of text); "
            f"pinned host->device {h2d_bw * 1e3 / 1e9:.1f} GB/s -> upload floor {n / h2d_bw:.1f} ms"
        )
    floor_ms, upload_floor_ms = n / copy_bw, n / h2d_bw

    # Host anchors first (they also give the counts every GPU row must reproduce).
    host: dict[int, dict[str, float]] = {}
    counts: dict[int, int] = {}
    tmp = Path(tempfile.mkdtemp(prefix="search-bench-"))
    try:
        if args.rg:
            (tmp / "text.txt").write_bytes(text)
            pieces = tmp / "pieces"
            pieces.mkdir()
            step = -(-n // cores)
            for k in range(
                cores
            ):  # one file per core, overlapping by 255 bytes (a match across a cut is found once or twice)
                (pieces / f"{k:03d}.txt").write_bytes(text[k * step : (k + 1) * step + max(LENGTHS) - 1])
        for m, pattern in zip(LENGTHS, patterns, strict=True):
            row: dict[str, float] = {}
            if not args.skip_find:
                row["find"], counts[m] = find_loop_ms(text, pattern)
            if args.rg:
                row["rg_c"], row["rg_c_lines"] = ripgrep_ms(
                    args.rg, ["-c", "-F", "-a"], pattern, str(tmp / "text.txt"), False
                )
                row["rg_ob"], row["rg_ob_matches"] = ripgrep_ms(
                    args.rg, ["-o", "-b", "-F", "-a"], pattern, str(tmp / "text.txt"), True
                )
                row["rg_c_cores"], _ = ripgrep_ms(
                    args.rg, ["-c", "-F", "-a", "-j", str(cores)], pattern, str(pieces), False
                )
            host[m] = row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.rg:
        print(
            "ripgrep: not installed here (rg not on PATH, no --rg): its rows are skipped. To include it: "
            "apt-get install ripgrep, or --rg PATH to a binary"
        )

    print("\n## Host anchors (one thread unless said)")
    print(
        "m | count (overlapping) | bytes.find loop ms | GB/s | rg -c -F ms | GB/s | rg -o -b -F ms (matches) | "
        "rg -c -F, text in per-core files, -j cores ms | GB/s"
    )
    for m in LENGTHS:
        row = host[m]
        print(
            f"{m} | {counts.get(m, '-')} | {row.get('find', float('nan')):.0f} | {gbps(n, row.get('find', 0)):.2f} | "
            f"{row.get('rg_c', float('nan')):.0f} | {gbps(n, row.get('rg_c', 0)):.2f} | "
            f"{row.get('rg_ob', float('nan')):.0f} ({int(row.get('rg_ob_matches', -1))}) | "
            f"{row.get('rg_c_cores', float('nan')):.0f} | {gbps(n, row.get('rg_c_cores', 0)):.2f}"
        )
    if gpu is None:
        return

    print(
        "\n## GPU, one pattern (resident: text in device memory; with upload: pinned host -> device + search + "
        "positions back)"
    )
    print(
        "m | algorithm | variant | granularity x threads | count | resident ms | resident GB/s | x floor | "
        "with upload ms | GB/s | x upload floor | vs find | vs rg -c | vs rg -c cores"
    )
    best_resident: dict[int, float] = {}
    best_upload: dict[int, float] = {}
    for m, pattern in zip(LENGTHS, patterns, strict=True):
        for algorithm in ("auto", *KERNEL_ALGORITHMS):
            for variant in VARIANTS:
                params = SearchParams((pattern,), algorithm=algorithm, variant=variant)
                resident, found = gpu.resident_ms(params, args.repeats)
                if m in counts and found[0] != counts[m]:
                    raise SystemExit(f"m={m} {algorithm}/{variant}: {found[0]} matches, bytes.find found {counts[m]}")
                upload = gpu.with_upload_ms(params, max(1, args.repeats // 2))
                launch = gpu.cuda.plan_launch(params, params.algorithm_for(pattern), m)
                best_resident[m] = min(best_resident.get(m, float("inf")), resident)
                best_upload[m] = min(best_upload.get(m, float("inf")), upload)
                row = host[m]
                label = f"auto ({params.algorithm_for(pattern)})" if algorithm == "auto" else algorithm
                print(
                    f"{m} | {label} | {variant} | {launch.granularity} x {launch.threads} | {found[0]} | "
                    f"{resident:.3f} | {gbps(n, resident):.0f} | {resident / floor_ms:.1f} | "
                    f"{upload:.1f} | {gbps(n, upload):.1f} | {upload / upload_floor_ms:.2f} | "
                    f"{row.get('find', float('nan')) / upload:.0f} | "
                    f"{row.get('rg_c', float('nan')) / upload:.1f} | {row.get('rg_c_cores', float('nan')) / upload:.2f}"
                )

    print(
        "\n## Where the time goes (auto, optimized): count kernel alone, whole search (count + prefix sum + "
        "totals to host + write), against the floor"
    )
    print("m | algorithm | floor ms | count kernel ms | x floor | whole search ms | x floor | write share")
    where = [(str(m), SearchParams((pattern,))) for m, pattern in zip(LENGTHS, patterns, strict=True)]
    where.append(("8 fused", SearchParams(tuple(eight_patterns(text)), fused=True)))
    for label, params in where:
        count_ms = gpu.count_kernel_ms(params, args.repeats)
        whole, _ = gpu.resident_ms(params, args.repeats)
        algorithm = "fused" if params.fused else params.algorithm_for(params.patterns[0])
        print(
            f"{label} | {algorithm} | {floor_ms:.3f} | {count_ms:.3f} | {count_ms / floor_ms:.1f} | "
            f"{whole:.3f} | {whole / floor_ms:.1f} | {1 - count_ms / whole:.0%}"
        )

    print("\n## Eight patterns (4, 16, 64, 256 bytes, two of each): one fused pass against one pass per pattern")
    eight = eight_patterns(text)
    print("mode | resident ms | text GB/s | x floor | with upload ms | GB/s")
    fused_ms = None
    for label, params in (
        ("fused (one pass)", SearchParams(tuple(eight), fused=True)),
        ("8 passes, auto, 8 streams", SearchParams(tuple(eight), streams=8)),
        ("8 passes, auto, 1 stream", SearchParams(tuple(eight), streams=1)),
    ):
        resident, found = gpu.resident_ms(params, args.repeats)
        expected = (
            [reference.find_all(text, p).size for p in eight]
            if label.startswith("fused") and not args.skip_find
            else None
        )
        if expected is not None and found != expected:
            raise SystemExit(f"{label}: counts {found}, bytes.find {expected}")
        upload = gpu.with_upload_ms(params, max(1, args.repeats // 2))
        fused_ms = fused_ms or resident
        print(
            f"{label} | {resident:.3f} | {gbps(n, resident):.0f} | {resident / floor_ms:.1f} | {upload:.1f} | "
            f"{gbps(n, upload):.1f}"
        )

    print("\n## Targets (issue 5)")
    best = min(best_resident.values())
    print(
        f"resident single pattern >= 1 TB/s: best {gbps(n, best) / 1000:.2f} TB/s; per length "
        + ", ".join(f"m={m}: {gbps(n, t) / 1000:.2f}" for m, t in best_resident.items())
    )
    print(f"8 patterns fused >= 1 TB/s of text: {gbps(n, fused_ms) / 1000:.2f} TB/s")
    for m, t in best_upload.items():
        rg = host[m].get("rg_c", float("nan"))
        print(
            f"with upload >= 3x ripgrep, m={m}: {t:.1f} ms, rg -c -F {rg:.0f} ms: {rg / t:.1f}x (rg -c on "
            f"{cores} cores: {host[m].get('rg_c_cores', float('nan')) / t:.2f}x)"
        )


if __name__ == "__main__":
    main()
