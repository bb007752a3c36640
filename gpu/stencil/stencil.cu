// One leapfrog step of the 3D acoustic wave equation with the 13-point 4th-order
// Laplacian (Pavan et al. 2018), in the paper's nine variants: memory path x z-marching.
//
//   memory path  naive     p's loads cached in L2 only (ld.global.cg, __ldcg), as global
//                          loads were on the paper's Kepler: no on-chip reuse
//                shared    the x-y tile of the plane with a 2-cell halo in shared memory
//                          (filled with ld.global.cg); z neighbours from global memory
//                          (plain, int_z) or registers (int_z_reg)
//                readonly  p through the SM's read-only / L1 path (__ldg)
//   marching     plain     one thread per point: grid (x tiles, y tiles, interior planes)
//                int_z     one thread per (x, y) column marching a chunk of planes,
//                          loading all 13 points at each plane (reuse left to the caches)
//                int_z_reg the z-march keeping p's z column in registers: one new plane
//                          value per step along z, loads issued several planes ahead
//
// Each variant has two kernels, stencil_<variant> (no sponge: eta = 0, and the operations
// (1 - eta) p_prev and num / (1 + eta) are identities, left out as in the reference) and
// stencil_<variant>_sponge; the registers of each are allocated for its own path. Both
// update a box of the interior (Step's x_lo .. y_hi, and the planes of the launch's view):
// the whole interior, or, with the convolutional PML, the inner box that no layer reaches;
// cpml_shell (below) updates the rest, the layers' shell (gpu/stencil/cpml.py).
//
// Fields are (nz, ny, nx) float32, x fastest. Ping-pong: p is p^n (read only), pp holds
// p^(n-1) on entry and receives p^(n+1) (each point read, then written, by one thread),
// c is (v dt / h)^2. Only the interior [2, n-3] of each axis is written: the 2-cell
// Dirichlet border stays 0. Per point and step: p (reused on chip or from L2), pp read and
// written, c read: 16 bytes from DRAM at best.
//
// Indices are 32-bit: nx ny nz < 2^31 (cuda.py launches larger grids as z slabs), so every
// address is one IMAD.WIDE from the kernel's base pointer.
//
// pp and c are touched once per step in every variant and go through the streaming
// (evict-first) loads and stores __ldcs / __stcs, so that they do not push out of L2 the
// planes of p that are still to be reused.
//
// Tiles: a block is 32 x 8 threads, one point each. x tiles start at x = x_tile + 32 bx
// (x_tile a multiple of 32: aligned with the 128-byte lines when nx % 32 == 0), y tiles at
// y = y_lo + 8 by. Threads outside the box (x < x_lo, x >= x_hi, y >= y_hi) never write;
// where they load, they load their point clamped into the array, a value no interior point
// ever reads (every neighbour of an interior point lies inside the array). So those loads
// need no branch and stay in bounds.
//
// int_z_reg software pipeline (the point of that variant):
// p's values live in a ring of PR = 8 registers (planes z-2 .. z+5: the stencil's column
// and 3 planes in flight), pp, c and the shared tile's halo value in queues of Q = 4
// (planes z .. z+3). The z loop is unrolled 8 times so that every slot is a compile-time
// register: no register move ever waits on a load in flight. A slot is refilled right
// after its last use, and only with planes of the chunk.
//
// z-marching grids are 1D: block b -> (tile, chunk) by cuda.py's plan (march_plan): the
// first tiles_a tiles in chunks of za planes, the rest in chunks of zb, chunk-major within
// each phase (tiles that run at the same time are neighbours at the same depth).
//
// The arithmetic is the reference's (gpu/stencil/reference.py), operation for operation,
// with explicitly rounded intrinsics (__fadd_rn, __fmul_rn, ... are never fused into
// FMAs), so that every variant agrees with the NumPy reference bit for bit.

namespace {

constexpr int R = 2;  // stencil radius = Dirichlet border width
constexpr int BX = 32;
constexpr int BY = 8;
constexpr int THREADS = BX * BY;
constexpr int TW = BX + 2 * R;  // shared tile width and height, with halo
constexpr int TH = BY + 2 * R;
constexpr int RING = 2 * R * BX + 2 * R * BY;  // halo values of a tile, corners excluded (a star stencil never reads them)
constexpr int PR = 8;      // int_z_reg: registers of p's ring, planes z-2 .. z+5
constexpr int Q = 4;       // int_z_reg: queue length of pp, c and the halo value, planes z .. z+3
constexpr int UNROLL = 8;  // a multiple of PR, Q and 2 (the double-buffered tile)
static_assert(UNROLL % PR == 0 && UNROLL % Q == 0 && UNROLL % 2 == 0, "static register slots");

constexpr float C0 = -7.5f;  // 3 x (-5/2)
constexpr float C1 = 4.0f / 3.0f;
constexpr float C2 = -1.0f / 12.0f;

enum Memory { NAIVE = 0, SHARED = 1, READONLY = 2 };
enum March { PLAIN = 0, INT_Z = 1, INT_Z_REG = 2 };
enum Boundary { WALLS = 0, SPONGE = 1 };  // what lies inside the Dirichlet border (the CPML: cpml_shell)

struct Step {
    int nx, ny, nz;
    int x_tile, x_lo, x_hi, y_lo, y_hi;  // the box: x in [x_lo, x_hi), tiles from x_tile; y in [y_lo, y_hi)
    int tiles_x, tiles_a, za, zb;  // z-marching plan (cuda.py: march_plan)
    int sx, sy, sz;  // source point
    float amp;       // source term of this step, dt^2 v_src^2 w(n dt)
    float eta_max;   // sigma dt at the sponge's outer edge (sponge kernels)
    const float* __restrict__ ramps;  // sponge kernels: fx (nx values), fy (ny), fz (nz): reference.axis_ramp
};

template <int M>
__device__ __forceinline__ float load(const float* __restrict__ a) {
    if constexpr (M == READONLY) {
        return __ldg(a);
    } else {
        return __ldcg(a);
    }
}

// ((((a + b) + c) + d) + e) + f: the reference's order.
__device__ __forceinline__ float sum6(float a, float b, float c, float d, float e, float f) {
    return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(a, b), c), d), e), f);
}

// Hides a value from the optimiser: the z loop's index stays one register advanced by one
// add a plane, instead of one precomputed register per unrolled step.
__device__ __forceinline__ void opaque(int& v) { asm volatile("" : "+r"(v)); }

// One thread's point: (x, y), whether it is updated, its in-plane index clamped into the
// array, and what the update needs of it.
struct Point {
    int x, y;
    bool active;
    int own;      // min(y, ny-1) nx + min(x, nx-1): y nx + x for every point inside the array
    bool source;  // (x, y) is the source's column
    float fxy;    // fx^2 + fy^2 of the sponge (sponge kernels)
};

template <int B>
__device__ __forceinline__ Point point(int x0, int y0, const Step& s) {
    Point q;
    q.x = x0 + static_cast<int>(threadIdx.x);
    q.y = y0 + static_cast<int>(threadIdx.y);  // >= y_lo always
    q.active = q.x >= s.x_lo && q.x < s.x_hi && q.y < s.y_hi;
    q.own = min(q.y, s.ny - 1) * s.nx + min(q.x, s.nx - 1);
    q.source = q.x == s.sx && q.y == s.sy;
    q.fxy = 0.0f;
    if constexpr (B == SPONGE) {
        // (W - d) / W within W cells of the border, else 0, from the table (no division
        // here); clamped like the loads, values of outside threads are never used.
        const float fx = __ldg(s.ramps + min(q.x, s.nx - 1)), fy = __ldg(s.ramps + s.nx + min(q.y, s.ny - 1));
        q.fxy = __fadd_rn(__fmul_rn(fx, fx), __fmul_rn(fy, fy));
    }
    return q;
}

// h^2 Lap4 p from the centre value and the neighbour sums at distance 1 (s1) and 2 (s2).
__device__ __forceinline__ float laplacian(float centre, float s1, float s2) {
    return __fadd_rn(__fadd_rn(__fmul_rn(C0, centre), __fmul_rn(C1, s1)), __fmul_rn(C2, s2));
}

// p^(n+1) at the point's plane z (flat index i) from the centre value, p^(n-1), c, and the
// neighbour sums at distance 1 (s1) and 2 (s2).
template <int B>
__device__ __forceinline__ float update(float centre, float prev, float c, float s1, float s2, int z, int i, const Point& q, const Step& s) {
    const float lap = laplacian(centre, s1, s2);
    if constexpr (B == SPONGE) {
        const float fz = __ldg(s.ramps + s.nx + s.ny + z);
        const float eta = __fmul_rn(s.eta_max, __fadd_rn(q.fxy, __fmul_rn(fz, fz)));
        float num = __fadd_rn(__fsub_rn(__fadd_rn(centre, centre), __fmul_rn(__fsub_rn(1.0f, eta), prev)), __fmul_rn(c, lap));
        if (q.source && z == s.sz) num = __fadd_rn(num, s.amp);
        if (eta != 0.0f) num = __fdiv_rn(num, __fadd_rn(1.0f, eta));
        return num;
    } else {
        float num = __fadd_rn(__fsub_rn(__fadd_rn(centre, centre), prev), __fmul_rn(c, lap));
        if (q.source && z == s.sz) num = __fadd_rn(num, s.amp);
        return num;
    }
}


// ------------------------------------------------------------------- the CPML --
// (gpu/stencil/cpml.py.) A CPML step is two launches: cpml_shell on the layers' shell, then
// the variant's kernel on the inner box, which no layer reaches. The shell's blocks are
// 32 x 8 columns of points marching along z over planes [z0, z1), listed by the host
// (geometry.shell_chunks) as int4 (x0, y0, z0, z1): thread (tx, ty) updates (x0 + tx,
// y0 + ty, z) for z0 <= z < z1 when 2 <= x <= nx-3 and y <= ny-3.
//
// The memory variables of a layer cell and axis share one 32-bit word, psi's bfloat16 in
// its low half and zeta's in its high half, kept only in the layers: axis x's cells as
// (nz-4, ny-4, 2W), y's as (nz-4, 2W, nx-4), z's as (2W, ny-4, nx-4), one array after the
// other; along its own axis a cell's slot is d (0 .. W-1) in the low layer, 2W-1-d in the
// high one (d: cells from the first interior cell of the nearer face). The words of step n-1
// are read from `state` and those of step n written to `next` (the host swaps the two):
// D1 psi^n needs psi^n of the 4 neighbours along the axis, which no other launch has
// written, so each thread computes them itself from psi^(n-1) and p^n: along z once a
// plane, as it marches (a ring of 5 values in registers); along x and y for each point.

struct Shell {
    int nx, ny, nz, width;
    const float* __restrict__ p;         // p^n
    const float2* __restrict__ profile;  // (a, b) of x, y, z (cpml.profile_table)
    const unsigned* __restrict__ state;  // step n-1's words
    unsigned* __restrict__ next;         // step n's
};

// The slot of coordinate v (of n) in its axis's layers, -1 outside them.
__device__ __forceinline__ int slot(int v, int n, int w) {
    const int low = v - R, high = n - 1 - R - v;
    if (low >= 0 && low < w) return low;
    if (high >= 0 && high < w) return 2 * w - 1 - high;
    return -1;
}

// (8 (f[+1] - f[-1]) - (f[+2] - f[-2])) / 12
__device__ __forceinline__ float d1(float m2, float m1, float p1, float p2) {
    return __fmul_rn(__fsub_rn(__fmul_rn(8.0f, __fsub_rn(p1, m1)), __fsub_rn(p2, m2)), 1.0f / 12.0f);
}

// (-5/2 p + 4/3 (p[-1] + p[+1])) - 1/12 (p[-2] + p[+2])
__device__ __forceinline__ float d2(float m2, float m1, float centre, float p1, float p2) {
    return __fadd_rn(__fadd_rn(__fmul_rn(-2.5f, centre), __fmul_rn(C1, __fadd_rn(m1, p1))), __fmul_rn(C2, __fadd_rn(m2, p2)));
}

// bfloat16 halves of a word, as floats; a float rounded to bfloat16 (to nearest, ties to
// even; a NaN stays a NaN: the bits cpml.to_bfloat16 gives).
__device__ __forceinline__ float low_half(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float high_half(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ unsigned bfloat16(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;  // quiet NaN
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// psi^n = b psi^(n-1) + a D1 p^n of a layer cell, from its word of step n-1, its (a, b)
// and p^n at its 4 neighbours.
__device__ __forceinline__ float psi_now(unsigned w, float2 ab, float m2, float m1, float p1, float p2) {
    return __fadd_rn(__fmul_rn(ab.y, low_half(w)), __fmul_rn(ab.x, d1(m2, m1, p1, p2)));
}

// e = D1 psi^n + zeta^n with zeta^n = b zeta^(n-1) + a (D2 p^n + D1 psi^n), the cell's
// word of step n (psi^n, zeta^n) stored at `next`. psi: psi^n at v-2 .. v+2; q: p^n there.
__device__ __forceinline__ float layer_e(const float psi[5], const float q[5], unsigned w, float2 ab, unsigned* next) {
    const float g = d1(psi[0], psi[1], psi[3], psi[4]);
    const float zeta = __fadd_rn(__fmul_rn(ab.y, high_half(w)), __fmul_rn(ab.x, __fadd_rn(d2(q[0], q[1], q[2], q[3], q[4]), g)));
    __stcs(next, (bfloat16(zeta) << 16) | bfloat16(psi[2]));
    return __fadd_rn(g, zeta);
}

// e of the layer cell (x, y, z) (flat index i) along the in-plane axis AX (0: x, 1: y), its
// word stored. Every load is unconditional, so that the compiler issues them together: p at
// v-4 .. v+4 (those past the border are other rows' values, which only feed a neighbour
// outside the layers, whose psi is 0), a neighbour's word at slot 0 when it has none.
template <int AX>
__device__ __forceinline__ float in_plane_e(int x, int y, int z, int i, const Shell& s) {
    const int ix = s.nx - 2 * R, iy = s.ny - 2 * R, iz = s.nz - 2 * R, two_w = 2 * s.width;
    int v, n, st, base, step, table;  // the words of the cell's row along the axis: base + slot * step
    if constexpr (AX == 0) {
        v = x, n = s.nx, st = 1, base = ((z - R) * iy + (y - R)) * two_w, step = 1, table = 0;
    } else {
        v = y, n = s.ny, st = s.nx, base = iz * iy * two_w + (z - R) * two_w * ix + (x - R), step = ix, table = s.nx;
    }
    float q[9];  // p^n at v-4 .. v+4
#pragma unroll
    for (int k = -4; k <= 4; ++k) q[k + 4] = __ldg(s.p + (i + k * st));
    float psi[5];
#pragma unroll
    for (int k = -2; k <= 2; ++k) {
        const int l = slot(v + k, n, s.width);
        const float value = psi_now(__ldg(s.state + (base + max(l, 0) * step)), __ldg(s.profile + (table + v + k)), q[k + 2], q[k + 3], q[k + 5], q[k + 6]);
        psi[k + 2] = l < 0 ? 0.0f : value;
    }
    const int own = base + slot(v, n, s.width) * step;
    return layer_e(psi, q + 2, __ldg(s.state + own), __ldg(s.profile + (table + v)), s.next + own);
}

// ------------------------------------------------------------- block geometry --

struct Block {
    int x0, y0;  // first point of the tile (x0 = x_tile + 32 bx, y0 = y_lo + 8 by)
    int z0, z1;  // planes [z0, z1) of the block (plain: one)
};

__device__ __forceinline__ Block plain_block(const Step& s) {
    Block b;
    b.x0 = s.x_tile + static_cast<int>(blockIdx.x) * BX;
    b.y0 = s.y_lo + static_cast<int>(blockIdx.y) * BY;
    b.z0 = R + static_cast<int>(blockIdx.z);
    b.z1 = b.z0 + 1;
    return b;
}

// z-marching: block -> (tile, chunk). Phase A: tiles [0, tiles_a) in chunks of za planes;
// phase B: tiles [tiles_a, tiles) in chunks of zb; chunk-major within a phase. Tiles are
// numbered x-fastest: tile = by tiles_x + bx.
__device__ __forceinline__ Block march_block(const Step& s) {
    const int interior = s.nz - 2 * R;
    const int tiles = s.tiles_x * ((s.y_hi - s.y_lo + BY - 1) / BY);
    const int chunks_a = (interior + s.za - 1) / s.za;
    int b = static_cast<int>(blockIdx.x), tile, chunk, length;
    if (b < s.tiles_a * chunks_a) {
        chunk = b / s.tiles_a;
        tile = b - chunk * s.tiles_a;
        length = s.za;
    } else {
        b -= s.tiles_a * chunks_a;
        const int rest = tiles - s.tiles_a;
        chunk = b / rest;
        tile = s.tiles_a + (b - chunk * rest);
        length = s.zb;
    }
    const int by = tile / s.tiles_x;
    Block k;
    k.x0 = s.x_tile + (tile - by * s.tiles_x) * BX;
    k.y0 = s.y_lo + by * BY;
    k.z0 = R + chunk * length;
    k.z1 = min(k.z0 + length, s.nz - R);
    return k;
}

// The tile's halo value this thread loads (threads t < RING): tile[j][i] holds the plane
// at (x0 - 2 + i, y0 - 2 + j). t < 128: the 2 halo rows above and below (a warp a row,
// aligned with the tile); 128 <= t < 160: the 2 halo columns left and right of each of the
// BY rows. off: the in-plane index, clamped into the array.
struct Ring {
    bool has;
    int j, i;
    int off;
};

__device__ __forceinline__ Ring ring(int x0, int y0, const Step& s) {
    const int t = static_cast<int>(threadIdx.y) * BX + static_cast<int>(threadIdx.x);
    Ring r;
    r.has = t < RING;
    int gx, gy;
    if (t < 2 * R * BX) {
        const int row = t / BX, col = t - row * BX;
        r.j = row < R ? row : BY + row;
        r.i = R + col;
        gy = y0 - R + r.j;
        gx = x0 + col;
    } else {
        const int q = min(t - 2 * R * BX, 2 * R * BY - 1), row = q / (2 * R), side = q - row * (2 * R);
        r.j = R + row;
        r.i = side < R ? side : BX + side;
        gy = y0 + row;
        gx = x0 - R + r.i;
    }
    r.off = min(max(gy, 0), s.ny - 1) * s.nx + min(max(gx, 0), s.nx - 1);
    return r;
}

using Tile = float[TH][TW];

// The shared variants' tile: one buffer for plain and int_z, two for int_z_reg (only the
// kernels that use it get it).
__shared__ Tile shared_tiles[2];

// s1, s2 of the point at the tile's centre (ty, tx), with the z neighbours given.
__device__ __forceinline__ float tile_s1(const Tile& t, int tx, int ty, float zm, float zp) {
    return sum6(t[ty + R][tx + R - 1], t[ty + R][tx + R + 1], t[ty + R - 1][tx + R], t[ty + R + 1][tx + R], zm, zp);
}

__device__ __forceinline__ float tile_s2(const Tile& t, int tx, int ty, float zm, float zp) {
    return sum6(t[ty + R][tx + R - 2], t[ty + R][tx + R + 2], t[ty + R - 2][tx + R], t[ty + R + 2][tx + R], zm, zp);
}

// ------------------------------------------------- plain and int_z: naive, readonly --

template <int M, int B>
__device__ __forceinline__ void global_plain_or_int_z(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, const Block& b, const Step& s) {
    const Point q = point<B>(b.x0, b.y0, s);
    if (!q.active) return;
    const int sy = s.nx, sz = s.nx * s.ny;  // 2 sz < 2^31 (cuda.py: at least 5 planes a launch)
#pragma unroll 1
    for (int z = b.z0; z < b.z1; ++z) {
        const int i = z * sz + q.own;
        const float* __restrict__ a = p + i;  // all 13 points through the variant's load path
        const float s1 = sum6(load<M>(a - 1), load<M>(a + 1), load<M>(p + (i - sy)), load<M>(p + (i + sy)), load<M>(p + (i - sz)), load<M>(p + (i + sz)));
        const float s2 = sum6(load<M>(a - 2), load<M>(a + 2), load<M>(p + (i - 2 * sy)), load<M>(p + (i + 2 * sy)), load<M>(p + (i - 2 * sz)), load<M>(p + (i + 2 * sz)));
        __stcs(pp + i, update<B>(load<M>(a), __ldcs(pp + i), __ldcs(c + i), s1, s2, z, i, q, s));
    }
}

// ------------------------------------------------------ plain and int_z: shared --

template <int B>
__device__ __forceinline__ void shared_plain_or_int_z(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, Tile& tile, const Block& b, const Step& s) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    const Point q = point<B>(b.x0, b.y0, s);
    const Ring r = ring(b.x0, b.y0, s);
    const int sz = s.nx * s.ny;
#pragma unroll 1
    for (int z = b.z0; z < b.z1; ++z) {
        const int base = z * sz, i = base + q.own;
        if (z > b.z0) __syncthreads();  // the previous plane's tile has been read
        tile[ty + R][tx + R] = __ldcg(p + i);
        if (r.has) tile[r.j][r.i] = __ldcg(p + (base + r.off));
        __syncthreads();
        if (q.active) {
            const float s1 = tile_s1(tile, tx, ty, __ldcg(p + (i - sz)), __ldcg(p + (i + sz)));
            const float s2 = tile_s2(tile, tx, ty, __ldcg(p + (i - 2 * sz)), __ldcg(p + (i + 2 * sz)));
            __stcs(pp + i, update<B>(tile[ty + R][tx + R], __ldcs(pp + i), __ldcs(c + i), s1, s2, z, i, q, s));
        }
    }
}

// ---------------------------------------------------------------- int_z_reg --

// The z-march with p's column in registers, for the three memory paths of p's in-plane
// neighbours: naive (L2), readonly (L1), shared (the double-buffered tile).
template <int M, int B>
__device__ __forceinline__ void march_reg(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, Tile* tiles, const Block& b, const Step& s) {
    const int tx = threadIdx.x, ty = threadIdx.y;
    const Point q = point<B>(b.x0, b.y0, s);
    const Ring r = ring(b.x0, b.y0, s);
    const int sy = s.nx, sz = s.nx * s.ny;
    const int halo = r.off - q.own;  // the halo value's index minus the point's
    const int last_p = b.z1 + 1, last_q = b.z1 - 1;  // the last planes the chunk reads: of p, of pp / c / halo

    // Ring slot of p's plane w: (w - z0 + 2) % PR; queue slot of plane w: (w - z0) % Q.
    // Planes past the chunk are never loaded (their slots are never read).
    float ring_p[PR], queue_pp[Q], queue_c[Q], queue_halo[Q];
    int o = b.z0 * sz + q.own;  // the point at plane z
#pragma unroll
    for (int k = 0; k < PR - 1; ++k) {  // planes z0-2 .. z0+4
        ring_p[k] = 0.0f;
        if (b.z0 - R + k <= last_p) ring_p[k] = load<M>(p + (o + (k - R) * sz));
    }
    ring_p[PR - 1] = 0.0f;  // plane z0+5: loaded in the first step
#pragma unroll
    for (int k = 0; k < Q; ++k) {  // planes z0 .. z0+3
        queue_pp[k] = queue_c[k] = queue_halo[k] = 0.0f;
        if (b.z0 + k <= last_q) {
            queue_pp[k] = __ldcs(pp + (o + k * sz));
            queue_c[k] = __ldcs(c + (o + k * sz));
            if constexpr (M == SHARED) {
                if (r.has) queue_halo[k] = __ldcg(p + (o + k * sz + halo));
            }
        }
    }
    for (int zb = b.z0; zb < b.z1; zb += UNROLL) {
        const int left = b.z1 - zb;  // planes left in the chunk (z1 = z0 + left)
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int z = zb + u;  // (z - z0) % UNROLL == u: every slot index below is a constant
            if (u < left) {        // z < z1; uniform over the block
                const float zm2 = ring_p[u % PR], zm1 = ring_p[(u + 1) % PR], zc = ring_p[(u + 2) % PR];
                const float zp1 = ring_p[(u + 3) % PR], zp2 = ring_p[(u + 4) % PR];
                if constexpr (M == SHARED) {
                    Tile& t = tiles[u & 1];  // double buffer: one barrier a plane
                    t[ty + R][tx + R] = zc;
                    if (r.has) t[r.j][r.i] = queue_halo[u % Q];
                    __syncthreads();
                    if (q.active) {
                        const float s1 = tile_s1(t, tx, ty, zm1, zp1);
                        const float s2 = tile_s2(t, tx, ty, zm2, zp2);
                        __stcs(pp + o, update<B>(zc, queue_pp[u % Q], queue_c[u % Q], s1, s2, z, o, q, s));
                    }
                } else {
                    if (q.active) {
                        const float* __restrict__ a = p + o;  // p at the point, plane z
                        const float s1 = sum6(load<M>(a - 1), load<M>(a + 1), load<M>(p + (o - sy)), load<M>(p + (o + sy)), zm1, zp1);
                        const float s2 = sum6(load<M>(a - 2), load<M>(a + 2), load<M>(p + (o - 2 * sy)), load<M>(p + (o + 2 * sy)), zm2, zp2);
                        __stcs(pp + o, update<B>(zc, queue_pp[u % Q], queue_c[u % Q], s1, s2, z, o, q, s));
                    }
                }
            }
            // Refill: p's plane z+5 into the slot of plane z-3, pp / c / halo's plane z+4 into
            // the slot of plane z (both read for the last time above), while inside the chunk:
            // z + 5 <= z1 + 1 (p), z + 4 <= z1 - 1 (pp, c, halo).
            if (u + PR - 3 <= left + 1) ring_p[(u + PR - 1) % PR] = load<M>(p + (o + (PR - 3) * sz));
            if (u + Q <= left - 1) {
                const int o4 = o + Q * sz;
                queue_pp[u % Q] = __ldcs(pp + o4);
                queue_c[u % Q] = __ldcs(c + o4);
                if constexpr (M == SHARED) {
                    if (r.has) queue_halo[u % Q] = __ldcg(p + (o4 + halo));
                }
            }
            o += sz;
            opaque(o);
        }
    }
}

// ------------------------------------------------------------------ dispatch --

template <int M, int Z, int B>
__device__ __forceinline__ void variant(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, const Step& s) {
    Tile* tiles = nullptr;
    if constexpr (M == SHARED) tiles = shared_tiles;
    const Block b = Z == PLAIN ? plain_block(s) : march_block(s);
    if constexpr (Z == INT_Z_REG) {
        march_reg<M, B>(p, pp, c, tiles, b, s);
    } else if constexpr (M == SHARED) {
        shared_plain_or_int_z<B>(p, pp, c, tiles[0], b, s);
    } else {
        global_plain_or_int_z<M, B>(p, pp, c, b, s);
    }
}

}  // namespace

// ------------------------------------------------------- the kernels (9 x 2) --

#define STENCIL_ARGS                                                                                                \
    const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, int nx, int ny, int nz,       \
        int x_tile, int x_lo, int x_hi, int y_lo, int y_hi, int tiles_x, int tiles_a, int za, int zb, int sx,       \
        int sy, int sz, float amp, float eta_max, const float* __restrict__ ramps
#define STEP Step{nx, ny, nz, x_tile, x_lo, x_hi, y_lo, y_hi, tiles_x, tiles_a, za, zb, sx, sy, sz, amp, eta_max, ramps}

// Occupancy (blocks of 256 threads per SM, registers per thread): plain and int_z 8 (32);
// int_z_reg 6 (40): its queues hold 20 registers; the sponge kernels of int_z and int_z_reg
// one block less (the IEEE division's call needs registers). No spills (nvcc
// --resource-usage).
#define KERNELS(NAME, MEMORY, MARCH, BLOCKS, SPONGE_BLOCKS)                                                           \
    __global__ void __launch_bounds__(THREADS, BLOCKS) stencil_##NAME(STENCIL_ARGS) {                               \
        variant<MEMORY, MARCH, WALLS>(p, pp, c, STEP);                                                                 \
    }                                                                                                                 \
    __global__ void __launch_bounds__(THREADS, SPONGE_BLOCKS) stencil_##NAME##_sponge(STENCIL_ARGS) {               \
        variant<MEMORY, MARCH, SPONGE>(p, pp, c, STEP);                                                                \
    }

// cpml_shell: 5 blocks (48 registers; 32-72 bytes of its ring spill to the stack, which ran
// faster than 4 blocks with no spill: BENCHMARKS.md, "Absorbing boundaries").
constexpr int SHELL_BLOCKS = 5;

extern "C" {

KERNELS(naive, NAIVE, PLAIN, 8, 8)
KERNELS(naive_int_z, NAIVE, INT_Z, 8, 6)
KERNELS(naive_int_z_reg, NAIVE, INT_Z_REG, 6, 5)
KERNELS(shared, SHARED, PLAIN, 8, 8)
KERNELS(shared_int_z, SHARED, INT_Z, 8, 6)
KERNELS(shared_int_z_reg, SHARED, INT_Z_REG, 6, 5)
KERNELS(readonly, READONLY, PLAIN, 8, 8)
KERNELS(readonly_int_z, READONLY, INT_Z, 8, 6)
KERNELS(readonly_int_z_reg, READONLY, INT_Z_REG, 6, 5)

// The CPML's shell (see "the CPML" above): p^(n+1) into pp at the chunk's points, with
// e = (e_x + e_y) + e_z of the axes whose layers hold the point added to the Laplacian, as
// the reference does. p's in-plane neighbours come through the read-only path, its column
// from a ring of registers: planes z-2 .. z+4 (z+4 for psi_z^n at z+2), with psi_z^n at
// z-2 .. z+2 and the z words at z .. z+2.
__global__ void __launch_bounds__(THREADS, SHELL_BLOCKS)
    cpml_shell(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, const int4* __restrict__ chunks,
               const float2* __restrict__ profile, const unsigned* __restrict__ state, unsigned* __restrict__ next, int nx, int ny, int nz,
               int width, int sx, int sy, int sz, float amp) {
    const int4 chunk = __ldg(chunks + blockIdx.x);
    const int x = chunk.x + static_cast<int>(threadIdx.x), y = chunk.y + static_cast<int>(threadIdx.y), z0 = chunk.z, z1 = chunk.w;
    if (x < R || x >= nx - R || y >= ny - R) return;
    const Shell s{nx, ny, nz, width, p, profile, state, next};
    const int row = nx, plane = nx * ny, column = y * nx + x;  // strides
    const bool in_x = slot(x, nx, width) >= 0, in_y = slot(y, ny, width) >= 0;
    const int zbase = (nz - 2 * R) * 2 * width * ((ny - 2 * R) + (nx - 2 * R)) + (y - R) * (nx - 2 * R) + (x - R);
    const int zstep = (ny - 2 * R) * (nx - 2 * R), ztable = nx + ny;

    // The column at z0: p at z0-2 .. z0+3 (planes outside the array read as 0: they only
    // feed psi outside the layers), psi_z^n at z0-2 .. z0+1, words at z0, z0+1.
    float r[7], psi[5];
    unsigned w[3] = {0u, 0u, 0u};
    float early[2];  // p at z0-4, z0-3: psi_z^n at z0-2 needs them
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int zz = z0 - 4 + j;
        early[j] = zz >= 0 ? __ldg(p + (zz * plane + column)) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 6; ++j) {
        const int zz = z0 - 2 + j;
        r[j] = zz < nz ? __ldg(p + (zz * plane + column)) : 0.0f;
    }
    r[6] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // psi_z^n at z0-2+j from p at z0-4+j .. z0+j
        const int zz = z0 - 2 + j, l = slot(zz, nz, width);
        psi[j] = 0.0f;
        if (l >= 0) {
            const float m2 = j < 2 ? early[j] : r[j - 2];
            const float m1 = j < 1 ? early[j + 1] : r[j - 1];
            const unsigned word = __ldg(state + (zbase + l * zstep));
            psi[j] = psi_now(word, __ldg(profile + (ztable + zz)), m2, m1, r[j + 1], r[j + 2]);
            if (j >= 2) w[j - 2] = word;
        }
    }
    psi[4] = 0.0f;

#pragma unroll 1
    for (int z = z0; z < z1; ++z) {
        const int i = z * plane + column;
        // The ring's new plane, and psi_z^n at z+2.
        r[6] = z + 4 < nz ? __ldg(p + (i + 4 * plane)) : 0.0f;
        const int l2 = slot(z + 2, nz, width);
        psi[4] = 0.0f;
        w[2] = 0u;
        if (l2 >= 0) {
            w[2] = __ldg(state + (zbase + l2 * zstep));
            psi[4] = psi_now(w[2], __ldg(profile + (ztable + z + 2)), r[2], r[3], r[5], r[6]);
        }
        const float* __restrict__ a = p + i;
        const float s1 = sum6(__ldg(a - 1), __ldg(a + 1), __ldg(p + (i - row)), __ldg(p + (i + row)), r[1], r[3]);
        const float s2 = sum6(__ldg(a - 2), __ldg(a + 2), __ldg(p + (i - 2 * row)), __ldg(p + (i + 2 * row)), r[0], r[4]);
        float e = 0.0f;
        if (in_x) e = __fadd_rn(e, in_plane_e<0>(x, y, z, i, s));
        if (in_y) e = __fadd_rn(e, in_plane_e<1>(x, y, z, i, s));
        const int l = slot(z, nz, width);
        if (l >= 0) e = __fadd_rn(e, layer_e(psi, r, w[0], __ldg(profile + (ztable + z)), next + (zbase + l * zstep)));
        const float term = __fadd_rn(laplacian(r[2], s1, s2), e);
        float num = __fadd_rn(__fsub_rn(__fadd_rn(r[2], r[2]), __ldcs(pp + i)), __fmul_rn(__ldcs(c + i), term));
        if (x == sx && y == sy && z == sz) num = __fadd_rn(num, amp);
        __stcs(pp + i, num);
#pragma unroll
        for (int j = 0; j < 6; ++j) r[j] = r[j + 1];
#pragma unroll
        for (int j = 0; j < 4; ++j) psi[j] = psi[j + 1];
        w[0] = w[1];
        w[1] = w[2];
    }
}

// The shot record: out[k] = p[index[k]] for k < n (one row of the record per step).
__global__ void gather_receivers(const float* __restrict__ p, const long long* __restrict__ index, int n, float* __restrict__ out) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = p[index[k]];
}

}  // extern "C"
