"""The texts and patterns the string-search tests run on, shared by the reference tests
(CPU) and the CUDA tests (GPU): every case the issue lists, made fresh from a seed.

    english         real English prose: the Python Language Reference's topics shipped
                    with CPython (pydoc_data.topics) and the Zen of Python
    random_bytes    uniformly random bytes
    dna             a 4-letter alphabet
    runs            long runs of one byte ("aaaa" in "aaaaaaa": overlapping matches)
    boundaries      a pattern straddling every chunk boundary at every offset
    long_pattern    patterns longer than the chunk (granularity)
    longer_than_text / equal_to_text
    utf8            non-ASCII UTF-8 (accents, CJK, emoji)
    nul_bytes       binary with NUL bytes

Each case is (text, patterns, granularity or None); the granularity, when given, is the
one the case is built for (chunk boundaries at its multiples). CASE_NAMES: their names,
for the tests to parametrize over.
"""

from __future__ import annotations

import contextlib
import io
from functools import lru_cache

import numpy as np

CASE_NAMES = (
    "english",
    "random_bytes",
    "dna",
    "runs",
    "boundaries",
    "long_pattern",
    "longer_than_text",
    "equal_to_text",
    "utf8",
    "nul_bytes",
)


@lru_cache(maxsize=1)
def english_source() -> bytes:
    """About 0.5 MB of real English: CPython's pydoc topics and the Zen of Python."""
    from pydoc_data.topics import topics

    with contextlib.redirect_stdout(io.StringIO()):
        import this
    zen = "".join(this.d.get(c, c) for c in this.s)
    return (zen + "\n" + "\n".join(topics[k] for k in sorted(topics))).encode("utf-8")


def english(size: int, rng: np.random.Generator) -> bytes:
    """`size` bytes of English from a random place of the source (repeated if needed)."""
    source = english_source()
    start = int(rng.integers(0, len(source)))
    out = (source[start:] + source) * (1 + size // len(source))
    return out[:size]


def _pick(text: bytes, length: int, rng: np.random.Generator) -> bytes:
    start = int(rng.integers(0, len(text) - length + 1))
    return text[start : start + length]


def boundary_text(granularity: int, m: int, size: int, rng: np.random.Generator) -> tuple[bytes, bytes]:
    """Random bytes in which a pattern of m bytes starts d bytes before the chunk boundary
    k * granularity for k = 1, 2, ..., d cycling through 0 .. m - 1 (so every way of
    straddling a boundary occurs), as far as the occurrences do not overlap."""
    pattern = bytes(rng.integers(0, 256, m, dtype=np.uint8))
    text = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    last_end = 0
    for k in range(1, size // granularity + 1):
        start = k * granularity - (k - 1) % m
        if start >= last_end and start + m <= size:
            text[start : start + m] = pattern
            last_end = start + m
    return bytes(text), pattern


def cases(rng: np.random.Generator, size: int = 24_000) -> dict[str, tuple[bytes, list[bytes], int | None]]:
    """name -> (text, patterns (1..8), granularity the case is built for or None)."""
    eng = english(size, rng)
    rnd = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    dna = bytes(np.frombuffer(b"ACGT", np.uint8)[rng.integers(0, 4, size)])
    runs = b"a" * (size // 2) + b"b" + b"a" * 37 + b"ab" * 100 + b"a" * (size // 4)
    bound80, pat16 = boundary_text(80, 16, size, rng)
    utf8 = ("naïve café — 日本語のテキスト, emoji 😀🚀; Ελληνικά, русский, עברית.\n" * (size // 120)).encode("utf-8")
    nul = bytearray(rng.integers(0, 4, size, dtype=np.uint8).tobytes())  # mostly 0..3: NUL-heavy
    nul[100:108] = b"\0" * 8
    nul = bytes(nul)
    built = {
        "english": (
            eng,
            [
                b"the ",
                b"e",
                _pick(eng, 16, rng),
                _pick(eng, 64, rng),
                _pick(eng, 257, rng),
                b"Python",
                b"zzqx not there",
            ],
            None,
        ),
        "random_bytes": (
            rnd,
            [
                _pick(rnd, 1, rng),
                _pick(rnd, 2, rng),
                _pick(rnd, 5, rng),
                _pick(rnd, 33, rng),
                _pick(rnd, 300, rng),
                bytes(rng.integers(0, 256, 6, dtype=np.uint8)),
            ],
            None,
        ),
        "dna": (dna, [b"A", b"AC", b"ACGT", _pick(dna, 12, rng), _pick(dna, 40, rng), b"AAAA"], None),
        "runs": (runs, [b"a", b"aaaa", b"a" * 100, b"ab", b"ba", b"aab", b"a" * 1000], None),
        "boundaries": (bound80, [pat16, pat16[:5], pat16[-7:]], 80),
        "long_pattern": (eng, [_pick(eng, 100, rng), _pick(eng, 1500, rng), _pick(eng, 4096, rng)], 16),
        "longer_than_text": (eng[:50], [eng[:60], eng[:51] + b"x", b"the"], None),
        "equal_to_text": (eng[:4096], [eng[:4096], eng[:4095], eng[1:4096]], None),
        "utf8": (
            utf8,
            [
                "日本".encode(),
                "é".encode(),
                "😀".encode(),
                "emoji 😀🚀; Ελ".encode(),
                "русский, עברית.\nnaïve".encode(),
            ],
            None,
        ),
        "nul_bytes": (nul, [b"\0", b"\0\0", b"\0\x01\0", b"\0" * 8, b"\x03\0\x03"], None),
    }
    assert tuple(built) == CASE_NAMES, "CASE_NAMES names every case, in order"
    return built
