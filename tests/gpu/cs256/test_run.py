"""gpu.cs256's front door on the CPU: generated and uploaded matrices stored and rehydrated
as the service keeps them, pruned, multiplied and reported."""

from __future__ import annotations

import numpy as np
import pytest

from gpu import cs256
from gpu.cs256 import files as cs_files
from gpu.cs256 import reference
from gpu.cs256.format import to_float32
from gpu.errors import ParamError
from tests.gpu.jobkit import stored_and_back, written


def test_a_generated_job_round_trips_and_its_product_is_right(tmp_path):
    params = cs256.Cs256Params(sparsity=0.5, vec=8, vectors=3, repeats=1, save="both")
    job = stored_and_back(cs256.Cs256Job.generated(params, 64, 600, "float16", seed=7), tmp_path / "in")
    assert job.input_files() == {} and job.to_json()["spec"] == {"m": 64, "n": 600, "dtype": "float16", "seed": 7}
    result = cs256.run(job)
    files = written(result, tmp_path / "out")
    a, x = job.inputs()
    matrix = cs_files.load_npz(files["cs256.npz"])
    assert cs_files.load_safetensors(files["cs256.safetensors"]).values.tobytes() == matrix.values.tobytes()
    y = np.load(files["y.npy"])
    expected = reference.dense_product(matrix.to_dense(), x, "float16")
    assert (
        y.shape == (64, 3)
        and reference.relative_error(y, to_float32(expected, "float16"), "float16") <= reference.TOLERANCE["float16"]
    )
    summary = result.summary
    assert summary["accuracy"]["within_tolerance"] and summary["vectors"] == 3 and summary["backend"] == "cpu"
    assert summary["format"]["nnz"] == 64 * 600 // 2 and summary["format"]["sparsity"] == 0.5
    assert summary["pruning"]["target_sparsity"] == 0.5 and 0 < summary["pruning"]["removed_norm"] < 1


def test_an_uploaded_matrix_and_x_are_stored_as_files(tmp_path, rng):
    a = rng.standard_normal((40, 300)).astype(np.float32)
    x = rng.standard_normal(300)
    params = cs256.Cs256Params(sparsity=None, repeats=1, save="none")
    job = cs256.Cs256Job.uploaded(params, a, "float32", {"file": "npy"}, x=x)
    assert set(job.input_files()) == {"matrix.npy", "x.npy"} and job.to_json()["x"] == "given"
    back = stored_and_back(job, tmp_path)
    np.testing.assert_array_equal(back.matrix, a)
    result = cs256.run(back)
    assert set(result.files) == {"y.npy"} and result.summary["pruning"] is None and result.summary["source"] == "upload"


@pytest.mark.parametrize(
    ("matrix", "x", "field", "code"),
    [
        (np.array([[1.0, np.inf]], np.float32), None, "matrix", "invalid_matrix"),
        (np.full((2, 2), 1e6, np.float32), None, "matrix", "invalid_matrix"),  # past float16
        (np.ones((2, 3), np.float32), np.ones(4), "x", "invalid_x"),
        (np.ones((2, 3), np.float32), np.array([1.0, np.nan, 0.0]), "x", "invalid_x"),
    ],
)
def test_bad_uploads_name_their_field(matrix, x, field, code):
    with pytest.raises(ParamError) as caught:
        cs256.Cs256Job.uploaded(cs256.Cs256Params(), matrix, "float16", {"file": "npy"}, x=x)
    assert (caught.value.field, caught.value.code) == (field, code)


def test_split4_takes_one_vector():
    with pytest.raises(ParamError, match="split4"):
        cs256.Cs256Params(vectors=2, variant="split4")
