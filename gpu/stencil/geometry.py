"""Launch geometry of the stencil kernels (gpu/stencil/stencil.cu): tiles, the z-marching
plan that fills the GPU in whole waves, the z slabs that keep every launch's indices
32-bit, and the CPML's split of the interior into an inner box and a shell. Pure
arithmetic (NumPy, no CuPy): cuda.py launches with it, the CPU tests check it.

Tiles are BX x BY = 32 x 8 points, one thread each. A variant's kernel updates a Box:
the whole interior, or with the CPML the inner box that no layer reaches (x tiles start
at a multiple of 32, aligned with 128-byte lines when nx % 32 == 0; y tiles at the box's
first row). Plain variants launch a 3D grid (x tiles, y tiles, planes); the z-marching
variants (int_z, int_z_reg) a 1D grid of (tile, chunk of planes) blocks, in two phases
(see `march_plan`); cpml_shell a 1D grid over the shell's columns (`shell_chunks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gpu.stencil.params import KERNEL_INDEX_MAX, RADIUS

BX, BY = 32, 8  # mirrors stencil.cu
THREADS = BX * BY
MAX_INDEX = KERNEL_INDEX_MAX  # the most points of one launch
SHELL_CHUNK = 32  # planes a cpml_shell block marches at most (its start re-reads 6 planes of p)
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


@dataclass(frozen=True)
class Box:
    """The points a variant's kernel updates: x in [x_lo, x_hi) in tiles from x_tile (a
    multiple of BX), y in [y_lo, y_hi) in tiles from y_lo, planes z in [z_lo, z_hi)."""

    x_tile: int
    x_lo: int
    x_hi: int
    y_lo: int
    y_hi: int
    z_lo: int
    z_hi: int

    @property
    def tiles(self) -> tuple[int, int]:
        """(x tiles, y tiles)."""
        return -(-(self.x_hi - self.x_tile) // BX), -(-(self.y_hi - self.y_lo) // BY)

    @property
    def points(self) -> int:
        return (self.x_hi - self.x_lo) * (self.y_hi - self.y_lo) * (self.z_hi - self.z_lo)


def interior(shape: tuple[int, int, int]) -> Box:
    """The whole interior of a (nz, ny, nx) grid: 2 .. n-3 on each axis."""
    nz, ny, nx = shape
    return Box(0, RADIUS, nx - RADIUS, RADIUS, ny - RADIUS, RADIUS, nz - RADIUS)


def inner_box(shape: tuple[int, int, int], width: int) -> Box | None:
    """The part of the interior that no CPML layer of `width` cells reaches, narrowed in x
    and y to whole tiles of the plane (x tiles from 0, y tiles from 2), so that every tile
    of a plane lies wholly inside or wholly outside it; None where nothing is left. The
    rest of the interior is the shell (cpml_shell)."""
    nz, ny, nx = shape
    edge = RADIUS + width
    x_lo, x_hi = -(-edge // BX) * BX, (nx - edge) // BX * BX
    y_lo, y_hi = RADIUS + -(-width // BY) * BY, RADIUS + (ny - edge - RADIUS) // BY * BY
    box = Box(x_lo, x_lo, x_hi, y_lo, y_hi, edge, nz - edge)
    if box.x_hi <= box.x_lo or box.y_hi <= box.y_lo or box.z_hi <= box.z_lo:
        return None
    return box


def shell_chunks(shape: tuple[int, int, int], width: int, planes: int | None = None) -> np.ndarray:
    """cpml_shell's blocks: (blocks, 4) int32 rows (x0, y0, z0, z1), a tile of the plane
    marching over planes [z0, z1), that cover every interior point outside inner_box
    exactly once: tiles outside the box's footprint over all interior planes, those inside
    it over the two z layers, in chunks of at most `planes` planes (default SHELL_CHUNK);
    sorted by first plane (blocks that run together read nearby planes)."""
    nz, ny, nx = shape
    planes = planes or SHELL_CHUNK
    box = inner_box(shape, width)
    x0s, y0s = np.arange(0, nx - RADIUS, BX), np.arange(RADIUS, ny - RADIUS, BY)
    x0, y0 = (a.ravel() for a in np.meshgrid(x0s, y0s))
    if box is None:
        inside = np.zeros(len(x0), bool)
        layers = []
    else:
        inside = (x0 >= box.x_lo) & (x0 < box.x_hi) & (y0 >= box.y_lo) & (y0 < box.y_hi)
        layers = [(RADIUS, box.z_lo), (box.z_hi, nz - RADIUS)]
    rows = []  # never empty: the first x tile holds layer cells
    for tiles, ranges in ((~inside, [(RADIUS, nz - RADIUS)]), (inside, layers)):
        count = int(tiles.sum())
        for lo, hi in ranges:
            for z0 in range(lo, hi, planes):
                rows.append(
                    np.column_stack([x0[tiles], y0[tiles], np.full(count, z0), np.full(count, min(z0 + planes, hi))])
                )
    out = np.concatenate(rows)
    out = out[np.argsort(out[:, 2], kind="stable")]
    return np.ascontiguousarray(out, dtype=np.int32)


@dataclass(frozen=True)
class MarchPlan:
    """Blocks of a z-marching launch: phase A, tiles [0, tiles_a) in chunks of za planes;
    phase B, tiles [tiles_a, tiles) in chunks of zb planes (chunk-major in each phase, so
    that the tiles running at the same time are neighbours at the same depth)."""

    tiles: int
    tiles_a: int
    za: int
    zb: int
    interior: int  # planes each tile marches over (the box's)

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


def uniform_plan(tiles: int, planes: int, zchunk: int) -> MarchPlan:
    """Every one of `tiles` tiles in chunks of `zchunk` of its `planes` planes (the last
    chunk of a column may be shorter)."""
    if zchunk < 1:
        raise ValueError(f"zchunk must be >= 1, got {zchunk}")
    za = min(zchunk, planes)
    return MarchPlan(tiles, tiles, za, za, planes)


def march_plan(tiles: int, planes: int, resident: int, kind: str = "int_z_reg") -> MarchPlan:
    """The plan that wastes least of `resident` concurrent blocks (blocks per SM x SMs) for
    `tiles` tiles of `planes` planes each.

    Blocks of equal length run in waves. Phase A marches the first k * resident tiles
    (k = tiles // resident) over whole columns: k full waves. Phase B cuts the remaining
    tiles' columns into c chunks, c minimising ceil(rest c / resident) x (chunk + start)
    (start: START_PLANES[kind], the cost of a chunk's start), chunks of at least
    MIN_ZCHUNK planes. All tiles chunked (k = 0) is tried too; the cheaper plan wins."""
    start = START_PLANES[kind]
    resident = max(1, resident)
    most = max(1, -(-planes // MIN_ZCHUNK))

    def phase_b(count: int) -> tuple[float, int]:
        """(cost in plane-times, chunk length) of `count` tiles chunked at best."""
        best = (math.inf, planes)
        for c in range(1, most + 1):
            length = -(-planes // c)
            chunks = -(-planes // length)
            cost = -(-count * chunks // resident) * (length + start)
            if cost < best[0]:
                best = (cost, length)
        return best

    candidates = []
    k = tiles // resident
    if k:
        rest = tiles - k * resident
        cost_b, zb = phase_b(rest) if rest else (0.0, planes)
        candidates.append((k * (planes + start) + cost_b, MarchPlan(tiles, k * resident, planes, zb, planes)))
    cost_b, zb = phase_b(tiles)
    candidates.append((cost_b, MarchPlan(tiles, 0, planes, zb, planes)))
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
    """One launch of a variant's kernel in a step: `kernel` on the arrays' planes [lo, hi)
    (a view of hi - lo planes, whose planes lo+2 .. hi-3 it updates), `grid` blocks of
    BX x BY threads, and the kernel's integer arguments after the three arrays: nx, ny,
    planes, the box's x_tile, x_lo, x_hi, y_lo, y_hi, then tiles_x, tiles_a, za, zb, sx,
    sy, sz (the source's z in the view). The float arguments (amp, eta_max) and the
    sponge's ramp table (fx, fy, fz of planes lo .. hi) come after them."""

    kernel: str
    lo: int
    hi: int
    grid: tuple[int, int, int]
    ints: tuple[int, ...]
    plan: MarchPlan | None


def kernel_name(variant: str, sponge: int) -> str:
    """stencil_<variant>, or stencil_<variant>_sponge (the update with the damping term)."""
    return f"stencil_{variant}_sponge" if sponge > 0 else f"stencil_{variant}"


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
    """The launches of `variant`'s kernel in one step on a (nz, ny, nx) grid: one per z
    slab of the interior; with a CPML of `cpml` cells, one on its inner box (none if
    there is none; cpml_shell does the rest, in the whole grid's one launch).
    resident(kernel): blocks the device runs at once (for march_plan; unused with zchunk)."""
    nz, ny, nx = shape
    if sponge > 0 and cpml > 0:
        raise ValueError("a sponge or a CPML, not both")
    name = kernel_name(variant, sponge)
    kind = marching(variant)
    sx, sy, sz = source
    parts = slabs(nx, ny, nz, max_points)
    if cpml:
        if len(parts) > 1:
            raise ValueError(f"the CPML runs a grid in one launch; {nx} x {ny} x {nz} needs {len(parts)} z slabs")
        box = inner_box(shape, cpml)
        boxes = [] if box is None else [box]
    else:
        boxes = [replace(interior(shape), z_lo=lo + RADIUS, z_hi=hi - RADIUS) for lo, hi in parts]
    out = []
    for box in boxes:
        lo, hi = box.z_lo - RADIUS, box.z_hi + RADIUS
        planes = box.z_hi - box.z_lo
        tx, ty = box.tiles
        if kind is None:
            plan, grid, march = None, (tx, ty, planes), (tx, 0, 1, 1)
        else:
            plan = (
                uniform_plan(tx * ty, planes, zchunk)
                if zchunk is not None
                else march_plan(tx * ty, planes, resident(name), kind)
            )
            grid, march = (plan.blocks, 1, 1), (tx, plan.tiles_a, plan.za, plan.zb)
        ints = (nx, ny, hi - lo, box.x_tile, box.x_lo, box.x_hi, box.y_lo, box.y_hi, *march, sx, sy, sz - lo)
        out.append(Launch(name, lo, hi, grid, ints, plan))
    return out
