"""The string search on the GPU: the kernels of `search.cu` launched through CuPy on a
lease of the device pool, with the text resident in device memory between searches.

One search, for P patterns spread over S streams (the lease's two and cached extra ones):

    main      start ---------------------------------------------------------- join -> stop, download
    stream s     wait start -> count kernel -> prefix sum -> totals to the host
                 -> write kernel (compacted positions) [-> line numbers] -> record for the join

A text not yet on the device (the first search of a corpus) is streamed in while it is
searched (`search_streamed`): reader threads fill a pinned ring piece by piece, each
piece is copied on the lease's upload stream as soon as it is full, and after every
STREAM_CHUNK bytes each pass's stream waits for the copies and runs its count kernel over
the blocks whose bytes have all arrived (a block owns its start positions and reads
pattern_length - 1 bytes past them, so a match across a chunk edge is counted once, by
its block, once both sides are there). Then the rest as above, from the last chunk.

    readers    read k+2 | read k+3 | ...          (os.preadv into the pinned ring)
    upload        copy k+1 | copy k+2 | ...       (memcpyAsync, upload stream)
    stream s         count blocks of chunk k | count chunk k+1 | ... -> prefix sum ...

or, fused, one count and one write kernel for all patterns (the prefix sums of its
per-pattern block counts by `block_offsets`, one launch; one pattern's by CUB through
CuPy). Between its two kernels a pass brings only its totals (8 bytes a pattern) to the
host, to allocate the positions at their exact size; the positions (and lines) are the
only large download.

The newline index (line numbers) is built on the device the first time a search asks for
line numbers, and kept with the text. Only the positions a search returns come back to
the host (SearchParams.positions: none, the first max_positions, or all).

Timing: `upload` (wall time until the whole text is on the device: for a streamed search,
the count kernels of the chunks so far ran meanwhile), `kernels` (CUDA events from start
to stop: the kernels after the upload, the prefix sums and the totals' round trip through
the host), `download` (positions and lines to the host).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

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
    blocks_ready,
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

# Streaming a text to the device (a first search of a corpus, an inline text): reader
# threads fill the pieces of a pinned ring (os.preadv from the page cache, or a memory
# copy), each piece copied to the device on the lease's upload stream as soon as it is
# full; every STREAM_CHUNK bytes the count kernels of a search run over the blocks whose
# bytes have arrived, while the next pieces are read and copied.
STREAM_PIECE = 8 * 1024 * 1024  # bytes per read (one reader thread) and per host -> device copy
STREAM_RING = 16  # pieces of the pinned ring (128 MiB): reads in flight at once
STREAM_CHUNK = 64 * 1024 * 1024  # bytes uploaded between two launches of the count kernels
READERS = min(16, os.cpu_count() or 1)  # reader threads (shared by every search of the process)


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


@dataclass(eq=False)
class DeviceText:
    """A text in device memory, never changed once complete (searches on several streams
    share a resident one): `data` holds its n bytes then TEXT_PAD zero bytes (and up to
    15 more, to a multiple of 16). Its newline index, for line numbers, is built the first
    time a search asks for them (`segment_before`)."""

    data: cupy.ndarray
    n: int
    device: int
    _segment_before: cupy.ndarray | None = field(default=None, repr=False)
    _index_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def nbytes(self) -> int:
        index = self._segment_before
        return int(self.data.nbytes) + (int(index.nbytes) if index is not None else 0)

    def segment_before(self, lease) -> cupy.ndarray:
        """The newlines before each LINE_SEGMENT-byte segment (int64, exclusive prefix
        sum): built once on the lease's stream (about 1/64 of a pass over the text) and
        waited for, so that every other stream sees it complete."""
        with self._index_lock:
            if self._segment_before is None:
                with cupy.cuda.Device(lease.device), lease.stream:
                    index = _newline_index(self.data, self.n)
                lease.stream.synchronize()
                self._segment_before = index
            return self._segment_before


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
    """The DeviceText of `data`, filled on the lease's stream: the stream waited for, so
    that the text is complete before any other stream or search can see it."""
    lease.stream.synchronize()
    return DeviceText(data, n, lease.device)


def _allocate_text(n: int) -> cupy.ndarray:
    data = cupy.empty(_round16(n) + TEXT_PAD, cupy.uint8)
    data[n:].fill(0)
    return data


_readers_lock = threading.Lock()
_readers: list[ThreadPoolExecutor] = []


def reader_pool() -> ThreadPoolExecutor:
    """The process's READERS reader threads (made on first use)."""
    with _readers_lock:
        if not _readers:
            _readers.append(ThreadPoolExecutor(READERS, thread_name_prefix="search-read"))
        return _readers[0]


Fill = Callable[[memoryview, int], None]  # fill(view, offset): the text's bytes [offset, offset + len(view))
Arrived = Callable[[int, object], None]  # arrived(uploaded, event): see stream_to_device


def stream_to_device(data: cupy.ndarray, n: int, fill: Fill, lease, arrived: Arrived | None = None):
    """Copy the text's n bytes into `data` (device, current device) piece by piece:
    reader threads `fill` the STREAM_PIECE pieces of a pinned ring of STREAM_RING, each
    copied on the lease's upload stream once full and in order, the reads of the next
    pieces going on meanwhile. After each STREAM_CHUNK bytes (and the last piece),
    `arrived(uploaded, event)`: the first `uploaded` bytes are on the device once `event`
    (recorded on the upload stream) has completed. Returns that last event: the ring
    is free again once it has completed. A failed read (or `arrived`) is raised once no
    reader writes into the ring and no copy reads from it any more."""
    ring = lease.staging("search-ring", STREAM_RING * STREAM_PIECE)
    copies = upload_stream(lease)
    readers = reader_pool()
    copied: list = [None] * STREAM_RING  # the event of the last copy out of each ring slot
    offsets = range(0, n, STREAM_PIECE)

    def read(slot: int, offset: int, size: int, free) -> None:
        if free is not None:
            free.synchronize()  # the slot's previous piece has left for the device
        fill(memoryview(ring[slot * STREAM_PIECE : slot * STREAM_PIECE + size]), offset)

    pending: deque = deque()
    submitted, reported, last = 0, 0, None
    try:
        for index, offset in enumerate(offsets):
            while submitted < len(offsets) and submitted < index + STREAM_RING:
                slot, at = submitted % STREAM_RING, offsets[submitted]
                size = min(STREAM_PIECE, n - at)
                pending.append(readers.submit(read, slot, at, size, copied[slot]))
                submitted += 1
            pending.popleft().result()
            slot, size = index % STREAM_RING, min(STREAM_PIECE, n - offset)
            cupy.cuda.runtime.memcpyAsync(
                data.data.ptr + offset,
                ring[slot * STREAM_PIECE :].ctypes.data,
                size,
                cupy.cuda.runtime.memcpyHostToDevice,
                copies.ptr,
            )
            last = cupy.cuda.Event(block=False, disable_timing=True)
            last.record(copies)
            copied[slot] = last
            uploaded = offset + size
            if arrived is not None and (uploaded - reported >= STREAM_CHUNK or uploaded == n):
                arrived(uploaded, last)
                reported = uploaded
    except BaseException:
        for future in pending:
            future.cancel()
        for future in pending:
            if not future.cancelled():
                future.exception()  # wait: no reader may still write into the ring
        copies.synchronize()
        raise
    return last


def _file_reader(fd: int, path: Path, n: int) -> Fill:
    def fill(view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{path} ended at byte {offset + done}, expected {n} bytes")
            done += got

    return fill


def _host_reader(host: np.ndarray) -> Fill:
    def fill(view: memoryview, offset: int) -> None:
        np.copyto(np.frombuffer(view, np.uint8), host[offset : offset + len(view)])

    return fill


def _as_bytes(host: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    if isinstance(host, (bytes, bytearray, memoryview)):
        return np.frombuffer(host, np.uint8)
    return np.ascontiguousarray(host).view(np.uint8).ravel()


def _streamed_text(n: int, fill: Fill, lease, arrived=None) -> DeviceText:
    """A new DeviceText streamed in by `fill` (see stream_to_device), complete on return."""
    with cupy.cuda.Device(lease.device), lease.stream:
        data = _allocate_text(n)
        lease.stream.synchronize()  # the allocation's zero padding, before the upload stream writes
        last = stream_to_device(data, n, fill, lease, arrived)
        if last is not None:
            last.synchronize()
    return DeviceText(data, n, lease.device)


def text_from_host(host: np.ndarray | bytes, lease) -> tuple[DeviceText, float]:
    """Copy host bytes to a new DeviceText through the pinned ring. Returns it and the
    upload's wall time in ms (waited for)."""
    array = _as_bytes(host)
    start = time.perf_counter()
    text = _streamed_text(array.size, _host_reader(array), lease)
    return text, (time.perf_counter() - start) * 1000


def text_from_file(path: Path, n: int, lease) -> tuple[DeviceText, float]:
    """Read the first n bytes of `path` into a new DeviceText (reader threads, the pinned
    ring, copies overlapping the reads). Returns it and the wall time in ms."""
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        text = _streamed_text(n, _file_reader(fd, path, n), lease)
    finally:
        os.close(fd)
    return text, (time.perf_counter() - start) * 1000


# ---------------------------------------------------------------------- streams --

_streams_lock = threading.Lock()
_extra_streams: dict[tuple[int, int], list] = {}
_upload_streams: dict[tuple[int, int], object] = {}


def upload_stream(lease):
    """The lease slot's stream for text uploads (non-blocking, kept per slot): its copies
    overlap the search kernels on the lease's other streams."""
    with _streams_lock:
        key = (lease.device, lease.slot)
        if key not in _upload_streams:
            with cupy.cuda.Device(lease.device):
                _upload_streams[key] = cupy.cuda.Stream(non_blocking=True)
        return _upload_streams[key]


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
        self.counted = 0  # logical blocks counted so far
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
        self.count_ready(self.text.n)
        self.prefix_sums()

    def count_ready(self, uploaded: int) -> None:
        """The count kernel over the blocks not counted yet whose bytes lie in the text's
        first `uploaded` bytes (params.blocks_ready), queued on the pass's stream."""
        if self.end <= 0:  # every pattern longer than the text
            return
        ready = blocks_ready(uploaded, self.text.n, self.launch, self.m_max, self.blocks)
        if ready > self.counted:
            self.count_kernel(self.counted, ready)
            self.counted = ready

    def _allocate_counts(self) -> None:
        P, K = len(self.patterns), self.launch.slots
        self.counts = kernels.empty(P * self.blocks, cupy.int32)
        self.flags = kernels.empty(self.blocks, cupy.uint8)
        self.slots = kernels.empty(self.blocks * K, cupy.uint32)

    def count_kernel(self, first: int = 0, stop: int | None = None) -> None:
        """The count kernel alone over logical blocks first .. stop - 1 (default: all):
        their counts, flags and kept slots."""
        stop = self.blocks if stop is None else stop
        if first == 0:
            self._allocate_counts()
        target, power = self.target, self.power
        K = self.launch.slots
        g, n, end = np.int32(self.launch.granularity), np.int64(self.text.n), np.int64(self.end)
        args: tuple[Any, ...]
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
        _k(self._kernel_name("count"))(
            (stop - first,), (self.launch.threads,), (*args, np.int32(first)), shared_mem=self._shared()
        )

    def prefix_sums(self) -> None:
        """(Once every block is counted.) offsets (int64 [patterns][blocks]): inclusive
        prefix sums of the counts; and the totals, on the device. One pattern: CUB's scan
        (through CuPy); several: one launch of `block_offsets` (CuPy's scan along an axis
        takes a launch per doubling)."""
        if self.end <= 0:
            return
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

    def write(self, wanted: int | None, segment_before: cupy.ndarray | None) -> None:
        """Allocate the positions arrays and queue the write kernel, then the line numbers
        (with `segment_before`, the text's newline index) of the first `wanted` positions
        of each pattern (None: all). wanted == 0: nothing is written (counts only).
        The patterns' positions share one allocation, pattern after pattern (the fused
        write kernel finds each pattern's start from the totals on the device): the
        host's work between the count and write kernels, which the GPU waits for, stays
        one allocation and one launch (each pattern's view of the allocation is made after it)."""
        ends = np.cumsum(self.totals) if wanted != 0 else np.zeros(len(self.patterns), np.int64)
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
        if wanted == 0:
            self.outs = [flat] * len(self.patterns)
        else:
            firsts = [int(end - total) for end, total in zip(ends, self.totals, strict=True)]
            keep = [int(total) if wanted is None else min(int(total), wanted) for total in self.totals]
            self.outs = [flat[first : first + k] for first, k in zip(firsts, keep, strict=True)]
        self.lines = [None] * len(self.outs)
        if segment_before is not None:
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


class _Search:
    """One search of a text on a lease: its passes (one per pattern, or one fused) on the
    lease's streams, driven in phases. `count_ready` may run while the text is still being
    uploaded (each time over the blocks whose bytes have arrived); `finish` counts the rest,
    writes and downloads the positions."""

    def __init__(self, text: DeviceText, params: SearchParams, lease):
        self.text, self.params, self.lease = text, params, lease
        self.main = lease.stream
        spec = (
            [(list(params.patterns), "rabin_karp")]
            if params.fused
            else [([p], params.algorithm_for(p)) for p in params.patterns]
        )
        self.streams = lease_streams(lease, params.stream_count)
        self.passes = [
            _Pass(text, params, patterns, algorithm, self.streams[i % len(self.streams)])
            for i, (patterns, algorithm) in enumerate(spec)
        ]
        for p in self.passes:
            with p.stream:
                p.upload()

    def count_ready(self, uploaded: int, arrived=None) -> None:
        """Queue the count kernels of the blocks whose bytes lie in the text's first
        `uploaded` bytes, each pass's stream waiting first for the event `arrived` (those
        bytes on the device)."""
        for p in self.passes:
            if arrived is not None:
                p.stream.wait_event(arrived)
            with p.stream:
                p.count_ready(uploaded)

    def finish(self) -> SearchOutput:
        """Count what is left, the prefix sums, the totals to the host, the write kernels
        (unless only counts are wanted) and the line numbers, then download the positions
        wanted (params.positions_wanted). The text must be complete on the main stream.
        times_ms: kernels (CUDA events on the main stream, from this call to the last
        kernel) and download."""
        params, main = self.params, self.main
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(main)
        for p in self.passes:
            p.stream.wait_event(start)
            with p.stream:
                p.count()
        for p in self.passes:
            p.wait_totals()
        wanted = params.positions_wanted
        segment_before = self.text.segment_before(self.lease) if params.line_numbers and wanted != 0 else None
        for p in self.passes:
            with p.stream:
                p.write(wanted, segment_before)
            done = cupy.cuda.Event(disable_timing=True)
            done.record(p.stream)
            main.wait_event(done)
        stop.record(main)
        begin = time.perf_counter()
        results: list[PatternResult] = []
        for p in self.passes:
            for i, out in enumerate(p.outs):
                positions = out.get(stream=main)
                line_numbers = p.lines[i]
                lines = line_numbers.get(stream=main) if line_numbers is not None else None
                results.append(PatternResult(positions, lines, p.algorithm, int(p.totals[i])))
        main.synchronize()
        download_ms = (time.perf_counter() - begin) * 1000
        launch = self.passes[0].launch
        return SearchOutput(
            results,
            self.text.n,
            {"kernels": cupy.cuda.get_elapsed_time(start, stop), "download": download_ms},
            launch={
                "granularity": launch.granularity,
                "threads": launch.threads,
                "slots": launch.slots,
                "streams": len(self.streams),
            },
        )


def search_device(text: DeviceText, params: SearchParams, lease) -> SearchOutput:
    """Every pattern of `params` in a complete DeviceText, on the lease's device and
    streams. The positions wanted and their lines come back to the host; times_ms has
    kernels and download."""
    with cupy.cuda.Device(lease.device):
        return _Search(text, params, lease).finish()


def search_streamed(fill: Fill, n: int, params: SearchParams, lease, progress=None) -> tuple[DeviceText, SearchOutput]:
    """A search of a text that is not on the device yet, uploaded by `fill` (see
    stream_to_device) while its first parts are searched: after each STREAM_CHUNK bytes,
    the count kernels of the blocks that have arrived. Returns the complete text (to keep
    resident) and the output; times_ms: upload (wall time until every byte is on the
    device, the count kernels of the chunks so far included), kernels (GPU time after the
    upload: the last chunk's count, prefix sums, write), download."""
    start = time.perf_counter()
    with cupy.cuda.Device(lease.device), lease.stream:
        data = _allocate_text(n)
        lease.stream.synchronize()  # the allocation's zero padding, before the upload stream writes
        text = DeviceText(data, n, lease.device)
        search = _Search(text, params, lease)
        try:
            last = stream_to_device(data, n, fill, lease, search.count_ready)
        except BaseException:
            for stream in search.streams:  # the count kernels queued so far read `data`: none may outlive it
                stream.synchronize()
            raise
        if last is not None:
            last.synchronize()
        upload_ms = (time.perf_counter() - start) * 1000
        if progress is not None:
            progress(0.2)
        output = search.finish()
    output.times_ms = {"upload": upload_ms, **output.times_ms}
    return text, output


def search_file(
    lease, path: Path, n: int, params: SearchParams, key: tuple | None = None, progress=None
) -> SearchOutput:
    """A search of the first n bytes of the file `path` on a lease. With `key` (a corpus
    identity), the text stays resident on the device for the next search with that key
    (LRU within the residency budget), which skips the upload; the first one streams the
    file in while searching it (search_streamed). Without a key, the text is streamed in
    for this search only. Out of device memory, the device's resident texts are dropped
    before the error goes on to the pool (which frees its cached blocks and retries once)."""
    device = lease.device
    try:
        with cupy.cuda.Device(device):
            text = RESIDENT.get(device, key) if key is not None else None
            if text is not None:
                output = _resident_search(text, params, lease, progress)
            elif key is None:
                output = _streamed_search(path, n, params, lease, progress)[1]
            else:
                with RESIDENT.loading(device, key):  # one upload when several jobs want the same corpus
                    text = RESIDENT.get(device, key)
                    if text is not None:
                        output = _resident_search(text, params, lease, progress)
                    else:
                        text, output = _streamed_search(path, n, params, lease, progress)
                        RESIDENT.put(device, key, text, device_capacity(device))
    except cupy.cuda.memory.OutOfMemoryError:
        RESIDENT.evict_device(device)
        raise
    return output


def _resident_search(text: DeviceText, params: SearchParams, lease, progress) -> SearchOutput:
    if progress is not None:
        progress(0.2)
    output = search_device(text, params, lease)
    output.times_ms = {"upload": 0.0, **output.times_ms}
    output.resident = True
    return output


def _streamed_search(path: Path, n: int, params: SearchParams, lease, progress) -> tuple[DeviceText, SearchOutput]:
    fd = os.open(path, os.O_RDONLY)
    try:
        text, output = search_streamed(_file_reader(fd, path, n), n, params, lease, progress)
    finally:
        os.close(fd)
    output.resident = False
    return text, output


def device_capacity(device: int) -> int:
    """Bytes the pool lets CuPy hold on `device`: its memory pool limit, else the card."""
    with cupy.cuda.Device(device):
        limit = cupy.get_default_memory_pool().get_limit()
        return int(limit) if limit else int(cupy.cuda.runtime.memGetInfo()[1])
