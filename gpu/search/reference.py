"""Exact string search in Python and NumPy: the definition of correct, and the CPU backend.

The answer to "where does pattern p (m bytes) occur in text t (n bytes)" is every start
position i, 0 <= i <= n - m, with t[i:i + m] == p, in increasing order, overlapping
occurrences included ("aaaa" occurs 4 times in "aaaaaaa"), as int64 byte offsets. The
line of a position is 1 + the number of b"\\n" bytes before it.

Three parts:

- The pattern tables the GPU kernels read (gpu/search/search.cu): the Rabin-Karp hash
  and the power of the base that drops the outgoing byte, the KMP prefix table (LPS),
  Boyer-Moore's bad-character and (strong) good-suffix tables. Built here, on the host,
  once per pattern, and uploaded.
- The three algorithms in plain Python, over one chunk of start positions [lo, hi) that
  reads only t[lo:hi + m - 1], exactly what one GPU thread does in the divide-and-conquer
  scheme of the seed report; `search_chunked` runs them chunk after chunk. Slow (pure
  Python): for tests on small texts, where they pin down the tables and the chunking.
- The CPU backend, `search`: every pattern through `find_all` (bytes.find / mmap.find,
  CPython's two-way/Boyer-Moore-Horspool "fastsearch", looping over overlapping
  occurrences) in blocks of BLOCK_BYTES, so that a text of gigabytes is searched from an
  mmap without being read into memory, with progress (and cancel) between blocks. It
  gives the same positions for every algorithm: the choice of algorithm only matters on
  the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from gpu.search.params import RK_BASE, RK_MASK, PatternResult, SearchOutput, SearchParams

BLOCK_BYTES = 64 * 1024 * 1024  # text searched between two progress reports by the CPU backend
NEWLINE = 0x0A
CPU_ALGORITHM = "find"  # what the CPU backend reports it ran, whatever the request's algorithm


# ------------------------------------------------------------------ pattern tables --


def rk_hash(data: bytes) -> int:
    """The Rabin-Karp hash of `data`: sum of data[i] * RK_BASE ** (len - 1 - i), modulo 2^32."""
    h = 0
    for byte in data:
        h = (h * RK_BASE + byte) & RK_MASK
    return h


def rk_power(m: int) -> int:
    """RK_BASE ** m modulo 2^32: rolling the window one byte right is
    h' = h * RK_BASE + incoming - RK_BASE ** m * outgoing (mod 2^32)."""
    return pow(RK_BASE, m, RK_MASK + 1)


def lps_table(pattern: bytes) -> np.ndarray:
    """KMP's prefix table, int16 of length m: lps[j] is the length of the longest proper
    prefix of pattern[:j + 1] that is also its suffix."""
    m = len(pattern)
    lps = np.zeros(m, np.int16)
    k = 0
    for j in range(1, m):
        while k > 0 and pattern[j] != pattern[k]:
            k = int(lps[k - 1])
        if pattern[j] == pattern[k]:
            k += 1
        lps[j] = k
    return lps


def bad_character_table(pattern: bytes) -> np.ndarray:
    """Boyer-Moore's bad-character table, int16 of length 256: the last index of each
    byte value in the pattern, -1 for bytes it does not contain."""
    table = np.full(256, -1, np.int16)
    for index, byte in enumerate(pattern):
        table[byte] = index
    return table


def good_suffix_table(pattern: bytes) -> np.ndarray:
    """Boyer-Moore's strong good-suffix shifts, int16 of length m + 1: after a mismatch at
    pattern index j (pattern[j + 1:] matched), shift[j + 1] is the least s >= 1 that lines
    the matched suffix up with an equal part of the pattern preceded by a different byte
    (or by nothing); shift[0], used after a full match, is the pattern's period."""
    m = len(pattern)
    shift = [0] * (m + 1)
    border = [0] * (m + 1)  # border[i]: start of the widest border of pattern[i:]
    i, j = m, m + 1
    border[i] = j
    while i > 0:
        while j <= m and pattern[i - 1] != pattern[j - 1]:
            if shift[j] == 0:
                shift[j] = j - i
            j = border[j]
        i, j = i - 1, j - 1
        border[i] = j
    j = border[0]
    for i in range(m + 1):
        if shift[i] == 0:
            shift[i] = j
        if i == j:
            j = border[j]
    return np.asarray(shift, np.int16)


@lru_cache(maxsize=64)
def _tables(pattern: bytes) -> tuple[list[int], list[int], list[int]]:
    """(lps, bad character, good suffix) of a pattern as lists, for the Python scans."""
    return lps_table(pattern).tolist(), bad_character_table(pattern).tolist(), good_suffix_table(pattern).tolist()


# ------------------------------------------------------------ the three algorithms --
# Each scans one chunk: start positions lo <= i < hi of `text`, reading text[lo:hi + m - 1]
# only (the caller guarantees hi + m - 1 <= len(text)). They return the positions found.


def rabin_karp_chunk(text: bytes, pattern: bytes, lo: int, hi: int) -> list[int]:
    """Rolling hash over the windows starting in [lo, hi); a hash equal to the pattern's
    is checked byte by byte (hashes collide)."""
    m = len(pattern)
    if lo >= hi:
        return []
    target, power = rk_hash(pattern), rk_power(m)
    h = rk_hash(text[lo : lo + m])
    found = []
    for i in range(lo, hi):
        if h == target and text[i : i + m] == pattern:
            found.append(i)
        if i + 1 < hi:
            h = (h * RK_BASE + text[i + m] - power * text[i]) & RK_MASK
    return found


def kmp_chunk(text: bytes, pattern: bytes, lo: int, hi: int) -> list[int]:
    """Knuth-Morris-Pratt over text[lo:hi + m - 1]: j bytes of the pattern matched so far;
    on a mismatch fall back to lps[j - 1] without moving in the text."""
    m = len(pattern)
    lps = _tables(pattern)[0]
    found = []
    j = 0
    for i in range(lo, hi + m - 1 if lo < hi else lo):
        c = text[i]
        while j > 0 and pattern[j] != c:
            j = lps[j - 1]
        if pattern[j] == c:
            j += 1
        if j == m:
            found.append(i - m + 1)
            j = lps[m - 1]
    return found


def boyer_moore_chunk(text: bytes, pattern: bytes, lo: int, hi: int) -> list[int]:
    """Boyer-Moore for windows starting in [lo, hi): compare right to left; shift by the
    larger of the bad-character and good-suffix rules (by the period after a match)."""
    m = len(pattern)
    _, bad, good = _tables(pattern)
    found = []
    s = lo
    while s < hi:
        j = m - 1
        while j >= 0 and pattern[j] == text[s + j]:
            j -= 1
        if j < 0:
            found.append(s)
            s += good[0]
        else:
            s += max(good[j + 1], j - bad[text[s + j]])
    return found


CHUNK_SCANS: dict[str, Callable[[bytes, bytes, int, int], list[int]]] = {
    "rabin_karp": rabin_karp_chunk,
    "kmp": kmp_chunk,
    "boyer_moore": boyer_moore_chunk,
}


def search_chunked(text: bytes, pattern: bytes, algorithm: str, granularity: int) -> np.ndarray:
    """The divide-and-conquer scheme: start positions cut into chunks of `granularity`,
    each scanned on its own (its view ends pattern_length - 1 bytes past the chunk), the
    chunks' positions concatenated. int64, increasing."""
    m, n = len(pattern), len(text)
    end = n - m + 1  # start positions 0 <= i < end
    scan = CHUNK_SCANS[algorithm]
    found: list[int] = []
    for lo in range(0, max(end, 0), granularity):
        hi = min(lo + granularity, end)
        view = text[lo : hi + m - 1]  # what one GPU thread reads
        found.extend(lo + i for i in scan(view, pattern, 0, hi - lo))
    return np.asarray(found, np.int64)


# ---------------------------------------------------------------- the CPU backend --


def find_all(buffer, pattern: bytes, start: int = 0, end: int | None = None) -> np.ndarray:
    """Every start position of `pattern` in buffer[start:end] (matches lying wholly in
    it), as absolute int64 offsets, increasing. `buffer`: bytes, bytearray or an mmap
    (anything with .find(sub, start, end))."""
    end = len(buffer) if end is None else end
    found = []
    i = buffer.find(pattern, start, end)
    while i != -1:
        found.append(i)
        i = buffer.find(pattern, i + 1, end)
    return np.asarray(found, np.int64)


def line_numbers(buffer, positions: np.ndarray) -> np.ndarray:
    """The 1-based line of each position (increasing int64 offsets into `buffer`): one
    plus the number of newline bytes before it. Reads the text block by block."""
    data = np.frombuffer(buffer, np.uint8)
    lines = np.empty(positions.size, np.int64)
    before = done = 0
    for start in range(0, data.size, BLOCK_BYTES):
        stop = min(data.size, start + BLOCK_BYTES)
        upto = int(np.searchsorted(positions, stop, side="left"))
        if upto > done:
            newlines = np.flatnonzero(data[start:stop] == NEWLINE) + start
            lines[done:upto] = 1 + before + np.searchsorted(newlines, positions[done:upto], side="left")
            before += newlines.size
        else:
            before += int(np.count_nonzero(data[start:stop] == NEWLINE))
        done = upto
        if done == positions.size:
            break
    return lines


def search(buffer, params: SearchParams, progress: Callable[[float], None] | None = None) -> SearchOutput:
    """The CPU backend: every pattern of `params` in `buffer` (bytes or an mmap), block by
    block; `progress(fraction)` is called between blocks (it may raise to cancel). Each
    result keeps the positions the search returns (params.positions_wanted: all, the
    first max_positions or none) and their lines; its count is every occurrence."""
    n = len(buffer)
    start_time = time.perf_counter()
    results = []
    total_steps = max(1, sum(-(-max(n - len(p) + 1, 0) // BLOCK_BYTES) for p in params.patterns))
    step = 0
    for pattern in params.patterns:
        m = len(pattern)
        parts = []
        for lo in range(0, max(n - m + 1, 0), BLOCK_BYTES):
            hi = min(lo + BLOCK_BYTES, n - m + 1)
            parts.append(find_all(buffer, pattern, lo, hi + m - 1))
            step += 1
            if progress is not None:
                progress(step / total_steps)
        found = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        positions = found[: params.positions_wanted]
        lines = None  # as the GPU's: None when no position is wanted (positions "none"), even with line numbers
        if params.line_numbers and params.positions_wanted != 0:
            lines = line_numbers(buffer, positions) if positions.size else np.zeros(0, np.int64)
        results.append(PatternResult(positions, lines, CPU_ALGORITHM, int(found.size)))
    elapsed = (time.perf_counter() - start_time) * 1000
    return SearchOutput(results, n, {"search": elapsed})


def brute_force(text: bytes, pattern: bytes) -> np.ndarray:
    """Every i with text[i:i + m] == pattern, by comparing at every position: the slowest
    and plainest definition, for tests."""
    m = len(pattern)
    return np.asarray([i for i in range(len(text) - m + 1) if text[i : i + m] == pattern], np.int64)
