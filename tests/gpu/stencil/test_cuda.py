"""gpu/stencil/cuda.py and stencil.cu against gpu/stencil/reference.py: all nine variants
(18 kernels: no layer, the sponge; with the CPML on its inner box beside cpml_shell) on
small odd-sized grids (not multiples of the 32 x 8 block; nx a multiple of 32; a second
x tile holding only the border; a grid with an inner box, its shell in short chunks;
several z chunkings, down to one plane a block), from random fields in random velocity
models, over 100+ steps; the source on tile and chunk edges; z slabs (forced with a small
index limit); no write outside the interior (borders of pp and c poisoned with NaN); no
spills under NVRTC; `auto`; the CuPy-slicing anchor; cancel; NVML energy.

CUDA only (marker `gpu`; skipped without a device). Fresh random seeds (printed). The same
cases run on the CPU, on an emulation of the kernels, in test_emulated.py; the physics of a
shot, one body on both backends, in test_backends.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu.backend import cuda_devices
from gpu.stencil import geometry
from gpu.stencil import reference as ref
from gpu.stencil.params import (
    VARIANTS,
    ArrayModel,
    ConstantModel,
    LayeredModel,
    StencilParams,
)
from tests.gpu.stencil.fields import random_fields

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device"),
    pytest.mark.pool(streams_per_device=2),
]

# (nx, ny, nz): odd sizes (36 x 12: a 32 x 8 interior); nx a multiple of 32 (aligned full
# tiles); nx = 33 (x = 2 .. 30: one x tile); 70 x 29 x 23 (with a 2- or 3-cell CPML, an
# inner box beside the shell: every variant's kernel runs on it); a single interior point; a
# tall one that the z-marching variants cut into chunks.
SHAPES = [(37, 21, 19), (70, 13, 23), (36, 12, 9), (64, 11, 12), (33, 13, 10), (5, 5, 5), (9, 27, 45), (70, 29, 23)]
STEPS = 120


@pytest.fixture(scope="module")
def cuda():
    from gpu.stencil import cuda

    return cuda


def random_case(
    rng: np.random.Generator,
    shape_xyz: tuple[int, int, int],
    sponge: int = 0,
    steps: int = STEPS,
    source: tuple[int, int, int] | None = None,
    cpml: int = 0,
) -> tuple[StencilParams, tuple[np.ndarray, np.ndarray]]:
    """Random velocities (1500-4000 m/s) at dt near the largest stable step, a random source
    (unless given) and receivers, random initial fields (zero border)."""
    nx, ny, nz = shape_xyz
    velocity = rng.uniform(1500, 4000, (nz, ny, nx)).astype(np.float32)
    h = 10.0
    dt = 0.499 * h / float(velocity.max())  # just under the CFL limit (0.5 itself may round above it)
    interior = [rng.integers(2, n - 2, 8) for n in shape_xyz]
    points = [tuple(int(a[i]) for a in interior) for i in range(8)]
    if source is not None:
        points[0] = source
    params = StencilParams(
        nx=nx,
        ny=ny,
        nz=nz,
        h=h,
        steps=steps,
        f0=float(rng.uniform(10, 40)),
        model=ArrayModel(velocity),
        dt=dt,
        source=points[0],
        receivers=points[1:],
        sponge=sponge,
        cpml=cpml,
        snapshot_every=steps // 3,
    )
    return params, random_fields(rng, params.shape)


def relative_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm((actual - expected).astype(np.float64)) / np.linalg.norm(expected.astype(np.float64)))


def compare(run, expected: ref.Shot, what: str) -> None:
    shot = run.shot
    assert np.isfinite(shot.record).all(), f"{what}: record rows missing (NaN) or diverged"
    for name, a, b in (
        ("field", shot.field, expected.field),
        ("previous", shot.previous, expected.previous),
        ("record", shot.record, expected.record),
    ):
        error = relative_l2(a, b)
        assert error <= 1e-5, (
            f"{what}: {name} relative L2 {error:.3g}, {int(np.count_nonzero(a != b))} of {a.size} values differ"
        )
    assert [s.step for s in shot.snapshots] == [s.step for s in expected.snapshots]
    for got, want in zip(shot.snapshots, expected.snapshots, strict=True):
        assert relative_l2(got.xz, want.xz) <= 1e-5 and relative_l2(got.xy, want.xy) <= 1e-5, (
            f"{what}: snapshot {want.step}"
        )


# every shape without a layer, and with a 2-cell sponge and a 2-cell CPML where there is room
BOUNDARY_CASES = [(shape, "none") for shape in SHAPES] + [
    (shape, boundary) for shape in SHAPES if min(shape) >= 9 for boundary in ("sponge", "cpml")
]


def widths(boundary: str, width: int = 2) -> dict[str, int]:
    return {"sponge": width if boundary == "sponge" else 0, "cpml": width if boundary == "cpml" else 0}


@pytest.mark.parametrize(
    ("shape", "boundary"), BOUNDARY_CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v
)
def test_every_variant_matches_the_reference(cuda, lease, rng, shape, boundary):
    params, initial = random_case(rng, shape, **widths(boundary))
    expected = ref.simulate(params, initial=initial)
    for variant in VARIANTS:
        for zchunk in (None, 1, 5) if "int_z" in variant else (None,):
            run = cuda.simulate(lease, params, variant=variant, initial=initial, zchunk=zchunk, measure_energy=False)
            assert run.variant == variant
            marching = "int_z" in variant and (not params.cpml or geometry.inner_box(params.shape, params.cpml))
            assert (run.plan is not None) == bool(marching)  # a CPML with no inner box runs the shell alone
            compare(run, expected, f"{variant} zchunk {zchunk} ({run.plan})")


def test_the_variants_agree_bit_for_bit(cuda, lease, rng):
    """The kernels round every operation as the reference does (no FMA contraction): the
    results are identical, not just close."""
    for boundary in ("sponge", "cpml"):
        params, initial = random_case(rng, (45, 19, 23), steps=100, **widths(boundary, 3))
        expected = ref.simulate(params, initial=initial)
        for variant in VARIANTS:
            run = cuda.simulate(lease, params, variant=variant, initial=initial, measure_energy=False)
            np.testing.assert_array_equal(run.shot.field, expected.field, err_msg=f"{variant} {boundary}")
            np.testing.assert_array_equal(run.shot.record, expected.record, err_msg=f"{variant} {boundary}")


def test_the_cpml_run_matches_the_reference_where_its_layers_meet(cuda, lease, rng):
    """The widest CPML a grid holds (the two layers of the shortest axis touch: psi is read
    across), from random fields over many crossings of the layers: bit for bit. Then the
    job's case, from rest with the Ricker source: within rounding (relative L2 1e-5).
    From rest, the wavefront's leading edge passes through subnormal floats, which the GPU
    and the host treat differently (measured: the same run on the host with subnormals
    flushed to zero differs from the reference as the GPU's does, by a few ulps); the
    sponge damps that edge away, the CPML (and bare walls) carry it on, and a value a few
    ulps off that sits on a bfloat16 rounding boundary is stored one bfloat16 step away."""
    params, initial = random_case(rng, (40, 23, 29), steps=300, cpml=(23 - 4) // 2, source=(20, 11, 14))
    expected = ref.simulate(params, initial=initial)
    for variant in VARIANTS:
        run = cuda.simulate(lease, params, variant=variant, initial=initial, measure_energy=False)
        np.testing.assert_array_equal(run.shot.record, expected.record, err_msg=variant)
        np.testing.assert_array_equal(run.shot.field, expected.field, err_msg=variant)
    from_rest = ref.simulate(params)
    assert np.abs(from_rest.record).max() > 0
    for variant in VARIANTS:
        compare(cuda.simulate(lease, params, variant=variant, measure_energy=False), from_rest, f"{variant} from rest")


@pytest.mark.parametrize("boundary", ["none", "sponge", "cpml"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_no_write_outside_the_interior(cuda, lease, rng, variant, boundary):
    """One launch on arrays that sit inside NaN-filled guard zones, with the Dirichlet
    border of pp and c NaN too (the update never needs them): the guards and pp's border
    stay NaN (a store there would replace it), a read outside the arrays or of pp / c off
    the interior would bring NaN in, and the interior equals one reference step."""
    import cupy

    shape = (70, 29, 23) if boundary == "cpml" else (41, 15, 13)  # the CPML's with an inner box
    params, (p0, p_prev) = random_case(rng, shape, steps=1, **widths(boundary))
    guard = 4096
    n = params.points
    interior = (slice(2, -2),) * 3
    poisoned_prev = np.full(params.shape, np.nan, np.float32)
    poisoned_prev[interior] = p_prev[interior]
    coefficients = ref.coefficients(params.velocity(), params.dt, params.h)
    poisoned_c = np.full(params.shape, np.nan, np.float32)
    poisoned_c[interior] = coefficients[interior]
    buffers = []
    for array in (p0, poisoned_prev, poisoned_c):
        padded = cupy.full(n + 2 * guard, np.nan, np.float32)
        padded[guard : guard + n] = cupy.asarray(array.ravel())
        buffers.append(padded)
    p, pp, c = (b[guard : guard + n] for b in buffers)
    amp = float(ref.source_amplitudes(params)[0])
    for zchunk in (None, 3) if "int_z" in variant else (None,):
        pp[...] = cupy.asarray(poisoned_prev.ravel())
        layers = cuda.CpmlBuffers.of(params)
        cuda.launch(
            variant,
            p,
            pp,
            c,
            params.shape,
            params.source,
            amp,
            params.sponge,
            float(np.float32(params.eta_max)),
            zchunk=zchunk,
            cpml=layers,
        )
        for b in buffers:
            assert bool(cupy.isnan(b[:guard]).all()) and bool(cupy.isnan(b[guard + n :]).all()), (
                f"{variant} wrote into a guard zone"
            )
        out = pp.get().reshape(params.shape)
        border = out.copy()
        border[interior] = np.nan
        assert np.isnan(border).all(), f"{variant} zchunk {zchunk} wrote on the Dirichlet border"
        expected = ref.simulate(params, initial=(p0, p_prev)).field
        np.testing.assert_array_equal(out[interior], expected[interior], err_msg=f"{variant} zchunk {zchunk}")
        np.testing.assert_array_equal(p.get(), p0.ravel())  # p^n is only read


@pytest.mark.parametrize("variant", VARIANTS)
def test_source_on_tile_and_chunk_edges(cuda, lease, rng, variant):
    """The source at the first and last column of an x tile (31, 32), the first and last
    row of a y tile (9, 10), a corner of the grid, a z chunk's first plane, the sponge."""
    for index, source in enumerate(((31, 9, 6), (32, 10, 7), (2, 2, 2), (38, 17, 12), (33, 3, 10))):
        boundary = "sponge" if index % 2 == 0 else "cpml"
        params, initial = random_case(rng, (41, 20, 15), steps=30, source=source, **widths(boundary, 3))
        expected = ref.simulate(params, initial=initial)
        run = cuda.simulate(
            lease,
            params,
            variant=variant,
            initial=initial,
            zchunk=5 if "int_z" in variant else None,
            measure_energy=False,
        )
        np.testing.assert_array_equal(run.shot.field, expected.field, err_msg=f"{variant} source {source}")
        np.testing.assert_array_equal(run.shot.record, expected.record, err_msg=f"{variant} source {source}")


@pytest.mark.parametrize("variant", ["naive", "shared_int_z", "readonly_int_z_reg", "shared_int_z_reg"])
def test_z_slabs(cuda, lease, rng, monkeypatch, variant):
    """Grids of 2^31 points or more run as z slabs, one launch each on views of the arrays:
    forced here with a small index limit (slabs of 5 and 9 planes)."""
    params, initial = random_case(rng, (45, 19, 31), sponge=2, steps=40)
    expected = ref.simulate(params, initial=initial)
    plane = params.nx * params.ny
    for planes in (5, 9):
        monkeypatch.setattr(geometry, "MAX_INDEX", planes * plane)
        assert len(cuda.launches(variant, params.shape, params.source, params.sponge)) > 1
        run = cuda.simulate(lease, params, variant=variant, initial=initial, measure_energy=False)
        np.testing.assert_array_equal(run.shot.field, expected.field, err_msg=f"{variant} slabs of {planes} planes")
        with pytest.raises(ValueError, match="CPML runs a grid in one launch"):
            cuda.launches(variant, params.shape, params.source, 0, cpml=2)


def test_no_kernel_spills_and_the_plans_use_the_residency(cuda, lease):
    """NVRTC's build of the 18 variant kernels keeps everything in registers (no local
    memory; cpml_shell spills a few bytes of its ring at 5 blocks a SM, which ran faster
    than 4 without), and the z-marching plans are made for the blocks the device holds at
    once, on the whole interior or the CPML's inner box."""
    shell = cuda._k("cpml_shell")
    print(f"cpml_shell: {shell.num_regs} registers, {shell.local_size_bytes} B local")
    assert shell.local_size_bytes <= 128 and cuda.resident_blocks("cpml_shell") >= 5 * cuda.kernels.device_attribute(
        "MultiProcessorCount"
    )
    shape = (260, 260, 1028)
    for variant in VARIANTS:
        for sponge, cpml in ((0, 0), (3, 0), (0, 3)):
            name = cuda.kernel_name(variant, sponge)
            kernel = cuda._k(name)
            resident = cuda.resident_blocks(name)
            print(
                f"{name}: {kernel.num_regs} registers, {kernel.shared_size_bytes} B shared, "
                f"{kernel.local_size_bytes} B local, {resident} blocks at once"
            )
            assert kernel.local_size_bytes == 0, f"{name} spills {kernel.local_size_bytes} bytes"
            assert resident >= 4 * cuda.kernels.device_attribute("MultiProcessorCount")
            plan = cuda.march_plan(variant, shape, sponge=sponge, cpml=cpml)
            if plan is not None:
                box = geometry.inner_box(shape, cpml) if cpml else geometry.interior(shape)
                tx, ty = box.tiles
                assert plan == geometry.march_plan(tx * ty, box.z_hi - box.z_lo, resident, geometry.marching(variant))


def test_the_cpml_shell_in_short_chunks_around_an_inner_box(cuda, lease, rng, monkeypatch):
    """A grid with an inner box, its shell columns cut into chunks of 3, 7 and 32 planes
    (the register rings start inside the z layers and across their edges), the source in
    a corner of the layers, then inside the box; 150 steps against the reference."""
    for planes, source in ((3, (4, 5, 3)), (7, (32, 10, 8)), (32, (4, 5, 3)), (32, (63, 33, 22))):
        monkeypatch.setattr(geometry, "SHELL_CHUNK", planes)
        params, initial = random_case(rng, (100, 43, 31), steps=150, cpml=6, source=source)
        assert geometry.inner_box(params.shape, 6) is not None
        expected = ref.simulate(params, initial=initial)
        for variant in ("readonly", "readonly_int_z_reg", "shared"):
            run = cuda.simulate(lease, params, variant=variant, initial=initial, measure_energy=False)
            compare(run, expected, f"{variant}, shell chunks of {planes}")


def test_auto_times_the_nine_once_per_grid(cuda, lease, rng):
    cuda.forget_choices()
    params, initial = random_case(rng, (57, 29, 33), sponge=0, steps=101)
    expected = ref.simulate(params, initial=initial)
    first = cuda.simulate(lease, params, variant="auto", initial=initial, measure_energy=False)
    assert first.variant in VARIANTS and set(first.trial_ms) == set(VARIANTS)
    assert all(ms > 0 for ms in first.trial_ms.values())
    assert first.variant == min(first.trial_ms, key=first.trial_ms.get)
    compare(first, expected, "auto")  # the trial left no trace in the fields
    second = cuda.simulate(lease, params, variant="auto", initial=initial, measure_energy=False)
    assert second.variant == first.variant and second.trial_ms is None
    np.testing.assert_array_equal(second.shot.record, first.shot.record)
    with_cpml, initial = random_case(rng, (100, 43, 31), 0, steps=101, cpml=6)  # an inner box
    expected = ref.simulate(with_cpml, initial=initial)
    third = cuda.simulate(lease, with_cpml, variant="auto", initial=initial, measure_energy=False)
    assert third.trial_ms is not None, "the variants are timed on the CPML's inner box on their own"
    compare(third, expected, "auto with the CPML")  # the trial left no trace in the layers' words either
    all_shell, initial = random_case(rng, (57, 29, 33), 0, steps=30, cpml=6)  # no inner box: nothing to choose
    assert geometry.inner_box(all_shell.shape, 6) is None
    fourth = cuda.simulate(lease, all_shell, variant="auto", initial=initial, measure_energy=False)
    assert fourth.trial_ms is None and fourth.variant == cuda.UNUSED_VARIANT
    compare(fourth, ref.simulate(all_shell, initial=initial), "auto with the CPML, all shell")


def test_a_shot_from_rest_matches_the_reference(cuda, lease):
    """The job's case: zero fields, a Ricker source, a layered model, receivers on a line."""
    params = StencilParams(
        nx=101,
        ny=37,
        nz=61,
        h=10.0,
        steps=400,
        f0=12.0,
        model=LayeredModel((0.0, 300.0), (1500.0, 2500.0)),
        source=(50, 18, 12),
        receivers=tuple((x, 18, 12) for x in range(4, 97, 3)),
        sponge=8,
        snapshot_every=100,
    )
    expected = ref.simulate(params)
    assert np.abs(expected.record).max() > 0
    run = cuda.simulate(lease, params, variant="readonly_int_z_reg", measure_energy=False)
    compare(run, expected, "shot")
    assert run.batches >= 2 and run.timeline[-1][0] == params.steps


def test_the_cupy_slicing_anchor_matches_the_reference(lease, rng):
    import cupy

    params, initial = random_case(rng, (33, 17, 21), sponge=2, steps=100)
    expected = ref.simulate(params, initial=initial)
    prop = ref.Propagator(params, xp=cupy, initial=initial)
    for n in range(params.steps):
        prop.step(n)
    assert relative_l2(prop.field().get(), expected.field) <= 1e-5


def test_cancel_between_batches(cuda, lease, pool):
    params = StencilParams(
        nx=64, ny=64, nz=64, h=10.0, steps=5000, f0=10.0, model=ConstantModel(2000.0), snapshot_every=0
    )
    seen = []

    class Stop(Exception):
        pass

    def checkpoint(done):
        seen.append(done)
        if len(seen) == 2:
            raise Stop

    with pytest.raises(Stop):
        cuda.simulate(lease, params, variant="shared", checkpoint=checkpoint, measure_energy=False)
    assert seen[0] < seen[1] < params.steps
    run = cuda.simulate(
        lease,
        StencilParams(nx=16, ny=16, nz=16, h=10.0, steps=10, f0=10.0, model=ConstantModel(2000.0)),
        variant="naive",
        measure_energy=False,
    )
    assert np.isfinite(run.shot.record).all()  # the lease still works


def test_energy_is_measured_over_the_run(cuda, lease):
    params = StencilParams(
        nx=256,
        ny=256,
        nz=256,
        h=10.0,
        steps=1500,
        f0=5.0,
        model=ConstantModel(2000.0),
        snapshot_every=0,
        receivers=[(128, 128, 128)],
    )
    run = cuda.simulate(lease, params, variant="readonly")
    energy = run.energy
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert energy.joules is None and "nvidia-ml-py" in energy.note
        return
    assert energy.method in ("total_energy_counter", "power_samples"), energy
    assert energy.joules > 0 and 20 < energy.average_watts < 2000, energy
    assert run.kernel_seconds <= run.wall_seconds + 1e-3
