"""StencilParams and the velocity models: defaults, derived values and every refusal,
each with its API error code and a message naming the problem."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu.stencil.params import (
    ABSORBING_DEFAULT,
    CFL_LIMIT,
    DEFAULT_BOUNDARY_WIDTH,
    DEFAULT_CFL,
    MAX_RECORD_VALUES,
    MAX_SNAPSHOTS,
    VARIANTS,
    ArrayModel,
    ConstantModel,
    LayeredModel,
    ParamError,
    StencilJob,
    StencilParams,
    boundary_widths,
    receiver_line,
)


def make(**changes) -> StencilParams:
    values = {"nx": 40, "ny": 30, "nz": 20, "h": 10.0, "steps": 100, "f0": 10.0, "model": ConstantModel(2000.0)}
    values.update(changes)
    return StencilParams(**values)


def refused(code: str, match: str, **changes) -> ParamError:
    with pytest.raises(ParamError, match=match) as info:
        make(**changes)
    assert info.value.code == code, info.value
    return info.value


def test_nine_variants():
    assert VARIANTS == (
        "naive",
        "naive_int_z",
        "naive_int_z_reg",
        "shared",
        "shared_int_z",
        "shared_int_z_reg",
        "readonly",
        "readonly_int_z",
        "readonly_int_z_reg",
    )


def test_defaults():
    params = make()
    assert params.dt == pytest.approx(DEFAULT_CFL * 10.0 / 2000.0) and params.cfl == pytest.approx(DEFAULT_CFL)
    assert params.dt_max == pytest.approx(CFL_LIMIT * 10.0 / 2000.0)
    assert params.source == (20, 15, 10)
    assert params.receivers == tuple((x, 15, 10) for x in range(2, 38))
    assert params.snapshot_every == 25 and params.snapshot_steps == (25, 50, 75, 100)
    assert params.shape == (20, 30, 40) and params.points == 24000 and params.interior_points == 36 * 26 * 16
    assert params.sponge == 0 and params.eta_max == 0 and params.variant == "auto"
    assert make(snapshot_every=0).snapshot_steps == ()
    assert params.points_per_wavelength == pytest.approx(2000.0 / (2.5 * 10.0 * 10.0))


def test_cfl_violation_names_the_largest_stable_dt():
    error = refused(
        "cfl_violation", "largest stable dt is 0.002", dt=0.0026, model=LayeredModel((0.0, 100.0), (1500.0, 2500.0))
    )
    assert "2500" in str(error) and "0.65" in str(error)
    assert make(dt=0.0025).cfl == pytest.approx(CFL_LIMIT)  # the limit itself is stable
    # a layer below the grid does not count
    assert make(dt=0.0025, model=LayeredModel((0.0, 500.0), (2000.0, 9000.0))).v_max == 2000.0


@pytest.mark.parametrize("source", [(1, 5, 5), (38, 5, 5), (5, 1, 5), (5, 28, 5), (5, 5, 1), (5, 5, 18), (-3, 5, 5)])
def test_a_source_outside_the_interior_is_refused(source):
    axis = "xyz"[next(i for i, v in enumerate(source) if v != 5)]
    refused("source_outside_grid", f"{axis} = ", source=source)


def test_receivers_outside_the_interior_are_refused():
    refused("receiver_outside_grid", r"receivers\[1\]: z = 18", receivers=[(5, 5, 5), (5, 5, 18)])
    refused("invalid_parameter", "expected 1 to", receivers=[])
    refused("invalid_parameter", r"receivers\[0\]\[y\]: expected an integer", receivers=[(5, 5.5, 5)])
    refused("invalid_parameter", r"receivers\[0\]: expected \[x, y, z\]", receivers=[(5, 5)])


def test_receiver_line():
    assert receiver_line((2, 5, 3), (12, 5, 3), 6) == tuple((x, 5, 3) for x in (2, 4, 6, 8, 10, 12))
    assert receiver_line((2, 5, 3), (9, 7, 3), 1) == ((2, 5, 3),)
    line = receiver_line((3, 3, 3), (30, 20, 10), 7)
    assert line[0] == (3, 3, 3) and line[-1] == (30, 20, 10) and len(line) == 7
    with pytest.raises(ParamError, match="receivers.count"):
        receiver_line((3, 3, 3), (4, 4, 4), 0)
    with pytest.raises(ParamError, match="receivers.start"):
        receiver_line((3, 3), (4, 4, 4), 2)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"nx": 4}, "nx: must be >= 5"),
        ({"ny": True}, "ny: expected an integer"),
        ({"nz": 65_540}, "nz: must be <= 65539"),
        ({"h": 0.0}, "h: must be > 0"),
        ({"h": math.inf}, "h: expected a finite number"),
        ({"h": "10"}, "h: expected a finite number"),
        ({"dt": -1e-3}, "dt: must be > 0"),
        ({"steps": 0}, "steps: must be >= 1"),
        ({"steps": 2_000_000}, "steps: must be <= 1000000"),
        ({"f0": 0.0}, "f0: must be > 0"),
        ({"sponge": 9}, r"sponge: must be <= 8"),
        ({"sponge": -1}, "sponge: must be >= 0"),
        ({"cpml": 9}, r"boundary_width: must be <= 8"),
        ({"cpml": 2, "sponge": 2}, "boundary: a sponge .* or a CPML .*, not both"),
        ({"snapshot_every": 0.5}, "snapshot_every: expected an integer"),
        ({"variant": "fast"}, "variant: must be one of auto, naive"),
        ({"model": 2000.0}, "model: expected a constant"),
    ],
)
def test_bad_values_are_refused(changes, match):
    with pytest.raises(ParamError, match=match):
        make(**changes)


def test_a_cpml_whose_memory_the_kernels_cannot_index_is_refused():
    """1200^3 points fit the kernels' 32-bit indices, a 300-cell CPML's memory (2.57e9 cells
    of psi) does not: refused naming boundary_width; 100 cells (0.86e9) run."""
    with pytest.raises(ParamError, match="boundary_width: a CPML of 300 cells keeps 2,574,"):
        make(nx=1200, ny=1200, nz=1200, cpml=300)
    assert sum(make(nx=1200, ny=1200, nz=1200, cpml=100).cpml_slabs) < (1 << 31) - 1


def test_too_many_snapshots_or_record_values():
    refused("invalid_parameter", f"at most {MAX_SNAPSHOTS}", steps=1000, snapshot_every=9)
    assert len(make(steps=1000, snapshot_every=10).snapshot_steps) == 100
    refused(
        "invalid_parameter",
        "shot record would hold",
        steps=1_000_000,
        receivers=[(5, 5, 5)] * (MAX_RECORD_VALUES // 1_000_000 + 1),
    )


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (lambda: ConstantModel(0.0), "model.velocity: must be > 0"),
        (lambda: ConstantModel(math.nan), "model.velocity: expected a finite number"),
        (lambda: ConstantModel(2e5), "model.velocity: must be <= 100000"),
        (lambda: LayeredModel((10.0, 20.0), (1500.0, 2000.0)), r"depths\[0\]: the first layer must start at depth 0"),
        (lambda: LayeredModel((0.0, 20.0, 20.0), (1500.0, 2000.0, 2500.0)), r"depths\[2\]: depths must increase"),
        (lambda: LayeredModel((0.0, 20.0), (1500.0,)), "2 depths but 1 velocities"),
        (lambda: LayeredModel((0.0, 20.0), (1500.0, -5.0)), r"velocities\[1\]: must be > 0"),
        (lambda: LayeredModel((), ()), "expected 1 to 1024 layer tops"),
        (lambda: LayeredModel((0.0, math.inf), (1.0, 2.0)), r"depths\[1\]: expected a finite number"),
        (lambda: ArrayModel(np.full((6, 6), 1500.0, np.float32)), "expected a 3-D array"),
        (lambda: ArrayModel(np.full((6, 6, 6), 1500, np.int32)), "int32; send float32"),
        (lambda: ArrayModel(np.full((6, 6, 4), 1500.0, np.float32)), "at least 5 points"),
    ],
)
def test_bad_models_are_refused(model, match):
    with pytest.raises(ParamError, match=match) as info:
        model()
    assert info.value.code == "invalid_model"


@pytest.mark.parametrize(
    ("changes", "name", "match"),
    [
        ({"h": 1e30}, "h", "<= 1e[+]06 m"),
        ({"h": 1e-20}, "h", ">= 1e-06 m"),
        ({"f0": 1e-20}, "f0", "period 1 / f0 is"),
        ({"f0": 5e-324}, "f0", "period 1 / f0 is inf"),
        ({"f0": 1e12}, "f0", "<= 1e[+]09 Hz"),
        ({"f0": 1000.0}, "f0", "must span 2 to 1e[+]07 steps"),  # dt = 0.002 s: above Nyquist
        ({"dt": 1e-300}, "f0", "period 1 / f0 is"),
        ({"model": lambda: ConstantModel(1e-300)}, "model.velocity", ">= 1 m/s"),
        ({"model": lambda: LayeredModel((0.0, 50.0), (2000.0, 0.5))}, "model.velocities[1]", ">= 1 m/s"),
    ],
)
def test_physical_quantities_have_bounds_that_keep_the_arithmetic_finite(changes, name, match):
    """Each of these once passed validation and failed (or overflowed) inside the job.
    (Models are built inside the check: their own validation is what refuses.)"""
    with pytest.raises(ParamError, match=match) as info:
        make(**{key: value() if callable(value) else value for key, value in changes.items()})
    assert info.value.field == name
    assert info.value.code == ("invalid_model" if name.startswith("model") else "invalid_parameter")


def test_default_receivers_are_every_interior_x_thinned_to_the_limit():
    from gpu.stencil.params import MAX_RECEIVERS

    assert [r[0] for r in make().receivers] == list(range(2, 38))
    wide = make(nx=200_000, ny=5, nz=5, steps=10)
    xs = [r[0] for r in wide.receivers]
    assert len(xs) == MAX_RECEIVERS and xs[0] == 2 and xs[-1] == 200_000 - 3 and xs == sorted(set(xs))


def test_receiver_lines_far_outside_are_named_not_overflowed():
    from gpu.stencil.params import receiver_line

    with pytest.raises(ParamError, match=r"receivers.end\[x\]: must be <="):
        receiver_line((2, 2, 2), (10**20, 2, 2), 3)


def test_array_models(rng):
    values = rng.uniform(1500, 3000, (20, 30, 40)).astype(np.float64)
    params = make(model=ArrayModel(values))
    assert params.velocity().dtype == np.float32
    np.testing.assert_array_equal(params.velocity(), values.astype(np.float32))
    assert params.v_max == pytest.approx(values.max(), rel=1e-6) and params.v_min == pytest.approx(
        values.min(), rel=1e-6
    )
    bad = values.copy()
    bad[3, 4, 5] = np.nan
    with pytest.raises(ParamError, match="1 velocities are NaN"):
        ArrayModel(bad)
    bad[3, 4, 5] = -1
    with pytest.raises(ParamError, match="1 velocities are below 1 m/s"):
        ArrayModel(bad)
    refused("invalid_model", r"shape \(20, 30, 39\)", model=ArrayModel(values[:, :, :39]))


def test_layered_model_on_the_grid():
    model = LayeredModel((0.0, 45.0, 100.0), (1500.0, 2000.0, 3000.0))
    v = model.build(7, 6, 14, 10.0)
    assert v.shape == (14, 6, 7) and v.dtype == np.float32
    np.testing.assert_array_equal(v[:, 0, 0], [1500] * 5 + [2000] * 5 + [3000] * 4)  # plane z at depth 10 z
    assert model.v_range(14, 10.0) == (1500.0, 3000.0) and model.v_range(10, 10.0) == (1500.0, 2000.0)


def test_memory_estimates():
    params = make(receivers=[(5, 5, 5)] * 3, snapshot_every=50)
    assert params.gpu_bytes() == 12 * 24000 + 100 * 3 * 4 + 3 * 8 + 2 * (40 * 20 + 40 * 30) * 4
    assert params.cpu_bytes() > params.gpu_bytes() - 3 * 8


def test_velocity_at_is_the_built_value(rng):
    shape = (14, 9, 11)
    models = [
        ConstantModel(float(rng.uniform(1000, 3000))),
        LayeredModel((0.0, 33.3, 71.0), tuple(rng.uniform(1000, 3000, 3).tolist())),
        ArrayModel(rng.uniform(1000, 3000, shape)),
    ]
    for model in models:
        built = model.build(11, 9, 14, 10.0)
        for _ in range(20):
            x, y, z = int(rng.integers(11)), int(rng.integers(9)), int(rng.integers(14))
            assert model.velocity_at(x, y, z, 10.0) == float(built[z, y, x]), (type(model).__name__, x, y, z)


def test_slabs_and_sections_are_the_whole_grid(rng):
    models = [
        ConstantModel(1700.0),
        LayeredModel((0.0, 42.0, 95.0), (1500.0, 2100.0, 2900.0)),
        ArrayModel(rng.uniform(1000, 3000, (14, 9, 11))),
    ]
    for model in models:
        params = make(nx=11, ny=9, nz=14, model=model)
        whole = params.velocity()
        np.testing.assert_array_equal(
            np.concatenate([params.velocity(z, min(z + 4, 14)) for z in range(0, 14, 4)]), whole
        )
        np.testing.assert_array_equal(params.velocity_xz(5), whole[:, 5, :])
        np.testing.assert_array_equal(params.velocity_xy(9), whole[9])


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        ({}, (0, 0)),
        ({"sponge": 0}, (0, 0)),
        ({"sponge": 6}, (6, 0)),  # older requests and stored jobs: the sponge they asked for
        ({"boundary": "cpml"}, (0, DEFAULT_BOUNDARY_WIDTH)),
        ({"boundary": "cpml", "boundary_width": 7}, (0, 7)),
        ({"boundary": "sponge", "boundary_width": 7}, (7, 0)),
        ({"boundary": "cpml", "sponge": 5}, (0, 5)),  # boundary wins; sponge gives the width
        ({"boundary": "cpml", "sponge": 5, "boundary_width": 9}, (0, 9)),
        ({"boundary": "none", "sponge": 5}, (0, 0)),
        ({"boundary_width": 4}, (4, 0) if ABSORBING_DEFAULT == "sponge" else (0, 4)),
        ({"boundary_width": 0}, (0, 0)),
    ],
)
def test_the_boundary_a_request_asks_for(request_fields, expected):
    assert boundary_widths({"nx": 60, "ny": 50, "nz": 48, **request_fields}) == expected


def test_a_named_layer_gets_at_most_what_the_grid_holds():
    assert boundary_widths({"nx": 40, "ny": 30, "nz": 20, "boundary": "cpml"}) == (0, 8)


@pytest.mark.parametrize(
    ("request_fields", "match"),
    [
        ({"boundary": "pml"}, "boundary: must be one of none, sponge, cpml"),
        ({"boundary": "none", "boundary_width": 3}, "boundary_width: boundary none has no layer"),
        ({"boundary": "cpml", "boundary_width": 0}, "boundary_width: must be >= 1"),
        ({"boundary": "sponge", "boundary_width": 2.5}, "boundary_width: expected an integer"),
    ],
)
def test_bad_boundaries_are_refused(request_fields, match):
    with pytest.raises(ParamError, match=match):
        boundary_widths({"nx": 40, "ny": 30, "nz": 20, **request_fields})


def test_a_stored_job_keeps_its_boundary():
    """The stored request holds the resolved boundary and width: it comes back the same
    even if ABSORBING_DEFAULT changes later."""
    base = {
        "nx": 40,
        "ny": 30,
        "nz": 20,
        "h": 10.0,
        "steps": 10,
        "f0": 10.0,
        "model": {"type": "constant", "velocity": 2000.0},
    }
    job = StencilJob.from_request({**base, "boundary_width": 5})
    stored = job.to_json()
    assert stored["boundary"] == ABSORBING_DEFAULT and stored["boundary_width"] == 5
    again = StencilJob.from_json(stored, {})
    assert (again.params.sponge, again.params.cpml) == (job.params.sponge, job.params.cpml)
    legacy = StencilJob.from_request({**base, "sponge": 4})
    assert (legacy.params.boundary, legacy.params.boundary_width) == ("sponge", 4)


def test_the_cpml_memory_is_its_layers():
    plain, with_cpml = make(), make(cpml=4)
    layer_cells = 2 * 4 * (36 * 26 + 26 * 16 + 36 * 16)
    assert with_cpml.gpu_bytes() - plain.gpu_bytes() == 2 * 4 * layer_cells
    assert with_cpml.cpu_bytes() > plain.cpu_bytes()
