// One leapfrog step of the 3D acoustic wave equation with the 13-point 4th-order
// Laplacian (Pavan et al. 2018), in the paper's nine variants: memory path x z-marching.
//
//   memory path  naive     global loads cached in L2 only (ld.global.cg, __ldcg), as
//                          global loads were on the paper's Kepler: no on-chip reuse
//                shared    the x-y tile of the plane with a 2-cell halo in shared memory
//                          (filled with ld.global.cg); z neighbours from global memory
//                readonly  every load through the SM's read-only / L1 path (__ldg)
//   marching     plain     one thread per point: grid (x tiles, y tiles, interior planes)
//                int_z     one thread per (x, y) column marching a chunk of `zchunk` planes,
//                          loading all 13 points at each plane (reuse left to the caches)
//                int_z_reg the z-march keeping the 5-point z column (z-2 .. z+2) in registers:
//                          one new plane value per step along z
//
// Fields are (nz, ny, nx) float32, x fastest. Ping-pong: p is p^n (read only), pp holds
// p^(n-1) on entry and receives p^(n+1) (each point read, then written, by one thread),
// c is (v dt / h)^2. Only the interior [2, n-3] of each axis is written: the 2-cell
// Dirichlet border stays 0. Per point and step: p (reused from on-chip memory or L2),
// pp read and written, c read: 16 bytes from DRAM at best.
//
// The memory path of a variant is that of p, the field the stencil reuses. pp and c are
// touched once per step in every variant and go through the streaming (evict-first)
// loads and stores __ldcs / __stcs, so that they do not push the planes of p that are
// still to be reused out of L2 (on 7168 x 256 planes, five planes of p are 37 MB).
// The z-marching variants load pp and c of the next plane one iteration ahead, with
// p's plane z + 3: three independent DRAM loads in flight per thread.
//
// The arithmetic is the reference's (gpu/stencil/reference.py), operation for operation,
// with explicitly rounded intrinsics (__fadd_rn, __fmul_rn, ... are never fused into
// FMAs), so that every variant agrees with the NumPy reference bit for bit.
//
// Launch: block (BX, BY) = (32, 8); plain variants grid (ceil((nx-4)/BX), ceil((ny-4)/BY),
// nz-4); z-marching variants grid (..., ..., ceil((nz-4)/zchunk)). Mirrored in cuda.py.

namespace {

constexpr int R = 2;  // stencil radius = Dirichlet border width
constexpr int BX = 32;
constexpr int BY = 8;
constexpr int TW = BX + 2 * R;  // shared tile width and height, with halo
constexpr int TH = BY + 2 * R;
constexpr int THREADS = BX * BY;

constexpr float C0 = -7.5f;  // 3 x (-5/2)
constexpr float C1 = 4.0f / 3.0f;
constexpr float C2 = -1.0f / 12.0f;

enum Memory { NAIVE = 0, SHARED = 1, READONLY = 2 };
enum March { PLAIN = 0, INT_Z = 1, INT_Z_REG = 2 };

struct Step {
    int nx, ny, nz, zchunk;
    int sx, sy, sz;  // source point
    float amp;       // source term of this step, dt^2 v_src^2 w(n dt)
    int sponge;      // sponge width in cells (0: none)
    float eta_max;   // sigma dt at the sponge's outer edge
};

template <int M>
__device__ __forceinline__ float load(const float* __restrict__ a, long long i) {
    if constexpr (M == READONLY) {
        return __ldg(a + i);
    } else {
        return __ldcg(a + i);
    }
}

// (W - d) / W within W cells of the border (d = 0 at the first interior cell), else 0.
__device__ __forceinline__ float ramp(int i, int n, int w) {
    const int d = min(i - R, n - 1 - R - i);
    return d < w ? __fdiv_rn(static_cast<float>(w - d), static_cast<float>(w)) : 0.0f;
}

// p^(n+1) at (x, y, z) from the centre value, p^(n-1), c, and the neighbour sums at
// distance 1 (s1) and 2 (s2).
__device__ __forceinline__ float next_value(float centre, float prev, float c, float s1, float s2, int x, int y, int z, const Step& s) {
    const float lap = __fadd_rn(__fadd_rn(__fmul_rn(C0, centre), __fmul_rn(C1, s1)), __fmul_rn(C2, s2));
    float eta = 0.0f;
    if (s.sponge > 0) {
        const float fx = ramp(x, s.nx, s.sponge), fy = ramp(y, s.ny, s.sponge), fz = ramp(z, s.nz, s.sponge);
        eta = __fmul_rn(s.eta_max, __fadd_rn(__fadd_rn(__fmul_rn(fx, fx), __fmul_rn(fy, fy)), __fmul_rn(fz, fz)));
    }
    float num = __fadd_rn(__fsub_rn(__fadd_rn(centre, centre), __fmul_rn(__fsub_rn(1.0f, eta), prev)), __fmul_rn(c, lap));
    if (x == s.sx && y == s.sy && z == s.sz) num = __fadd_rn(num, s.amp);
    if (eta != 0.0f) num = __fdiv_rn(num, __fadd_rn(1.0f, eta));
    return num;
}

// ((((a + b) + c) + d) + e) + f: the reference's order.
__device__ __forceinline__ float sum6(float a, float b, float c, float d, float e, float f) {
    return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(a, b), c), d), e), f);
}

// ------------------------------------------------------- naive and readonly --

// All 13 points from global memory (through the variant's load path).
template <int M>
__device__ __forceinline__ void point_global(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, long long i, int x, int y, int z, const Step& s) {
    const long long sy = s.nx, sz = static_cast<long long>(s.nx) * s.ny;
    const float s1 = sum6(load<M>(p, i - 1), load<M>(p, i + 1), load<M>(p, i - sy), load<M>(p, i + sy), load<M>(p, i - sz), load<M>(p, i + sz));
    const float s2 = sum6(load<M>(p, i - 2), load<M>(p, i + 2), load<M>(p, i - 2 * sy), load<M>(p, i + 2 * sy), load<M>(p, i - 2 * sz), load<M>(p, i + 2 * sz));
    __stcs(pp + i, next_value(load<M>(p, i), __ldcs(pp + i), __ldcs(c + i), s1, s2, x, y, z, s));
}

template <int M, int Z>
__device__ __forceinline__ void global_variant(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, const Step& s) {
    const int x = R + blockIdx.x * BX + threadIdx.x;
    const int y = R + blockIdx.y * BY + threadIdx.y;
    if (x > s.nx - 1 - R || y > s.ny - 1 - R) return;
    const long long sz = static_cast<long long>(s.nx) * s.ny;
    if constexpr (Z == PLAIN) {
        const int z = R + blockIdx.z;
        point_global<M>(p, pp, c, z * sz + static_cast<long long>(y) * s.nx + x, x, y, z, s);
    } else {
        const int z0 = R + blockIdx.z * s.zchunk;
        const int z1 = min(z0 + s.zchunk, s.nz - R);
        long long i = z0 * sz + static_cast<long long>(y) * s.nx + x;
        if constexpr (Z == INT_Z) {
            for (int z = z0; z < z1; ++z, i += sz) point_global<M>(p, pp, c, i, x, y, z, s);
        } else {
            const long long sy = s.nx;
            float zm2 = load<M>(p, i - 2 * sz), zm1 = load<M>(p, i - sz), zc = load<M>(p, i);
            float zp1 = load<M>(p, i + sz), zp2 = load<M>(p, i + 2 * sz);
            float prev = __ldcs(pp + i), cc = __ldcs(c + i);
            for (int z = z0; z < z1; ++z, i += sz) {
                // the next plane's loads, issued before this plane's work
                const bool more = z + 1 < z1;
                const float ahead = more ? load<M>(p, i + 3 * sz) : 0.0f;
                const float next_prev = more ? __ldcs(pp + i + sz) : 0.0f;
                const float next_c = more ? __ldcs(c + i + sz) : 0.0f;
                const float s1 = sum6(load<M>(p, i - 1), load<M>(p, i + 1), load<M>(p, i - sy), load<M>(p, i + sy), zm1, zp1);
                const float s2 = sum6(load<M>(p, i - 2), load<M>(p, i + 2), load<M>(p, i - 2 * sy), load<M>(p, i + 2 * sy), zm2, zp2);
                __stcs(pp + i, next_value(zc, prev, cc, s1, s2, x, y, z, s));
                zm2 = zm1; zm1 = zc; zc = zp1; zp1 = zp2; zp2 = ahead;
                prev = next_prev; cc = next_c;
            }
        }
    }
}

// ------------------------------------------------------------------- shared --

// Tile element (j, k) holds plane z at (x0 - 2 + k, y0 - 2 + j); 0 beyond the array.
__device__ __forceinline__ float tile_value(const float* __restrict__ p, int gx, int gy, long long plane, const Step& s) {
    return gx < s.nx && gy < s.ny ? __ldcg(p + plane + static_cast<long long>(gy) * s.nx + gx) : 0.0f;
}

__device__ __forceinline__ void load_tile(float (&tile)[TH][TW], const float* __restrict__ p, int x0, int y0, long long plane, const Step& s) {
    const int t = threadIdx.y * BX + threadIdx.x;
    for (int k = t; k < TW * TH; k += THREADS) {
        const int j = k / TW, i = k - j * TW;
        tile[j][i] = tile_value(p, x0 - R + i, y0 - R + j, plane, s);
    }
}

// The halo ring only (the centre comes from the threads' registers): 2 rows on top, 2 at
// the bottom, then 2 columns left and right of each of the BY middle rows.
__device__ __forceinline__ void load_ring(float (&tile)[TH][TW], const float* __restrict__ p, int x0, int y0, long long plane, const Step& s) {
    constexpr int RING = TW * TH - BX * BY;
    const int t = threadIdx.y * BX + threadIdx.x;
    for (int k = t; k < RING; k += THREADS) {
        int j, i;
        if (k < R * TW) {
            j = k / TW; i = k - j * TW;
        } else if (k < 2 * R * TW) {
            const int q = k - R * TW;
            j = BY + R + q / TW; i = q % TW;
        } else {
            const int q = k - 2 * R * TW;
            j = R + q / (2 * R);
            const int side = q % (2 * R);
            i = side < R ? side : BX + side;
        }
        tile[j][i] = tile_value(p, x0 - R + i, y0 - R + j, plane, s);
    }
}

__device__ __forceinline__ float tile_s1(const float (&tile)[TH][TW], int tx, int ty, float zm, float zp) {
    return sum6(tile[ty + R][tx + R - 1], tile[ty + R][tx + R + 1], tile[ty + R - 1][tx + R], tile[ty + R + 1][tx + R], zm, zp);
}

__device__ __forceinline__ float tile_s2(const float (&tile)[TH][TW], int tx, int ty, float zm, float zp) {
    return sum6(tile[ty + R][tx + R - 2], tile[ty + R][tx + R + 2], tile[ty + R - 2][tx + R], tile[ty + R + 2][tx + R], zm, zp);
}

template <int Z>
__device__ __forceinline__ void shared_variant(const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, const Step& s) {
    __shared__ float tile[TH][TW];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int x0 = R + blockIdx.x * BX, y0 = R + blockIdx.y * BY;
    const int x = x0 + tx, y = y0 + ty;
    const bool active = x <= s.nx - 1 - R && y <= s.ny - 1 - R;
    const long long sz = static_cast<long long>(s.nx) * s.ny;
    const long long column = static_cast<long long>(y) * s.nx + x;
    if constexpr (Z == PLAIN) {
        const int z = R + blockIdx.z;
        const long long plane = z * sz;
        load_tile(tile, p, x0, y0, plane, s);
        __syncthreads();
        if (!active) return;
        const long long i = plane + column;
        const float s1 = tile_s1(tile, tx, ty, __ldcg(p + i - sz), __ldcg(p + i + sz));
        const float s2 = tile_s2(tile, tx, ty, __ldcg(p + i - 2 * sz), __ldcg(p + i + 2 * sz));
        __stcs(pp + i, next_value(tile[ty + R][tx + R], __ldcs(pp + i), __ldcs(c + i), s1, s2, x, y, z, s));
    } else {
        const int z0 = R + blockIdx.z * s.zchunk;
        const int z1 = min(z0 + s.zchunk, s.nz - R);
        if constexpr (Z == INT_Z) {
            for (int z = z0; z < z1; ++z) {
                const long long plane = z * sz, i = plane + column;
                __syncthreads();  // the previous plane's tile has been read
                load_tile(tile, p, x0, y0, plane, s);
                __syncthreads();
                if (active) {
                    const float s1 = tile_s1(tile, tx, ty, __ldcg(p + i - sz), __ldcg(p + i + sz));
                    const float s2 = tile_s2(tile, tx, ty, __ldcg(p + i - 2 * sz), __ldcg(p + i + 2 * sz));
                    __stcs(pp + i, next_value(tile[ty + R][tx + R], __ldcs(pp + i), __ldcs(c + i), s1, s2, x, y, z, s));
                }
            }
        } else {
            // Threads outside the array (partial tiles) hold zeros; those on the border
            // hold the border's values, which interior neighbours read from the tile.
            const bool inside = x < s.nx && y < s.ny;
            long long i = z0 * sz + column;
            float zm2 = 0.0f, zm1 = 0.0f, zc = 0.0f, zp1 = 0.0f, zp2 = 0.0f, prev = 0.0f, cc = 0.0f;
            if (inside) {
                zm2 = __ldcg(p + i - 2 * sz); zm1 = __ldcg(p + i - sz); zc = __ldcg(p + i);
                zp1 = __ldcg(p + i + sz); zp2 = __ldcg(p + i + 2 * sz);
            }
            if (active) {
                prev = __ldcs(pp + i); cc = __ldcs(c + i);
            }
            for (int z = z0; z < z1; ++z, i += sz) {
                // the next plane's loads, issued before this plane's work
                const bool more = z + 1 < z1;
                const float ahead = inside && more ? __ldcg(p + i + 3 * sz) : 0.0f;
                const float next_prev = active && more ? __ldcs(pp + i + sz) : 0.0f;
                const float next_c = active && more ? __ldcs(c + i + sz) : 0.0f;
                __syncthreads();  // the previous plane's tile has been read
                tile[ty + R][tx + R] = zc;
                load_ring(tile, p, x0, y0, z * sz, s);
                __syncthreads();
                if (active) {
                    const float s1 = tile_s1(tile, tx, ty, zm1, zp1);
                    const float s2 = tile_s2(tile, tx, ty, zm2, zp2);
                    __stcs(pp + i, next_value(zc, prev, cc, s1, s2, x, y, z, s));
                }
                zm2 = zm1; zm1 = zc; zc = zp1; zp1 = zp2; zp2 = ahead;
                prev = next_prev; cc = next_c;
            }
        }
    }
}

}  // namespace

// ---------------------------------------------------------- the nine kernels --

#define STENCIL_ARGS                                                                                     \
    const float* __restrict__ p, float* __restrict__ pp, const float* __restrict__ c, int nx, int ny, int nz, \
        int zchunk, int sx, int sy, int sz, float amp, int sponge, float eta_max
#define STEP Step{nx, ny, nz, zchunk, sx, sy, sz, amp, sponge, eta_max}

// Occupancy: 8 blocks of 256 threads per SM (32 registers) where that costs no spills;
// the register-queue variants need a few more registers (6 blocks, up to 40).

extern "C" {

__global__ void __launch_bounds__(THREADS, 8) stencil_naive(STENCIL_ARGS) { global_variant<NAIVE, PLAIN>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 8) stencil_naive_int_z(STENCIL_ARGS) { global_variant<NAIVE, INT_Z>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 6) stencil_naive_int_z_reg(STENCIL_ARGS) { global_variant<NAIVE, INT_Z_REG>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 8) stencil_shared(STENCIL_ARGS) { shared_variant<PLAIN>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 8) stencil_shared_int_z(STENCIL_ARGS) { shared_variant<INT_Z>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 6) stencil_shared_int_z_reg(STENCIL_ARGS) { shared_variant<INT_Z_REG>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 8) stencil_readonly(STENCIL_ARGS) { global_variant<READONLY, PLAIN>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 8) stencil_readonly_int_z(STENCIL_ARGS) { global_variant<READONLY, INT_Z>(p, pp, c, STEP); }
__global__ void __launch_bounds__(THREADS, 6) stencil_readonly_int_z_reg(STENCIL_ARGS) { global_variant<READONLY, INT_Z_REG>(p, pp, c, STEP); }

// The shot record: out[k] = p[index[k]] for k < n (one row of the record per step).
__global__ void gather_receivers(const float* __restrict__ p, const long long* __restrict__ index, int n, float* __restrict__ out) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = p[index[k]];
}

}  // extern "C"
