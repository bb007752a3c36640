"""Benchmark of the string search (issues 5, 21, 25), with its anchors and floors measured in the same run.

    python bench/search.py [--size-mib 1024] [--repeats 5] [--rg PATH] [--skip-find]

The text: real English, the Python Language Reference's topics shipped with CPython
(pydoc_data.topics) and the Zen of Python, ~0.46 MB with each paragraph on one line,
repeated to --size-mib and written to a file, as a stored corpus is (read from the page
cache by everyone, as it is after POST /corpora). Patterns of 4, 16, 64 and 256 bytes
cut from it where "exception" first starts a paragraph tail long enough: no newline
inside, so that ripgrep, which matches within lines, can find them too).

Rows (every figure a median of --repeats after one untimed run, ours and the anchors alike):
- floors: the device copy bandwidth (a device-to-device copy of the text, read + write
  bytes over time; text / it is the resident floor), the pinned host-to-device bandwidth
  (a copy from a pinned buffer filled beforehand), and the host's read of the file from
  the page cache into pinned memory alone (no device), by one thread and by the upload's
  reader threads: a first search cannot beat the slower of the read and the copy;
- the service's path (gpu.search.run on a SearchJob of the stored file, on a lease, what
  a search job runs, auto/optimized, positions: json): the first search of the corpus
  (the file streamed to the device while it is searched; the resident copy dropped before
  each repeat; the pinned ring and the device pool's memory are warm, as in a running
  server), and the resident repeat; wall times, beside ripgrep on the same file and a
  Python bytes.find loop over the text in memory;
- kernel-only (labelled so): each algorithm x variant on the resident text, CUDA events
  around count + prefix sum + totals + write kernels, no transfer, against the floor;
- 8 patterns: one fused pass against 8 passes (kernel-only), and the service's path with
  frequent patterns (e, the, ...) for positions json (the first 1000 listed) and files
  (every position downloaded);
- host anchors: ripgrep (`rg -c -F`: lines with a match; `rg -o -b -F`: every match with
  its offset, non overlapping; one file is searched by one thread, so also over the text
  cut into one file per core with `-j cores`), when installed; skipped with a note when not.
Times drift between machines: read the ratios.
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


def find_loop_ms(text: bytes, pattern: bytes, repeats: int) -> tuple[float, int]:
    """Median wall time of the bytes.find loop (overlapping matches, as the CPU backend),
    after one untimed run, and its count."""
    count = reference.find_all(text, pattern).size
    return median_ms(lambda: reference.find_all(text, pattern), repeats), count


def ripgrep_ms(
    rg: str, args: list[str], pattern: bytes, target: str, count_lines: bool, repeats: int
) -> tuple[float, int]:
    """Median wall time of `repeats` rg runs after one untimed one, and its count (the -c
    sum, or the lines of -o -b output)."""
    command = [rg, *args, "-e", pattern.decode("utf-8"), target]
    runs = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, check=False)
        runs.append((time.perf_counter() - start) * 1000)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"{rg} failed: {done.stderr.decode(errors='replace')[:300]}")
    out = done.stdout
    count = out.count(b"\n") if count_lines else sum(int(line.rsplit(b":", 1)[-1]) for line in out.splitlines() if line)
    return statistics.median(runs[1:]), count


# ---------------------------------------------------------------------- GPU --


class Gpu:
    def __init__(self, text: bytes, path: Path):
        import cupy
        import cupyx

        from gpu.pool import DevicePool
        from gpu.search import cuda

        self.cupy, self.cuda = cupy, cuda
        self.pool = DevicePool([0], streams_per_device=2)
        self.lease = self.pool.acquire()
        self.n, self.path = len(text), path
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

    def read_ms(self, threads: int, repeats: int) -> float:
        """The file read from the page cache into the upload's pinned ring alone (no
        device copy), by `threads` threads taking STREAM_PIECE pieces in turn: the host's
        share of a first search."""
        from concurrent.futures import ThreadPoolExecutor

        cuda = self.cuda
        ring = self.lease.staging("search-ring", cuda.STREAM_RING * cuda.STREAM_PIECE)
        fd = os.open(self.path, os.O_RDONLY)
        fill = cuda._file_reader(fd, self.path, self.n)
        offsets = range(0, self.n, cuda.STREAM_PIECE)

        def read_piece(index: int) -> None:
            slot = index % cuda.STREAM_RING
            size = min(cuda.STREAM_PIECE, self.n - offsets[index])
            fill(memoryview(ring[slot * cuda.STREAM_PIECE : slot * cuda.STREAM_PIECE + size]), offsets[index])

        try:
            with ThreadPoolExecutor(threads) as readers:
                return median_ms(lambda: list(readers.map(read_piece, range(len(offsets)))), repeats)
        finally:
            os.close(fd)

    def job(self, params: SearchParams):
        """The search job of the stored file, as the job system hands it to gpu.search.run."""
        from gpu import search
        from gpu.search.params import CORPUS_FILE

        corpus = search.Corpus("bench", "bench", "0" * 64, self.n)
        return search.SearchJob.from_json(
            search.SearchJob.on_corpus(params, corpus).to_json(), {CORPUS_FILE: self.path}
        )

    def service_ms(self, params: SearchParams, repeats: int) -> tuple[float, float, float, dict]:
        """The service's path, gpu.search.run on the job of the stored file: the first
        search (the resident copy dropped before each) and the resident repeat. Returns
        their median wall times, the median upload time within the first (its times_ms),
        and the last summary of the repeat."""
        from gpu import search
        from gpu.search.residency import RESIDENT

        job = self.job(params)
        firsts, uploads, repeats_ms, again = [], [], [], {}
        for i in range(repeats + 1):
            RESIDENT.clear()
            start = time.perf_counter()
            first = search.run(job, self.lease).summary
            first_ms = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            again = search.run(job, self.lease).summary
            again_ms = (time.perf_counter() - start) * 1000
            if not (first["resident"] is False and again["resident"] is True):
                raise SystemExit(f"residency: first {first['resident']}, repeat {again['resident']}")
            if again["patterns"] != first["patterns"]:
                raise SystemExit("the resident repeat found other positions than the first search")
            if i:
                firsts.append(first_ms)
                uploads.append(first["times_ms"]["upload"])
                repeats_ms.append(again_ms)
        RESIDENT.clear()
        return median(firsts), median(repeats_ms), median(uploads), again

    def resident_ms(self, params: SearchParams, repeats: int) -> tuple[float, list[int]]:
        """Kernel-only: CUDA events around the kernels of a search of the resident text."""
        times, counts = [], []
        for i in range(repeats + 1):
            output = self.cuda.search_device(self.device_text, params, self.lease)
            counts = [int(r.count) for r in output.patterns]
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
    repeats = max(5, args.repeats)
    tmp = Path(tempfile.mkdtemp(prefix="search-bench-"))
    try:
        corpus = tmp / "text.txt"
        corpus.write_bytes(text)
        run(args, text, corpus, patterns, cores, repeats, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, text: bytes, corpus: Path, patterns: list[bytes], cores: int, repeats: int, tmp: Path) -> None:
    n = len(text)
    try:
        gpu = Gpu(text, corpus)
        device = gpu.name
    except (ImportError, RuntimeError) as exc:  # no CuPy, or no device / driver (CUDARuntimeError): the host rows only
        gpu, device = None, f"no GPU ({type(exc).__name__}: {exc})"
    print(
        f"# String search: {n / GIB:.3f} GiB of English (CPython pydoc topics + Zen of Python, repeated) in a file "
        f"(page cache); {device}; {cores} CPU cores; medians of {repeats} after a warm-up, anchors included"
    )

    copy_bw = h2d_bw = float("nan")
    if gpu is not None:
        copy_bw, h2d_bw = gpu.copy_bandwidth(repeats), gpu.h2d_bandwidth(repeats)
        readers = gpu.cuda.READERS
        read_one, read_all = gpu.read_ms(1, repeats), gpu.read_ms(readers, repeats)
        print(
            f"floors: device copy {copy_bw * 1e3 / 1e12:.2f} TB/s (read + write) -> resident floor "
            f"{n / copy_bw:.3f} ms ({copy_bw * 1e3 / 1e12:.2f} TB/s of text); "
            f"pinned host->device {h2d_bw * 1e3 / 1e9:.1f} GB/s -> copy floor {n / h2d_bw:.1f} ms; "
            f"file (page cache) -> pinned, no device: 1 thread {read_one:.1f} ms ({gbps(n, read_one):.1f} GB/s), "
            f"{readers} threads {read_all:.1f} ms ({gbps(n, read_all):.1f} GB/s) -> first-search floor "
            f"{max(read_all, n / h2d_bw):.1f} ms"
        )
    floor_ms = n / copy_bw

    # Host anchors first (they also give the counts every GPU row must reproduce).
    host: dict[int, dict[str, float]] = {}
    counts: dict[int, int] = {}
    if args.rg:
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
            row["find"], counts[m] = find_loop_ms(text, pattern, repeats)
        if args.rg:
            row["rg_c"], row["rg_c_lines"] = ripgrep_ms(
                args.rg, ["-c", "-F", "-a"], pattern, str(corpus), False, repeats
            )
            row["rg_ob"], row["rg_ob_matches"] = ripgrep_ms(
                args.rg, ["-o", "-b", "-F", "-a"], pattern, str(corpus), True, repeats
            )
            row["rg_c_cores"], _ = ripgrep_ms(
                args.rg, ["-c", "-F", "-a", "-j", str(cores)], pattern, str(tmp / "pieces"), False, repeats
            )
        host[m] = row
    if not args.rg:
        print(
            "ripgrep: not installed here (rg not on PATH, no --rg): its rows are skipped. To include it: "
            "apt-get install ripgrep, or --rg PATH to a binary"
        )

    print("\n## Host anchors (one thread unless said; warm, medians)")
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
        "\n## The service's path: gpu.search.run on the stored file (auto, optimized, positions json), wall time "
        "(first: streamed from the file while searched; repeat: resident)"
    )
    print(
        "m | algorithm | count | first search ms | GB/s | upload ms (in it) | x first-search floor | vs rg -c | "
        "vs rg -c cores | vs find | resident repeat ms | GB/s | vs rg -c"
    )
    service: dict[int, tuple[float, float]] = {}
    first_floor = max(read_all, n / h2d_bw)
    for m, pattern in zip(LENGTHS, patterns, strict=True):
        params = SearchParams(patterns=(pattern,))
        first_ms, again_ms, upload_ms, summary = gpu.service_ms(params, repeats)
        found = summary["patterns"][0]["count"]
        if m in counts and found != counts[m]:
            raise SystemExit(f"m={m}: the job found {found}, bytes.find {counts[m]}")
        service[m] = (first_ms, again_ms)
        row = host[m]
        print(
            f"{m} | {summary['patterns'][0]['algorithm']} | {found} | {first_ms:.1f} | {gbps(n, first_ms):.1f} | "
            f"{upload_ms:.1f} | {first_ms / first_floor:.2f} | "
            f"{row.get('rg_c', float('nan')) / first_ms:.2f} | {row.get('rg_c_cores', float('nan')) / first_ms:.2f} | "
            f"{row.get('find', float('nan')) / first_ms:.0f} | {again_ms:.2f} | {gbps(n, again_ms):.0f} | "
            f"{row.get('rg_c', float('nan')) / again_ms:.0f}"
        )

    print("\n## Kernel-only: one pattern on the resident text (CUDA events around the kernels; no transfer)")
    print("m | algorithm | variant | granularity x threads | count | kernels ms | GB/s | x floor")
    best_resident: dict[int, float] = {}
    for m, pattern in zip(LENGTHS, patterns, strict=True):
        for algorithm in ("auto", *KERNEL_ALGORITHMS):
            for variant in VARIANTS:
                params = SearchParams(patterns=(pattern,), algorithm=algorithm, variant=variant)
                resident, found = gpu.resident_ms(params, repeats)
                if m in counts and found[0] != counts[m]:
                    raise SystemExit(f"m={m} {algorithm}/{variant}: {found[0]} matches, bytes.find found {counts[m]}")
                launch = gpu.cuda.plan_launch(params, params.algorithm_for(pattern), m)
                best_resident[m] = min(best_resident.get(m, float("inf")), resident)
                label = f"auto ({params.algorithm_for(pattern)})" if algorithm == "auto" else algorithm
                print(
                    f"{m} | {label} | {variant} | {launch.granularity} x {launch.threads} | {found[0]} | "
                    f"{resident:.3f} | {gbps(n, resident):.0f} | {resident / floor_ms:.1f}"
                )

    print(
        "\n## Kernel-only, where the time goes (auto, optimized): count kernel alone, whole search (count + prefix "
        "sum + totals to host + write), against the floor"
    )
    print("m | algorithm | floor ms | count kernel ms | x floor | whole search ms | x floor | write share")
    where = [(str(m), SearchParams(patterns=(pattern,))) for m, pattern in zip(LENGTHS, patterns, strict=True)]
    where.append(("8 fused", SearchParams(patterns=tuple(eight_patterns(text)), fused=True)))
    for label, params in where:
        count_ms = gpu.count_kernel_ms(params, repeats)
        whole, _ = gpu.resident_ms(params, repeats)
        algorithm = "fused" if params.fused else params.algorithm_for(params.patterns[0])
        print(
            f"{label} | {algorithm} | {floor_ms:.3f} | {count_ms:.3f} | {count_ms / floor_ms:.1f} | "
            f"{whole:.3f} | {whole / floor_ms:.1f} | {1 - count_ms / whole:.0%}"
        )

    print(
        "\n## Eight patterns (4, 16, 64, 256 bytes, two of each), kernel-only: one fused pass against one per pattern"
    )
    eight = eight_patterns(text)
    print("mode | kernels ms | text GB/s | x floor")
    fused_ms = None
    for label, params in (
        ("fused (one pass)", SearchParams(patterns=tuple(eight), fused=True)),
        ("8 passes, auto, 8 streams", SearchParams(patterns=tuple(eight), streams=8)),
        ("8 passes, auto, 1 stream", SearchParams(patterns=tuple(eight), streams=1)),
    ):
        resident, found = gpu.resident_ms(params, repeats)
        expected = (
            [reference.find_all(text, p).size for p in eight]
            if label.startswith("fused") and not args.skip_find
            else None
        )
        if expected is not None and found != expected:
            raise SystemExit(f"{label}: counts {found}, bytes.find {expected}")
        fused_ms = fused_ms or resident
        print(f"{label} | {resident:.3f} | {gbps(n, resident):.0f} | {resident / floor_ms:.1f}")

    frequent = (b"e", b"the", b"of", b"and", b"exception", b"class", b"Python", b"iterator")
    print(
        "\n## Eight frequent patterns fused (e, the, of, ...), the service's path: positions json (the first 1000 "
        "listed) against files (every position downloaded)"
    )
    print("positions | matches | first search ms | resident repeat ms | its download ms")
    for mode in ("json", "files"):
        params = SearchParams(patterns=frequent, fused=True, positions=mode)
        first_ms, again_ms, _, again = gpu.service_ms(params, repeats)  # again: the last repeat's summary
        matches = sum(p["count"] for p in again["patterns"])
        print(f"{mode} | {matches} | {first_ms:.1f} | {again_ms:.1f} | {again['times_ms']['download']:.1f}")

    print("\n## Targets")
    best = min(best_resident.values())
    print(
        f"resident single pattern >= 1 TB/s (kernel-only): best {gbps(n, best) / 1000:.2f} TB/s; per length "
        + ", ".join(f"m={m}: {gbps(n, t) / 1000:.2f}" for m, t in best_resident.items())
    )
    print(f"8 patterns fused >= 1 TB/s of text (kernel-only): {gbps(n, fused_ms) / 1000:.2f} TB/s")
    for m, (first_ms, again_ms) in service.items():
        rg = host[m].get("rg_c", float("nan"))
        print(
            f"first search of the stored corpus >= 3x ripgrep, m={m}: {first_ms:.1f} ms, rg -c -F {rg:.0f} ms: "
            f"{rg / first_ms:.2f}x (rg -c on {cores} cores: {host[m].get('rg_c_cores', float('nan')) / first_ms:.2f}x; "
            f"first-search floor {first_floor:.1f} ms: {rg / first_floor:.2f}x); resident repeat {again_ms:.2f} ms: "
            f"{rg / again_ms:.0f}x"
        )


if __name__ == "__main__":
    main()
