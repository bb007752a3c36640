"""Parameters of the exact string search, validated once, and the launch plan both
backends agree on.

`SearchParams` says what to find (1..8 patterns of 1..4096 bytes each) and how: the
algorithm (Rabin-Karp, Knuth-Morris-Pratt, Boyer-Moore, or `auto`, which picks one per
pattern by its length and alphabet), the kernel variant (`naive`: everything read from
global memory; `optimized`: pattern and tables in shared memory, the block's text staged
there with 16-byte loads), the chunking (`granularity`: start positions per GPU thread,
each thread also reading pattern_length - 1 bytes past its chunk), how many CUDA streams
the patterns are spread over, or `fused`: one pass over the text for all patterns.
None of these choices changes the answer: every backend and every choice gives the same
positions, every (overlapping) occurrence, in increasing order.

`plan_launch` turns a request into the geometry of the GPU kernels (bytes per thread,
threads per block, position slots per block): pure arithmetic, tested on the CPU.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args

import numpy as np
from pydantic import BeforeValidator, Field

from gpu.errors import InputError, ParamError
from gpu.spec import JobSpec, Result, spec

MAX_PATTERNS = 8
MAX_PATTERN_BYTES = 4096
Algorithm = Literal["auto", "rabin_karp", "kmp", "boyer_moore"]
Variant = Literal["naive", "optimized"]
Positions = Literal["none", "json", "files"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
KERNEL_ALGORITHMS = ALGORITHMS[1:]
VARIANTS: tuple[str, ...] = get_args(Variant)
MAX_STREAMS = 8
MAX_POSITIONS_LIMIT = 100_000  # positions listed per pattern in a JSON result
POSITIONS: tuple[str, ...] = get_args(Positions)
DEFAULT_POSITIONS: Final = "json"
STORED_POSITIONS = "files"  # what a job stored before the option existed did
GRANULARITY_MIN = 1
GRANULARITY_MAX = {"naive": 65536, "optimized": 2048}

# Rabin-Karp: polynomial hash modulo 2^32 (the natural overflow of 32-bit arithmetic: no
# division per byte, unlike the report's prime modulus 101) with an odd base, so that
# every byte of the window counts (base 256 modulo 2^32 would keep only the last 4 bytes).
RK_BASE = 16777619
RK_MASK = 0xFFFFFFFF

# Launch geometry of the kernels (gpu/search/search.cu mirrors these).
THREADS = 256  # threads per block, at most
TILE_BYTES = 48 * 1024  # start positions one block of the optimized kernels covers, at most
SLOTS_MAX = 256  # matches a block keeps for the write pass without scanning its text again
OPTIMIZED_ALIGN = 16  # bytes per shared-memory load of the optimized kernels
FUSED_PREFIX_MAX = 4  # bytes of each pattern's prefix the fused filter hashes

# `auto`: a priori thresholds (bench/search.py prints every algorithm, to revisit them).
AUTO_RUN_ALPHABET = 1  # a run of one byte: KMP (linear in the worst case; BM and RK verify m bytes per position)
AUTO_SMALL_ALPHABET = 4  # DNA-like: Rabin-Karp (bad-character shifts are short, a first-byte skip loop rarely skips)
AUTO_SHORT_PATTERN = 3  # up to this length: KMP, whose first-byte skip loop is a vectorised memchr
AUTO_ALPHABET_EVIDENCE = 8  # a pattern this long with few distinct bytes suggests a small alphabet


@spec
class SearchOptions:
    """How to search (every choice gives the same positions); validated on construction."""

    algorithm: Algorithm = Field(
        default="auto",
        description=(
            "auto: per pattern, KMP for runs and up to 3 bytes, Rabin-Karp for long small-alphabet "
            "patterns, else Boyer-Moore"
        ),
    )
    variant: Variant = Field(
        default="optimized",
        description=(
            "naive: everything from global memory; optimized: pattern, tables and text tile in shared "
            "memory, 16-byte loads"
        ),
    )
    granularity: int | None = Field(
        default=None,
        ge=GRANULARITY_MIN,
        le=GRANULARITY_MAX["naive"],
        description=(
            f"start positions per GPU thread (optimized: at most {GRANULARITY_MAX['optimized']}, "
            "rounded up to an odd multiple of 16); default: by pattern length"
        ),
    )
    streams: int | None = Field(
        default=None,
        ge=1,
        le=MAX_STREAMS,
        description="CUDA streams the patterns are spread over (default: one per pattern, at most 4)",
    )
    max_positions: int = Field(
        default=1000, ge=0, le=MAX_POSITIONS_LIMIT, description="positions listed per pattern in the JSON result"
    )
    positions: Positions = Field(
        default=DEFAULT_POSITIONS,
        description=(
            "none: counts only (no position is written nor downloaded); json: the first max_positions of each "
            "pattern in the result; files: also every position in positions_<i>.npy (and lines_<i>.npy)"
        ),
    )
    line_numbers: bool = Field(default=False, description="also give the 1-based line of each position")
    fused: bool = Field(
        default=False,
        description="one pass over the text for all patterns (multi-pattern Rabin-Karp; optimized variant)",
    )

    def __post_init__(self) -> None:
        if self.granularity is not None and self.granularity > GRANULARITY_MAX[self.variant]:
            raise ParamError(
                "granularity", f"must be <= {GRANULARITY_MAX[self.variant]} for {self.variant}; got {self.granularity}"
            )
        if self.fused:
            if self.algorithm not in ("auto", "rabin_karp"):
                raise ParamError(
                    "fused",
                    "the fused pass is a multi-pattern Rabin-Karp; use algorithm auto or rabin_karp, not "
                    f"{self.algorithm}",
                )
            if self.variant != "optimized":
                raise ParamError(
                    "fused",
                    "the fused pass keeps every pattern and its hash filter in shared memory: it exists as the "
                    "optimized variant only",
                )


# bytes, or a bytearray taken as its bytes (a str is no pattern: its encoding is the caller's choice)
Pattern = Annotated[
    bytes,
    BeforeValidator(lambda value: bytes(value) if isinstance(value, bytearray) else value),
    Field(min_length=1, max_length=MAX_PATTERN_BYTES),
]


@spec
class SearchParams(SearchOptions):
    """One search: what to find (1..MAX_PATTERNS byte strings of 1..MAX_PATTERN_BYTES bytes,
    a list or tuple of bytes or bytearrays) and how (SearchOptions)."""

    _: KW_ONLY
    patterns: tuple[Pattern, ...] = Field(strict=False, min_length=1, max_length=MAX_PATTERNS)

    @property
    def positions_wanted(self) -> int | None:
        """Positions of each pattern a search must bring back: all (None), the first
        max_positions, or none (0)."""
        return {"none": 0, "json": self.max_positions, "files": None}[self.positions]

    @property
    def stream_count(self) -> int:
        """Streams the separate passes are spread over (1 for a fused pass)."""
        if self.fused:
            return 1
        return self.streams if self.streams is not None else min(len(self.patterns), 4)

    def algorithm_for(self, pattern: bytes) -> str:
        """The kernel algorithm that runs `pattern` ("rabin_karp" for every pattern of a fused pass)."""
        if self.fused:
            return "rabin_karp"
        return choose_algorithm(pattern) if self.algorithm == "auto" else self.algorithm


TEXT_FILE = "text.bin"  # an inline text, stored with the job
CORPUS_FILE = "corpus"  # the text of a stored corpus, as the job system hands it over


@dataclass(frozen=True)
class Corpus:
    """A stored corpus a job searches: its id, name, SHA-256 (hex) and size in bytes."""

    id: str
    name: str | None
    sha256: str
    bytes: int


@dataclass(frozen=True)
class SearchJob:
    """One search job: what to find (`params`) in `text_bytes` bytes of text, either a
    stored `corpus` or an inline text (`text` at submission, stored with the job as
    TEXT_FILE). Once stored, `path` is the file to read. Build with `inline` or `on_corpus`."""

    params: SearchParams
    text_bytes: int
    corpus: Corpus | None = None
    text: bytes | None = field(default=None, repr=False)
    path: Path | None = None

    @classmethod
    def inline(
        cls, params: SearchParams, text: bytes, field_name: str = "text", max_bytes: int | None = None
    ) -> SearchJob:
        """A search of a text sent with the request, at most `max_bytes` long."""
        if not text:
            raise ParamError(field_name, "the text is empty")
        if max_bytes is not None and len(text) > max_bytes:
            raise InputError(
                "text_too_large",
                (
                    f"the inline text is {len(text):,} bytes; inline texts are limited to {max_bytes:,} "
                    "(PENCIL_MAX_SEARCH_TEXT_BYTES): store it with POST /corpora and search its corpus_id"
                ),
            )
        return cls(params, len(text), text=text)

    @classmethod
    def on_corpus(cls, params: SearchParams, corpus: Corpus) -> SearchJob:
        return cls(params, corpus.bytes, corpus=corpus)

    def to_json(self) -> dict[str, Any]:
        """What the job store keeps: patterns as base64, the options, the text's source."""
        p = self.params
        stored = {
            "patterns": [base64.b64encode(pattern).decode() for pattern in p.patterns],
            "algorithm": p.algorithm,
            "variant": p.variant,
            "granularity": p.granularity,
            "streams": p.streams,
            "max_positions": p.max_positions,
            "line_numbers": p.line_numbers,
            "fused": p.fused,
            "positions": p.positions,
        }
        if self.corpus is not None:
            c = self.corpus
            return {
                "source": "corpus",
                "corpus_id": c.id,
                "corpus_name": c.name,
                "corpus_sha256": c.sha256,
                "text_bytes": c.bytes,
                **stored,
            }
        return {"source": "text", "corpus_id": None, "text_bytes": self.text_bytes, **stored}

    def input_files(self) -> dict[str, bytes]:
        return {TEXT_FILE: self.text} if self.text is not None else {}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], files: Mapping[str, Path]) -> SearchJob:
        """The stored job, reading its text from files[TEXT_FILE] or, for a corpus,
        files[CORPUS_FILE]. RuntimeError when the corpus was deleted or changed since."""
        params = SearchParams(
            patterns=tuple(base64.b64decode(p) for p in stored["patterns"]),
            algorithm=stored["algorithm"],
            variant=stored["variant"],
            granularity=stored["granularity"],
            streams=stored["streams"],
            max_positions=stored["max_positions"],
            line_numbers=stored["line_numbers"],
            fused=stored["fused"],
            positions=stored.get("positions", STORED_POSITIONS),
        )
        n = stored["text_bytes"]
        if stored["source"] != "corpus":
            return cls(params, n, path=files[TEXT_FILE])
        path = files.get(CORPUS_FILE)
        if path is None or not path.is_file() or path.stat().st_size != n:
            raise RuntimeError(f"corpus {stored['corpus_id']} was deleted or changed after this job was submitted")
        return cls(
            params,
            n,
            corpus=Corpus(stored["corpus_id"], stored.get("corpus_name"), stored["corpus_sha256"], n),
            path=path,
        )


def choose_algorithm(pattern: bytes) -> str:
    """What `auto` runs for `pattern`: by its alphabet (distinct bytes) and its length.

    - one distinct byte (a run, "aaaa"): KMP, linear even when every position matches;
    - up to 3 bytes: KMP (its skip loop is a 16-bytes-at-a-time search for the first byte);
    - at least 8 bytes over at most 4 distinct ones (DNA-like): Rabin-Karp, whose cost
      does not depend on the alphabet (Boyer-Moore's bad-character shifts are short on a
      small alphabet, and KMP's first-byte skip loop stops at a quarter of the bytes);
    - otherwise Boyer-Moore, which skips up to the pattern length per comparison.
    """
    distinct = len(set(pattern))
    if distinct <= AUTO_RUN_ALPHABET or len(pattern) <= AUTO_SHORT_PATTERN:
        return "kmp"
    if distinct <= AUTO_SMALL_ALPHABET and len(pattern) >= AUTO_ALPHABET_EVIDENCE:
        return "rabin_karp"
    return "boyer_moore"


# ------------------------------------------------------------------ launch plan --


@dataclass(frozen=True)
class Launch:
    """Geometry of one kernel pass.

    granularity: start positions per thread (the optimized variant rounds the request up
    to an odd multiple of 16: its shared-memory reads are 16 bytes wide, and an odd
    stride of 16-byte words puts the 8 threads of a quarter-warp on distinct banks).
    threads: threads per block (a multiple of 32). slots: positions per block that the
    count pass keeps so that the write pass need not scan the block's text again.
    """

    granularity: int
    threads: int
    slots: int
    block_positions: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_positions", self.granularity * self.threads)

    def blocks(self, positions: int) -> int:
        """Blocks that cover `positions` start positions (at least 1)."""
        return max(1, -(-positions // self.block_positions))


def odd_multiple_of_16(value: int) -> int:
    """The least odd multiple of 16 that is >= value (value >= 1)."""
    q = -(-value // OPTIMIZED_ALIGN)
    return OPTIMIZED_ALIGN * (q if q % 2 else q + 1)


def default_granularity(variant: str, algorithm: str, pattern_length: int, fused: bool = False) -> int:
    """Start positions per thread when the request does not say.

    A thread of Rabin-Karp or KMP reads its chunk plus pattern_length - 1 bytes, so their
    chunks grow with the pattern (4 m: at most 25 % extra reads); Boyer-Moore jumps to its
    first window without reading the overlap, so a small chunk keeps more threads busy
    (it grows with long patterns only so that a block's text outweighs the pattern and
    tables it stages). The fused scan works by warps, whatever the chunk: 176 makes the
    fewest blocks for its prefix sums and write pass without costing its count kernel
    occupancy (BENCHMARKS.md, "Search"). The naive variant uses the report's ~1000 bytes.
    """
    if variant == "naive":
        return max(1024, 2 * pattern_length)
    if fused:
        return 176
    if algorithm == "boyer_moore":  # a block also stages m - 1 overlap bytes and ~3m of pattern and tables
        return max(48, pattern_length // 32)
    return min(GRANULARITY_MAX["optimized"], max(112, 4 * pattern_length))


def plan_launch(params: SearchParams, algorithm: str, pattern_length: int) -> Launch:
    """The launch of one pass: of one pattern of `pattern_length` bytes running
    `algorithm`, or, for a fused pass, of all patterns (pattern_length: the longest)."""
    g = (
        params.granularity
        if params.granularity is not None
        else default_granularity(params.variant, algorithm, pattern_length, params.fused)
    )
    threads = THREADS
    if params.variant == "optimized":
        g = odd_multiple_of_16(g)
        if THREADS * g > TILE_BYTES:
            threads = max(32, TILE_BYTES // g // 32 * 32)
    block = threads * g
    slots = min(SLOTS_MAX, max(16, block // 32))
    return Launch(g, threads, slots)


READ_MARGIN = 16  # bytes a block may read past its last window: the optimized tile's 16-byte loads round up


def blocks_ready(uploaded: int, n: int, launch: Launch, m_max: int, blocks: int) -> int:
    """How many leading logical blocks of a pass can be counted once the first `uploaded`
    of the text's n bytes are on the device: block b owns start positions [b B, (b + 1) B)
    (B = launch.block_positions) and reads their windows, up to (b + 1) B + m_max - 1
    bytes, plus READ_MARGIN. Every block (`blocks`) once the text is complete. A match
    across the edge of an upload belongs to the block it starts in, which waits for it."""
    if uploaded >= n:
        return blocks
    return max(0, min(blocks, (uploaded - (m_max - 1) - READ_MARGIN) // launch.block_positions))


# ------------------------------------------------------------------ results --


@dataclass
class PatternResult:
    """One pattern's answer: its start positions (int64, increasing, overlapping
    occurrences included): all of them, or the first ones only when the search was asked
    for fewer (SearchParams.positions_wanted); the 1-based line of each (int64) when
    asked; the algorithm that ran; and `count`, every occurrence (None: positions.size)."""

    positions: np.ndarray
    lines: np.ndarray | None
    algorithm: str
    count: int | None = None

    def __post_init__(self) -> None:
        if self.count is None:
            self.count = int(self.positions.size)


@dataclass
class SearchOutput:
    """A whole search: per pattern results, the text's size in bytes, times in ms
    (keys upload, kernels, download on the GPU; search on the CPU), whether the text
    was already resident in device memory (None on the CPU), and the launch used."""

    patterns: list[PatternResult]
    text_bytes: int
    times_ms: dict[str, float]
    resident: bool | None = None
    launch: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------- the job's contract --


@spec
class Base64Pattern:
    base64: str = Field(description="the pattern's bytes in standard base64 (RFC 4648, padded)", examples=["AAECAw=="])


SOURCES = ("corpus_id", "text", "text_base64")


@spec
class SearchRequest(SearchOptions):
    """A search request: the patterns, the options and exactly one source of text."""

    __schema_extra__ = {"oneOf": [{"required": [name]} for name in SOURCES]}
    _: KW_ONLY
    corpus_id: str | None = Field(
        default=None, description="a stored corpus (POST /corpora); or give `text` / `text_base64`"
    )
    text: str | None = Field(
        default=None, description="a small text inline, as UTF-8 (at most PENCIL_MAX_SEARCH_TEXT_BYTES)"
    )
    text_base64: str | None = Field(default=None, description="a small text inline, any bytes, base64")
    patterns: list[str | Base64Pattern] = Field(
        min_length=1,
        max_length=MAX_PATTERNS,
        description='1 to 8 patterns, 1 to 4096 bytes each: a string (its UTF-8 bytes) or {"base64": ...}',
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [name for name in SOURCES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ParamError("", f"give exactly one of {', '.join(SOURCES)} (got {', '.join(given) or 'none'})")

    @property
    def source(self) -> str:
        """Which of SOURCES the request gives."""
        return next(name for name in SOURCES if getattr(self, name) is not None)

    def params(self) -> SearchParams:
        """The search's parameters, the patterns as bytes. Strings are valid Unicode here (a
        JSON parser refuses lone surrogates), so bytes that are not UTF-8 come as base64."""
        patterns = [
            p.encode("utf-8") if isinstance(p, str) else decode_base64(p.base64, f"patterns[{i}].base64")
            for i, p in enumerate(self.patterns)
        ]
        options = {name: getattr(self, name) for name in SearchOptions.__dataclass_fields__}
        return SearchParams(patterns=tuple(patterns), **options)

    def inline_text(self) -> bytes:
        """The bytes of an inline `text` or `text_base64`."""
        if self.text is not None:
            return self.text.encode("utf-8")
        return decode_base64(self.text_base64 or "", "text_base64")


def decode_base64(value: str, field_name: str) -> bytes:
    """Standard base64 (RFC 4648, padded) or ParamError naming `field_name`."""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ParamError(field_name, f"not valid base64 ({exc})") from None


class PatternFound(Result):
    index: int
    pattern: str | None = Field(description="the pattern as text; null when its bytes are not UTF-8")
    pattern_base64: str
    length: int = Field(description="bytes")
    algorithm: str = Field(description="the algorithm that ran for it")
    count: int = Field(description="occurrences, overlapping ones included")
    positions: list[int] = Field(description="the first max_positions 0-based byte offsets (none with positions: none)")
    positions_truncated: bool = Field(description="more occurrences than listed")
    positions_file: str | None = Field(
        description="with positions: files, all of them: positions_<i>.npy (int64); else null"
    )
    lines: list[int] | None = Field(None, description="with line_numbers: the 1-based line of each listed position")
    lines_file: str | None = Field(None, description="with line_numbers and positions: files: lines_<i>.npy")


class SearchResult(Result):
    backend: str
    source: Literal["corpus", "text"]
    corpus_id: str | None
    text_bytes: int
    algorithm: str
    variant: str
    fused: bool
    positions: str = Field(description="what was returned of the positions: none, json or files")
    resident: bool | None = Field(description="the corpus was already on the device (GPU; null on the CPU)")
    launch: dict[str, Any] | list[Any] | None = Field(description="the kernels' launch geometry (GPU)")
    patterns: list[PatternFound]
    times_ms: dict[str, float] = Field(description="GPU: upload, kernels, download; CPU: search; and total")
    throughput_gbps: dict[str, float | None]


SEARCH_SPEC = JobSpec(
    name="search",
    summary="Exact search of 1 to 8 patterns in a corpus or text (Rabin-Karp, KMP, Boyer-Moore; fused)",
    body=SearchRequest,
    options=None,
    files=(),
    result=SearchResult,
    example={
        "corpus_id": "3f2a9c0d4b5e6f708192a3b4c5d6e7f8",
        "patterns": ["the", "Boyer-Moore", {"base64": "AAECAw=="}],
        "algorithm": "auto",
        "variant": "optimized",
        "max_positions": 100,
        "positions": "json",
        "line_numbers": True,
    },
    result_files="positions_<i>.npy (int64) and lines_<i>.npy with positions: files",
)
