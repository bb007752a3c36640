"""gpu.stencil's front door on the CPU: a shot stored and rehydrated as the service keeps it
(layered or uploaded model), run by the NumPy reference, its record and pictures checked."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gpu import stencil
from gpu.errors import ParamError
from gpu.stencil import reference
from tests.gpu.jobkit import stored_and_back, written

SHOT = {
    "nx": 40,
    "ny": 20,
    "nz": 30,
    "h": 10.0,
    "steps": 120,
    "f0": 12.0,
    "source": [20, 10, 8],
    "receivers": {"start": [4, 10, 8], "end": [35, 10, 8], "count": 32},
    "model": {"type": "layered", "depths": [0.0, 150.0], "velocities": [1500.0, 2500.0]},
    "snapshot_every": 60,
    "sponge": 4,
}


def test_a_layered_shot_round_trips_and_runs(tmp_path):
    job = stored_and_back(stencil.StencilJob.from_request(SHOT), tmp_path / "in")
    stored = job.to_json()
    assert (
        stored["receivers"] == SHOT["receivers"] and stored["dt"] == job.params.dt and stored["model"] == SHOT["model"]
    )
    result = stencil.run(job)
    files = written(result, tmp_path / "out")
    record = np.load(files["shot_record.npy"])
    np.testing.assert_array_equal(record, reference.simulate(job.params).record)
    assert record.shape == (120, 32) and np.abs(record).max() > 0
    assert sorted(files) == result.summary["files"]
    assert {"snapshot_0000060_xz.png", "snapshot_0000120_xy.png", "shot_record.png", "velocity_xz.png"} <= set(files)
    picture = np.asarray(Image.open(files["shot_record.png"]))
    assert picture.std() > 5  # arrivals, not a blank
    assert result.summary["variant"] == "reference" and result.summary["backend"] == "cpu"


def test_an_uploaded_model_is_stored_as_a_file_and_gives_the_same_shot(tmp_path):
    layered = stencil.StencilJob.from_request(SHOT)
    velocity = layered.params.velocity()
    uploaded = stencil.StencilJob.from_request({key: value for key, value in SHOT.items() if key != "model"}, velocity)
    assert uploaded.to_json()["model"] == {"type": "upload"} and set(uploaded.input_files()) == {"model.npy"}
    back = stored_and_back(uploaded, tmp_path)
    np.testing.assert_array_equal(
        stencil.run(back).summary["record"]["max_abs"], stencil.run(layered).summary["record"]["max_abs"]
    )


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"model": None}, "model"), ({"model": {"type": "upload"}}, "model"), ({"nx": None}, "nx"), ({"dt": 0.005}, "dt")],
)
def test_a_bad_request_names_its_field(changes, field):
    with pytest.raises(ParamError) as caught:
        stencil.StencilJob.from_request({**SHOT, **changes})
    assert caught.value.field == field
