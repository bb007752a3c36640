"""POST /jobs/search: every occurrence of 1 to 8 patterns in a stored corpus (`corpus_id`,
see app/corpora.py) or in a small inline text (`text` or `text_base64`).

Patterns are UTF-8 strings or {"base64": ...} objects (any bytes), 1 to 4096 bytes each.
Algorithms (gpu/search): Rabin-Karp, Knuth-Morris-Pratt, Boyer-Moore as CUDA kernels in
the chunked divide-and-conquer scheme, `naive` or `optimized`, the patterns on separate
streams, or one `fused` pass for all; `auto` picks per pattern by length and alphabet. On
the CPU backend every algorithm runs as CPython's bytes.find over an mmap of the text
(gpu/search/reference.py): the same positions.

The result, per pattern: the count, the first `max_positions` positions (0-based byte
offsets, overlapping occurrences included) and with `line_numbers` their 1-based lines,
all of them in positions_<i>.npy (and lines_<i>.npy); times (GPU: upload, kernels,
download; CPU: search) and throughput in GB/s.
"""

from __future__ import annotations

import base64
import binascii
import mmap
import time
from typing import Any, Literal

import numpy as np
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.config import Settings
from app.corpora import corpus_text
from app.errors import ApiError
from app.jobs.kinds import JobContext, JobKind, Submission, inline_schema, validation_detail
from gpu.search import reference
from gpu.search.params import ALGORITHMS, GRANULARITY_MAX, MAX_PATTERNS, MAX_POSITIONS_LIMIT, MAX_STREAMS, VARIANTS, SearchParamError, SearchParams

TEXT_FILE = "text.bin"


class Base64Pattern(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    base64: str = Field(..., description="the pattern's bytes in standard base64 (RFC 4648, padded)", examples=["AAECAw=="])


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    corpus_id: str | None = Field(None, description="a stored corpus (POST /corpora); or give `text` / `text_base64`")
    text: str | None = Field(None, description="a small text inline, as UTF-8 (at most PENCIL_MAX_SEARCH_TEXT_BYTES)")
    text_base64: str | None = Field(None, description="a small text inline, any bytes, base64")
    patterns: list[str | Base64Pattern] = Field(..., min_length=1, max_length=MAX_PATTERNS, description="1 to 8 patterns, 1 to 4096 bytes each: a string (its UTF-8 bytes) or {\"base64\": ...}")
    algorithm: Literal[ALGORITHMS] = Field("auto", description="auto: per pattern, KMP for runs and up to 3 bytes, Rabin-Karp for long small-alphabet patterns, else Boyer-Moore")  # type: ignore[valid-type]
    variant: Literal[VARIANTS] = Field("optimized", description="naive: everything from global memory; optimized: pattern, tables and text tile in shared memory, 16-byte loads")  # type: ignore[valid-type]
    granularity: int | None = Field(None, ge=1, le=GRANULARITY_MAX["naive"], description=f"start positions per GPU thread (optimized: at most {GRANULARITY_MAX['optimized']}, rounded up to an odd multiple of 16); default: by pattern length")
    streams: int | None = Field(None, ge=1, le=MAX_STREAMS, description="CUDA streams the patterns are spread over (default: one per pattern, at most 4)")
    max_positions: int = Field(1000, ge=0, le=MAX_POSITIONS_LIMIT, description="positions listed per pattern in the JSON result (all of them are in positions_<i>.npy)")
    line_numbers: bool = Field(False, description="also give the 1-based line of each position")
    fused: bool = Field(False, description="one pass over the text for all patterns (multi-pattern Rabin-Karp; optimized variant)")


EXAMPLE = {"corpus_id": "3f2a9c0d4b5e6f708192a3b4c5d6e7f8", "patterns": ["the", "Boyer-Moore", {"base64": "AAECAw=="}], "algorithm": "auto", "variant": "optimized", "max_positions": 100, "line_numbers": True}

OPENAPI = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": inline_schema(SearchRequest), "example": EXAMPLE}}},
    "responses": {
        "202": {
            "description": (
                "the job, queued; poll its Location. The result: {backend, source, corpus_id, text_bytes, algorithm, variant, fused, resident, launch, "
                "patterns: [{index, pattern, pattern_base64, length, algorithm, count, positions, positions_truncated, positions_file, lines?, lines_file?}], "
                "times_ms: GPU {upload, kernels, download, total} or CPU {search, total}, throughput_gbps} and the files positions_<i>.npy (int64) and lines_<i>.npy"
            )
        },
        "404": {"description": "corpus_not_found: no corpus with that id"},
        "413": {"description": "text_too_large: an inline text over PENCIL_MAX_SEARCH_TEXT_BYTES (store it with POST /corpora)"},
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
        out.append(pattern.encode("utf-8") if isinstance(pattern, str) else _decode_base64(pattern.base64, f"patterns[{i}].base64"))
    return out


async def parse(request: Request, settings: Settings) -> Submission:
    if not request.headers.get("content-type", "").lower().startswith("application/json"):
        raise ApiError(415, "unsupported_media_type", "send a JSON body (Content-Type: application/json) with `patterns` and a `corpus_id` or `text`; store large texts with POST /corpora")
    body = await request.body()
    try:
        req = SearchRequest.model_validate_json(body)
    except ValidationError as exc:
        if any(error["type"] == "json_invalid" for error in exc.errors()):
            raise ApiError(400, "bad_request", f"the body is not JSON: {exc.errors()[0]['msg']}") from None
        raise ApiError(422, "invalid_parameter", validation_detail(exc)) from None
    patterns = _patterns(req)
    try:
        params = SearchParams(tuple(patterns), algorithm=req.algorithm, variant=req.variant, granularity=req.granularity, streams=req.streams,
                              max_positions=req.max_positions, line_numbers=req.line_numbers, fused=req.fused)
    except SearchParamError as exc:
        raise ApiError(422, "invalid_parameter", str(exc)) from None
    sources = [name for name in ("corpus_id", "text", "text_base64") if getattr(req, name) is not None]
    if len(sources) != 1:
        raise ApiError(422, "invalid_parameter", f"give exactly one of corpus_id, text, text_base64 (got {', '.join(sources) or 'none'})")
    stored = {
        "patterns": [base64.b64encode(p).decode() for p in params.patterns],
        "algorithm": params.algorithm, "variant": params.variant, "granularity": params.granularity, "streams": params.streams,
        "max_positions": params.max_positions, "line_numbers": params.line_numbers, "fused": params.fused,
    }
    if req.corpus_id is not None:
        corpus = request.app.state.corpora.get(req.corpus_id)
        if corpus is None:
            raise ApiError(404, "corpus_not_found", f"there is no corpus {req.corpus_id!r}; GET /corpora lists them")
        return Submission({"source": "corpus", "corpus_id": corpus.id, "corpus_name": corpus.name, "corpus_sha256": corpus.sha256, "text_bytes": corpus.bytes, **stored})
    text = req.text.encode("utf-8") if req.text is not None else _decode_base64(req.text_base64, "text_base64")
    if not text:
        raise ApiError(422, "invalid_parameter", f"{sources[0]}: the text is empty")
    if len(text) > settings.max_search_text_bytes:
        raise ApiError(413, "text_too_large", f"the inline text is {len(text):,} bytes; inline texts are limited to {settings.max_search_text_bytes:,} (PENCIL_MAX_SEARCH_TEXT_BYTES): store it with POST /corpora and search its corpus_id")
    return Submission({"source": "text", "corpus_id": None, "text_bytes": len(text), **stored}, {TEXT_FILE: text})


# --------------------------------------------------------------------- running --


def _params(stored: dict[str, Any]) -> SearchParams:
    return SearchParams(tuple(base64.b64decode(p) for p in stored["patterns"]), algorithm=stored["algorithm"], variant=stored["variant"],
                        granularity=stored["granularity"], streams=stored["streams"], max_positions=stored["max_positions"],
                        line_numbers=stored["line_numbers"], fused=stored["fused"])


def _display(pattern: bytes) -> str | None:
    try:
        return pattern.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _rate(n: int, ms: float) -> float | None:
    return round(n / (ms / 1000) / 1e9, 3) if ms > 0 else None


def run(ctx: JobContext) -> dict[str, Any]:
    stored = ctx.job.params
    params = _params(stored)
    n = stored["text_bytes"]
    if stored["source"] == "corpus":
        path = corpus_text(ctx.data_dir, stored["corpus_id"])
        if not path.is_file() or path.stat().st_size != n:
            raise RuntimeError(f"corpus {stored['corpus_id']} was deleted or changed after this job was submitted")
    else:
        path = ctx.inputs / TEXT_FILE
    ctx.progress(0.02)
    start = time.perf_counter()
    if ctx.lease is None:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as text:
            output = reference.search(text, params, progress=lambda f: ctx.progress(0.02 + 0.88 * f))
    else:
        from gpu.search import cuda

        key = (stored["corpus_id"], stored["corpus_sha256"]) if stored["source"] == "corpus" else None
        output = cuda.search_file(ctx.lease, path, n, params, key=key, progress=ctx.progress)
    total_ms = (time.perf_counter() - start) * 1000
    ctx.progress(0.92)
    patterns = []
    for i, (pattern, found) in enumerate(zip(params.patterns, output.patterns, strict=True)):
        np.save(ctx.results / f"positions_{i}.npy", found.positions)
        entry = {
            "index": i, "pattern": _display(pattern), "pattern_base64": stored["patterns"][i], "length": len(pattern), "algorithm": found.algorithm,
            "count": int(found.positions.size), "positions": found.positions[:params.max_positions].tolist(),
            "positions_truncated": bool(found.positions.size > params.max_positions), "positions_file": f"positions_{i}.npy",
        }
        if found.lines is not None:
            np.save(ctx.results / f"lines_{i}.npy", found.lines)
            entry["lines"] = found.lines[:params.max_positions].tolist()
            entry["lines_file"] = f"lines_{i}.npy"
        patterns.append(entry)
    times = {**output.times_ms, "total": total_ms}
    compute = "kernels" if "kernels" in times else "search"
    return {
        "backend": ctx.backend, "source": stored["source"], "corpus_id": stored["corpus_id"], "text_bytes": n,
        "algorithm": params.algorithm, "variant": params.variant, "fused": params.fused, "resident": output.resident, "launch": output.launch or None,
        "patterns": patterns,
        "times_ms": {key: round(value, 3) for key, value in times.items()},
        "throughput_gbps": {compute: _rate(n, times[compute]), "end_to_end": _rate(n, total_ms)},
    }


SEARCH = JobKind(name="search", summary="Exact search of 1 to 8 patterns in a corpus or text (Rabin-Karp, KMP, Boyer-Moore; fused)", parse=parse, run=run, openapi=OPENAPI)
