"""gpu.svd's front door on the CPU: a job stored and rehydrated as the service does,
decomposed, its files and summary checked against NumPy's LAPACK."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from gpu import svd
from gpu.errors import ParamError
from gpu.spec import from_json
from gpu.svd.params import SvdRequest
from tests.gpu.jobkit import stored_and_back, written


@pytest.mark.parametrize("method", ["lapack", "golub_reinsch", "auto"])
def test_an_uploaded_matrix_round_trips_and_decomposes(tmp_path, rng, method):
    a = rng.standard_normal((30, 18)).astype(np.float32)
    job = stored_and_back(svd.SvdJob(svd.SvdParams(method=method), matrix=a.astype(">f4")), tmp_path / "in")
    assert job.to_json() == {
        "source": "upload",
        "m": 30,
        "n": 18,
        "dtype": "float32",
        "compute_uv": True,
        "full_matrices": False,
        "method": method,
        "block_size": 32,
    }
    result = svd.run(job)
    files = written(result, tmp_path / "out")
    s = np.load(files["s.npy"])
    np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.float64), compute_uv=False), rtol=2e-5)
    u, vt = np.load(files["u.npy"]), np.load(files["vt.npy"])
    np.testing.assert_allclose((u * s) @ vt, a, atol=1e-4 * s[0])
    summary = result.summary
    assert summary["method"] == ("lapack" if method == "auto" else method) and summary["backend"] == "cpu"
    assert summary["singular_values"] == s.astype(float).tolist() and max(summary["accuracy"].values()) < 35


def test_a_spec_is_stored_as_json_and_builds_the_same_matrix(tmp_path):
    spec = svd.MatrixSpec(m=12, n=20, dtype="float64", seed=5, kind="low_rank", rank=3)
    job = stored_and_back(svd.SvdJob(svd.SvdParams(compute_uv=False), spec=spec), tmp_path)
    assert job.input_files() == {} and job.spec == spec
    result = svd.run(job)
    assert set(result.files) == {"s.npy"} and result.summary["accuracy"] is None
    values = np.asarray(result.summary["singular_values"])
    assert np.count_nonzero(values > 1e-10 * values[0]) == 3  # rank 3


def test_methods_the_cpu_cannot_run_are_refused_before_the_job_exists():
    big = svd.SvdJob(svd.SvdParams(method="golub_reinsch"), spec=svd.MatrixSpec(m=600, n=520))
    for job in (svd.SvdJob(svd.SvdParams(method="cusolver"), spec=svd.MatrixSpec(m=4, n=4)), big):
        with pytest.raises(ParamError) as caught:
            job.check_backend("cpu")
        assert caught.value.field == "method"
        job.check_backend("cuda")


def test_golub_reinsch_past_the_chases_shared_memory_is_refused_on_the_gpu():
    """A spec is never built to check it: a 15000-column one is refused at once."""
    spec = svd.MatrixSpec(m=15_000, n=15_000)
    with pytest.raises(ParamError, match="shared memory") as caught:
        svd.SvdJob(svd.SvdParams(method="golub_reinsch"), spec=spec).check_backend("cuda")
    assert caught.value.field == "method"
    svd.SvdJob(svd.SvdParams(method="auto"), spec=spec).check_backend("cuda")


@pytest.mark.parametrize(
    ("matrix", "spec", "field", "code"),
    [
        (np.array([[1.0, np.nan]]), None, "matrix", "invalid_matrix"),
        (np.ones((0, 3)), None, "matrix", "invalid_matrix"),
        (None, None, "matrix", "invalid_parameter"),
        (np.ones((2, 2)), svd.MatrixSpec(m=2, n=2), "matrix", "invalid_parameter"),
    ],
)
def test_a_job_needs_exactly_one_valid_matrix(matrix, spec, field, code):
    with pytest.raises(ParamError) as caught:
        svd.SvdJob(svd.SvdParams(), spec=spec, matrix=matrix)
    assert (caught.value.field, caught.value.code) == (field, code)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"rank": 5}, "rank"),
        ({"cond": 0.5}, "cond"),
        ({"kind": "hilbert"}, "kind"),
        ({"m": 0}, "m"),
    ],
)
def test_a_spec_out_of_range_names_its_field(changes, field):
    with pytest.raises(ParamError) as caught:
        svd.MatrixSpec(**{"m": 4, "n": 3, **changes})
    assert caught.value.field == field
    with pytest.raises(ParamError) as caught:  # in a request, under its name there
        from_json(SvdRequest, json.dumps({"spec": {"m": 4, "n": 3, **changes}}))
    assert caught.value.field == f"spec.{field}"


def test_progress_that_raises_stops_the_job(rng):
    class Stop(Exception):
        pass

    def cancel(fraction):
        raise Stop

    with pytest.raises(Stop):
        svd.run(svd.SvdJob(svd.SvdParams(), matrix=rng.standard_normal((5, 4))), progress=cancel)


def test_a_long_lapack_call_reports_steady_progress(monkeypatch, rng):
    """One LAPACK call reports nothing of itself: the front door moves the progress with the
    time its flop count should take here (the CPU SVD example once sat at 0.05 for 55 s)."""
    import gpu.jobs
    from gpu.svd import reference

    a = rng.standard_normal((300, 200))
    expected = svd.cpu_seconds(a.shape, True)
    began = time.perf_counter()
    np.linalg.svd(a, full_matrices=False)
    assert 0.02 < expected / (time.perf_counter() - began) < 50  # the estimate is of the right size

    monkeypatch.setattr(gpu.jobs, "TICK_S", 0.02)
    real_svd = reference.svd

    def slow_svd(*args, **kwargs):  # a call of 0.3 s that reports nothing, whatever the machine's load
        time.sleep(0.3)
        return real_svd(*args, **kwargs)

    monkeypatch.setattr(reference, "svd", slow_svd)
    seen: list[float] = []
    svd.run(svd.SvdJob(svd.SvdParams(method="lapack"), matrix=a), progress=seen.append)
    between = [p for p in seen if 0.05 < p < 0.9]
    assert seen[0] == 0.05 and seen[-1] == 0.9 and between == sorted(between) and len(set(between)) == len(between)
    assert len(between) >= 5  # about 15 ticks in 0.3 s
