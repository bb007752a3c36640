// CS256 sparse matrix times dense vector(s), y = A x (SpMV) and Y = A X for up to 16
// vectors (SpMM), after the kernel of Lasby, Zimmer, Pokutta & Schultheis (appendix A.1).
// gpu/cs256/format.py defines the arrays, gpu/cs256/reference.py the product; compiled at
// run time by NVRTC (gpu/kernels.py), once per device. No headers: half and bfloat16 are
// carried as 16-bit patterns and converted here.
//
// The format, for an m x n matrix with T = ceil(n / 256) tiles of 1 x 256 columns per row
// and P = T rounded up to a multiple of 4:
//   values[row_ptr[i] .. row_ptr[i + 1])  row i's stored entries, tile after tile, columns
//                                         ascending within a tile (explicit zeros pad)
//   indices[...]                          uint8: the column within the tile
//   block_increments[i * P + t]           uint8: entries of tile t in units of vec (0 for t >= T)
// Each tile holds a multiple of vec (4, 8 or 16) entries. So a chunk of W entries (W divides
// vec) never straddles two tiles and starts at an element offset that is a multiple of W:
// values and indices load as W-wide vectors, and four tile counts load as one 32-bit word.
// Stored entries past column n (padding of the last, partial tile) are zeros; x is staged
// with zeros there.
//
// Two kernels:
//   cs256_group_*   G lanes (a power of two up to 32) per row split the row's chunks
//                   round-robin (split-k over chunks): consecutive lanes load consecutive
//                   chunks (coalesced). Each lane streams its chunks through a ring of R
//                   register slots (R loads in flight, each slot reloaded R chunks ahead as
//                   soon as it is used: loads and math overlap, no load-then-compute phases)
//                   and finds the tile of a chunk by walking the row's tile counts (prefetched
//                   into L1 at the row start; values and indices bypass L1). x, or a slice of
//                   whole tiles of x, sits in shared memory, staged with cp.async while the
//                   first chunks load; float accumulation; a shuffle reduction over the G
//                   lanes. Blocks of 512 threads stride over the rows. K vectors (1, 2, 4, 8,
//                   16) per launch.
//   cs256_split4_*  the appendix design as written: 4 threads per row, each taking one tile
//                   of every group of four (split-k over tiles), the 4 x 256 slice of x of
//                   the group staged in shared memory per round, VEC-wide loads, a 4-lane
//                   reduction. One vector. Rows need not be a multiple of 64.
// Both take any m >= 1 and n >= 1.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#define GROUP_BLOCK 512

// Tuning knobs, set with -D by bench/cs256_tune.py (the defaults are what cuda.py runs):
// CS256_RING: chunks in flight per lane (0: by element size and K, see group_kernel);
// CS256_L2_FETCH: bytes L2 fetches from DRAM per miss of a values or indices load
// (0: the default sector, else 64, 128 or 256: the PTX L2::<n>B hint);
// CS256_MIN_BLOCKS: blocks per SM the group kernel's registers must allow.
#ifndef CS256_RING
#define CS256_RING 0
#endif
#ifndef CS256_L2_FETCH
#define CS256_L2_FETCH 0
#endif
#ifndef CS256_MIN_BLOCKS
#define CS256_MIN_BLOCKS 2
#endif
#if CS256_L2_FETCH == 0
#define CS256_L2_HINT ""
#elif CS256_L2_FETCH == 64
#define CS256_L2_HINT ".L2::64B"
#elif CS256_L2_FETCH == 128
#define CS256_L2_HINT ".L2::128B"
#elif CS256_L2_FETCH == 256
#define CS256_L2_HINT ".L2::256B"
#else
#error "CS256_L2_FETCH must be 0, 64, 128 or 256"
#endif
#define SPLIT4_BLOCK 256
#define SPLIT4_ROWS (SPLIT4_BLOCK / 4)

// ------------------------------------------------------------------ element types --
// S: the stored type; to_float / from_float: exact widening, round-to-nearest-even narrowing.

struct F32 {
    typedef float S;
    static __device__ __forceinline__ float to_float(float v) { return v; }
    static __device__ __forceinline__ float from_float(float f) { return f; }
    static __device__ __forceinline__ float from_words(const u32* w, int k) { return __uint_as_float(w[k]); }
};

struct F16 {
    typedef u16 S;
#if defined(__CUDA_ARCH__)
    static __device__ __forceinline__ float to_float(u16 h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ __forceinline__ u16 from_float(float f) {
        u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
#else  // the CPU emulation (tests/gpu/emulator): the compiler's IEEE half, same rounding
    static float to_float(u16 h) {
        _Float16 v;
        __builtin_memcpy(&v, &h, 2);
        return (float)v;
    }
    static u16 from_float(float f) {
        const _Float16 v = (_Float16)f;
        u16 h;
        __builtin_memcpy(&h, &v, 2);
        return h;
    }
#endif
    static __device__ __forceinline__ float from_words(const u32* w, int k) { return to_float((u16)(w[k >> 1] >> ((k & 1) << 4))); }
};

struct BF16 {
    typedef u16 S;
    static __device__ __forceinline__ float to_float(u16 h) { return __uint_as_float((u32)h << 16); }
    static __device__ __forceinline__ u16 from_float(float f) {
        const u32 u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);  // NaN stays NaN (quiet)
        return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    static __device__ __forceinline__ float from_words(const u32* w, int k) {
        return __uint_as_float((k & 1) ? (w[k >> 1] & 0xffff0000u) : (w[k >> 1] << 16));
    }
};

// ------------------------------------------------------------------ memory access --

// N 32-bit words from p (aligned to min(4 N, 16) bytes) in the widest loads.
template <int N>
__device__ __forceinline__ void load_words(const void* p, u32 (&w)[N]) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            const uint4 v = reinterpret_cast<const uint4*>(p)[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else if constexpr (N == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        w[0] = v.x;
        w[1] = v.y;
    } else {
        static_assert(N == 1, "1, 2 or a multiple of 4 words");
        w[0] = *reinterpret_cast<const u32*>(p);
    }
}

// load_words for the streams read once (values, indices, global memory): they bypass L1,
// which so keeps the tile-count words the walk reads again and again.
template <int N>
__device__ __forceinline__ void stream_words(const void* p, u32 (&w)[N]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i)
            asm volatile("ld.global.nc.L1::no_allocate" CS256_L2_HINT ".v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w[4 * i]), "=r"(w[4 * i + 1]), "=r"(w[4 * i + 2]), "=r"(w[4 * i + 3])
                         : "l"(reinterpret_cast<const uint4*>(p) + i));
    } else if constexpr (N == 2) {
        asm volatile("ld.global.nc.L1::no_allocate" CS256_L2_HINT ".v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
    } else {
        static_assert(N == 1, "1, 2 or a multiple of 4 words");
        asm volatile("ld.global.nc.L1::no_allocate" CS256_L2_HINT ".u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
    }
#else
    load_words<N>(p, w);
#endif
}

// Asks L1 for the 32-byte sectors of bytes [p, p + bytes) (bytes >= 1), spread over `lanes`
// threads: a hint, nothing is read into registers and nothing outside the range is touched.
__device__ __forceinline__ void prefetch_l1(const u8* p, int bytes, int lane, int lanes) {
#if defined(__CUDA_ARCH__)
    for (int o = lane * 32; o < bytes + 31; o += lanes * 32) asm volatile("prefetch.global.L1 [%0];" ::"l"(p + min(o, bytes - 1)));
#endif
}

// One 16-byte unit from global to shared memory, asynchronously where the device can
// (sm_80+: cp.async, no registers; complete after wait_copies()), else at once. The CPU
// emulation lands it late, at wait_copies (tests/gpu/emulator/emu.h).
__device__ __forceinline__ void copy_unit(void* shared, const void* global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned long long address;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(address) : "l"(shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)address), "l"(global) : "memory");
#elif defined(CUDA_EMULATION)
    emu_copy_async(shared, global, 16);
#else
    *reinterpret_cast<uint4*>(shared) = *reinterpret_cast<const uint4*>(global);
#endif
}

// Waits for this thread's copy_unit copies (a __syncthreads must follow before others read them).
__device__ __forceinline__ void wait_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#elif defined(CUDA_EMULATION)
    emu_async_wait_all();
#endif
}

__device__ __forceinline__ int byte_of(u32 word, int k) { return (word >> (k << 3)) & 0xff; }

__device__ __forceinline__ int byte_sum(u32 w) {
    const u32 pairs = (w & 0x00ff00ffu) + ((w >> 8) & 0x00ff00ffu);
    return (int)((pairs & 0xffffu) + (pairs >> 16));
}

// acc[j] += v * x[col][j] for the K values of x's row `col` (xrow points at it, in shared memory).
template <class D, int K>
__device__ __forceinline__ void fma_row(float (&acc)[K], float v, const typename D::S* xrow) {
    if constexpr (K == 1) {
        acc[0] = fmaf(v, D::to_float(xrow[0]), acc[0]);
    } else {
        // K values in pieces of at most 16 bytes (4 registers live at a time).
        constexpr int PIECE = K * (int)sizeof(typename D::S) <= 16 ? K : 16 / (int)sizeof(typename D::S);
        constexpr int WORDS = PIECE * (int)sizeof(typename D::S) / 4;
#pragma unroll
        for (int p = 0; p < K; p += PIECE) {
            u32 w[WORDS];
            load_words<WORDS>(xrow + p, w);
#pragma unroll
            for (int j = 0; j < PIECE; ++j) acc[p + j] = fmaf(v, D::from_words(w, j), acc[p + j]);
        }
    }
}

// xs[0 .. cols * K) = x[col0 * K ..] for the columns col0 .. col0 + cols - 1 of x (n x K,
// row-major), zeros past column n. cols is a multiple of 256, so the slice is a whole
// number of 16-byte units and starts 512-byte aligned in x. All threads of the block; the
// whole units are copied with copy_unit (wait_copies, then __syncthreads, before reading),
// the one unit that straddles column n and those past it with plain stores.
template <class D, int K>
__device__ __forceinline__ void stage_x(typename D::S* xs, const typename D::S* __restrict__ x, int col0, int cols, int n) {
    typedef typename D::S S;
    constexpr int E = 16 / (int)sizeof(S);
    union Unit {
        uint4 v;
        S s[E];
    };
    const long long first = (long long)col0 * K;
    const int total = cols * K;
    const long long left = (long long)(n - col0) * K;
    const int valid = left < total ? (int)left : total;
    for (int e = threadIdx.x * E; e < total; e += blockDim.x * E) {
        if (e + E <= valid) {
            copy_unit(xs + e, x + first + e);
        } else {
            Unit unit;
#pragma unroll
            for (int i = 0; i < E; ++i) unit.s[i] = e + i < valid ? x[first + e + i] : (S)0;
            *reinterpret_cast<uint4*>(xs + e) = unit.v;
        }
    }
}

// ------------------------------------------------------------------ the group kernel --

// A lane's walk over its row's tiles: t the tile of the last chunk looked up (-1 before
// the first), tile_end the chunks of tiles 0..t, word the four tile counts holding t.
struct Walk {
    int t, tile_end;
    u32 word;
};

// Moves the walk forward to the tile of the row's chunk cu (tile counts are in units of
// vec, 1 << unit_shift chunks). Stops at the last padded tile (only malformed counts get there).
__device__ __forceinline__ void walk_to(Walk& walk, int cu, const u32* __restrict__ incw, int unit_shift, int padded_tiles) {
    while (cu >= walk.tile_end && walk.t + 1 < padded_tiles) {
        ++walk.t;
        if ((walk.t & 3) == 0) walk.word = incw[walk.t >> 2];
        walk.tile_end += byte_of(walk.word, walk.t & 3) << unit_shift;
    }
}

// acc += the lane's chunks c, c + G, ..., (nj of them; G = 1 << lanes_log2) of one row
// (vrow, irow: the row's first value and index), x's tiles s0.. in xs. A ring of R chunks
// in registers: R loads are issued first; each slot is reloaded with the chunk R steps
// ahead as soon as its own chunk is multiplied, so R - 1 .. R chunks are always in flight
// while the lane computes. wait_x (uniform in the block): x's asynchronous staging is
// waited for (and the block synchronized) once the first loads are in flight.
template <class D, int W, int K, int R>
__device__ __forceinline__ void ring(float (&acc)[K], const typename D::S* __restrict__ vrow, const u8* __restrict__ irow, int c, int nj,
                                     int lanes_log2, Walk& walk, const u32* __restrict__ incw, int unit_shift, int padded_tiles,
                                     const typename D::S* xs, int s0, bool wait_x) {
    typedef typename D::S S;
    constexpr int VW = W * (int)sizeof(S) / 4;  // words of values per chunk
    constexpr int IW = W / 4;                   // words of indices per chunk
    const int ahead = R << lanes_log2;          // chunks from a slot's chunk to its next one
    u32 vw[R][VW];
    u32 iw[R][IW];
#pragma unroll
    for (int s = 0; s < R; ++s) {
        if (s < nj) {
            const int cs = c + (s << lanes_log2);
            stream_words<VW>(vrow + cs * W, vw[s]);
            stream_words<IW>(irow + cs * W, iw[s]);
        }
    }
    if (wait_x) {
        wait_copies();
        __syncthreads();
    }
    for (int j = 0; j < nj; j += R) {
#pragma unroll
        for (int s = 0; s < R; ++s) {
            if (j + s < nj) {
                const int cu = c + ((j + s) << lanes_log2);
                walk_to(walk, cu, incw, unit_shift, padded_tiles);
                const S* xt = xs + (size_t)((walk.t - s0) << 8) * K;
#pragma unroll
                for (int k = 0; k < W; ++k) fma_row<D, K>(acc, D::from_words(vw[s], k), xt + byte_of(iw[s][k >> 2], k & 3) * K);
                if (j + s + R < nj) {
                    stream_words<VW>(vrow + (cu + ahead) * W, vw[s]);
                    stream_words<IW>(irow + (cu + ahead) * W, iw[s]);
                }
            }
        }
    }
}

// lanes_log2: G = 1 << lanes_log2 lanes per row (G <= 32); W: entries per chunk (4 or 8);
// unit_shift: log2(vec / W), tile counts are in units of vec; slice_tiles: tiles of x held
// in shared memory at once (>= T: all of x, staged once per block, asynchronously, while
// the first row's first chunks load; else a multiple of 4, and the block's rows step
// through the slices together, the ring restarting per slice). Dynamic shared memory:
// min(slice_tiles, T) * 256 * K * sizeof(S) bytes.
template <class D, int W, int K>
__device__ __forceinline__ void group_kernel(const typename D::S* __restrict__ values, const u8* __restrict__ indices,
                                             const int* __restrict__ row_ptr, const u8* __restrict__ increments,
                                             int m, int n, int padded_tiles, int unit_shift,
                                             const typename D::S* __restrict__ x, typename D::S* __restrict__ y,
                                             int lanes_log2, int slice_tiles) {
    typedef typename D::S S;
    // The ring: chunks in flight per lane. 2 is the fastest of the rings bench/cs256_tune.py
    // tried on every issue shape (BENCHMARKS.md, "Figures behind choices in the code").
    constexpr int R = CS256_RING > 0 ? CS256_RING : (K >= 16 && sizeof(S) == 4) ? 1 : 2;
    constexpr int W_LOG2 = W == 8 ? 3 : 2;
    static_assert(W == 4 || W == 8, "chunks of 4 or 8 entries");
#ifndef CUDA_EMULATION
    extern __shared__ uint4 shared_units[];
    S* xs = reinterpret_cast<S*>(shared_units);
#else
    S* xs = reinterpret_cast<S*>(shared_base());
#endif

    const int G = 1 << lanes_log2;
    const int lane = threadIdx.x & (G - 1);
    const int groups = blockDim.x >> lanes_log2;
    const int group = threadIdx.x >> lanes_log2;
    const int tiles = (n + 255) >> 8;
    const bool one_slice = slice_tiles >= tiles;
    const int stride = gridDim.x * groups;
    const int first = blockIdx.x * groups;

    // row_ptr of the group's next row, loaded one row ahead.
    int next_begin = 0, next_end = 0;
    if (first + group < m) {
        next_begin = row_ptr[first + group];
        next_end = row_ptr[first + group + 1];
    }
    if (one_slice) stage_x<D, K>(xs, x, 0, tiles * 256, n);  // waited for in the first ring, after its loads

    for (int base = first; base < m; base += stride) {  // uniform in the block
        const int row = base + group;
        const bool active = row < m;
        const int start = next_begin;
        const int chunks = (next_end - next_begin) >> W_LOG2;
        if (row + stride < m) {
            next_begin = row_ptr[row + stride];
            next_end = row_ptr[row + stride + 1];
        }
        const u8* counts = increments + (size_t)(active ? row : 0) * padded_tiles;
        // The row's tile counts into L1 now, in parallel with its first chunks: the walk's
        // loads of them then hit L1 instead of each waiting for DRAM.
        if (active) prefetch_l1(counts, padded_tiles, lane, G);
        const u32* incw = reinterpret_cast<const u32*>(counts);
        float acc[K];
#pragma unroll
        for (int j = 0; j < K; ++j) acc[j] = 0.f;
        Walk walk = {-1, 0, 0u};
        int c_lo = 0;  // the row's chunks before slice s0
        for (int s0 = 0; s0 < tiles; s0 += slice_tiles) {
            int c_hi = chunks;
            if (!one_slice) {
                const int s1 = min(s0 + slice_tiles, tiles);
                __syncthreads();  // the previous slice is no longer read
                stage_x<D, K>(xs, x, s0 * 256, (s1 - s0) * 256, n);
                wait_copies();
                __syncthreads();
                if (active) {
                    int units = 0;
                    for (int q = s0 >> 2; q < (s1 + 3) >> 2; ++q) units += byte_sum(incw[q]);  // counts past T are 0
                    c_hi = c_lo + (units << unit_shift);
                }
            }
            // Chunk c of the row belongs to lane c mod G: the lane's first one in [c_lo, c_hi).
            const int c = c_lo + ((lane - c_lo) & (G - 1));
            const int nj = (active && c < c_hi) ? ((c_hi - c + G - 1) >> lanes_log2) : 0;
            ring<D, W, K, R>(acc, values + start, indices + start, c, nj, lanes_log2, walk, incw, unit_shift, padded_tiles, xs, s0,
                             one_slice && base == first);
            c_lo = c_hi;
        }
        // Sum the G lanes' parts of each row (every lane of the warp takes part).
        for (int offset = G >> 1; offset > 0; offset >>= 1) {
#pragma unroll
            for (int j = 0; j < K; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], offset);
        }
        if (active) {
#pragma unroll
            for (int j = 0; j < K; ++j)
                if ((j & (G - 1)) == lane) y[(size_t)row * K + j] = D::from_float(acc[j]);
        }
    }
    wait_copies();  // no copy outlives its block (a block without rows: none with cuda.py's grid)
}

// ------------------------------------------------------------------ the appendix kernel --

// Four consecutive elements of x from column col (zeros past n).
template <class D>
__device__ __forceinline__ void load_x4(typename D::S (&out)[4], const typename D::S* __restrict__ x, int col, int n) {
    typedef typename D::S S;
    if (col + 4 <= n) {
        if constexpr (sizeof(S) == 2) {
            const uint2 v = *reinterpret_cast<const uint2*>(x + col);
            out[0] = (S)(v.x & 0xffffu);
            out[1] = (S)(v.x >> 16);
            out[2] = (S)(v.y & 0xffffu);
            out[3] = (S)(v.y >> 16);
        } else {
            const float4 v = *reinterpret_cast<const float4*>(x + col);
            out[0] = v.x;
            out[1] = v.y;
            out[2] = v.z;
            out[3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = col + i < n ? x[col + i] : (S)0;
    }
}

template <class D, int VEC>
__device__ __forceinline__ void split4_kernel(const typename D::S* __restrict__ values, const u8* __restrict__ indices,
                                              const int* __restrict__ row_ptr, const u8* __restrict__ increments,
                                              int m, int n, int padded_tiles,
                                              const typename D::S* __restrict__ x, typename D::S* __restrict__ y) {
    typedef typename D::S S;
    constexpr int VW = VEC * (int)sizeof(S) / 4;
    constexpr int IW = VEC / 4;
    __shared__ __align__(16) S xs[4 * 256];
    const int part = threadIdx.x & 3;  // the tile of each group of four this thread takes
    const int r = threadIdx.x >> 2;
    for (int base = blockIdx.x * SPLIT4_ROWS; base < m; base += gridDim.x * SPLIT4_ROWS) {  // uniform in the block
        const int row = base + r;
        const bool active = row < m;
        int start = active ? row_ptr[row] : 0;
        const u32* incw = reinterpret_cast<const u32*>(increments + (size_t)(active ? row : 0) * padded_tiles);
        float s = 0.f;
        S ftr[4];
        load_x4<D>(ftr, x, threadIdx.x * 4, n);
        for (int q = 0; q < padded_tiles; q += 4) {
            const u32 counts = active ? incw[q >> 2] : 0u;
            __syncthreads();  // the previous round's slice is no longer read
#pragma unroll
            for (int i = 0; i < 4; ++i) xs[threadIdx.x * 4 + i] = ftr[i];
            load_x4<D>(ftr, x, (q + 4) * 256 + threadIdx.x * 4, n);  // the next round's slice, in flight meanwhile
            __syncthreads();
            int begin = start;
            for (int j = 0; j < part; ++j) begin += byte_of(counts, j) * VEC;
            const int end = begin + byte_of(counts, part) * VEC;
            const S* xt = xs + part * 256;
            for (int e = begin; e < end; e += VEC) {
                u32 vw[VW];
                u32 iw[IW];
                load_words<VW>(values + e, vw);
                load_words<IW>(indices + e, iw);
#pragma unroll
                for (int k = 0; k < VEC; ++k) s = fmaf(D::from_words(vw, k), D::to_float(xt[byte_of(iw[k >> 2], k & 3)]), s);
            }
            start += byte_sum(counts) * VEC;
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (active && part == 0) y[row] = D::from_float(s);
    }
}

// ------------------------------------------------------------------ entry points --
// cs256_group_<f16|bf16|f32>_w<W>_k<K> and cs256_split4_<f16|bf16|f32>_v<VEC>.

#define GROUP_ENTRY(NAME, D, W, K)                                                                                      \
    extern "C" __global__ void __launch_bounds__(GROUP_BLOCK, CS256_MIN_BLOCKS) NAME(                                                     \
        const D::S* __restrict__ values, const u8* __restrict__ indices, const int* __restrict__ row_ptr,               \
        const u8* __restrict__ increments, int m, int n, int padded_tiles, int unit_shift,                              \
        const D::S* __restrict__ x, D::S* __restrict__ y, int lanes_log2, int slice_tiles) {                             \
        group_kernel<D, W, K>(values, indices, row_ptr, increments, m, n, padded_tiles, unit_shift, x, y, lanes_log2,   \
                              slice_tiles);                                                                             \
    }

#define GROUP_ENTRIES(TAG, D, W)              \
    GROUP_ENTRY(cs256_group_##TAG##_w##W##_k1, D, W, 1)   \
    GROUP_ENTRY(cs256_group_##TAG##_w##W##_k2, D, W, 2)   \
    GROUP_ENTRY(cs256_group_##TAG##_w##W##_k4, D, W, 4)   \
    GROUP_ENTRY(cs256_group_##TAG##_w##W##_k8, D, W, 8)   \
    GROUP_ENTRY(cs256_group_##TAG##_w##W##_k16, D, W, 16)

GROUP_ENTRIES(f16, F16, 4)
GROUP_ENTRIES(f16, F16, 8)
GROUP_ENTRIES(bf16, BF16, 4)
GROUP_ENTRIES(bf16, BF16, 8)
GROUP_ENTRIES(f32, F32, 4)
GROUP_ENTRIES(f32, F32, 8)

#define SPLIT4_ENTRY(NAME, D, VEC)                                                                                      \
    extern "C" __global__ void __launch_bounds__(SPLIT4_BLOCK) NAME(                                                    \
        const D::S* __restrict__ values, const u8* __restrict__ indices, const int* __restrict__ row_ptr,               \
        const u8* __restrict__ increments, int m, int n, int padded_tiles, const D::S* __restrict__ x,                  \
        D::S* __restrict__ y) {                                                                                         \
        split4_kernel<D, VEC>(values, indices, row_ptr, increments, m, n, padded_tiles, x, y);                          \
    }

SPLIT4_ENTRY(cs256_split4_f16_v4, F16, 4)
SPLIT4_ENTRY(cs256_split4_f16_v8, F16, 8)
SPLIT4_ENTRY(cs256_split4_f16_v16, F16, 16)
SPLIT4_ENTRY(cs256_split4_bf16_v4, BF16, 4)
SPLIT4_ENTRY(cs256_split4_bf16_v8, BF16, 8)
SPLIT4_ENTRY(cs256_split4_bf16_v16, BF16, 16)
SPLIT4_ENTRY(cs256_split4_f32_v4, F32, 4)
SPLIT4_ENTRY(cs256_split4_f32_v8, F32, 8)
SPLIT4_ENTRY(cs256_split4_f32_v16, F32, 16)

// ------------------------------------------------------------------ timing helpers --
// Used by gpu/cs256/anchors.py to time one launch at a time with CUDA events: cs256_spin
// keeps the stream busy while the host queues the events and the launch (so the events
// time the GPU, not the host), cs256_read_flush reads a buffer larger than L2 (clean
// lines: the next kernel evicts them for free, unlike a memset's dirty ones);
// cs256_read_rows is the read floor the benchmark sets the kernels against.

extern "C" __global__ void cs256_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

// A span of bytes [p, p + bytes) as the read floor reads it: `head` bytes up to the first
// 16-byte boundary and the bytes after the last whole unit one at a time, `units` 16-byte
// units in between as the group kernel loads its streams.
struct Span {
    const u8* p;
    long long bytes, head, units;  // bytes in all, bytes before the first unit, 16-byte units
};

__device__ __forceinline__ Span span_of(const u8* p, long long bytes) {
    const long long head = min(bytes, (long long)((16 - (reinterpret_cast<unsigned long long>(p) & 15)) & 15));
    return {p, bytes, head, (bytes - head) >> 4};
}

// The span's bytes outside its units (at most 30) are read one per thread, each as byte
// (address mod 4) of a word: this thread's, or 0. Called before the units' loop and its
// result used after, so that these loads are in flight with the first units', not
// before them.
__device__ __forceinline__ u32 end_byte(const Span& s) {
    const long long tail = s.head + (s.units << 4), ends = s.head + (s.bytes - tail), j = threadIdx.x;
    if (j >= ends) return 0u;
    const long long i = j < s.head ? j : tail + (j - s.head);
    return (u32)s.p[i] << (8 * ((reinterpret_cast<unsigned long long>(s.p) + i) & 3));
}

// The read floor of a CS256 product (gpu/cs256/anchors.py ReadFloor): block b reads rows
// [b * rows_per_block, ..) of the matrix, their values (item bytes each), indices and tile
// counts, three contiguous spans whose 16-byte units the block's threads take in turn as
// one sequence (READ_FLOOR_DEPTH loads in flight per thread, whichever span they fall in),
// computing nothing but the XOR of the little-endian words read, one per warp into
// partials[block][warp] (a test checks that every byte was read once). The time a plain
// streaming read of these bytes from DRAM takes, to set the kernels against.
// Blocks of whole warps (at least 32 threads).
#define READ_FLOOR_DEPTH 4
extern "C" __global__ void cs256_read_rows(const u8* __restrict__ values, const u8* __restrict__ indices, const int* __restrict__ row_ptr,
                                           const u8* __restrict__ increments, int m, int padded_tiles, int item, int rows_per_block,
                                           u32* partials) {
    const int r0 = min((int)blockIdx.x * rows_per_block, m), r1 = min(r0 + rows_per_block, m);
    const long long e0 = row_ptr[r0], e1 = row_ptr[r1];
    const Span spans[3] = {span_of(values + e0 * item, (e1 - e0) * item), span_of(indices + e0, e1 - e0),
                           span_of(increments + (long long)r0 * padded_tiles, (long long)(r1 - r0) * padded_tiles)};
    const u32 ends = end_byte(spans[0]) ^ end_byte(spans[1]) ^ end_byte(spans[2]);
    u32 acc = 0;
    const long long first = spans[0].units, second = first + spans[1].units, total = second + spans[2].units;
    for (long long u = threadIdx.x; u < total; u += READ_FLOOR_DEPTH * (long long)blockDim.x) {
        u32 w[READ_FLOOR_DEPTH][4];
#pragma unroll
        for (int k = 0; k < READ_FLOOR_DEPTH; ++k) {
            const long long v = u + k * (long long)blockDim.x;
            if (v < total) {
                const Span& s = v < first ? spans[0] : v < second ? spans[1] : spans[2];
                const long long unit = v < first ? v : v < second ? v - first : v - second;
                stream_words<4>(s.p + s.head + (unit << 4), w[k]);
            }
        }
#pragma unroll
        for (int k = 0; k < READ_FLOOR_DEPTH; ++k)
            if (u + k * (long long)blockDim.x < total) acc ^= w[k][0] ^ w[k][1] ^ w[k][2] ^ w[k][3];
    }
    acc ^= ends;
    for (int offset = 16; offset > 0; offset >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
    if ((threadIdx.x & 31) == 0) partials[blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)] = acc;  // no atomics: they queue on one word
}

extern "C" __global__ void cs256_read_flush(const uint4* __restrict__ data, long long units, u32* __restrict__ sink) {
    u32 acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < units; i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = data[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; practically never stores
}
