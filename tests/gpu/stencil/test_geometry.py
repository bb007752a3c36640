"""gpu/stencil/geometry.py: tiles, the z-marching plans (every interior (tile, plane) once,
whole waves on the benchmark's grids), the z slabs past 2^31 points, and the launches that
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


def test_tiles_start_at_x_0_and_y_2():
    assert geometry.tiles(1024, 256) == (
        32,
        32,
    )  # 1024 columns in 32 aligned tiles; 252 interior rows in 32 (the last half full)
    assert geometry.tiles(33, 13) == (2, 2)  # the second x tile holds only the border column x = 32
    assert geometry.tiles(5, 5) == (1, 1)


@pytest.mark.parametrize("kind", ["int_z", "int_z_reg"])
@pytest.mark.parametrize(
    "shape", [(37, 21, 19), (64, 11, 12), (5, 5, 5), (200, 100, 100), (1024, 40, 70), (33, 13, 300)]
)
def test_every_plan_updates_every_interior_plane_of_every_tile_once(shape, kind):
    nx, ny, nz = shape
    for resident in (1, 2, 7, 64, 792, 100_000):
        plan = geometry.march_plan(nx, ny, nz, resident, kind)
        assert (covered(plan) == 1).all(), (shape, resident, plan)
        assert plan.tiles_a % resident == 0 or plan.tiles_a == plan.tiles  # phase A: whole waves
    for zchunk in (1, 3, 8, nz, 10 * nz):
        assert (covered(geometry.uniform_plan(nx, ny, nz, zchunk)) == 1).all(), (shape, zchunk)
    with pytest.raises(ValueError):
        geometry.uniform_plan(nx, ny, nz, 0)


@pytest.mark.parametrize(
    "shape", [(1024, 256, 256), (2048, 256, 256), (4096, 256, 256), (7168, 256, 256), (512, 512, 512)]
)
def test_the_plans_fill_whole_waves_on_the_benchmark_grids(shape):
    """At the residencies the kernels can have on 132 SMs (4 .. 8 blocks of 256 a SM), the
    plan's blocks finish within 5% of the ideal (every slot busy to the end, no start
    cost), where whole columns for every tile (the obvious plan) lose up to 35%."""
    nx, ny, nz = shape
    tiles = np.prod(geometry.tiles(nx, ny))
    start = geometry.START_PLANES["int_z_reg"]
    for resident in (4 * 132, 5 * 132, 6 * 132, 8 * 132):
        ideal = tiles * (nz - 4) / resident
        plan = geometry.march_plan(nx, ny, nz, resident)
        efficiency = ideal / makespan(plan, resident, start)
        assert efficiency > 0.95, (shape, resident, plan.describe(), efficiency)
        whole = geometry.uniform_plan(nx, ny, nz, nz)
        assert efficiency >= ideal / makespan(whole, resident, start) - 1e-9


def test_a_plan_for_the_widest_benchmark_grid():
    plan = geometry.march_plan(7168, 256, 256, 792)
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
    kind = geometry.marching(variant)
    if kind is None:
        assert one.plan is None and one.grid == (1, 2, nz - 4)
    else:
        assert one.plan == geometry.march_plan(nx, ny, nz, 792, kind) and one.grid == (one.plan.blocks, 1, 1)
        assert one.ints[3:7] == (1, one.plan.tiles_a, one.plan.za, one.plan.zb)
    assert one.ints[:3] == (nx, ny, nz) and one.ints[7:] == source
    slabs = geometry.launches(variant, shape, source, 3, 4, lambda name: 792, max_points=9 * nx * ny)
    assert [s.kernel for s in slabs] == [f"stencil_{variant}_sponge"] * len(slabs) and len(slabs) == 5
    for s in slabs:
        assert s.ints[2] == s.hi - s.lo and s.ints[9] == source[2] - s.lo  # the source's z in the slab's view
        if kind is not None:
            assert s.plan == geometry.uniform_plan(nx, ny, s.hi - s.lo, 4)
    [cpml] = geometry.launches(variant, shape, source, 0, None, lambda name: 792, cpml=3)
    assert cpml.kernel == f"stencil_{variant}_cpml" and cpml.ints == one.ints
    with pytest.raises(ValueError, match="one launch"):
        geometry.launches(variant, shape, source, 0, 4, lambda name: 792, max_points=9 * nx * ny, cpml=3)
    with pytest.raises(ValueError, match="not both"):
        geometry.kernel_name(variant, 2, 2)
