"""Launch geometry of the stencil kernels (gpu/stencil/stencil.cu): tiles, the z-marching
plan that fills the GPU in whole waves, and the z slabs that keep every launch's indices
32-bit. Pure arithmetic (no CuPy): cuda.py launches with it, the CPU tests check it.

Tiles are BX x BY = 32 x 8 points, one thread each: x tiles start at x = 0 (aligned with
128-byte lines when nx % 32 == 0), y tiles at y = 2. Plain variants launch a 3D grid
(x tiles, y tiles, interior planes); the z-marching variants (int_z, int_z_reg) a 1D grid
of (tile, chunk of planes) blocks, in two phases (see `march_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpu.stencil.params import KERNEL_INDEX_MAX, RADIUS

BX, BY = 32, 8  # mirrors stencil.cu
THREADS = BX * BY
MAX_INDEX = KERNEL_INDEX_MAX  # the most points of one launch
MIN_ZCHUNK = 16  # planes: shorter chunks of the second phase cost more than they balance
START_PLANES = {
    "int_z": 0.0,
    "int_z_reg": 2.0,
}  # a chunk's start in plane-times: int_z_reg re-reads 4 planes of p (1 plane of traffic) and fills its pipeline


def marching(variant: str) -> str | None:
    """'int_z', 'int_z_reg' or None (plain) for a variant name such as 'shared_int_z_reg'."""
    if variant.endswith("_int_z_reg"):
        return "int_z_reg"
    if variant.endswith("_int_z"):
        return "int_z"
    return None


def tiles(nx: int, ny: int) -> tuple[int, int]:
    """(x tiles, y tiles) of a plane: ceil(nx / 32), ceil((ny - 4) / 8)."""
    return -(-nx // BX), -(-(ny - 2 * RADIUS) // BY)


@dataclass(frozen=True)
class MarchPlan:
    """Blocks of a z-marching launch: phase A, tiles [0, tiles_a) in chunks of za planes;
    phase B, tiles [tiles_a, tiles) in chunks of zb planes (chunk-major in each phase, so
    that the tiles running at the same time are neighbours at the same depth)."""

    tiles: int
    tiles_a: int
    za: int
    zb: int
    interior: int  # interior planes, nz - 4

    @property
    def chunks_a(self) -> int:
        return -(-self.interior // self.za)

    @property
    def chunks_b(self) -> int:
        return -(-self.interior // self.zb) if self.tiles > self.tiles_a else 0

    @property
    def blocks(self) -> int:
        return self.tiles_a * self.chunks_a + (self.tiles - self.tiles_a) * self.chunks_b

    def describe(self) -> str:
        a = (
            f"{self.tiles_a} tiles x {self.chunks_a} chunk{'s' if self.chunks_a > 1 else ''} of {self.za}"
            if self.tiles_a
            else ""
        )
        rest = self.tiles - self.tiles_a
        b = f"{rest} tiles x {self.chunks_b} chunk{'s' if self.chunks_b > 1 else ''} of {self.zb}" if rest else ""
        return " + ".join(part for part in (a, b) if part) + " planes"

    def chunk(self, block: int) -> tuple[int, int, int]:
        """(tile, first plane, end plane) of a block: march_block of stencil.cu, for tests."""
        if block < self.tiles_a * self.chunks_a:
            chunk, tile, length = block // self.tiles_a, block % self.tiles_a, self.za
        else:
            block -= self.tiles_a * self.chunks_a
            rest = self.tiles - self.tiles_a
            chunk, tile, length = block // rest, self.tiles_a + block % rest, self.zb
        z0 = RADIUS + chunk * length
        return tile, z0, min(z0 + length, self.interior + RADIUS)


def uniform_plan(nx: int, ny: int, nz: int, zchunk: int) -> MarchPlan:
    """Every tile in chunks of `zchunk` planes (the last chunk of a column may be shorter)."""
    if zchunk < 1:
        raise ValueError(f"zchunk must be >= 1, got {zchunk}")
    tx, ty = tiles(nx, ny)
    interior = nz - 2 * RADIUS
    za = min(zchunk, interior)
    return MarchPlan(tx * ty, tx * ty, za, za, interior)


def march_plan(nx: int, ny: int, nz: int, resident: int, kind: str = "int_z_reg") -> MarchPlan:
    """The plan that wastes least of `resident` concurrent blocks (blocks per SM x SMs).

    Blocks of equal length run in waves. Phase A marches the first k * resident tiles
    (k = tiles // resident) over whole columns: k full waves. Phase B cuts the remaining
    tiles' columns into c chunks, c minimising ceil(rest c / resident) x (chunk + start)
    (start: START_PLANES[kind], the cost of a chunk's start), chunks of at least
    MIN_ZCHUNK planes. All tiles chunked (k = 0) is tried too; the cheaper plan wins."""
    tx, ty = tiles(nx, ny)
    total = tx * ty
    interior = nz - 2 * RADIUS
    start = START_PLANES[kind]
    resident = max(1, resident)
    most = max(1, -(-interior // MIN_ZCHUNK))

    def phase_b(count: int) -> tuple[float, int]:
        """(cost in plane-times, chunk length) of `count` tiles chunked at best."""
        best = (math.inf, interior)
        for c in range(1, most + 1):
            length = -(-interior // c)
            chunks = -(-interior // length)
            cost = -(-count * chunks // resident) * (length + start)
            if cost < best[0]:
                best = (cost, length)
        return best

    candidates = []
    k = total // resident
    if k:
        rest = total - k * resident
        cost_b, zb = phase_b(rest) if rest else (0.0, interior)
        candidates.append((k * (interior + start) + cost_b, MarchPlan(total, k * resident, interior, zb, interior)))
    cost_b, zb = phase_b(total)
    candidates.append((cost_b, MarchPlan(total, 0, interior, zb, interior)))
    return min(candidates, key=lambda item: item[0])[1]


def slabs(nx: int, ny: int, nz: int, max_points: int = MAX_INDEX) -> list[tuple[int, int]]:
    """Planes [lo, hi) of each launch: the whole grid when it has at most max_points points,
    else z slabs of at most max_points points overlapping by 4 planes. A launch updates its
    planes lo+2 .. hi-3, so the slabs' updates tile the interior planes 2 .. nz-3 once."""
    plane = nx * ny
    if plane * nz <= max_points:
        return [(0, nz)]
    per = max_points // plane
    if per < 2 * RADIUS + 1:
        raise ValueError(f"a plane of {nx} x {ny} points leaves fewer than 5 planes within {max_points} points")
    out, z = [], RADIUS
    while z < nz - RADIUS:
        end = min(z + per - 2 * RADIUS, nz - RADIUS)
        out.append((z - RADIUS, end + RADIUS))
        z = end
    return out


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a step: `kernel` on the arrays' planes [lo, hi) (a view of
    hi - lo planes), `grid` blocks of BX x BY threads, and the kernel's integer arguments
    after the three arrays: nx, ny, planes, tiles_x, tiles_a, za, zb, sx, sy, sz (the
    source's z in the view). The float arguments (amp, eta_max), the sponge's ramp table
    (fx, fy, fz of planes lo .. hi) or the CPML's profile, and the CPML's psi, zeta and
    width come after them."""

    kernel: str
    lo: int
    hi: int
    grid: tuple[int, int, int]
    ints: tuple[int, ...]
    plan: MarchPlan | None


def kernel_name(variant: str, sponge: int, cpml: int = 0) -> str:
    """stencil_<variant>, stencil_<variant>_sponge (the update with the damping term) or
    stencil_<variant>_cpml (with the CPML's terms)."""
    if sponge > 0 and cpml > 0:
        raise ValueError("a sponge or a CPML, not both")
    return (
        f"stencil_{variant}_sponge" if sponge > 0 else f"stencil_{variant}_cpml" if cpml > 0 else f"stencil_{variant}"
    )


def launches(
    variant: str,
    shape: tuple[int, int, int],
    source: tuple[int, int, int],
    sponge: int,
    zchunk: int | None,
    resident: Callable[[str], int],
    max_points: int = MAX_INDEX,
    cpml: int = 0,
) -> list[Launch]:
    """The launches of one step of `variant` on a (nz, ny, nx) grid: one per z slab (the
    CPML's only one: its layers' state is laid out for the whole grid).
    resident(kernel): blocks the device runs at once (for march_plan; unused with zchunk)."""
    nz, ny, nx = shape
    name = kernel_name(variant, sponge, cpml)
    kind = marching(variant)
    sx, sy, sz = source
    tx, ty = tiles(nx, ny)
    out = []
    parts = slabs(nx, ny, nz, max_points)
    if cpml and len(parts) > 1:
        raise ValueError(f"the CPML runs a grid in one launch; {nx} x {ny} x {nz} needs {len(parts)} z slabs")
    for lo, hi in parts:
        planes = hi - lo
        if kind is None:
            plan, grid, march = None, (tx, ty, planes - 2 * RADIUS), (tx, 0, 1, 1)
        else:
            plan = (
                uniform_plan(nx, ny, planes, zchunk)
                if zchunk is not None
                else march_plan(nx, ny, planes, resident(name), kind)
            )
            grid, march = (plan.blocks, 1, 1), (tx, plan.tiles_a, plan.za, plan.zb)
        out.append(Launch(name, lo, hi, grid, (nx, ny, planes, *march, sx, sy, sz - lo), plan))
    return out
