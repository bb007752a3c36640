"""POST /jobs/cs256 through the whole app on the CPU backend: jobs from a JSON spec, from an
uploaded .npy and from a .safetensors (named tensor, bfloat16), with given or random x, the
result files checked independently (y against the float64 dense product of the saved
CS256 matrix, the matrix against the upload and the pruning rule), and every bad input
answered at once with a 4xx and no job. A GPU-marked test runs a job on the CUDA backend."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
from pencil_testkit import admin_client, assert_api_error, wait_for_job

from gpu.backend import cuda_devices
from gpu.cs256 import files, reference
from gpu.cs256 import format as fmt
from gpu.cs256.params import make_matrix, make_x

TOKEN = "cs256-test-token"
WAIT_S = 60.0
MAX_ELEMENTS = 50_000


def admin(make_client, **overrides):
    return admin_client(make_client, TOKEN, **overrides)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def safetensors(tensors: dict[str, tuple[str, np.ndarray]]) -> bytes:
    return files.write_safetensors(tensors)


def upload(data: bytes, name: str = "w.npy", x: bytes | None = None, **fields) -> dict:
    parts = {"matrix": (name, data, "application/octet-stream")}
    if x is not None:
        parts["x"] = ("x.npy", x, "application/octet-stream")
    return {"files": parts, "data": {"params": json.dumps(fields)} if fields else {}}


def run_job(client, **request) -> tuple[dict, dict]:
    """Submit, wait, return (result body, job body)."""
    response = client.post("/jobs/cs256", **request)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    job = wait_for_job(client, job_id, timeout_s=WAIT_S)
    assert job["status"] == "succeeded", job
    body = client.get(f"/jobs/{job_id}/result").json()
    return body, job


def fetch(client, url: str) -> bytes:
    response = client.get(url)
    assert response.status_code == 200, response.text
    return response.content


def check_result(
    client, body: dict, dense_in: np.ndarray, x: np.ndarray, dtype: str, vec: int, sparsity: float | None
) -> fmt.CS256:
    """The job's files and figures against an independent computation."""
    result = body["result"]
    cs = files.load_npz(fetch(client, body["files"]["cs256.npz"]))
    assert (cs.m, cs.n, cs.dtype, cs.vec) == (*dense_in.shape, dtype, vec)
    dense = cs.to_dense()
    if sparsity is None:
        np.testing.assert_array_equal(dense.view(np.uint8), dense_in.view(np.uint8))
    else:
        expected = fmt.prune(dense_in, sparsity, vec, dtype)
        np.testing.assert_array_equal(dense.view(np.uint8), expected.to_dense().view(np.uint8))
        assert result["pruning"]["target_sparsity"] == sparsity
        assert 0 < result["pruning"]["removed_norm"] < 1
    y = np.load(io.BytesIO(fetch(client, body["files"]["y.npy"])), allow_pickle=False)
    exact = reference.dense_product(dense, x, dtype)
    assert y.dtype == np.float32 and y.shape == exact.shape
    error = reference.relative_error(y, exact, dtype)
    assert error <= {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-5}[dtype]
    assert result["accuracy"]["max_relative_error"] == pytest.approx(error, rel=1e-6, abs=1e-12)
    assert result["accuracy"]["within_tolerance"] is True
    report = result["format"]
    assert report == json.loads(json.dumps(fmt.storage_report(cs)))
    assert result["vectors"] == (1 if x.ndim == 1 else x.shape[1])
    assert set(result["times_ms"]) >= {"load", "convert", "cs256", "dense"} and all(
        v >= 0 for v in result["times_ms"].values()
    )
    assert result["speedup"]["vs_dense"] == pytest.approx(
        result["times_ms"]["dense"] / result["times_ms"]["cs256"], rel=1e-3
    )
    vectors_bytes = (cs.m + cs.n) * result["vectors"] * fmt.STORAGE[dtype].itemsize
    assert result["bytes_moved"]["cs256"] == report["formats"]["cs256"]["bytes"] + vectors_bytes
    return cs


@pytest.mark.parametrize(
    ("dtype", "vec", "sparsity", "vectors"),
    [
        ("float16", 8, 0.66, 1),
        ("bfloat16", 4, 0.5, 3),
        ("float32", 16, 0.75, 16),
    ],
)
def test_a_generated_matrix_is_pruned_converted_and_multiplied(make_client, rng, dtype, vec, sparsity, vectors):
    client = admin(make_client)
    seed = int(rng.integers(0, 2**31))
    spec = {"m": 70, "n": 600, "dtype": dtype, "seed": seed}
    body, job = run_job(client, json={"spec": spec, "sparsity": sparsity, "vec": vec, "vectors": vectors, "repeats": 2})
    assert job["params"]["source"] == "spec" and job["params"]["vectors"] == vectors
    result = body["result"]
    assert (result["m"], result["n"], result["dtype"], result["vec"], result["backend"]) == (70, 600, dtype, vec, "cpu")
    assert set(body["files"]) == {"y.npy", "cs256.npz"}
    dense_in = make_matrix(70, 600, dtype, seed)
    x = make_x(600, vectors, dtype, seed)
    cs = check_result(client, body, dense_in, x, dtype, vec, sparsity)
    assert abs(cs.sparsity - sparsity) < 0.02


def test_json_x_is_used_as_given(make_client, rng):
    client = admin(make_client)
    x = rng.standard_normal((300, 2)).round(3)
    body, _ = run_job(
        client,
        json={
            "spec": {"m": 9, "n": 300, "dtype": "float32", "seed": 5},
            "sparsity": None,
            "x": x.tolist(),
            "save": "both",
            "repeats": 1,
        },
    )
    assert set(body["files"]) == {"y.npy", "cs256.npz", "cs256.safetensors"}
    check_result(client, body, make_matrix(9, 300, "float32", 5), x.astype(np.float32), "float32", 8, None)
    from_st = files.load_safetensors(fetch(client, body["files"]["cs256.safetensors"]))
    from_npz = files.load_npz(fetch(client, body["files"]["cs256.npz"]))
    for name in files.ARRAYS:
        np.testing.assert_array_equal(getattr(from_st, name), getattr(from_npz, name))
    assert body["result"]["pruning"] is None


def test_an_uploaded_npy_with_its_own_zeros(make_client, rng):
    client = admin(make_client)
    a = rng.standard_normal((33, 513)).astype(np.float16)
    a[rng.random(a.shape) < 0.7] = 0
    a[4] = 0  # an empty row
    x = rng.standard_normal(513).astype(np.float32)
    body, job = run_job(client, **upload(npy(a), x=npy(x), sparsity=None, vec=4, repeats=1))
    assert job["params"]["source"] == "upload" and job["params"]["file"] == "npy" and job["params"]["x"] == "given"
    cs = check_result(client, body, a, x.astype(np.float16), "float16", 4, None)
    assert cs.nnz == np.count_nonzero(a)


def test_a_product_past_float16s_range_is_reported_not_a_server_error(make_client):
    """60000 x 300 overflows float16 (65504): y holds infinities; the result says how many
    and gives no relative error (JSON has no infinity), and the API still answers."""
    client = admin(make_client)
    a = np.full((8, 300), 60000, np.float16)
    body, _ = run_job(client, **upload(npy(a), x=npy(np.ones(300, np.float16)), sparsity=None, repeats=1))
    accuracy = body["result"]["accuracy"]
    assert accuracy["outputs_out_of_range"] == 8
    assert accuracy["max_relative_error"] is None and accuracy["within_tolerance"] is False


def test_a_safetensors_tensor_by_name_in_bfloat16(make_client, rng):
    client = admin(make_client)
    weight = fmt.float32_to_bf16_bits(rng.standard_normal((40, 700)).astype(np.float32))
    data = safetensors(
        {
            "model.embed": ("F32", rng.standard_normal((4, 4)).astype(np.float32)),
            "model.layers.0.mlp.up_proj.weight": ("BF16", weight),
            "bias": ("F32", np.ones(40, np.float32)),
        }
    )
    body, job = run_job(
        client,
        **upload(
            data, "model.safetensors", tensor="model.layers.0.mlp.up_proj.weight", sparsity=0.66, seed=3, repeats=1
        ),
    )
    assert (
        job["params"]["file"] == "safetensors"
        and job["params"]["dtype"] == "bfloat16"
        and job["params"]["tensor"] == "model.layers.0.mlp.up_proj.weight"
    )
    check_result(client, body, weight, make_x(700, 1, "bfloat16", 3), "bfloat16", 8, 0.66)


def test_a_single_tensor_needs_no_name_and_dtype_rounds_float64(make_client, rng):
    client = admin(make_client)
    a = rng.standard_normal((12, 300))
    body, job = run_job(
        client, **upload(safetensors({"w": ("F64", a)}), "w.safetensors", dtype="float16", sparsity=0.5, repeats=1)
    )
    assert job["params"]["tensor"] == "w" and job["params"]["dtype"] == "float16"
    check_result(client, body, a.astype(np.float16), make_x(300, 1, "float16", 0), "float16", 8, 0.5)


def _file(header: dict, buffer: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + buffer


GOOD = np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4)
WITH_NAN = GOOD.copy()
WITH_NAN[1, 1] = np.nan
WITH_INF = GOOD.copy()
WITH_INF[0, 0] = np.inf
TWO = safetensors({"a": ("F32", GOOD), "b": ("F32", GOOD)})


def spec(**changes) -> dict:
    return {"spec": {"m": 4, "n": 300, "dtype": "float16", "seed": 0, **changes}}


BAD_REQUESTS = [
    pytest.param(upload(b"these bytes are no matrix file at all"), 415, "unsupported_format", id="garbage"),
    pytest.param(upload(npy(GOOD)[:-7]), 400, "malformed_npy", id="truncated-npy"),
    pytest.param(upload(b""), 400, "empty_file", id="empty-file"),
    pytest.param(upload(npy(np.ones((2, 3, 4), np.float32))), 422, "not_a_matrix", id="3-d"),
    pytest.param(upload(npy(np.ones(5, np.float32))), 422, "not_a_matrix", id="1-d"),
    pytest.param(upload(npy(np.ones((0, 4), np.float32))), 422, "invalid_matrix", id="empty-matrix"),
    pytest.param(upload(npy(GOOD.astype(np.int32))), 422, "unsupported_dtype", id="int32"),
    pytest.param(upload(npy(GOOD.astype(np.complex64))), 422, "unsupported_dtype", id="complex"),
    pytest.param(upload(npy(GOOD.astype(np.float64))), 422, "unsupported_dtype", id="float64-without-dtype"),
    pytest.param(upload(npy(WITH_NAN)), 422, "invalid_matrix", id="nan"),
    pytest.param(upload(npy(WITH_INF)), 422, "invalid_matrix", id="inf"),
    pytest.param(upload(npy(GOOD * 1e5), dtype="float16"), 422, "invalid_matrix", id="float16-overflow"),
    pytest.param(upload(npy(np.ones((300, 300), np.float32))), 413, "too_many_elements", id="upload-too-large"),
    pytest.param(upload(npy(GOOD), sparsity=1), 422, "invalid_parameter", id="sparsity-1"),
    pytest.param(upload(npy(GOOD), sparsity=-0.1), 422, "invalid_parameter", id="sparsity-negative"),
    pytest.param(upload(npy(GOOD), sparsity=1.5), 422, "invalid_parameter", id="sparsity-above-1"),
    pytest.param(upload(npy(GOOD), sparsity=float("nan")), 422, "invalid_parameter", id="sparsity-nan"),
    pytest.param(upload(npy(GOOD), sparsity="half"), 422, "invalid_parameter", id="sparsity-text"),
    pytest.param(upload(npy(GOOD), vec=5), 422, "invalid_parameter", id="vec-5"),
    pytest.param(upload(npy(GOOD), vectors=17), 422, "invalid_parameter", id="vectors-17"),
    pytest.param(upload(npy(GOOD), repeats=0), 422, "invalid_parameter", id="repeats-0"),
    pytest.param(upload(npy(GOOD), save="zip"), 422, "invalid_parameter", id="save-zip"),
    pytest.param(upload(npy(GOOD), seed=-1), 422, "invalid_parameter", id="seed-negative"),
    pytest.param(upload(npy(GOOD), dtype="int8"), 422, "invalid_parameter", id="dtype-int8"),
    pytest.param(upload(npy(GOOD), colour="red"), 422, "invalid_parameter", id="unknown-option"),
    pytest.param(
        {**upload(npy(GOOD)), "data": {"sparsity": "0.5"}}, 422, "use_params_field", id="options-as-separate-fields"
    ),
    pytest.param(
        {"files": [("matrix", ("a.npy", npy(GOOD), "application/octet-stream"))] * 2},
        400,
        "duplicate_field",
        id="two-matrix-parts",
    ),
    pytest.param(
        {**upload(npy(GOOD)), "data": {"params": ["{}", '{"vec": 4}']}}, 400, "duplicate_field", id="two-params-fields"
    ),
    pytest.param(upload(npy(GOOD), tensor="w"), 422, "invalid_parameter", id="tensor-for-npy"),
    pytest.param(upload(npy(GOOD), vectors=2, variant="split4"), 422, "invalid_parameter", id="split4-several-vectors"),
    pytest.param(upload(TWO, "m.safetensors"), 422, "missing_tensor", id="safetensors-no-tensor-name"),
    pytest.param(upload(TWO, "m.safetensors", tensor="c"), 422, "unknown_tensor", id="safetensors-unknown-tensor"),
    pytest.param(
        upload(safetensors({"v": ("F32", np.ones(5, np.float32))}), "m.safetensors"),
        422,
        "not_a_matrix",
        id="safetensors-1-d",
    ),
    pytest.param(
        upload(safetensors({"w": ("I32", np.ones((3, 3), np.int32))}), "m.safetensors"),
        422,
        "unsupported_dtype",
        id="safetensors-int32",
    ),
    pytest.param(
        upload(safetensors({"w": ("F32", WITH_NAN)}), "m.safetensors"), 422, "invalid_matrix", id="safetensors-nan"
    ),
    pytest.param(
        upload(safetensors({"w": ("F32", np.ones((300, 300), np.float32))}), "m.safetensors"),
        413,
        "too_many_elements",
        id="safetensors-too-large",
    ),
    pytest.param(
        upload(_file({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}}, b"\0" * 40), "m.safetensors"),
        400,
        "malformed_safetensors",
        id="safetensors-truncated",
    ),
    pytest.param(upload(_file({}, b""), "m.safetensors"), 422, "missing_tensor", id="safetensors-empty"),
    pytest.param(upload(npy(GOOD), x=npy(np.ones(5, np.float32))), 422, "invalid_x", id="x-wrong-length"),
    pytest.param(upload(npy(GOOD), x=npy(np.ones((4, 17), np.float32))), 422, "invalid_x", id="x-17-vectors"),
    pytest.param(upload(npy(GOOD), x=npy(np.array([1, np.nan, 2, 3], np.float32))), 422, "invalid_x", id="x-nan"),
    pytest.param(upload(npy(GOOD), x=npy(np.ones(4, np.int64))), 422, "invalid_x", id="x-integers"),
    pytest.param(upload(npy(GOOD), x=b"not npy"), 400, "malformed_npy", id="x-garbage"),
    pytest.param(
        upload(npy(GOOD), x=npy(np.ones(4, np.float32))[:128] + b"\0" * 8),
        400,
        "malformed_npy",
        id="x-header-longer-than-its-data",
    ),
    pytest.param(
        upload(npy(GOOD), x=npy(np.ones((4, 2), np.float32)), vectors=3),
        422,
        "invalid_parameter",
        id="x-and-vectors-disagree",
    ),
    pytest.param(
        {"files": {"x": ("x.npy", npy(np.ones(4)), "application/octet-stream")}},
        400,
        "missing_matrix",
        id="no-matrix-field",
    ),
    pytest.param(
        {"files": {"other": ("o", b"1")}, "data": {"matrix": "not a file"}},
        400,
        "missing_matrix",
        id="matrix-not-a-file",
    ),
    pytest.param(
        {"content": b"1 2 3", "headers": {"Content-Type": "text/plain"}}, 415, "unsupported_media_type", id="text-plain"
    ),
    pytest.param(
        {"content": b"{'spec': ", "headers": {"Content-Type": "application/json"}}, 400, "bad_request", id="not-json"
    ),
    pytest.param({"json": [1, 2]}, 422, "invalid_parameter", id="json-array"),
    pytest.param({"json": {"sparsity": 0.5}}, 422, "invalid_parameter", id="no-spec"),
    pytest.param({"json": spec(m=0)}, 422, "invalid_parameter", id="m-zero"),
    pytest.param({"json": spec(dtype="float64")}, 422, "invalid_parameter", id="spec-float64"),
    pytest.param({"json": spec(seed=-1)}, 422, "invalid_parameter", id="spec-seed-negative"),
    pytest.param({"json": spec(m=1000, n=1000)}, 413, "too_many_elements", id="spec-too-large"),
    pytest.param(
        {"json": spec(m=MAX_ELEMENTS // 256 + 1, n=1)}, 413, "too_many_elements", id="spec-narrow-but-padded-too-large"
    ),
    pytest.param({"json": spec(m=True)}, 422, "invalid_parameter", id="spec-m-boolean"),
    pytest.param({"json": {**spec(), "repeats": True}}, 422, "invalid_parameter", id="repeats-boolean"),
    pytest.param({"json": {**spec(n=3), "x": [True, 1.0, 2.0]}}, 422, "invalid_parameter", id="x-boolean"),
    pytest.param({"json": {**spec(), "sparsity": 1.0}}, 422, "invalid_parameter", id="json-sparsity-1"),
    pytest.param({"json": {**spec(), "vec": 2}}, 422, "invalid_parameter", id="json-vec-2"),
    pytest.param({"json": {**spec(), "dtype": "float32"}}, 422, "invalid_parameter", id="json-dtype-outside-spec"),
    pytest.param({"json": {**spec(), "sparsty": 0.5}}, 422, "invalid_parameter", id="json-misspelt-option"),
    pytest.param({"json": {**spec(), "x": [1.0, 2.0]}}, 422, "invalid_x", id="json-x-short"),
    pytest.param(
        {"json": {**spec(), "x": [[1.0, 2.0], [3.0]] + [[0.0, 0.0]] * 298}}, 422, "invalid_x", id="json-x-ragged"
    ),
    pytest.param({"json": {**spec(), "x": [1e6] * 300}}, 422, "invalid_x", id="json-x-overflows-float16"),
    pytest.param({"json": {**spec(), "x": [[1.0] * 17] * 300}}, 422, "invalid_x", id="json-x-17-vectors"),
]


@pytest.mark.parametrize(("request_kwargs", "status", "code"), BAD_REQUESTS)
def test_bad_input_is_refused_at_once_and_creates_no_job(make_client, tmp_path, request_kwargs, status, code):
    client = admin(make_client, max_cs256_elements=MAX_ELEMENTS)
    assert_api_error(client.post("/jobs/cs256", **request_kwargs), status, code, client)
    assert client.get("/jobs").json()["jobs"] == []
    jobs_dir = tmp_path / "data" / "jobs"
    assert not jobs_dir.exists() or list(jobs_dir.iterdir()) == []


def test_json_nan_in_x_is_refused(make_client):
    client = admin(make_client)
    body = b'{"spec": {"m": 2, "n": 3}, "x": [1.0, NaN, 2.0]}'
    assert_api_error(
        client.post("/jobs/cs256", content=body, headers={"Content-Type": "application/json"}), 422, "invalid_x"
    )


def test_the_api_docs_show_the_cs256_job(make_client):
    client = make_client()
    post = client.get("/openapi.json").json()["paths"]["/jobs/cs256"]["post"]
    body = post["requestBody"]["content"]
    assert {"m", "n", "dtype", "seed"} <= set(body["application/json"]["schema"]["properties"]["spec"]["properties"])
    assert {"sparsity", "vec", "x", "vectors", "repeats", "save", "variant"} <= set(
        body["application/json"]["schema"]["properties"]
    )
    assert "$ref" not in str(body)
    assert body["multipart/form-data"]["schema"]["required"] == ["matrix"]
    assert body["application/json"]["example"]["sparsity"] == 0.66


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", fmt.DTYPES)
def test_a_job_on_the_gpu_measures_the_kernel_and_its_anchors(make_client, rng, dtype):
    client = make_client(backend="cuda", admin_token=TOKEN)
    client.headers["Authorization"] = f"Bearer {TOKEN}"
    seed = int(rng.integers(0, 2**31))
    for vectors, variant in ((1, "group"), (1, "split4"), (5, "group")):
        body, _ = run_job(
            client,
            json={
                "spec": {"m": 1000, "n": 2000, "dtype": dtype, "seed": seed},
                "sparsity": 0.66,
                "vectors": vectors,
                "variant": variant,
                "repeats": 5,
            },
        )
        result = body["result"]
        assert result["backend"] == "cuda" and result["kernel"]["variant"] == variant
        check_result(
            client, body, make_matrix(1000, 2000, dtype, seed), make_x(2000, vectors, dtype, seed), dtype, 8, 0.66
        )
        assert result["times_ms"]["cs256"] > 0 and result["times_ms"]["dense"] > 0 and result["times_ms"]["csr"] > 0
        assert result["anchors"]["dense"].startswith("cuBLAS") and result["anchors"]["csr"].startswith("cuSPARSE")
