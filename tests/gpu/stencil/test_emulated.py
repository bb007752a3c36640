"""gpu/stencil/stencil.cu on the CPU: the real kernel source compiled by g++ with a small
CUDA shim (tests/gpu/stencil/emulator/emulator.cpp), launched exactly as cuda.launch
launches it (geometry.launches: slabs, wave plans, boxes, grids, arguments; the CPML's
cpml_shell over geometry.shell_chunks), against gpu/stencil/reference.py bit for bit.

What this checks without a GPU: the index arithmetic of all 18 variant kernels (no layer,
the sponge; with the CPML on its inner box) and of cpml_shell, with the production blocks
(32 x 8 threads), on odd sizes, partial tiles, one-point grids, every kind of z chunking
(uniform, two-phase plans, chunks shorter than the register pipeline), z slabs, shell
columns cut into chunks that start inside a layer; that no load leaves the arrays and no
store leaves the interior of pp or the CPML's next words, that each interior point is
stored exactly once a step (by the shell or the box) and each word once a launch; that the
Dirichlet border and p are never written; that barriers are block-uniform and shared
memory is never read before it is written in a block (poisoned with NaN); and, by running
each block's threads in forward, reverse and shuffled order between barriers, that there
is no shared-memory race. What it cannot check: timing, and the GPU's own compiler (the
GPU tests in test_cuda.py run the same cases on the device).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gpu.stencil import cpml as layers
from gpu.stencil import geometry
from gpu.stencil import reference as ref
from gpu.stencil.params import VARIANTS, ArrayModel, StencilParams

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "gpu" / "stencil" / "stencil.cu"
EMULATOR = Path(__file__).with_name("emulator") / "emulator.cpp"

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None, reason="needs g++ (C++20) to build the CPU emulation of the kernels"
)

FLOAT_P = ctypes.POINTER(ctypes.c_float)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """The emulator, built once per test session (a few seconds)."""
    build = tmp_path_factory.mktemp("stencil_emulator") / "libemulator.so"
    command = [
        "g++",
        "-std=c++20",
        "-O1",
        "-ffp-contract=off",
        "-fno-fast-math",
        "-fPIC",
        "-shared",
        "-Wall",
        "-Wno-unknown-pragmas",
        f'-DSTENCIL_SOURCE="{SOURCE}"',
        "-x",
        "c++",
        str(EMULATOR),
        "-o",
        str(build),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    lib = ctypes.CDLL(str(build))
    lib.emulate.restype = ctypes.c_int
    lib.emulate.argtypes = [
        ctypes.c_char_p,
        FLOAT_P,
        FLOAT_P,
        FLOAT_P,
        ctypes.c_longlong,
        FLOAT_P,
        ctypes.c_longlong,
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_float,
        ctypes.c_float,
        *(ctypes.c_int,) * 4,
        ctypes.c_uint,
        ctypes.c_char_p,
        ctypes.c_int,
    ]
    lib.emulate_shell.restype = ctypes.c_int
    lib.emulate_shell.argtypes = [
        FLOAT_P,
        FLOAT_P,
        FLOAT_P,
        ctypes.c_void_p,
        ctypes.c_int,
        FLOAT_P,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_longlong,
        *(ctypes.c_int,) * 7,
        ctypes.c_float,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_char_p,
        ctypes.c_int,
    ]
    lib.begin_step.restype = None
    lib.begin_step.argtypes = [FLOAT_P, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.end_step.restype = ctypes.c_int
    lib.end_step.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return lib


def _pointer(a: np.ndarray):
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return a.ctypes.data_as(FLOAT_P)


class CpmlState:
    """The CPML's buffers as cuda.CpmlBuffers holds them, in NumPy: the words of the last
    step and of this one (uint32, psi and zeta as bfloat16, slab layout, zero at the start),
    the profile table, cpml_shell's chunks and the width."""

    def __init__(self, params: StencilParams, planes: int | None = None):
        cells = sum(params.cpml_slabs)
        self.state, self.next = np.zeros(cells, np.uint32), np.zeros(cells, np.uint32)
        self.profile = layers.profile_table(params)
        self.chunks = geometry.shell_chunks(params.shape, params.cpml, planes)
        self.width = params.cpml

    def swap(self) -> None:
        self.state, self.next = self.next, self.state


def shell_on_emulator(
    lib, p, pp, c, shape, source, amp: float, state: CpmlState, blocks_short: int = 0, order: int = 0, seed: int = 0
) -> tuple[int, bytes]:
    """cpml_shell on the emulator over the shell's chunks (`blocks_short` fewer), inside a
    step (begin_step): (return code, the emulator's message)."""
    nz, ny, nx = shape
    message = ctypes.create_string_buffer(512)
    rc = lib.emulate_shell(
        _pointer(p),
        _pointer(pp),
        _pointer(c),
        state.chunks.ctypes.data,
        len(state.chunks) - blocks_short,
        _pointer(state.profile),
        state.state.ctypes.data,
        state.next.ctypes.data,
        state.state.size,
        nx,
        ny,
        nz,
        state.width,
        *source,
        amp,
        order,
        seed,
        message,
        len(message),
    )
    return rc, message.value


def end_step(lib) -> tuple[int, bytes]:
    """The emulator's check at the end of a step: (return code, message)."""
    message = ctypes.create_string_buffer(512)
    return lib.end_step(message, len(message)), message.value


def emulate_kernel(lib, step: geometry.Launch, views, ramps, amp: float, eta_max: float, grid=None, order=0, seed=0):
    """One launch of a variant's kernel on the emulator: (return code, message)."""
    message = ctypes.create_string_buffer(512)
    rc = lib.emulate(
        step.kernel.encode(),
        *(_pointer(v) for v in views),
        views[0].size,
        _pointer(ramps) if ramps is not None else None,
        0 if ramps is None else ramps.size,
        (ctypes.c_int * len(step.ints))(*step.ints),
        amp,
        eta_max,
        *(grid or step.grid),
        order,
        seed,
        message,
        len(message),
    )
    return rc, message.value


def emulated_launch(
    lib,
    variant: str,
    p: np.ndarray,
    pp: np.ndarray,
    c: np.ndarray,
    shape,
    source,
    amp: float,
    sponge: int,
    eta_max: float,
    zchunk: int | None = None,
    resident: int = 792,
    max_points: int = geometry.MAX_INDEX,
    order: int = 0,
    seed: int = 0,
    cpml: CpmlState | None = None,
) -> None:
    """One step as cuda.launch does it (p, pp, c flat float32 NumPy arrays), on the
    emulator; every interior point must be stored exactly once by the step's launches."""
    nz, ny, nx = shape
    plane = nx * ny
    lib.begin_step(_pointer(pp), nx, ny, nz)
    if cpml is not None:
        rc, text = shell_on_emulator(lib, p, pp, c, shape, source, amp, cpml, order=order, seed=seed)
        assert rc == 0, f"cpml_shell: {text.decode()}"
    width = cpml.width if cpml is not None else 0
    for step in geometry.launches(variant, shape, source, sponge, zchunk, lambda _name: resident, max_points, width):
        part = slice(step.lo * plane, step.hi * plane)
        ramps = ref.ramp_table(nx, ny, nz, sponge, step.lo, step.hi) if sponge > 0 else None
        rc, text = emulate_kernel(lib, step, (p[part], pp[part], c[part]), ramps, amp, eta_max, order=order, seed=seed)
        assert rc == 0, (
            f"{step.kernel} {step.grid}: {text.decode() or ('unknown kernel' if rc == 2 else 'nx ny nz != points')}"
        )
    rc, text = end_step(lib)
    assert rc == 0, text.decode()
    if cpml is not None:
        cpml.swap()


def random_case(rng: np.random.Generator, shape_xyz, sponge: int, steps: int, source=None, cpml: int = 0):
    """Random velocities near the CFL limit, random fields (zero border), a source (random
    unless given) and its amplitudes; a sponge or a CPML of the given widths."""
    nx, ny, nz = shape_xyz
    velocity = rng.uniform(1500, 4000, (nz, ny, nx)).astype(np.float32)
    dt = 0.499 * 10.0 / float(velocity.max())
    if source is None:
        source = tuple(int(rng.integers(2, n - 2)) for n in shape_xyz)
    params = StencilParams(
        nx=nx,
        ny=ny,
        nz=nz,
        h=10.0,
        steps=steps,
        f0=float(rng.uniform(10, 40)),
        model=ArrayModel(velocity),
        dt=dt,
        source=source,
        receivers=[source],
        sponge=sponge,
        cpml=cpml,
        snapshot_every=0,
    )
    fields = []
    for _ in range(2):
        f = np.zeros(params.shape, np.float32)
        f[2:-2, 2:-2, 2:-2] = rng.standard_normal((nz - 4, ny - 4, nx - 4))
        fields.append(f)
    return params, fields[0], fields[1]


def run_emulated(
    lib,
    variant: str,
    params: StencilParams,
    p0: np.ndarray,
    p_prev: np.ndarray,
    shell_planes: int | None = None,
    **launch,
) -> tuple[np.ndarray, np.ndarray]:
    """(p^steps, p^(steps-1)) of `params.steps` emulated steps from (p0, p_prev); the
    CPML's shell in chunks of at most `shell_planes` planes."""
    c = ref.coefficients(params.velocity(), params.dt, params.h).ravel()
    p, pp = p0.ravel().copy(), p_prev.ravel().copy()
    amplitudes = ref.source_amplitudes(params)
    eta_max = float(np.float32(params.eta_max))
    state = CpmlState(params, shell_planes) if params.cpml else None
    for n in range(params.steps):
        before = p.copy()
        emulated_launch(
            lib,
            variant,
            p,
            pp,
            c,
            params.shape,
            params.source,
            float(amplitudes[n]),
            params.sponge,
            eta_max,
            cpml=state,
            **launch,
        )
        np.testing.assert_array_equal(p, before, err_msg="p^n was written")
        p, pp = pp, p
    return p.reshape(params.shape), pp.reshape(params.shape)


def assert_matches(lib, variant: str, params, p0, p_prev, what: str = "", **launch) -> np.ndarray:
    expected = ref.simulate(params, initial=(p0, p_prev))
    field, previous = run_emulated(lib, variant, params, p0, p_prev, **launch)
    label = f"{variant} {params.shape} {params.boundary} {params.boundary_width} {launch} {what}"
    border = field.copy()
    border[2:-2, 2:-2, 2:-2] = 0
    assert not border.any(), f"{label}: the Dirichlet border was written"
    differ = int(np.count_nonzero(field != expected.field))
    assert differ == 0, (
        f"{label}: {differ} of {field.size} values differ from the reference (max |diff| "
        f"{np.abs(field - expected.field).max():.3g})"
    )
    np.testing.assert_array_equal(previous, expected.previous, err_msg=label)
    return field


# (nx, ny, nz): odd sizes; nx a multiple of 32 (aligned full tiles); nx = 33 (x = 2 .. 30:
# one x tile); one interior point; tall columns for chunking; 70 x 29 x 23 (with a 2-cell
# CPML, an inner box beside the shell: every variant's kernel runs on it).
SHAPES = [(37, 21, 19), (64, 11, 12), (33, 13, 9), (5, 5, 5), (9, 27, 30), (70, 6, 17), (70, 29, 23)]


@pytest.mark.parametrize("boundary", ["none", "sponge", "cpml"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_kernel_matches_the_reference(emulator, rng, variant, boundary):
    """Every shape; with a 2-cell layer where there is room for one (5 x 5 x 5 has none),
    and with the widest CPML a shape holds (its two layers meet in the middle of the
    shortest axis: psi read across from one into the other)."""
    for shape in SHAPES:
        room = (min(shape) - 4) // 2
        if boundary != "none" and room < 2:
            continue
        widths = {"none": [0], "sponge": [2], "cpml": sorted({2, room})}[boundary]
        for width in widths:
            params, p0, p_prev = random_case(
                rng, shape, width if boundary == "sponge" else 0, steps=3, cpml=width if boundary == "cpml" else 0
            )
            assert_matches(emulator, variant, params, p0, p_prev)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if "int_z" in v])
def test_every_z_chunking(emulator, rng, variant):
    """Uniform chunks of 1 .. 9 planes (shorter than, equal to and longer than the 8-plane
    unroll and the 5-plane pipeline), chunks longer than the column, and two-phase plans
    from small residencies (whole columns for some tiles, chunks for the rest)."""
    params, p0, p_prev = random_case(rng, (45, 19, 27), sponge=3, steps=2)
    interior = params.nz - 4
    for zchunk in (1, 2, 3, 4, 5, 7, 8, 9, 16, interior, interior + 5):
        assert_matches(emulator, variant, params, p0, p_prev, zchunk=zchunk)
    with_cpml, p0_cpml, p_prev_cpml = random_case(rng, (100, 43, 31), sponge=0, steps=2, cpml=6)  # an inner box
    for zchunk in (1, 3, 5, 8, 9, interior + 5):
        assert_matches(emulator, variant, with_cpml, p0_cpml, p_prev_cpml, zchunk=zchunk)
    tiles = int(np.prod(geometry.interior(params.shape).tiles))
    for resident in (1, 3, 5, tiles - 1, tiles + 1, 1000):
        plan = geometry.march_plan(tiles, interior, resident, geometry.marching(variant))
        assert_matches(emulator, variant, params, p0, p_prev, what=plan.describe(), resident=resident)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.startswith("shared")])
def test_no_shared_memory_race(emulator, rng, variant):
    """The block's threads in reverse and shuffled order between barriers give the same
    result as in order (a race would make it depend on the order); with the CPML, on its
    inner box."""
    for sponge, cpml, shape in ((2, 0, (41, 18, 14)), (0, 3, (70, 29, 23))):
        params, p0, p_prev = random_case(rng, shape, sponge=sponge, steps=1, cpml=cpml)
        assert not cpml or geometry.inner_box(params.shape, cpml) is not None
        fields = [
            run_emulated(emulator, variant, params, p0, p_prev, zchunk=zchunk, order=order, seed=seed)[0]
            for zchunk in (None, 3)
            for order, seed in ((0, 0), (1, 0), (2, 1), (2, 2))
        ]
        for f in fields[1:]:
            np.testing.assert_array_equal(f, fields[0], err_msg=f"{variant} {params.boundary}")


@pytest.mark.parametrize("variant", ["naive", "shared_int_z", "readonly_int_z_reg", "shared_int_z_reg"])
def test_z_slabs(emulator, rng, variant):
    """Grids past the 32-bit index limit run as z slabs: forced here with a small limit
    (slabs of 5 to 11 planes, the source in one of them)."""
    params, p0, p_prev = random_case(rng, (23, 14, 29), sponge=2, steps=2)
    plane = params.nx * params.ny
    for planes in (5, 6, 11):
        assert len(geometry.slabs(params.nx, params.ny, params.nz, planes * plane)) > 1
        assert_matches(emulator, variant, params, p0, p_prev, max_points=planes * plane)


@pytest.mark.parametrize("variant", VARIANTS)
def test_source_on_tile_and_chunk_edges(emulator, rng, variant):
    """The source at the first and last column of an x tile, the first and last row of a
    y tile, the first plane of a z chunk, and inside the sponge."""
    for index, source in enumerate(((31, 9, 6), (32, 10, 7), (2, 2, 2), (38, 17, 12), (33, 3, 10))):
        sponge, cpml = (3, 0) if index % 2 == 0 else (0, 3)
        params, p0, p_prev = random_case(rng, (41, 20, 15), sponge=sponge, steps=2, source=source, cpml=cpml)
        assert_matches(
            emulator, variant, params, p0, p_prev, what=f"source {source}", zchunk=5 if "int_z" in variant else None
        )


def test_the_emulator_catches_what_it_checks(emulator, rng):
    """Its checks are live: a sponge table without the interior planes' fz is a load
    outside the arrays; a launch that skips the last planes leaves interior points unwritten."""
    params, p0, p_prev = random_case(rng, (37, 12, 9), sponge=2, steps=1)
    nz, ny, nx = params.shape
    p, pp, c = (
        p0.ravel().copy(),
        p_prev.ravel().copy(),
        ref.coefficients(params.velocity(), params.dt, params.h).ravel(),
    )
    [step] = geometry.launches(
        "readonly_int_z_reg", params.shape, params.source, params.sponge, None, lambda _name: 792
    )
    short = ref.ramp_table(nx, ny, nz, params.sponge, 0, 2)  # fz of the border planes 0, 1 only
    emulator.begin_step(_pointer(pp), nx, ny, nz)
    rc, text = emulate_kernel(emulator, step, (p, pp, c), short, 0.0, 1.0)
    assert rc == 1 and b"load outside" in text
    [fewer] = geometry.launches("readonly", params.shape, params.source, 0, None, lambda _name: 792)
    emulator.begin_step(_pointer(pp), nx, ny, nz)
    rc, text = emulate_kernel(emulator, fewer, (p, pp, c), None, 0.0, 0.0, grid=(*fewer.grid[:2], fewer.grid[2] - 1))
    assert rc == 0
    rc, text = end_step(emulator)
    assert rc == 1 and b"not written" in text


def test_the_emulator_catches_a_cpml_cell_left_out(emulator, rng):
    """A shell launch one chunk short leaves its layer words unwritten; a step whose inner
    box launch misses its last plane leaves interior points unwritten: both are reported."""
    params, p0, _ = random_case(rng, (100, 50, 45), sponge=0, steps=1, cpml=5)
    nz, ny, nx = params.shape
    state = CpmlState(params)
    p = p0.ravel().copy()
    pp, c = np.zeros_like(p), ref.coefficients(params.velocity(), params.dt, params.h).ravel()
    emulator.begin_step(_pointer(pp), nx, ny, nz)
    rc, text = shell_on_emulator(emulator, p, pp, c, params.shape, params.source, 0.0, state, blocks_short=1)
    assert rc == 1 and b"CPML word" in text and b"not written" in text, text
    emulator.begin_step(_pointer(pp), nx, ny, nz)
    rc, text = shell_on_emulator(emulator, p, pp, c, params.shape, params.source, 0.0, state)
    assert rc == 0, text
    [box] = geometry.launches("naive", params.shape, params.source, 0, None, lambda _name: 792, cpml=5)
    part = slice(box.lo * nx * ny, box.hi * nx * ny)
    grid = (*box.grid[:2], box.grid[2] - 1)
    rc, text = emulate_kernel(emulator, box, (p[part], pp[part], c[part]), None, 0.0, 0.0, grid=grid)
    assert rc == 0, text
    rc, text = end_step(emulator)
    assert rc == 1 and b"not written" in text


def test_shell_chunks_that_start_inside_a_layer(emulator, rng):
    """Shell columns cut into chunks of 3 and 7 planes (their rings start inside the z
    layers and across their edges), on a grid with an inner box, the source in a corner of
    the layers, then inside the box (at its first and last points)."""
    cases = ((3, "readonly", (3, 4, 3)), (7, "shared", (32, 10, 8)), (7, "naive_int_z_reg", (63, 33, 22)))
    for planes, variant, source in cases:
        params, p0, p_prev = random_case(rng, (100, 43, 31), sponge=0, steps=3, source=source, cpml=6)
        assert geometry.inner_box(params.shape, 6) == geometry.Box(32, 32, 64, 10, 34, 8, 23)
        assert_matches(emulator, variant, params, p0, p_prev, what=f"chunks of {planes}", shell_planes=planes)
