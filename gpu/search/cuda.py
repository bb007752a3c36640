"""The string search on the GPU: the kernels of `search.cu` launched through CuPy on a
lease of the device pool, with the text resident in device memory between searches.

One search, for P patterns spread over S streams (the lease's two and cached extra ones):

    main      [upload + newline index] start ------------------------------ join -> stop, download
    stream s     wait start -> count kernel -> prefix sum -> totals to the host
                 -> write kernel (compacted positions) [-> line numbers] -> record for the join

or, fused, one count and one write kernel for all patterns (the prefix sums of its
per-pattern block counts by `block_offsets`, one launch; one pattern's by CUB through
CuPy). Between its two kernels a pass brings only its totals (8 bytes a pattern) to the
host, to allocate the positions at their exact size; the positions (and lines) are the
only large download.

Timing: `upload` (file or host bytes -> device and the text's newline index, wall time),
`kernels` (CUDA events from start to stop: every kernel, the prefix sums and the totals'
round trip through the host), `download` (positions and lines to the host).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import cupy
import numpy as np

from gpu import kernels
from gpu.search import reference
from gpu.search.params import (
    FUSED_PREFIX_MAX,
    MAX_STREAMS,
    SLOTS_MAX,
    THREADS,
    Launch,
    PatternResult,
    SearchOutput,
    SearchParams,
    plan_launch,
)
from gpu.search.residency import RESIDENT

SOURCE = Path(__file__).with_name("search.cu")
_k = partial(kernels.kernel, SOURCE)

# Mirrored from search.cu.
RECORDS_PER_THREAD = 4  # matches a thread keeps during the count pass (single pattern)
SCRATCH_BYTES = 512
TILE_PAD = 64
FUSED_MAX = 8
POOL_CHUNK = 8  # fused: records per chunk of the block's pool of kept matches
FUSED_WARPS_MAX = THREADS // 32  # fused: warps of a block the pool is sized for
POOL_WORDS = (
    SLOTS_MAX // POOL_CHUNK + FUSED_WARPS_MAX
) * POOL_CHUNK + 4  # fused: the pool and its count of chunks taken (uint32)
QUEUE_CAP = 64  # fused: candidates a warp queues for verification
WARP_WORDS = (
    QUEUE_CAP + FUSED_MAX + SLOTS_MAX // POOL_CHUNK // 4
)  # fused, per warp: queue, per-pattern counts, chunk list (uint32)
FILTER_BITS = 12
FILTER_SIZE = 1 << FILTER_BITS
LANE_MUL, BIT_MUL = 2654435761, 2246822507  # the filters' hashes: high words of key * each (search.cu)
COARSE_BITS = 10  # the coarse bitmap the scan reads by warp shuffles: one uint32 per lane
COARSE_BYTES = 4 << (COARSE_BITS - 5)
META_INTS = 3 + 4 * FUSED_MAX
LINE_SEGMENT = 512
LINE_THREADS = 256
OFFSET_THREADS = 1024  # threads of a block that scans a segment of one pattern's per-block counts
OFFSET_SEGMENTS_MAX = 64  # blocks per pattern of that scan, at most (about an SM each)
WRITE_BLOCKS_PER_SM = 8

TEXT_PAD = 64  # zero bytes after the text on the device: 16-byte loads and Rabin-Karp's last roll read past its end
UPLOAD_PIECE = 32 * 1024 * 1024  # bytes per pinned staging buffer of a file upload
UPLOAD_BUFFERS = 4  # pinned buffers (and reader threads) of a file upload


def _resident_blocks() -> int:
    """CUDA blocks of the write kernels' grid: about as many as the device runs at once
    (each loops over the logical blocks of the count pass)."""
    return WRITE_BLOCKS_PER_SM * kernels.device_attribute("MultiProcessorCount")


def _round16(x: int) -> int:
    return (x + 15) & ~15


def table_bytes(algorithm: str, m: int) -> int:
    """Bytes of the table staged in shared memory ("fused": filter + coarse bitmap + meta)."""
    return {
        "kmp": 2 * m,
        "boyer_moore": 2 * (256 + m + 1),
        "rabin_karp": 0,
        "fused": FILTER_SIZE + COARSE_BYTES + 4 * META_INTS,
    }[algorithm]


def shared_bytes(variant: str, algorithm: str, launch: Launch, pattern_bytes: int, m_max: int) -> int:
    """Dynamic shared memory of one block (search.cu `layout`)."""
    words = (
        POOL_WORDS + launch.threads // 32 * WARP_WORDS if algorithm == "fused" else launch.threads * RECORDS_PER_THREAD
    )
    size = _round16(words * 4) + SCRATCH_BYTES
    if variant == "naive":
        return size
    return (
        size
        + _round16(pattern_bytes)
        + _round16(table_bytes(algorithm, m_max))
        + _round16(launch.block_positions + m_max - 1)
        + TILE_PAD
    )


# ------------------------------------------------------------------ device texts --


@dataclass(eq=False, frozen=True)
class DeviceText:
    """A text in device memory, complete and never changed once made (searches on several
    streams share a resident one): `data` holds its n bytes then TEXT_PAD zero bytes (and
    up to 15 more, to a multiple of 16); `segment_before` the newlines before each
    LINE_SEGMENT-byte segment (int64, exclusive prefix sum: the line numbers' index)."""

    data: cupy.ndarray
    n: int
    device: int
    segment_before: cupy.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + int(self.segment_before.nbytes)


def _newline_index(data: cupy.ndarray, n: int) -> cupy.ndarray:
    """segment_before of the text in `data`, queued on the current stream."""
    segments = max(1, -(-n // LINE_SEGMENT))
    counts = kernels.empty(segments, cupy.int32)
    warps_per_block = LINE_THREADS // 32
    _k("newline_counts")(
        (-(-segments // warps_per_block),), (LINE_THREADS,), (data, np.int64(n), counts, np.int64(segments))
    )
    inclusive = cupy.cumsum(counts, dtype=cupy.int64)
    return inclusive - counts


def finish_text(data: cupy.ndarray, n: int, lease) -> DeviceText:
    """The DeviceText of an uploaded `data`: its newline index built on the lease's stream
    (about 1/64 of a pass over the text), then the stream waited for, so that the text is
    complete before any other stream or search can see it."""
    with lease.stream:
        segment_before = _newline_index(data, n)
    lease.stream.synchronize()
    return DeviceText(data, n, lease.device, segment_before)


def _allocate_text(n: int) -> cupy.ndarray:
    data = cupy.empty(_round16(n) + TEXT_PAD, cupy.uint8)
    data[n:].fill(0)
    return data


def text_from_host(host: np.ndarray | bytes, lease) -> tuple[DeviceText, float]:
    """Copy host bytes to a new DeviceText on the lease's stream. Returns it and the
    upload time in ms (a pinned staging copy, then an async copy; waited for)."""
    host = (
        np.frombuffer(host, np.uint8)
        if isinstance(host, (bytes, bytearray, memoryview))
        else np.ascontiguousarray(host).view(np.uint8).ravel()
    )
    n = host.size
    start = time.perf_counter()
    with cupy.cuda.Device(lease.device), lease.stream:
        data = _allocate_text(n)
        for offset in range(0, n, UPLOAD_PIECE):
            size = min(UPLOAD_PIECE, n - offset)
            staging = lease.staging(f"search{(offset // UPLOAD_PIECE) % 2}", size)
            lease.stream.synchronize()  # the previous copy out of this buffer is done
            staging[:] = host[offset : offset + size]
            cupy.cuda.runtime.memcpyAsync(
                data.data.ptr + offset,
                staging.ctypes.data,
                size,
                cupy.cuda.runtime.memcpyHostToDevice,
                lease.stream.ptr,
            )
        text = finish_text(data, n, lease)
    return text, (time.perf_counter() - start) * 1000


def text_from_file(path: Path, n: int, lease) -> tuple[DeviceText, float]:
    """Read the first n bytes of `path` into a new DeviceText: UPLOAD_BUFFERS reader
    threads fill pinned buffers (os.preadv), each copied asynchronously to the device on
    the lease's stream as soon as it is full, while the others are being read. Returns
    it and the wall time in ms."""
    start = time.perf_counter()
    with cupy.cuda.Device(lease.device), lease.stream:
        data = _allocate_text(n)
        buffers = [lease.staging(f"search{k}", min(UPLOAD_PIECE, max(n, 1))) for k in range(UPLOAD_BUFFERS)]
        copied: list = [None] * UPLOAD_BUFFERS
        fd = os.open(path, os.O_RDONLY)
        try:

            def read(k: int, offset: int, size: int) -> None:
                view = memoryview(buffers[k])[:size]
                done = 0
                while done < size:
                    got = os.preadv(fd, [view[done:]], offset + done)
                    if got <= 0:
                        raise OSError(f"{path} ended at byte {offset + done}, expected {n} bytes")
                    done += got

            def copy(k: int, offset: int, size: int, future) -> None:
                future.result()
                cupy.cuda.runtime.memcpyAsync(
                    data.data.ptr + offset,
                    buffers[k].ctypes.data,
                    size,
                    cupy.cuda.runtime.memcpyHostToDevice,
                    lease.stream.ptr,
                )
                event = cupy.cuda.Event(block=False, disable_timing=True)
                event.record(lease.stream)
                copied[k] = event

            pending: deque = deque()
            with ThreadPoolExecutor(UPLOAD_BUFFERS, thread_name_prefix="search-read") as readers:
                for index, offset in enumerate(range(0, n, UPLOAD_PIECE)):
                    k = index % UPLOAD_BUFFERS
                    if copied[k] is not None:
                        copied[k].synchronize()  # the buffer's previous copy is done
                    size = min(UPLOAD_PIECE, n - offset)
                    pending.append((k, offset, size, readers.submit(read, k, offset, size)))
                    if len(pending) == UPLOAD_BUFFERS:
                        copy(*pending.popleft())
                while pending:
                    copy(*pending.popleft())
        finally:
            os.close(fd)
        text = finish_text(data, n, lease)
    return text, (time.perf_counter() - start) * 1000


# ---------------------------------------------------------------------- streams --

_streams_lock = threading.Lock()
_extra_streams: dict[tuple[int, int], list] = {}


def lease_streams(lease, count: int) -> list:
    """`count` streams for the lease: its own two first, then extra non-blocking streams
    kept per lease slot (so two leases never share one)."""
    streams = [lease.stream, lease.side_stream]
    if count > 2:
        with _streams_lock:
            extra = _extra_streams.setdefault((lease.device, lease.slot), [])
            with cupy.cuda.Device(lease.device):
                while len(extra) < MAX_STREAMS - 2:
                    extra.append(cupy.cuda.Stream(non_blocking=True))
            streams += extra
    return streams[:count]


# ----------------------------------------------------------------------- passes --


class _Pass:
    """One count + write pair of kernels on one stream: a single pattern, or all of them
    fused. Holds the device arrays between the two phases."""

    def __init__(self, text: DeviceText, params: SearchParams, patterns: list[bytes], algorithm: str, stream):
        self.text, self.params, self.patterns, self.algorithm, self.stream = text, params, patterns, algorithm, stream
        self.fused = params.fused
        lengths = [len(p) for p in patterns]
        self.m_max, self.m_min = max(lengths), min(lengths)
        self.end = text.n - self.m_min + 1  # start positions 0 <= i < end
        self.launch = plan_launch(params, algorithm, self.m_max)
        self.blocks = self.launch.blocks(max(self.end, 1))
        self.totals = np.zeros(len(patterns), np.int64)
        self.outs: list[cupy.ndarray] = []
        self.lines: list[cupy.ndarray | None] = []
        self._totals_dev = None
        self.host_pattern, self.host_table, self.target, self.power = self._tables()
        self.pattern_bytes = self.host_pattern.size

    # -- host-side tables --

    def _tables(self) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(pattern bytes, table bytes, hash target, hash power) of a single pattern, or
        of the fused set (patterns concatenated; filter + meta)."""
        if self.fused:
            return fused_tables(self.patterns)
        pattern = self.patterns[0]
        table = {
            "kmp": lambda: reference.lps_table(pattern),
            "boyer_moore": lambda: np.concatenate(
                [reference.bad_character_table(pattern), reference.good_suffix_table(pattern)]
            ),
            "rabin_karp": lambda: np.zeros(1, np.int16),
        }[self.algorithm]()
        return (
            np.frombuffer(pattern, np.uint8),
            table.view(np.uint8),
            reference.rk_hash(pattern),
            reference.rk_power(len(pattern)),
        )

    def _kernel_name(self, phase: str) -> str:
        return f"{phase}_fused" if self.fused else f"{phase}_{self.algorithm}_{self.params.variant}"

    def _shared(self) -> int:
        staged = 0 if self.fused else self.pattern_bytes  # the fused pass leaves its patterns in global memory
        return shared_bytes(
            self.params.variant, "fused" if self.fused else self.algorithm, self.launch, staged, self.m_max
        )

    # -- phases --

    def upload(self) -> None:
        """The pattern(s) and table to the device, on the pass's stream (before the timed
        part), zero-padded to a multiple of 16 bytes: the kernels copy them 16 bytes at a time."""
        self.d_pattern = cupy.asarray(_pad16(self.host_pattern))
        self.d_table = cupy.asarray(_pad16(self.host_table.view(np.uint8)))

    def count(self) -> None:
        """Count kernel and prefix sums, queued on the pass's stream (read the totals with
        `wait_totals`)."""
        if self.end <= 0:  # every pattern longer than the text
            return
        self.count_kernel()
        self.prefix_sums()

    def count_kernel(self) -> None:
        """The count kernel alone: counts, flags and kept slots per block."""
        target, power = self.target, self.power
        P, K = len(self.patterns), self.launch.slots
        self.counts = kernels.empty(P * self.blocks, cupy.int32)
        self.flags = kernels.empty(self.blocks, cupy.uint8)
        self.slots = kernels.empty(self.blocks * K, cupy.uint32)
        g, n, end = np.int32(self.launch.granularity), np.int64(self.text.n), np.int64(self.end)
        if self.fused:
            args = (
                self.text.data,
                n,
                end,
                g,
                self.d_pattern,
                np.int32(self.pattern_bytes),
                np.int32(self.m_max),
                self.d_table,
                self.counts,
                np.int32(self.blocks),
                self.flags,
                self.slots,
                np.int32(K),
            )
        else:
            args = (
                self.text.data,
                n,
                end,
                g,
                self.d_pattern,
                np.int32(len(self.patterns[0])),
                self.d_table,
                np.uint32(target),
                np.uint32(power),
                self.counts,
                np.int32(self.blocks),
                self.flags,
                self.slots,
                np.int32(K),
            )
        self.args_head = args[:9] if not self.fused else args[:8]
        _k(self._kernel_name("count"))((self.blocks,), (self.launch.threads,), args, shared_mem=self._shared())

    def prefix_sums(self) -> None:
        """offsets (int64 [patterns][blocks]): inclusive prefix sums of the counts; and the
        totals, on the device. One pattern: CUB's scan (through CuPy); several: one launch
        of `block_offsets` (CuPy's scan along an axis takes a launch per doubling)."""
        P = len(self.patterns)
        if P == 1:
            self.offsets = cupy.cumsum(self.counts, dtype=cupy.int64).reshape(1, self.blocks)
            self._totals_dev = self.offsets[:, -1].copy()
        else:
            self.offsets = kernels.empty((P, self.blocks), cupy.int64)
            self._totals_dev = kernels.empty(P, cupy.int64)
            segments = max(1, min(OFFSET_SEGMENTS_MAX, kernels.device_attribute("MultiProcessorCount") // P))
            _k("block_offsets")(
                (P * segments,),
                (OFFSET_THREADS,),
                (self.counts, np.int32(self.blocks), np.int32(segments), self.offsets, self._totals_dev),
            )

    def wait_totals(self) -> None:
        if self._totals_dev is not None:
            self.totals = self._totals_dev.get(stream=self.stream)

    def write(self) -> None:
        """Allocate the positions arrays and queue the write kernel (and line numbers).
        The patterns' positions share one allocation, pattern after pattern (the fused
        write kernel finds each pattern's start from the totals on the device): the
        host's work between the count and write kernels, which the GPU waits for, stays
        one allocation and one launch (each pattern's view of the allocation is made after it)."""
        ends = np.cumsum(self.totals)
        flat = kernels.empty(int(ends[-1]), cupy.int64)
        if flat.size > 0:
            K = np.int32(self.launch.slots)
            if self.fused:
                args = (
                    *self.args_head,
                    self.counts,
                    np.int32(self.blocks),
                    self.flags,
                    self.slots,
                    K,
                    self.offsets,
                    self._totals_dev,
                    flat,
                    np.int32(len(self.patterns)),
                )
            else:
                args = (
                    *self.args_head,
                    self.counts,
                    np.int32(self.blocks),
                    self.flags,
                    self.slots,
                    K,
                    self.offsets,
                    flat,
                )
            _k(self._kernel_name("write"))(
                (min(self.blocks, _resident_blocks()),), (self.launch.threads,), args, shared_mem=self._shared()
            )
        self.outs = [flat[int(end - total) : int(end)] for end, total in zip(ends, self.totals, strict=True)]
        self.lines = [None] * len(self.outs)
        if self.params.line_numbers:
            segment_before = self.text.segment_before
            for i, out in enumerate(self.outs):
                lines = kernels.empty(out.size, cupy.int64)
                if out.size:
                    _k("line_numbers")(
                        (-(-out.size // LINE_THREADS),),
                        (LINE_THREADS,),
                        (self.text.data, out, np.int64(out.size), segment_before, lines),
                    )
                self.lines[i] = lines


def _pad16(data: np.ndarray) -> np.ndarray:
    out = np.zeros(max(16, _round16(data.size)), np.uint8)
    out[: data.size] = data
    return out


def fine_index(a: int, b: int) -> int:
    """The fine filter's entry for a key's hashes a, b: its coarse bucket (a mod 32, b mod 32)
    and FILTER_BITS - 10 more bits of a (search.cu's fine_index)."""
    return (a & 31) | (b & 31) << 5 | ((a >> 5) & ((1 << (FILTER_BITS - 10)) - 1)) << 10


def fused_tables(patterns: list[bytes]) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The fused pass's inputs: the patterns concatenated (uint8, each starting at a
    multiple of 4 bytes and zero-padded to one), and its table: the prefix filter
    (FILTER_SIZE bytes, bit q set at `fine_index` of pattern q's first k bytes), the coarse
    bitmap (2^COARSE_BITS bits as uint32 words: bit b mod 32 of word a mod 32 for each
    pattern's hashes a, b), then the meta ints P, k, m_max, lengths[8], offsets[8],
    heads[8][2] (bytes 0..3 and 4..7 of each pattern as little-endian words, zeros past
    its end)."""
    k = min(FUSED_PREFIX_MAX, min(len(p) for p in patterns))
    filter_ = np.zeros(FILTER_SIZE, np.uint8)
    coarse = np.zeros(COARSE_BYTES // 4, np.uint32)
    meta = np.zeros(META_INTS, np.int64)
    meta[0], meta[1], meta[2] = len(patterns), k, max(len(p) for p in patterns)
    padded = [p + bytes(-len(p) % 4) for p in patterns]
    offset = 0
    for q, p in enumerate(patterns):
        key = int.from_bytes(p[:k], "little")
        a, b = (key * LANE_MUL) >> 32, (key * BIT_MUL) >> 32
        filter_[fine_index(a, b)] |= 1 << q
        coarse[a & 31] |= np.uint32(1 << (b & 31))
        head = p[:8].ljust(8, b"\0")
        meta[3 + q], meta[3 + FUSED_MAX + q] = len(p), offset
        meta[3 + 2 * FUSED_MAX + 2 * q] = int.from_bytes(head[:4], "little")
        meta[3 + 2 * FUSED_MAX + 2 * q + 1] = int.from_bytes(head[4:], "little")
        offset += len(padded[q])
    meta32 = meta.astype(np.uint32).view(np.uint8)  # heads up to 2^32 - 1: stored as their 32 bits
    return np.frombuffer(b"".join(padded), np.uint8), np.concatenate([filter_, coarse.view(np.uint8), meta32]), 0, 0


# ----------------------------------------------------------------------- search --


def search_device(text: DeviceText, params: SearchParams, lease) -> SearchOutput:
    """Every pattern of `params` in a DeviceText, on the lease's device and streams.
    Positions and lines come back to the host; times_ms has kernels and download."""
    with cupy.cuda.Device(lease.device):
        main = lease.stream
        if params.fused:
            passes_spec = [(list(params.patterns), "rabin_karp")]
        else:
            passes_spec = [([p], params.algorithm_for(p)) for p in params.patterns]
        streams = lease_streams(lease, params.stream_count)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        passes = [
            _Pass(text, params, patterns, algorithm, streams[i % len(streams)])
            for i, (patterns, algorithm) in enumerate(passes_spec)
        ]
        for p in passes:
            with p.stream:
                p.upload()
        start.record(main)
        for p in passes:
            p.stream.wait_event(start)
            with p.stream:
                p.count()
        for p in passes:
            p.wait_totals()
        for p in passes:
            with p.stream:
                p.write()
            done = cupy.cuda.Event(disable_timing=True)
            done.record(p.stream)
            main.wait_event(done)
        stop.record(main)
        begin = time.perf_counter()
        results: list[PatternResult] = []
        for p in passes:
            for i, out in enumerate(p.outs):
                positions = out.get(stream=main)
                lines = p.lines[i].get(stream=main) if p.lines[i] is not None else None
                results.append(PatternResult(positions, lines, p.algorithm))
        main.synchronize()
        download_ms = (time.perf_counter() - begin) * 1000
        kernels_ms = cupy.cuda.get_elapsed_time(start, stop)
    launch = passes[0].launch
    return SearchOutput(
        results,
        text.n,
        {"kernels": kernels_ms, "download": download_ms},
        launch={
            "granularity": launch.granularity,
            "threads": launch.threads,
            "slots": launch.slots,
            "streams": len(streams),
        },
    )


def search_file(
    lease, path: Path, n: int, params: SearchParams, key: tuple | None = None, progress=None
) -> SearchOutput:
    """A search of the first n bytes of the file `path` on a lease. With `key` (a corpus
    identity), the text stays resident on the device for the next search with that key
    (LRU within the residency budget); without it, it is uploaded for this search only.
    Out of device memory, the device's resident texts are dropped before the error goes
    on to the pool (which frees its cached blocks and retries once)."""
    device = lease.device
    try:
        with cupy.cuda.Device(device):
            upload_ms, resident = 0.0, False
            text = RESIDENT.get(device, key) if key is not None else None
            if text is not None:
                resident = True
            elif key is None:
                text, upload_ms = text_from_file(path, n, lease)
            else:
                with RESIDENT.loading(device, key):  # one upload when several jobs want the same corpus
                    text = RESIDENT.get(device, key)
                    if text is not None:
                        resident = True
                    else:
                        text, upload_ms = text_from_file(path, n, lease)
                        RESIDENT.put(device, key, text, device_capacity(device))
            if progress is not None:
                progress(0.2)
            output = search_device(text, params, lease)
    except cupy.cuda.memory.OutOfMemoryError:
        RESIDENT.evict_device(device)
        raise
    output.times_ms = {"upload": upload_ms, **output.times_ms}
    output.resident = resident
    return output


def device_capacity(device: int) -> int:
    """Bytes the pool lets CuPy hold on `device`: its memory pool limit, else the card."""
    with cupy.cuda.Device(device):
        limit = cupy.get_default_memory_pool().get_limit()
        return int(limit) if limit else int(cupy.cuda.runtime.memGetInfo()[1])
