"""gpu.search's front door on the CPU: inline texts and stored corpora as the service keeps
them, every occurrence found, positions and lines in the files and the summary."""

from __future__ import annotations

import numpy as np
import pytest
import search_cases

from gpu import search
from gpu.errors import ParamError
from gpu.search.params import CORPUS_FILE
from gpu.search.reference import brute_force
from tests.gpu.jobkit import stored_and_back, written


def test_an_inline_text_round_trips_and_every_occurrence_is_found(tmp_path, rng):
    text = search_cases.english(20_000, rng)
    patterns = (b"the", text[5000:5012], b"\xff\xfe no such bytes")
    params = search.SearchParams(patterns=patterns, max_positions=5, line_numbers=True, positions="files")
    job = stored_and_back(search.SearchJob.inline(params, text), tmp_path / "in")
    assert job.to_json()["source"] == "text" and job.text_bytes == len(text)
    result = search.run(job)
    files = written(result, tmp_path / "out")
    for i, pattern in enumerate(patterns):
        expected = brute_force(text, pattern)
        entry = result.summary["patterns"][i]
        np.testing.assert_array_equal(np.load(files[f"positions_{i}.npy"]), expected)
        assert entry["count"] == expected.size and entry["positions"] == expected[:5].tolist()
        assert entry["positions_truncated"] == (expected.size > 5)
        lines = np.load(files[f"lines_{i}.npy"])
        assert lines.tolist() == [text.count(b"\n", 0, p) + 1 for p in expected]
    assert result.summary["patterns"][2]["pattern"] is None  # not UTF-8: only its base64
    assert result.summary["backend"] == "cpu" and set(result.summary["times_ms"]) == {"search", "total"}


def test_a_corpus_job_reads_the_corpus_file_and_notices_a_change(tmp_path, rng):
    text = search_cases.english(5000, rng)
    corpus_file = tmp_path / "text.bin"
    corpus_file.write_bytes(text)
    corpus = search.Corpus("c0ffee", "prose.txt", "ab" * 32, len(text))
    job = search.SearchJob.on_corpus(search.SearchParams(patterns=(b"e",)), corpus)
    assert job.input_files() == {}
    back = stored_and_back(job, tmp_path / "in", {CORPUS_FILE: corpus_file})
    assert back.corpus == corpus and back.path == corpus_file
    result = search.run(back)
    assert result.summary["corpus_id"] == "c0ffee" and result.summary["patterns"][0]["count"] == text.count(b"e")
    corpus_file.write_bytes(text[:-1])
    with pytest.raises(RuntimeError, match="deleted or changed"):
        stored_and_back(job, tmp_path / "in", {CORPUS_FILE: corpus_file})


def test_an_empty_inline_text_is_refused():
    with pytest.raises(ParamError) as caught:
        search.SearchJob.inline(search.SearchParams(patterns=(b"a",)), b"", "text_base64")
    assert caught.value.field == "text_base64"


def test_positions_json_lists_them_and_none_counts_only_without_files(tmp_path, rng):
    text = search_cases.english(20_000, rng)
    expected = brute_force(text, b"the")
    assert expected.size > 5
    for mode, listed in (("json", 5), ("none", 0)):
        params = search.SearchParams(patterns=(b"the",), max_positions=5, line_numbers=True, positions=mode)
        job = stored_and_back(search.SearchJob.inline(params, text), tmp_path / mode)
        assert job.params.positions == mode
        result = search.run(job)
        (entry,) = result.summary["patterns"]
        assert result.files == {} and result.summary["positions"] == mode
        assert entry["count"] == expected.size and entry["positions"] == expected[:listed].tolist()
        assert entry["positions_truncated"] and entry["positions_file"] is None
        assert ("lines" in entry) == (mode == "json")
        if mode == "json":
            assert entry["lines"] == [text.count(b"\n", 0, p) + 1 for p in expected[:5]]


def test_a_job_stored_before_the_positions_option_still_writes_its_files(tmp_path, rng):
    text = search_cases.english(5000, rng)
    job = search.SearchJob.inline(search.SearchParams(patterns=(b"e",)), text)
    stored = job.to_json()
    del stored["positions"]
    (tmp_path / "text.bin").write_bytes(text)
    back = search.SearchJob.from_json(stored, {"text.bin": tmp_path / "text.bin"})
    assert back.params.positions == "files"
