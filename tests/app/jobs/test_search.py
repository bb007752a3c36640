"""The search job over HTTP (app/jobs/search.py with app/corpora.py): corpora and inline
texts searched for UTF-8 and base64 patterns on every case of the issue, positions and
lines checked against brute force in the JSON result and in the .npy files; bad input
answered 4xx at once (no job); a corpus gone before its job runs; and, under the gpu
marker, the same through the CUDA backend with the corpus resident between searches."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest
from pencil_testkit import admin_client, assert_api_error, fetch_npy, wait_for_job

from gpu.backend import cuda_devices
from gpu.search import reference as ref
from jobs.runner import JobRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "search"))
from search_cases import CASE_NAMES, cases, english

TOKEN = "search-test-token"
ALGORITHMS = ("auto", "rabin_karp", "kmp", "boyer_moore")


def admin(make_client, **overrides):
    return admin_client(make_client, TOKEN, **overrides)


def store_corpus(client, data: bytes) -> str:
    response = client.post("/corpora", content=data)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def submit(client, body: dict) -> str:
    response = client.post("/jobs/search", json=body)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def result_of(client, body: dict) -> dict:
    job_id = submit(client, body)
    job = wait_for_job(client, job_id)
    assert job["status"] == "succeeded", job
    response = client.get(f"/jobs/{job_id}/result")
    assert response.status_code == 200, response.text
    return response.json()


def as_json_pattern(pattern: bytes, rng) -> str | dict:
    """A pattern as the API takes it: its UTF-8 text when it is UTF-8 (half the time), else base64."""
    try:
        text = pattern.decode("utf-8")
        if rng.random() < 0.5:
            return text
    except UnicodeDecodeError:
        pass
    return {"base64": base64.b64encode(pattern).decode()}


def check_result(
    client, result: dict, text: bytes, patterns: list[bytes], max_positions: int, line_numbers: bool
) -> None:
    """The result against brute force, for the `positions` mode it reports: none (counts
    only), json (the first max_positions listed, no file) or files (also every one)."""
    body = result["result"]
    assert body["text_bytes"] == len(text)
    assert len(body["patterns"]) == len(patterns)
    mode = body["positions"]
    listed = 0 if mode == "none" else max_positions
    for i, (pattern, entry) in enumerate(zip(patterns, body["patterns"], strict=True)):
        expected = ref.brute_force(text, pattern)
        context = f"pattern {i} {pattern[:30]!r}, positions {mode}"
        assert entry["index"] == i and entry["length"] == len(pattern), context
        assert base64.b64decode(entry["pattern_base64"]) == pattern, context
        assert entry["count"] == expected.size, context
        assert entry["positions"] == expected[:listed].tolist(), context
        assert entry["positions_truncated"] == (expected.size > listed), context
        if mode == "files":
            positions = fetch_npy(client, result["files"][entry["positions_file"]])
            assert positions.dtype == np.int64, context
            np.testing.assert_array_equal(positions, expected, err_msg=context)
        else:
            assert entry["positions_file"] is None and f"positions_{i}.npy" not in result["files"], context
        if line_numbers and mode != "none":
            newlines = np.flatnonzero(np.frombuffer(text, np.uint8) == ord("\n"))
            lines = np.searchsorted(newlines, expected).astype(np.int64) + 1  # newlines before each match, plus one
            assert entry["lines"] == lines[:listed].tolist(), context
            if mode == "files":
                np.testing.assert_array_equal(
                    fetch_npy(client, result["files"][entry["lines_file"]]), lines, err_msg=context
                )
            else:
                assert "lines_file" not in entry and f"lines_{i}.npy" not in result["files"], context
        else:
            assert "lines" not in entry and "lines_file" not in entry, context


# ------------------------------------------------------------------ CPU backend --


@pytest.mark.parametrize("name", CASE_NAMES)
def test_search_jobs_find_what_brute_force_finds(make_client, rng, name):
    client = admin(make_client)
    text, patterns, granularity = cases(rng, size=20_000)[name]
    corpus_id = store_corpus(client, text)
    algorithm = ALGORITHMS[int(rng.integers(0, len(ALGORITHMS)))]
    body = {
        "corpus_id": corpus_id,
        "patterns": [as_json_pattern(p, rng) for p in patterns],
        "algorithm": algorithm,
        "max_positions": 25,
        "line_numbers": True,
        "positions": "files",
    }
    if granularity:
        body["granularity"] = granularity
    result = result_of(client, body)
    check_result(client, result, text, patterns, 25, True)
    out = result["result"]
    assert out["positions"] == "files"
    assert (out["backend"], out["source"], out["corpus_id"], out["algorithm"]) == (
        "cpu",
        "corpus",
        corpus_id,
        algorithm,
    )
    assert out["times_ms"]["search"] >= 0 and out["times_ms"]["total"] >= out["times_ms"]["search"]
    assert set(out["throughput_gbps"]) == {"search", "end_to_end"}


def as_base64(patterns: list[bytes]) -> list[dict[str, str]]:
    """Patterns in the API's byte form: a slice of the text may cut a UTF-8 character."""
    return [{"base64": base64.b64encode(p).decode()} for p in patterns]


def test_inline_texts_utf8_and_base64(make_client, rng):
    client = admin(make_client)
    # a random slice of English may cut a character in two (pydoc's topics hold a few): whole ones only
    text = english(5000, rng).decode("utf-8", "ignore").encode() + "\n¿dónde está el 😀?\n".encode()
    patterns = [b"the", "😀".encode(), "dónde".encode(), b"\n"]
    result = result_of(
        client,
        {
            "text": text.decode("utf-8"),
            "patterns": [p.decode() for p in patterns],
            "line_numbers": True,
            "max_positions": 3,
        },
    )
    check_result(client, result, text, patterns, 3, True)
    assert result["result"]["positions"] == "json" and result["files"] == {}  # the default: no file
    assert result["result"]["source"] == "text" and result["result"]["corpus_id"] is None
    assert [e["pattern"] for e in result["result"]["patterns"]] == [p.decode() for p in patterns]
    binary = rng.integers(0, 3, 3000, dtype=np.uint8).tobytes()  # NUL-heavy
    patterns = [b"\0\0\0", b"\x01\0\x02", b"\xff"]
    result = result_of(
        client,
        {
            "text_base64": base64.b64encode(binary).decode(),
            "patterns": [{"base64": base64.b64encode(p).decode()} for p in patterns],
            "max_positions": 0,
            "fused": True,
        },
    )
    check_result(client, result, binary, patterns, 0, False)
    assert result["result"]["patterns"][0]["positions"] == [] and result["result"]["patterns"][0]["count"] > 0
    assert result["result"]["patterns"][2]["pattern"] is None  # not UTF-8: given as base64 only


def test_eight_patterns_each_algorithm_and_positions_mode(make_client, rng):
    client = admin(make_client)
    text = english(30_000, rng)
    corpus_id = store_corpus(client, text)
    patterns = [b"the", b"e", b"Python", b"The ", text[100:116], text[5000:5064], b"\n", b"not in the text at all"]
    modes = ("none", "json", "files")
    for k, algorithm in enumerate(ALGORITHMS):
        for j, variant in enumerate(("naive", "optimized")):
            positions = modes[(2 * k + j) % 3]
            result = result_of(
                client,
                {
                    "corpus_id": corpus_id,
                    "patterns": as_base64(patterns),
                    "algorithm": algorithm,
                    "variant": variant,
                    "streams": 8,
                    "max_positions": 10,
                    "line_numbers": True,
                    "positions": positions,
                },
            )
            assert result["result"]["positions"] == positions
            check_result(client, result, text, patterns, 10, True)


@pytest.mark.parametrize(
    ("body", "status", "code", "mentions"),
    [
        ({"patterns": []}, 422, "invalid_parameter", "patterns"),
        ({"patterns": ["a"] * 9}, 422, "invalid_parameter", "at most 8"),
        ({"patterns": [""]}, 422, "invalid_parameter", "patterns[0]"),
        ({"patterns": ["ok", "x" * 4097]}, 422, "invalid_parameter", "patterns[1]"),
        ({"patterns": [{"base64": base64.b64encode(b"y" * 4097).decode()}]}, 422, "invalid_parameter", "4096"),
        ({"patterns": [{"base64": "not base64!"}]}, 422, "invalid_parameter", "patterns[0].base64"),
        ({"patterns": [{"base64": "QUJ"}]}, 422, "invalid_parameter", "padding"),
        ({"patterns": [{"base64": "QU=D"}]}, 422, "invalid_parameter", "base64"),
        ({"patterns": [{"text": "abc"}]}, 422, "invalid_parameter", "patterns[0]"),
        ({"patterns": [42]}, 422, "invalid_parameter", "patterns[0]"),
        ({"patterns": "abc"}, 422, "invalid_parameter", "patterns"),
        ({"patterns": ["a"], "algorithm": "aho_corasick"}, 422, "invalid_parameter", "algorithm"),
        ({"patterns": ["a"], "variant": "turbo"}, 422, "invalid_parameter", "variant"),
        ({"patterns": ["a"], "granularity": 0}, 422, "invalid_parameter", "granularity"),
        ({"patterns": ["a"], "granularity": 4096}, 422, "invalid_parameter", "granularity"),  # optimized: at most 2048
        ({"patterns": ["a"], "granularity": "16"}, 422, "invalid_parameter", "granularity"),
        ({"patterns": ["a"], "streams": 9}, 422, "invalid_parameter", "streams"),
        ({"patterns": ["a"], "max_positions": -1}, 422, "invalid_parameter", "max_positions"),
        ({"patterns": ["a"], "positions": "all"}, 422, "invalid_parameter", "positions"),
        ({"patterns": ["a"], "positions": True}, 422, "invalid_parameter", "positions"),
        ({"patterns": ["a"], "line_numbers": "yes"}, 422, "invalid_parameter", "line_numbers"),
        ({"patterns": ["a"], "fused": True, "algorithm": "kmp"}, 422, "invalid_parameter", "fused"),
        ({"patterns": ["a"], "pattern": "typo"}, 422, "invalid_parameter", "pattern"),
        ({"patterns": ["a"], "corpus_id": None, "text": None}, 422, "invalid_parameter", "exactly one"),
        ({"patterns": ["a"], "text": "abc", "text_base64": "YWJj"}, 422, "invalid_parameter", "exactly one"),
        ({"patterns": ["a"], "text": ""}, 422, "invalid_parameter", "empty"),
        ({"patterns": ["a"], "text_base64": "%%%"}, 422, "invalid_parameter", "text_base64"),
        ({"patterns": ["a"], "corpus_id": "0" * 32}, 404, "corpus_not_found", "0" * 32),
        ({"patterns": ["a"], "corpus_id": "../../etc/passwd"}, 404, "corpus_not_found", "corpus"),
    ],
)
def test_bad_input_is_4xx_now_and_makes_no_job(make_client, body, status, code, mentions):
    client = admin(make_client)
    if "text" not in body and "text_base64" not in body and "corpus_id" not in body:
        body = {**body, "text": "some text to search"}
    response = client.post("/jobs/search", json=body)
    assert_api_error(response, status, code, client)
    assert mentions in response.json()["detail"], response.json()
    assert client.get("/jobs").json()["jobs"] == []


def test_bodies_that_are_not_search_json(make_client):
    client = admin(make_client)
    assert_api_error(
        client.post(
            "/jobs/search", content=b'{"patterns": ["a"], "text": "abc"', headers={"Content-Type": "application/json"}
        ),
        400,
        "bad_request",
        client,
    )
    assert_api_error(
        client.post(
            "/jobs/search", content=b"patterns=a", headers={"Content-Type": "application/x-www-form-urlencoded"}
        ),
        415,
        "unsupported_media_type",
        client,
    )
    assert_api_error(
        client.post("/jobs/search", files={"text": ("t.txt", b"abc")}), 415, "unsupported_media_type", client
    )
    lone_surrogate = b'{"text": "abc", "patterns": ["\\ud800"]}'  # not Unicode text: such bytes go as base64
    response = client.post("/jobs/search", content=lone_surrogate, headers={"Content-Type": "application/json"})
    assert_api_error(response, 400, "bad_request", client)
    assert client.get("/jobs").json()["jobs"] == []


def test_inline_text_over_its_limit_is_413(make_client):
    client = admin(make_client, max_search_text_bytes=1000)
    response = client.post("/jobs/search", json={"text": "x" * 1001, "patterns": ["x"]})
    assert_api_error(response, 413, "text_too_large", client)
    assert "POST /corpora" in response.json()["detail"]
    result = result_of(client, {"text": "x" * 1000, "patterns": ["xx"], "max_positions": 5})
    assert result["result"]["patterns"][0]["count"] == 999


def test_a_job_whose_corpus_vanished_fails_clearly(make_client, monkeypatch):
    monkeypatch.setattr(JobRunner, "_work", lambda self: None)  # the job stays queued
    client = admin(make_client)
    corpus_id = store_corpus(client, b"to be removed behind the server's back")
    job_id = submit(client, {"corpus_id": corpus_id, "patterns": ["removed"]})
    folder = client.app.state.settings.data_dir / "corpora"
    client.__exit__(None, None, None)
    (folder / f"{corpus_id}.bin").unlink()
    monkeypatch.undo()  # a restarted server runs the queued job
    client = admin(make_client)
    job = wait_for_job(client, job_id)
    assert job["status"] == "failed" and "deleted or changed" in job["error"], job


def test_identical_requests_with_an_idempotency_key_are_one_job(make_client):
    client = admin(make_client)
    body = {"text": "abcabc", "patterns": ["abc"]}
    first = client.post("/jobs/search", json=body, headers={"Idempotency-Key": "k1"})
    again = client.post("/jobs/search", json=body, headers={"Idempotency-Key": "k1"})
    assert (first.status_code, again.status_code) == (202, 200) and first.json()["id"] == again.json()["id"]
    other = client.post("/jobs/search", json={**body, "text": "abcab"}, headers={"Idempotency-Key": "k1"})
    assert_api_error(other, 409, "idempotency_conflict", client)


# ------------------------------------------------------------------ CUDA backend --


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")
def test_search_jobs_on_the_gpu_keep_the_corpus_resident(make_client, rng):
    client = admin(make_client, backend="cuda", devices="0")  # one device: every search finds the corpus there
    text = english(3_000_000, rng)
    corpus_id = store_corpus(client, text)
    patterns = [b"the", b"e", text[1000:1016], text[90_000:90_256], b"\n", b"absent from the text, surely"]
    results = []
    for algorithm in ALGORITHMS:
        for variant in ("naive", "optimized"):
            result = result_of(
                client,
                {
                    "corpus_id": corpus_id,
                    "patterns": as_base64(patterns),
                    "algorithm": algorithm,
                    "variant": variant,
                    "streams": 3,
                    "line_numbers": True,
                    "max_positions": 20,
                    "positions": ("json", "files")[len(results) % 2],
                },
            )
            check_result(client, result, text, patterns, 20, True)
            results.append(result["result"])
    fused = result_of(
        client, {"corpus_id": corpus_id, "patterns": as_base64(patterns), "fused": True, "max_positions": 20}
    )
    check_result(client, fused, text, patterns, 20, False)
    assert results[0]["backend"] == "cuda" and results[0]["resident"] is False
    assert all(r["resident"] is True for r in results[1:]) and fused["result"]["resident"] is True
    assert (
        set(results[0]["times_ms"]) == {"upload", "kernels", "download", "total"}
        and results[0]["times_ms"]["upload"] > 0
    )
    assert all(r["times_ms"]["upload"] == 0 for r in results[1:])
    assert client.get(f"/corpora/{corpus_id}").json()["resident_on"] != []
    assert client.delete(f"/corpora/{corpus_id}").status_code == 200
    from gpu.search.residency import RESIDENT

    assert not any(key[0] == corpus_id for device in range(8) for key in RESIDENT.keys(device))
    inline = result_of(client, {"text": text[:50_000].decode("utf-8", "ignore"), "patterns": ["the"]})
    assert inline["result"]["resident"] is False
