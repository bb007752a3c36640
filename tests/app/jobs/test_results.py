"""Every kind's result, as the service returns it, matches the result schema its OpenAPI
declares (extra keys forbidden): the docs cannot drift from the front doors."""

from __future__ import annotations

import pytest
from pencil_testkit import admin_client, wait_for_job

from gpu.cs256.params import Cs256Result
from gpu.search.params import SearchResult
from gpu.stencil.params import StencilResult
from gpu.svd.params import SvdResult

TOKEN = "results-test-token"

JOBS = [
    pytest.param("svd", {"spec": {"m": 30, "n": 20, "seed": 4}, "method": "golub_reinsch"}, SvdResult, id="svd"),
    pytest.param("svd", {"spec": {"m": 30, "n": 20}, "compute_uv": False}, SvdResult, id="svd-values-only"),
    pytest.param(
        "search",
        {"text": "a needle in a haystack,\nanother needle", "patterns": ["needle", "x"], "line_numbers": True},
        SearchResult,
        id="search-lines",
    ),
    pytest.param("search", {"text": "abcabc", "patterns": [{"base64": "/w=="}]}, SearchResult, id="search-bytes"),
    pytest.param(
        "stencil",
        {
            "nx": 30,
            "ny": 16,
            "nz": 20,
            "h": 10.0,
            "steps": 40,
            "f0": 12.0,
            "model": {"type": "constant", "velocity": 1500.0},
            "snapshot_every": 20,
        },
        StencilResult,
        id="stencil",
    ),
    pytest.param(
        "cs256",
        {"spec": {"m": 32, "n": 300, "dtype": "float16", "seed": 2}, "sparsity": 0.5, "repeats": 1},
        Cs256Result,
        id="cs256",
    ),
    pytest.param(
        "cs256",
        {"spec": {"m": 16, "n": 256, "dtype": "float32"}, "sparsity": None, "repeats": 1, "vectors": 3},
        Cs256Result,
        id="cs256-no-pruning",
    ),
]


@pytest.mark.parametrize(("kind", "body", "model"), JOBS)
def test_a_result_matches_its_declared_schema(make_client, kind, body, model):
    client = admin_client(make_client, TOKEN)
    response = client.post(f"/jobs/{kind}", json=body)
    assert response.status_code == 202, response.text
    job = wait_for_job(client, response.json()["id"])
    assert job["status"] == "succeeded", job
    result = client.get(f"/jobs/{job['id']}/result").json()
    model.model_validate(result["result"], strict=False)  # raises naming any undeclared or mistyped key


def test_the_openapi_declares_one_result_schema_per_kind(make_client):
    client = admin_client(make_client, TOKEN)
    get = client.get("/openapi.json").json()["paths"]["/jobs/{job_id}/result"]["get"]
    schema = get["responses"]["200"]["content"]["application/json"]["schema"]
    titles = sorted(option["title"] for option in schema["properties"]["result"]["oneOf"])
    assert titles == ["cs256 result", "search result", "stencil result", "svd result", "video result"]
    assert "$ref" not in str(schema)
