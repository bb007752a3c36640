"""gpu/stencil/geometry.py: tiles, the z-marching plans (every interior (tile, plane) once,
whole waves on the benchmark's grids), the z slabs past 2^31 points, the CPML's inner box
and shell (every interior point once, by one of the two), and the launches that
cuda.launch and the CPU emulation share."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from gpu.stencil import geometry
from gpu.stencil.params import MAX_PLANE, VARIANTS, ConstantModel, ParamError, StencilParams


def covered(plan: geometry.MarchPlan) -> np.ndarray:
    """How many blocks of the plan update each (tile, interior plane)."""
    count = np.zeros((plan.tiles, plan.interior), np.int64)
    for block in range(plan.blocks):
        tile, z0, z1 = plan.chunk(block)
        assert 0 <= tile < plan.tiles and 2 <= z0 < z1 <= plan.interior + 2, (block, tile, z0, z1)
        count[tile, z0 - 2 : z1 - 2] += 1
    return count


def makespan(plan: geometry.MarchPlan, resident: int, start: float) -> float:
    """Blocks started in grid order on `resident` slots as they free up (the hardware's
    block scheduler), each lasting its planes plus `start`."""
    slots = [0.0] * resident
    for block in range(plan.blocks):
        _, z0, z1 = plan.chunk(block)
        heapq.heappush(slots, heapq.heappop(slots) + z1 - z0 + start)
    return max(slots)


def plan_of(nx: int, ny: int, nz: int, resident: int, kind: str = "int_z_reg") -> geometry.MarchPlan:
    """march_plan for the whole interior of a grid."""
    tx, ty = geometry.interior((nz, ny, nx)).tiles
    return geometry.march_plan(tx * ty, nz - 4, resident, kind)


def test_tiles_start_at_x_0_and_y_2():
    assert geometry.interior((256, 256, 1024)).tiles == (
        32,
        32,
    )  # 1020 interior columns from x = 0 in 32 aligned tiles; 252 rows in 32 (the last half full)
    assert geometry.interior((9, 13, 33)).tiles == (1, 2)  # x = 2 .. 30 in one tile
    assert geometry.interior((9, 13, 35)).tiles == (2, 2)  # x = 32 in a second
    assert geometry.interior((5, 5, 5)).tiles == (1, 1)


@pytest.mark.parametrize("kind", ["int_z", "int_z_reg"])
@pytest.mark.parametrize(
    "shape", [(37, 21, 19), (64, 11, 12), (5, 5, 5), (200, 100, 100), (1024, 40, 70), (33, 13, 300)]
)
def test_every_plan_updates_every_interior_plane_of_every_tile_once(shape, kind):
    nx, ny, nz = shape
    for resident in (1, 2, 7, 64, 792, 100_000):
        plan = plan_of(nx, ny, nz, resident, kind)
        assert (covered(plan) == 1).all(), (shape, resident, plan)
        assert plan.tiles_a % resident == 0 or plan.tiles_a == plan.tiles  # phase A: whole waves
    tiles = int(np.prod(geometry.interior((nz, ny, nx)).tiles))
    for zchunk in (1, 3, 8, nz, 10 * nz):
        assert (covered(geometry.uniform_plan(tiles, nz - 4, zchunk)) == 1).all(), (shape, zchunk)
    with pytest.raises(ValueError):
        geometry.uniform_plan(tiles, nz - 4, 0)


@pytest.mark.parametrize(
    "shape", [(1024, 256, 256), (2048, 256, 256), (4096, 256, 256), (7168, 256, 256), (512, 512, 512)]
)
def test_the_plans_fill_whole_waves_on_the_benchmark_grids(shape):
    """At the residencies the kernels can have on 132 SMs (4 .. 8 blocks of 256 a SM), the
    plan's blocks finish within 5% of the ideal (every slot busy to the end, no start
    cost), where whole columns for every tile (the obvious plan) lose up to 35%."""
    nx, ny, nz = shape
    tiles = int(np.prod(geometry.interior((nz, ny, nx)).tiles))
    start = geometry.START_PLANES["int_z_reg"]
    for resident in (4 * 132, 5 * 132, 6 * 132, 8 * 132):
        ideal = tiles * (nz - 4) / resident
        plan = plan_of(nx, ny, nz, resident)
        efficiency = ideal / makespan(plan, resident, start)
        assert efficiency > 0.95, (shape, resident, plan.describe(), efficiency)
        whole = geometry.uniform_plan(tiles, nz - 4, nz)
        assert efficiency >= ideal / makespan(whole, resident, start) - 1e-9


def test_a_plan_for_the_widest_benchmark_grid():
    plan = plan_of(7168, 256, 256, 792)
    assert (plan.tiles, plan.tiles_a, plan.za) == (7168, 7128, 252)  # 9 full waves of whole columns
    assert plan.tiles - plan.tiles_a == 40 and plan.zb == 16  # the 40 left in 16 chunks of 16: one more (short) wave
    assert plan.describe() == "7128 tiles x 1 chunk of 252 + 40 tiles x 16 chunks of 16 planes"


@pytest.mark.parametrize("shape", [(23, 14, 29), (5, 5, 5), (64, 64, 300)])
def test_slabs_update_every_interior_plane_once(shape):
    nx, ny, nz = shape
    plane = nx * ny
    assert geometry.slabs(nx, ny, nz) == [(0, nz)]
    for planes in sorted({5, 6, 11, max(5, nz - 1), nz}):
        limit = planes * plane
        slabs = geometry.slabs(nx, ny, nz, limit)
        updated = [z for lo, hi in slabs for z in range(lo + 2, hi - 2)]
        assert updated == list(range(2, nz - 2)), (planes, slabs)
        assert all((hi - lo) * plane <= limit and hi - lo >= 5 for lo, hi in slabs)
    with pytest.raises(ValueError, match="fewer than 5 planes"):
        geometry.slabs(nx, ny, 100, 4 * plane)


def test_every_grid_the_parameters_allow_fits_32_bit_indices():
    assert 5 * MAX_PLANE <= geometry.MAX_INDEX
    with pytest.raises(ParamError, match="nx \\* ny"):
        StencilParams(nx=MAX_PLANE // 5 + 1, ny=6, nz=5, h=10.0, steps=1, f0=10.0, model=ConstantModel(2000.0))


@pytest.mark.parametrize("variant", VARIANTS)
def test_launches(variant):
    shape, source = (29, 14, 23), (21, 9, 17)  # (nz, ny, nx), (x, y, z)
    nz, ny, nx = shape
    [one] = geometry.launches(variant, shape, source, 0, None, lambda name: 792)
    assert one.kernel == f"stencil_{variant}" and (one.lo, one.hi) == (0, nz)
    assert one.ints[:8] == (nx, ny, nz, 0, 2, nx - 2, 2, ny - 2)  # the box: the whole interior
    kind = geometry.marching(variant)
    if kind is None:
        assert one.plan is None and one.grid == (1, 2, nz - 4)
    else:
        assert one.plan == plan_of(nx, ny, nz, 792, kind) and one.grid == (one.plan.blocks, 1, 1)
        assert one.ints[8:12] == (1, one.plan.tiles_a, one.plan.za, one.plan.zb)
    assert one.ints[12:] == source
    slabs = geometry.launches(variant, shape, source, 3, 4, lambda name: 792, max_points=9 * nx * ny)
    assert [s.kernel for s in slabs] == [f"stencil_{variant}_sponge"] * len(slabs) and len(slabs) == 5
    for s in slabs:
        assert s.ints[2] == s.hi - s.lo and s.ints[14] == source[2] - s.lo  # the source's z in the slab's view
        if kind is not None:
            assert s.plan == geometry.uniform_plan(one.ints[8] * 2, s.hi - s.lo - 4, 4)
    with pytest.raises(ValueError, match="not both"):
        geometry.launches(variant, shape, source, 2, None, lambda name: 792, cpml=2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_cpml_launches_the_variant_on_its_inner_box(variant):
    shape, source = (60, 61, 130), (70, 30, 12)
    nz, ny, nx = shape
    box = geometry.inner_box(shape, 9)
    assert box == geometry.Box(32, 32, 96, 18, 50, 11, 49)  # x in whole tiles, y in whole 8-row tiles from 2
    [one] = geometry.launches(variant, shape, source, 0, None, lambda name: 792, cpml=9)
    assert one.kernel == f"stencil_{variant}" and (one.lo, one.hi) == (box.z_lo - 2, box.z_hi + 2)
    assert one.ints[:8] == (nx, ny, one.hi - one.lo, 32, 32, 96, 18, 50)
    assert one.ints[12:] == (70, 30, 12 - one.lo)
    if geometry.marching(variant) is None:
        assert one.grid == (2, 4, box.z_hi - box.z_lo)
    assert geometry.launches(variant, (40, 37, 70), source, 0, None, lambda name: 792, cpml=6) == []  # no box
    with pytest.raises(ValueError, match="one launch"):
        geometry.launches(variant, shape, source, 0, 4, lambda name: 792, max_points=9 * nx * ny, cpml=3)


@pytest.mark.parametrize(
    "shape_width",
    [
        ((256, 256, 1024), 20),
        ((60, 61, 130), 9),
        ((33, 70, 97), 3),
        ((40, 37, 70), 6),
        ((9, 9, 9), 2),
        ((45, 50, 100), 20),
    ],
)
def test_the_shell_and_the_inner_box_update_every_interior_point_once(shape_width):
    shape, width = shape_width
    nz, ny, nx = shape
    count = np.zeros(shape, np.int32)
    chunks = geometry.shell_chunks(shape, width, planes=16)
    assert chunks.dtype == np.int32 and chunks.flags.c_contiguous and (np.diff(chunks[:, 2]) >= 0).all()
    for x0, y0, z0, z1 in chunks:
        assert x0 % 32 == 0 and (y0 - 2) % 8 == 0 and 2 <= z0 < z1 <= nz - 2 and z1 - z0 <= 16
        xs = np.arange(x0, x0 + 32)
        xs = xs[(xs >= 2) & (xs < nx - 2)]
        ys = np.arange(y0, min(y0 + 8, ny - 2))
        count[z0:z1][:, ys[:, None], xs[None, :]] += 1
    box = geometry.inner_box(shape, width)
    if box is not None:
        count[box.z_lo : box.z_hi, box.y_lo : box.y_hi, box.x_lo : box.x_hi] += 1
        layer = np.zeros(shape, bool)  # no layer cell inside the box
        for axis, n in enumerate(shape):
            edge = [slice(None)] * 3
            edge[axis] = np.r_[2 : 2 + width, n - 2 - width : n - 2]
            layer[tuple(edge)] = True
        assert not layer[box.z_lo : box.z_hi, box.y_lo : box.y_hi, box.x_lo : box.x_hi].any()
    assert (count[2:-2, 2:-2, 2:-2] == 1).all() and count.sum() == (nx - 4) * (ny - 4) * (nz - 4)
