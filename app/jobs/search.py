"""POST /jobs/search: every occurrence of 1 to 8 patterns in a stored corpus (`corpus_id`,
see app/corpora.py) or in a small inline text (`text` or `text_base64`).

Patterns are UTF-8 strings or {"base64": ...} objects (any bytes), 1 to 4096 bytes each.
Algorithms (gpu/search): Rabin-Karp, Knuth-Morris-Pratt, Boyer-Moore as CUDA kernels in
the chunked divide-and-conquer scheme, `naive` or `optimized`, the patterns on separate
streams, or one `fused` pass for all; `auto` picks per pattern by length and alphabet. On
the CPU backend every algorithm runs as CPython's bytes.find over an mmap of the text
(gpu/search/reference.py): the same positions.

The result, per pattern: the count, the first `max_positions` positions (0-based byte
offsets, overlapping occurrences included) and with `line_numbers` their 1-based lines;
with `positions: "files"` all of them in positions_<i>.npy (and lines_<i>.npy), with
`positions: "none"` counts only; times (GPU: upload, kernels, download; CPU: search) and
throughput in GB/s.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.config import Settings
from app.errors import ApiError
from app.jobs.kinds import JobKind, ResultModel, Submission, inline_schema, validation_detail
from app.jobs.requests import is_json, unsupported
from gpu import search
from gpu.search.params import (
    ALGORITHMS,
    DEFAULT_POSITIONS,
    GRANULARITY_MAX,
    MAX_PATTERNS,
    MAX_POSITIONS_LIMIT,
    MAX_STREAMS,
    POSITIONS,
    VARIANTS,
)

# Literal types of the choice tuples: pydantic reads the Literal at run time, mypy sees str.
if TYPE_CHECKING:
    AlgorithmName = str
    VariantName = str
    PositionsName = str
else:
    AlgorithmName = Literal[ALGORITHMS]
    VariantName = Literal[VARIANTS]
    PositionsName = Literal[POSITIONS]


class Base64Pattern(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    base64: str = Field(
        ..., description="the pattern's bytes in standard base64 (RFC 4648, padded)", examples=["AAECAw=="]
    )


class SearchRequest(BaseModel):
    # exactly one source of text (parse checks it; the schema says it)
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"oneOf": [{"required": [name]} for name in ("corpus_id", "text", "text_base64")]},
    )
    corpus_id: str | None = Field(None, description="a stored corpus (POST /corpora); or give `text` / `text_base64`")
    text: str | None = Field(None, description="a small text inline, as UTF-8 (at most PENCIL_MAX_SEARCH_TEXT_BYTES)")
    text_base64: str | None = Field(None, description="a small text inline, any bytes, base64")
    patterns: list[str | Base64Pattern] = Field(
        ...,
        min_length=1,
        max_length=MAX_PATTERNS,
        description='1 to 8 patterns, 1 to 4096 bytes each: a string (its UTF-8 bytes) or {"base64": ...}',
    )
    algorithm: AlgorithmName = Field(
        "auto",
        description=(
            "auto: per pattern, KMP for runs and up to 3 bytes, Rabin-Karp for long small-alphabet "
            "patterns, else Boyer-Moore"
        ),
    )
    variant: VariantName = Field(
        "optimized",
        description=(
            "naive: everything from global memory; optimized: pattern, tables and text tile in shared "
            "memory, 16-byte loads"
        ),
    )
    granularity: int | None = Field(
        None,
        ge=1,
        le=GRANULARITY_MAX["naive"],
        description=(
            f"start positions per GPU thread (optimized: at most {GRANULARITY_MAX['optimized']}, "
            "rounded up to an odd multiple of 16); default: by pattern length"
        ),
    )
    streams: int | None = Field(
        None,
        ge=1,
        le=MAX_STREAMS,
        description="CUDA streams the patterns are spread over (default: one per pattern, at most 4)",
    )
    max_positions: int = Field(
        1000,
        ge=0,
        le=MAX_POSITIONS_LIMIT,
        description="positions listed per pattern in the JSON result",
    )
    positions: PositionsName = Field(
        DEFAULT_POSITIONS,
        description=(
            "none: counts only (no position is written nor downloaded); json: the first max_positions of each "
            "pattern in the result; files: also every position in positions_<i>.npy (and lines_<i>.npy)"
        ),
    )
    line_numbers: bool = Field(False, description="also give the 1-based line of each position")
    fused: bool = Field(
        False, description="one pass over the text for all patterns (multi-pattern Rabin-Karp; optimized variant)"
    )


class PatternFound(ResultModel):
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


class SearchResult(ResultModel):
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


EXAMPLE = {
    "corpus_id": "3f2a9c0d4b5e6f708192a3b4c5d6e7f8",
    "patterns": ["the", "Boyer-Moore", {"base64": "AAECAw=="}],
    "algorithm": "auto",
    "variant": "optimized",
    "max_positions": 100,
    "positions": "json",
    "line_numbers": True,
}

OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": inline_schema(SearchRequest), "example": EXAMPLE}},
    },
    "responses": {
        "202": {
            "description": (
                "the job, queued; poll its Location. The result: {backend, source, corpus_id, text_bytes, "
                "algorithm, variant, fused, positions, resident, launch, "
                "patterns: [{index, pattern, pattern_base64, length, algorithm, count, positions, "
                "positions_truncated, positions_file, lines?, lines_file?}], "
                "times_ms: GPU {upload, kernels, download, total} or CPU {search, total}, "
                "throughput_gbps}; with positions: files, the files positions_<i>.npy (int64) and lines_<i>.npy"
            )
        },
        "404": {"description": "corpus_not_found: no corpus with that id"},
        "413": {
            "description": (
                "text_too_large: an inline text over PENCIL_MAX_SEARCH_TEXT_BYTES (store it with POST /corpora)"
            )
        },
    },
}


def _decode_base64(value: str, where: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(422, "invalid_parameter", f"{where}: not valid base64 ({exc})") from None


def _patterns(request: SearchRequest) -> list[bytes]:
    """The patterns' bytes. Strings are valid Unicode here: the JSON parser refuses lone
    surrogates (400), so bytes that are not UTF-8 come as base64."""
    out = []
    for i, pattern in enumerate(request.patterns):
        out.append(
            pattern.encode("utf-8")
            if isinstance(pattern, str)
            else _decode_base64(pattern.base64, f"patterns[{i}].base64")
        )
    return out


async def parse(request: Request, settings: Settings) -> Submission:
    if not is_json(request):
        raise unsupported(
            "send a JSON body (Content-Type: application/json) with `patterns` and a `corpus_id` or "
            "`text`; store large texts with POST /corpora"
        )
    body = await request.body()
    try:
        req = SearchRequest.model_validate_json(body)
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            raise ApiError(400, "bad_request", f"the body is not JSON: {exc.errors()[0]['msg']}") from None
        raise ApiError(422, "invalid_parameter", validation_detail(exc)) from None
    params = search.SearchParams(
        tuple(_patterns(req)),
        algorithm=req.algorithm,
        variant=req.variant,
        granularity=req.granularity,
        streams=req.streams,
        max_positions=req.max_positions,
        line_numbers=req.line_numbers,
        fused=req.fused,
        positions=req.positions,
    )
    sources = [name for name in ("corpus_id", "text", "text_base64") if getattr(req, name) is not None]
    if len(sources) != 1:
        raise ApiError(
            422,
            "invalid_parameter",
            f"give exactly one of corpus_id, text, text_base64 (got {', '.join(sources) or 'none'})",
        )
    if req.corpus_id is not None:
        corpus = request.app.state.corpora.get(req.corpus_id)
        if corpus is None:
            raise ApiError(404, "corpus_not_found", f"there is no corpus {req.corpus_id!r}; GET /corpora lists them")
        return Submission.of(
            search.SearchJob.on_corpus(params, search.Corpus(corpus.id, corpus.name, corpus.sha256, corpus.bytes))
        )
    text = req.text.encode("utf-8") if req.text is not None else _decode_base64(req.text_base64 or "", "text_base64")
    if len(text) > settings.max_search_text_bytes:
        raise ApiError(
            413,
            "text_too_large",
            (
                f"the inline text is {len(text):,} bytes; inline texts are limited to "
                f"{settings.max_search_text_bytes:,} (PENCIL_MAX_SEARCH_TEXT_BYTES): store it with POST "
                "/corpora and search its corpus_id"
            ),
        )
    return Submission.of(search.SearchJob.inline(params, text, sources[0]))


SEARCH = JobKind(
    name="search",
    summary="Exact search of 1 to 8 patterns in a corpus or text (Rabin-Karp, KMP, Boyer-Moore; fused)",
    parse=parse,
    job_type=search.SearchJob,
    run=search.run,
    openapi=OPENAPI,
    result_model=SearchResult,
)
