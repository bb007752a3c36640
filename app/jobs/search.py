"""POST /jobs/search: every occurrence of 1 to 8 patterns in a stored corpus (`corpus_id`,
see app/corpora.py) or in a small inline text (`text` or `text_base64`). What it takes and
gives is gpu/search/params.py's SEARCH_SPEC; the search itself is gpu.search's front door
(CUDA kernels on a GPU, CPython's bytes.find over an mmap of the text on the CPU: the same
positions).
"""

from __future__ import annotations

from fastapi import Request

from app.config import Settings
from app.errors import ApiError
from app.jobs.requests import receive
from app.jobs.route import JobRoute
from gpu import search
from gpu.search.params import SEARCH_SPEC
from jobs.kinds import JobKind, Submission

RESPONSES = {
    "404": {"description": "corpus_not_found: no corpus with that id"},
    "413": {
        "description": "text_too_large: an inline text over PENCIL_MAX_SEARCH_TEXT_BYTES (store it with POST /corpora)"
    },
}


async def parse(request: Request, settings: Settings) -> Submission:
    body = (await receive(request, SEARCH_SPEC)).body
    params = body.params()
    if body.corpus_id is None:
        return Submission.of(
            search.SearchJob.inline(params, body.inline_text(), body.source, settings.max_search_text_bytes)
        )
    corpus = request.app.state.corpora.get(body.corpus_id)
    if corpus is None:
        raise ApiError(404, "corpus_not_found", f"there is no corpus {body.corpus_id!r}; GET /corpora lists them")
    return Submission.of(
        search.SearchJob.on_corpus(params, search.Corpus(corpus.id, corpus.name, corpus.sha256, corpus.bytes))
    )


SEARCH = JobRoute(JobKind(SEARCH_SPEC.name, search.SearchJob, search.run), SEARCH_SPEC, parse, RESPONSES)
