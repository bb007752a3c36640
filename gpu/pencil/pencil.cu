// The pencil pipeline of Lu, Xu & Jia (2012) as CUDA kernels, in the parallel layout of
// Qiu et al. (2019). gpu/pencil/reference.py is the definition; each kernel names the
// stage(s) it implements. Compiled at run time by NVRTC (gpu/kernels.py), once per device.
//
// Planes are row-major. "Padded" planes carry a zero border of `halo` px and are sized
// (rows_padded, pitch) = (round_up(H, LINE_TILE_H) + 2 halo, round_up(W, LINE_TILE_W) + 2 halo),
// so the line passes read every tap without a bounds check.

typedef unsigned char u8;
typedef unsigned int u32;

// ------------------------------------------------------------------ colour (OpenCV) --
// OpenCV's 8-bit YCrCb conversions, fixed point with 14 fraction bits, bit for bit.
#define YCC_SHIFT 14
__device__ __forceinline__ int descale(int x) { return (x + (1 << (YCC_SHIFT - 1))) >> YCC_SHIFT; }
__device__ __forceinline__ int clamp_u8(int v) { return min(max(v, 0), 255); }

__device__ __forceinline__ int luma_of(int r, int g, int b) { return descale(r * 4899 + g * 9617 + b * 1868); }

// ------------------------------------------- stage 6 (and the luma every stage reads) --
// image: (H, W, channels) uint8, channels 1 or 3 (RGB). Writes luma (H, W) and adds the
// 256-bin histogram of luma into `hist` (zeroed by the caller). Integer atomics: exact.
extern "C" __global__ void luma_histogram(const u8* __restrict__ image, int channels, long long pixels,
                                          u8* __restrict__ luma, u32* __restrict__ hist) {
    __shared__ u32 local[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) local[i] = 0;
    __syncthreads();
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < pixels; p += (long long)gridDim.x * blockDim.x) {
        int y;
        if (channels == 3) {
            y = luma_of(image[3 * p], image[3 * p + 1], image[3 * p + 2]);
        } else {
            y = image[p];
        }
        luma[p] = (u8)y;
        atomicAdd(&local[y], 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        if (local[i]) atomicAdd(&hist[i], local[i]);
}

// ------------------------------------------------------------- stages 1-2: M plane --
#define MG_BX 32
#define MG_BY 8

// Median of 9 by a fixed exchange network (partial sort: only the middle is kept exact).
__device__ __forceinline__ void sort2(int& a, int& b) { int t = min(a, b); b = max(a, b); a = t; }
__device__ __forceinline__ int median9(int p0, int p1, int p2, int p3, int p4, int p5, int p6, int p7, int p8) {
    sort2(p1, p2); sort2(p4, p5); sort2(p7, p8); sort2(p0, p1); sort2(p3, p4); sort2(p6, p7);
    sort2(p1, p2); sort2(p4, p5); sort2(p7, p8); sort2(p0, p3); sort2(p5, p8); sort2(p4, p7);
    sort2(p3, p6); sort2(p1, p4); sort2(p2, p5); sort2(p4, p7); sort2(p4, p2); sort2(p6, p4);
    sort2(p4, p2);
    return p4;
}

// Stage 1, median 3x3 of luma (edges replicated), and stage 2, the gradient as whole
// numbers: 255 M = |dx| + |dy| of the median (0 past the last column/row), exact, written
// into the padded plane `mag` (pitch x rows_padded, zero outside the image) as float32.
// The line tables carry the 1/255. One thread per padded pixel.
extern "C" __global__ void __launch_bounds__(MG_BX * MG_BY)
median_gradient(const u8* __restrict__ luma, int height, int width,
                float* __restrict__ mag, int pitch, int rows_padded, int halo) {
    __shared__ u8 tile[MG_BY + 3][MG_BX + 3];   // luma, rows y0-1 .. y0+MG_BY+1
    __shared__ u8 med[MG_BY + 1][MG_BX + 1];    // medians at y0 .. y0+MG_BY
    const int px = blockIdx.x * MG_BX + threadIdx.x, py = blockIdx.y * MG_BY + threadIdx.y;
    const int x0 = blockIdx.x * MG_BX - halo, y0 = blockIdx.y * MG_BY - halo;  // image coords
    const bool block_touches_image = x0 + MG_BX > 0 && x0 < width && y0 + MG_BY > 0 && y0 < height;
    if (block_touches_image) {   // uniform across the block: barriers below are safe
        const int tid = threadIdx.y * MG_BX + threadIdx.x;
        for (int i = tid; i < (MG_BY + 3) * (MG_BX + 3); i += MG_BX * MG_BY) {
            int ty = i / (MG_BX + 3), tx = i - ty * (MG_BX + 3);
            int gy = min(max(y0 - 1 + ty, 0), height - 1), gx = min(max(x0 - 1 + tx, 0), width - 1);
            tile[ty][tx] = luma[(long long)gy * width + gx];
        }
        __syncthreads();
        for (int i = tid; i < (MG_BY + 1) * (MG_BX + 1); i += MG_BX * MG_BY) {
            int my = i / (MG_BX + 1), mx = i - my * (MG_BX + 1);
            med[my][mx] = (u8)median9(tile[my][mx], tile[my][mx + 1], tile[my][mx + 2],
                                      tile[my + 1][mx], tile[my + 1][mx + 1], tile[my + 1][mx + 2],
                                      tile[my + 2][mx], tile[my + 2][mx + 1], tile[my + 2][mx + 2]);
        }
        __syncthreads();
    }
    if (px >= pitch || py >= rows_padded) return;
    const int x = px - halo, y = py - halo;
    int m = 0;
    if (x >= 0 && x < width && y >= 0 && y < height) {
        const int tx = threadIdx.x, ty = threadIdx.y, here = med[ty][tx];
        if (x + 1 < width) m += abs(med[ty][tx + 1] - here);
        if (y + 1 < height) m += abs(med[ty + 1][tx] - here);
    }
    mag[(long long)py * pitch + px] = (float)m;
}

// ----------------------------------------------------- stages 3-5: the line passes --
// A line kernel is a list of runs: taps that are consecutive along one axis (x for the
// near-horizontal directions, y for the near-vertical ones). Each thread computes a
// block of LINE_ROWS x LINE_COLS pixels and slides a ring of registers along a run, so
// one shared-memory load feeds LINE_COLS (or LINE_ROWS) multiply-adds.
// LINE_COLS is odd so that the 32 lanes of a warp, LINE_COLS words apart, never share
// a bank.
//
// The four directions along a pixel axis or diagonal (0, 45, 90, 135 degrees) have a
// constant weight between their anti-aliased ends. Tiled, those directions scan the tile
// into prefix sums along their step s, D(q) = sum_t T(q - t s), and an equal-weight
// stretch f..l of a line costs two loads per pixel, D(l) - D(f - s), whatever its
// length: the line sum slides along its own direction. Exact, since the tile holds
// whole numbers (M * 255 <= 510; sums stay below 2^24).
//
// Table (int32, built by gpu/pencil/cuda.py from reference.line_kernels / 255):
//   [0..8]  first run of each direction (run_start[8] = number of runs)
//   [9]     number of weights      [10] bit d set: direction d runs along y
//   [11..19] first prefix term of each direction (term_start[8] = number of terms)
//   runs, 3 ints each: (dy << 16 | dx & 0xffff) of the first tap, length, first weight
//   terms, 3 ints each: packed offsets a and b, weight index: w * (D[a] - D[b])
//   then the float32 weights.
#ifndef LINE_COLS
#define LINE_COLS 3
#endif
#ifndef LINE_ROWS
#define LINE_ROWS 8
#endif
#ifndef LINE_WARPS
#define LINE_WARPS 8
#endif
#define LINE_TILE_W (32 * LINE_COLS)
#define LINE_TILE_H (LINE_WARPS * LINE_ROWS)
#define TABLE_HEADER 20

struct LineShared {
    int* run_offset;   // offset of the run's first tap in the source, in elements
    int* run_length;
    int* run_weight;   // index of the run's first weight
    int* term_a;       // prefix terms: offsets of D[a] and D[b], weight index
    int* term_b;
    int* term_weight;
    float* weight;
};

// Stage the run table into shared memory, converting (dx, dy) to offsets for `pitch`.
__device__ __forceinline__ void stage_runs(const int* __restrict__ table, LineShared s, int pitch, int tid) {
    const int runs = table[8], weights = table[9], terms = table[TABLE_HEADER - 1];
    const int* run = table + TABLE_HEADER;
    const float* w = (const float*)(run + 3 * (runs + terms));
    for (int r = tid; r < runs; r += 32 * LINE_WARPS) {
        int packed = run[3 * r];
        int dx = (short)(packed & 0xffff), dy = packed >> 16;
        s.run_offset[r] = dy * pitch + dx;
        s.run_length[r] = run[3 * r + 1];
        s.run_weight[r] = run[3 * r + 2];
    }
    const int* term = run + 3 * runs;
    for (int r = tid; r < terms; r += 32 * LINE_WARPS) {
        int a = term[3 * r], b = term[3 * r + 1];
        s.term_a[r] = (a >> 16) * pitch + (short)(a & 0xffff);
        s.term_b[r] = (b >> 16) * pitch + (short)(b & 0xffff);
        s.term_weight[r] = term[3 * r + 2];
    }
    if (s.weight != w)   // tiled: the weights go to shared memory too
        for (int i = tid; i < weights; i += 32 * LINE_WARPS) s.weight[i] = w[i];
}

// In place over the tile (tile_pitch x tile_rows): prefix sums along step (sx, sy) of
// every line of that step, or (inverse) back from prefix sums to values. One thread walks
// one line, four cells at a time (loads first, so they are in flight together); lines
// start on the tile's first row or on its first (sx > 0) / last (sx < 0) column.
#define SCAN_BATCH 4
__device__ void prefix_scan(float* tile, int tile_pitch, int tile_rows, int sx, int sy, bool inverse, int tid) {
    const int from_rows = sx != 0 ? tile_rows : 0;             // lines starting on a side column
    const int from_top = sy != 0 ? tile_pitch - (sx != 0) : 0;  // lines starting on the top row (the corner once)
    const int step = sy * tile_pitch + sx;
    for (int line = tid; line < from_rows + from_top; line += 32 * LINE_WARPS) {
        int x, y;
        if (line < from_rows) { x = sx > 0 ? 0 : tile_pitch - 1; y = line; }
        else { y = 0; x = line - from_rows + (sx > 0); }
        int n = sx > 0 ? tile_pitch - x : sx < 0 ? x + 1 : tile_rows;   // cells on the line
        if (sy) n = min(n, tile_rows - y);
        float* cell = tile + y * tile_pitch + x;
        float carried = 0.0f;
        for (int t = 0; t < n; t += SCAN_BATCH, cell += SCAN_BATCH * step) {
            float value[SCAN_BATCH];
#pragma unroll
            for (int u = 0; u < SCAN_BATCH; ++u) value[u] = t + u < n ? cell[u * step] : 0.0f;
#pragma unroll
            for (int u = 0; u < SCAN_BATCH; ++u) {
                if (t + u < n) cell[u * step] = inverse ? value[u] - carried : value[u] + carried;
                carried = inverse ? value[u] : value[u] + carried;
            }
        }
    }
}

// A source value: pass 1 reads M; pass 2 untiled reads the packed plane (M with the
// label in its 3 low mantissa bits) and keeps only the pixels labelled `dir` (C_dir of
// stage 5). (Tiled, pass 2 decodes while staging the tile and reads like pass 1.)
template <int PASS>
__device__ __forceinline__ float source(const float* src, int index, int dir) {
    if (PASS == 1) return src[index];
    u32 bits = __float_as_uint(src[index]);
    return (bits & 7u) == (u32)dir ? __uint_as_float(bits & ~7u) : 0.0f;
}

// acc[i][j] += sum over the runs of direction `dir` of w * src(pixel (i, j) + tap).
// `base` indexes the thread's top-left pixel in src (row stride `pitch`).
template <int PASS>
__device__ __forceinline__ void accumulate_direction(const float* src, int pitch, int base, int dir, bool along_y,
                                                     int first_run, int last_run, LineShared s,
                                                     float (&acc)[LINE_ROWS][LINE_COLS]) {
    for (int r = first_run; r < last_run; ++r) {
        const int start = base + s.run_offset[r], n = s.run_length[r];
        const float* w = s.weight + s.run_weight[r];
        // The window is a ring of registers: slot k holds the source column (or row) whose
        // index is k modulo its size, so advancing one tap loads one value per row (or
        // column) and moves none; the tap loop is unrolled by the ring size so that every
        // slot index is a compile-time constant.
        if (!along_y) {   // per row, a ring of LINE_COLS columns sliding right
            float win[LINE_ROWS][LINE_COLS];
#pragma unroll
            for (int i = 0; i < LINE_ROWS; ++i)
#pragma unroll
                for (int j = 0; j < LINE_COLS - 1; ++j) win[i][j] = source<PASS>(src, start + i * pitch + j, dir);
            for (int t = 0; t < n; t += LINE_COLS) {
#pragma unroll
                for (int u = 0; u < LINE_COLS; ++u) {
                    if (t + u >= n) break;
                    const float wt = w[t + u];
#pragma unroll
                    for (int i = 0; i < LINE_ROWS; ++i) {
                        win[i][(u + LINE_COLS - 1) % LINE_COLS] = source<PASS>(src, start + i * pitch + t + u + LINE_COLS - 1, dir);
#pragma unroll
                        for (int j = 0; j < LINE_COLS; ++j) acc[i][j] = fmaf(wt, win[i][(u + j) % LINE_COLS], acc[i][j]);
                    }
                }
            }
        } else {          // per column, a ring of LINE_ROWS rows sliding down
            float win[LINE_COLS][LINE_ROWS];
#pragma unroll
            for (int j = 0; j < LINE_COLS; ++j)
#pragma unroll
                for (int i = 0; i < LINE_ROWS - 1; ++i) win[j][i] = source<PASS>(src, start + i * pitch + j, dir);
            for (int t = 0; t < n; t += LINE_ROWS) {
#pragma unroll
                for (int u = 0; u < LINE_ROWS; ++u) {
                    if (t + u >= n) break;
                    const float wt = w[t + u];
#pragma unroll
                    for (int j = 0; j < LINE_COLS; ++j) {
                        win[j][(u + LINE_ROWS - 1) % LINE_ROWS] = source<PASS>(src, start + (t + u + LINE_ROWS - 1) * pitch + j, dir);
#pragma unroll
                        for (int i = 0; i < LINE_ROWS; ++i) acc[i][j] = fmaf(wt, win[j][(u + i) % LINE_ROWS], acc[i][j]);
                    }
                }
            }
        }
    }
}

// acc[i][j] += sum over the prefix terms [first, last) of w * (D[a] - D[b]).
__device__ __forceinline__ void accumulate_terms(const float* tile, int pitch, int base, int first, int last, LineShared s,
                                                 float (&acc)[LINE_ROWS][LINE_COLS]) {
    for (int r = first; r < last; ++r) {
        const int a = base + s.term_a[r], b = base + s.term_b[r];
        const float w = s.weight[s.term_weight[r]];
#pragma unroll
        for (int i = 0; i < LINE_ROWS; ++i)
#pragma unroll
            for (int j = 0; j < LINE_COLS; ++j) acc[i][j] = fmaf(w, tile[a + i * pitch + j] - tile[b + i * pitch + j], acc[i][j]);
    }
}

// Pass 1 (PASS == 1, stages 3-4): the 8 responses L_i * M and their argmax. Reads the
// padded M plane; writes `label` (H, W) and the packed plane (padded, M with the label
// in the low 3 bits, for pass 2; its border must be zero).
// Pass 2 (PASS == 2, stage 5): S' = sum_i L'_i * C_i, from the packed plane; writes
// `strokes` (H, W) and folds min/max of S' (>= 0, so ordered as uint bits) into extrema.
// TILED: the block's source tile (+ halo) is first copied to shared memory; otherwise
// the taps read the padded plane in global memory (for halos too large for a tile).
template <int PASS, bool TILED>
__device__ void line_pass(const float* __restrict__ src, int pitch, int halo, int height, int width,
                          const int* __restrict__ table, u8* __restrict__ label, float* __restrict__ packed,
                          float* __restrict__ strokes, u32* __restrict__ extrema, float label_factor) {
    extern __shared__ float shared[];
    const int tile_pitch = LINE_TILE_W + 2 * halo, tile_rows = LINE_TILE_H + 2 * halo;
    const int runs = table[8], terms = table[TABLE_HEADER - 1];
    float* tile = shared;
    LineShared s;
    s.run_offset = (int*)(TILED ? tile + tile_pitch * tile_rows : shared);
    s.run_length = s.run_offset + runs;
    s.run_weight = s.run_length + runs;
    s.term_a = s.run_weight + runs;
    s.term_b = s.term_a + terms;
    s.term_weight = s.term_b + terms;
    // Tiled, the weights sit in shared memory after the runs; otherwise they are read from
    // the table (a table that large with the tile would not fit in shared memory).
    s.weight = TILED ? (float*)(s.term_weight + terms) : (float*)(table + TABLE_HEADER + 3 * (runs + terms));
    __shared__ int run_start[9], term_start[9];

    const int tid = threadIdx.y * 32 + threadIdx.x;
    const int bx = blockIdx.x * LINE_TILE_W, by = blockIdx.y * LINE_TILE_H;   // image coords
    const int src_pitch = TILED ? tile_pitch : pitch;
    stage_runs(table, s, src_pitch, tid);
    if (tid < 9) { run_start[tid] = table[tid]; term_start[tid] = table[11 + tid]; }
    __syncthreads();

    // Copy the block's source tile (+ halo) to shared memory: pass 1 once, M; pass 2 once
    // per direction, C_dir (M where the label is dir, else 0), so the tap loop reads plain
    // floats. Returns whether any value is non-zero (uniform across the block).
    auto stage_tile = [&](int dir) -> bool {
        bool any = false;
        for (int ty = threadIdx.y; ty < tile_rows; ty += LINE_WARPS) {
            const float* row = src + (long long)(by + ty) * pitch + bx;
            for (int tx = threadIdx.x; tx < tile_pitch; tx += 32) {
                float v = row[tx];
                if (PASS == 2) {
                    const u32 bits = __float_as_uint(v);
                    v = (bits & 7u) == (u32)dir ? __uint_as_float(bits & ~7u) : 0.0f;
                }
                any |= v != 0.0f;
                tile[ty * tile_pitch + tx] = v;
            }
        }
        return __syncthreads_or(any);
    };
    if (TILED && PASS == 1) stage_tile(0);
    const float* from = TILED ? tile : src;
    const int x = bx + threadIdx.x * LINE_COLS, y = by + threadIdx.y * LINE_ROWS;   // thread's top-left
    const int base = TILED ? (threadIdx.y * LINE_ROWS + halo) * tile_pitch + threadIdx.x * LINE_COLS + halo
                           : (y + halo) * pitch + x + halo;
    const int along_y_bits = table[10];

    float acc[LINE_ROWS][LINE_COLS];
    float best[LINE_ROWS][LINE_COLS];
    int best_dir[LINE_ROWS][LINE_COLS];
#pragma unroll
    for (int i = 0; i < LINE_ROWS; ++i)
#pragma unroll
        for (int j = 0; j < LINE_COLS; ++j) { acc[i][j] = 0.0f; best[i][j] = 0.0f; best_dir[i][j] = 0; }

    for (int dir = 0; dir < 8; ++dir) {
        const bool along_y = (along_y_bits >> dir) & 1;
        // Only the tiled table has prefix terms; such a direction has no runs.
        const bool prefix = TILED && term_start[dir + 1] > term_start[dir];
        const int sx = dir == 0 || dir == 2 ? 1 : dir == 6 ? -1 : 0, sy = dir == 0 ? 0 : 1;
        if (TILED && PASS == 2) {
            __syncthreads();                   // everyone is done with the previous direction's tile
            if (!stage_tile(dir)) continue;    // no stroke of this direction near this tile
        }
        if (prefix) {
            if (PASS == 1) __syncthreads();    // everyone is done reading the plain tile
            prefix_scan(tile, tile_pitch, tile_rows, sx, sy, false, tid);
            __syncthreads();
            accumulate_terms(tile, tile_pitch, base, term_start[dir], term_start[dir + 1], s, acc);
            if (PASS == 1) {   // the next directions read the plain tile again (walking the lines
                               // back is cheaper than copying the tile again from L2)
                __syncthreads();
                prefix_scan(tile, tile_pitch, tile_rows, sx, sy, true, tid);
                __syncthreads();
            }
        } else if (TILED && PASS == 2) {
            accumulate_direction<1>(from, src_pitch, base, dir, along_y, run_start[dir], run_start[dir + 1], s, acc);
        } else {
            accumulate_direction<PASS>(from, src_pitch, base, dir, along_y, run_start[dir], run_start[dir + 1], s, acc);
        }
        if (PASS == 1) {   // argmax, ties (within LABEL_MARGIN) to the lowest direction, as reference.classify
#pragma unroll
            for (int i = 0; i < LINE_ROWS; ++i)
#pragma unroll
                for (int j = 0; j < LINE_COLS; ++j) {
                    if (dir == 0 || acc[i][j] > best[i][j] * label_factor) { best[i][j] = acc[i][j]; best_dir[i][j] = dir; }
                    acc[i][j] = 0.0f;
                }
        }
    }

    float low = __int_as_float(0x7f800000), high = 0.0f;
#pragma unroll
    for (int i = 0; i < LINE_ROWS; ++i)
#pragma unroll
        for (int j = 0; j < LINE_COLS; ++j) {
            const int xi = x + j, yi = y + i;
            if (xi >= width || yi >= height) continue;
            const long long p = (long long)yi * width + xi;
            if (PASS == 1) {
                if (label) label[p] = (u8)best_dir[i][j];
                const long long q = (long long)(yi + halo) * pitch + xi + halo;
                packed[q] = __uint_as_float((__float_as_uint(src[q]) & ~7u) | (u32)best_dir[i][j]);
            } else {
                strokes[p] = acc[i][j];
                low = fminf(low, acc[i][j]);
                high = fmaxf(high, acc[i][j]);
            }
        }
    if (PASS == 2) {
        for (int offset = 16; offset > 0; offset >>= 1) {
            low = fminf(low, __shfl_xor_sync(0xffffffffu, low, offset));
            high = fmaxf(high, __shfl_xor_sync(0xffffffffu, high, offset));
        }
        if (threadIdx.x == 0) {
            atomicMin(&extrema[0], __float_as_uint(low));
            atomicMax(&extrema[1], __float_as_uint(high));
        }
    }
}

#define LINE_KERNEL(name, PASS, TILED)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * LINE_WARPS)                                       \
    name(const float* __restrict__ src, int pitch, int halo, int height, int width,                     \
         const int* __restrict__ table, u8* __restrict__ label, float* __restrict__ packed,             \
         float* __restrict__ strokes, u32* __restrict__ extrema, float label_factor) {                  \
        line_pass<PASS, TILED>(src, pitch, halo, height, width, table, label, packed, strokes, extrema, label_factor); \
    }
LINE_KERNEL(line_label_tiled, 1, true)
LINE_KERNEL(line_label_global, 1, false)
LINE_KERNEL(line_strokes_tiled, 2, true)
LINE_KERNEL(line_strokes_global, 2, false)

// ------------------------------------------------------------- stages 7-8: tone map --
// An inclusive prefix sum (Hillis-Steele) of a shared 256-entry array, in place: thread v
// of a block of 256 ends with the sum of entries 0..v at v. Every thread must call it.
__device__ void inclusive_scan_256(unsigned long long* values, int v) {
    for (int step = 1; step < 256; step <<= 1) {
        const unsigned long long add = v >= step ? values[v - step] : 0ull;
        __syncthreads();
        values[v] += add;
        __syncthreads();
    }
}

// Histogram specification: lut[v] = number of target CDF entries below the source CDF
// at v (minus 1e-12), i.e. numpy's searchsorted(target, source - 1e-12, 'left'). The
// same float64 operations as the reference: bit-exact. One block of 256 threads.
extern "C" __global__ void matching_lut(const u32* __restrict__ hist, const double* __restrict__ target_cdf,
                                        u8* __restrict__ lut) {
    __shared__ unsigned long long cumulative[256];
    __shared__ double target[256];
    const int v = threadIdx.x;
    cumulative[v] = hist[v];
    target[v] = target_cdf[v];
    __syncthreads();
    inclusive_scan_256(cumulative, v);
    const double source = (double)cumulative[v] / (double)cumulative[255] - 1e-12;
    int below = 0;
    for (int j = 0; j < 256; ++j) below += target[j] < source;
    lut[v] = (u8)min(below, 255);
}

// Stage 7 for tone="auto" (reference.fit_tone): the photo's values are counted brightened,
// value v at brighten[v] (reference.auto_brightening); the CDF F of those is compared with each candidate layer set
// (layers: n_sets x 3 x 256 CDFs, gram: n_sets x 3 x 3, both from the reference's tables),
// and the weights on the simplex minimising sum_v (F(v) - sum_i w_i G_i(v))^2 are found by
// solving every support's KKT system; a preset then moves `share` of the weight onto layer
// `toward` (0 for auto). Writes the chosen mixture's CDF to target_cdf and
// (set index, w0, w1, w2) to fit. One block of 256 threads; float64 throughout.
#define FIT_MAX_SETS 64
__device__ bool solve_small(double a[4][5], int n) {  // Gaussian elimination, partial pivoting
    for (int c = 0; c < n; ++c) {
        int pivot = c;
        for (int r = c + 1; r < n; ++r)
            if (fabs(a[r][c]) > fabs(a[pivot][c])) pivot = r;
        if (a[pivot][c] == 0.0) return false;
        for (int k = 0; k <= n; ++k) {
            const double t = a[c][k];
            a[c][k] = a[pivot][k];
            a[pivot][k] = t;
        }
        for (int r = c + 1; r < n; ++r) {
            const double f = a[r][c] / a[c][c];
            for (int k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
        }
    }
    for (int r = n - 1; r >= 0; --r) {
        double v = a[r][n];
        for (int k = r + 1; k < n; ++k) v -= a[r][k] * a[k][n];
        a[r][n] = v / a[r][r];
    }
    return true;
}

extern "C" __global__ void fit_tone(const u32* __restrict__ hist, const int* __restrict__ brighten,
                                    const double* __restrict__ layers,
                                    const double* __restrict__ gram, int n_sets, int toward, double share,
                                    double* __restrict__ target_cdf, double* __restrict__ fit) {
    __shared__ unsigned long long counts[256];
    __shared__ double source[256];
    __shared__ double rhs[FIT_MAX_SETS * 3];
    __shared__ double chosen[4];
    const int v = threadIdx.x;
    counts[v] = 0ull;
    __syncthreads();
    atomicAdd(&counts[brighten[v]], (unsigned long long)hist[v]);
    __syncthreads();
    inclusive_scan_256(counts, v);
    source[v] = (double)counts[v] / (double)counts[255];
    __syncthreads();
    for (int t = v; t < 3 * n_sets; t += blockDim.x) {  // rhs[set][i] = sum_v G_i(v) F(v)
        const double* g = layers + (long long)t * 256;
        double sum = 0.0;
        for (int k = 0; k < 256; ++k) sum += g[k] * source[k];
        rhs[t] = sum;
    }
    __syncthreads();
    if (v == 0) {
        const int supports[7] = {1, 2, 4, 3, 5, 6, 7};  // bit masks, as reference.TONE_SUPPORTS
        double best_cost = 1.0e300, best[3] = {1.0, 0.0, 0.0};  // NVRTC has no INFINITY; costs are O(256)
        int best_set = 0;
        for (int set = 0; set < n_sets; ++set) {
            const double* g = gram + set * 9;
            const double* r = rhs + set * 3;
            for (int s = 0; s < 7; ++s) {
                int index[3], k = 0;
                for (int i = 0; i < 3; ++i)
                    if (supports[s] >> i & 1) index[k++] = i;
                double a[4][5] = {};
                for (int i = 0; i < k; ++i) {
                    for (int j = 0; j < k; ++j) a[i][j] = g[index[i] * 3 + index[j]];
                    a[i][k] = 1.0;
                    a[k][i] = 1.0;
                    a[i][k + 1] = r[index[i]];
                }
                a[k][k + 1] = 1.0;
                if (!solve_small(a, k + 1)) continue;
                double w[3] = {0.0, 0.0, 0.0};
                bool feasible = true;
                for (int i = 0; i < k; ++i) {
                    feasible = feasible && a[i][k + 1] >= 0.0;
                    w[index[i]] = a[i][k + 1];
                }
                if (!feasible) continue;
                double cost = 0.0;
                for (int i = 0; i < 3; ++i) {
                    double gw = 0.0;
                    for (int j = 0; j < 3; ++j) gw += g[i * 3 + j] * w[j];
                    cost += w[i] * gw;
                }
                cost -= 2.0 * (r[0] * w[0] + r[1] * w[1] + r[2] * w[2]);
                if (cost < best_cost) {
                    best_cost = cost;
                    best_set = set;
                    for (int i = 0; i < 3; ++i) best[i] = w[i];
                }
            }
        }
        chosen[0] = best_set;
        // a preset's move of `share` of the weight onto layer `toward` (reference.fit_tone)
        for (int i = 0; i < 3; ++i) chosen[i + 1] = (1.0 - share) * best[i] + (i == toward ? share : 0.0);
        for (int i = 0; i < 4; ++i) fit[i] = chosen[i];
    }
    __syncthreads();
    const double* g = layers + (long long)chosen[0] * 3 * 256;
    target_cdf[v] = chosen[1] * g[v] + chosen[2] * g[256 + v] + chosen[3] * g[512 + v];
}

// Stage 8, vertical half of the k x k box sums (edges replicated) of the luma, exact in
// integers: colsum[y][x] = sum_{i<k} luma[clamp(y - k/2 + i)][x]. One thread per column
// run of TONE_RUN rows, sliding.
#define TONE_RUN 32
extern "C" __global__ void tone_columns(const u8* __restrict__ luma, int height, int width, int k, int* __restrict__ colsum) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y0 = blockIdx.y * TONE_RUN;
    if (x >= width) return;
    const int before = k / 2;
    int sum = 0;
    for (int i = 0; i < k; ++i) sum += luma[(long long)min(max(y0 - before + i, 0), height - 1) * width + x];
    const int y1 = min(y0 + TONE_RUN, height);
    for (int y = y0; y < y1; ++y) {
        colsum[(long long)y * width + x] = sum;
        const int leaving = min(max(y - before, 0), height - 1), entering = min(max(y - before + k, 0), height - 1);
        sum += (int)luma[(long long)entering * width + x] - (int)luma[(long long)leaving * width + x];
    }
}

// Stage 8, horizontal half (reference.tone_map): the local mean m = (sum of k colsums) / k^2
// in double, the LUT read there linearly, J = ((lut[i] + f (lut[i+1] - lut[i])) / 255) **
// gamma with i = min(floor(m), 254), f = m - i; float32 (H, W). With log_tone != nullptr
// (texture "lu") also writes ln max(J, 1/255).
#define TONE_ROW_BLOCK 256
extern "C" __global__ void tone_rows(const int* __restrict__ colsum, const u8* __restrict__ lut, int height, int width,
                                     int k, float gamma, float* __restrict__ tone, float* __restrict__ log_tone) {
    extern __shared__ int row[];   // TONE_ROW_BLOCK + k - 1 colsums
    __shared__ int table[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = lut[i];
    const int y = blockIdx.y, x0 = blockIdx.x * TONE_ROW_BLOCK, before = k / 2;
    const int* src = colsum + (long long)y * width;
    for (int i = threadIdx.x; i < TONE_ROW_BLOCK + k - 1; i += blockDim.x)
        row[i] = src[min(max(x0 - before + i, 0), width - 1)];
    __syncthreads();
    const int x = x0 + threadIdx.x;
    if (x >= width) return;
    long long sum = 0;
    for (int i = 0; i < k; ++i) sum += row[threadIdx.x + i];
    const double mean = (double)sum / ((double)k * (double)k);
    const int at = min((int)mean, 254);
    const double fraction = mean - (double)at, low = (double)table[at], high = (double)table[at + 1];
    float j = (float)(__dadd_rn(low, __dmul_rn(fraction, high - low)) / 255.0);
    if (gamma != 1.0f) j = powf(j, gamma);
    tone[(long long)y * width + x] = j;
    if (log_tone) log_tone[(long long)y * width + x] = logf(fmaxf(j, 1.0f / 255.0f));
}

// ------------------------------------------------- stage 9 (lu): conjugate gradient --
// Minimises ||beta ln H - ln J||^2 + lambda ||grad beta||^2 matrix-free, as
// reference.solve_beta_lu: A = diag(ln^2 H) + lambda (graph Laplacian, free borders),
// Jacobi preconditioner P = 1 / diag(A), stored once by cg_start (`jacobi`), from ln H (the
// tile, or with hatching="follow" a plane). The iterations read diag(A) back as 1 / P, never
// ln H, so a turned texture's plane costs them nothing. A d is never stored: whoever needs it
// recomputes it from d's 5-point stencil. Blocks of 32 x 8 px stride down the image (a grid of a few
// blocks per multiprocessor, so few partial sums). Two launches per iteration; each ends
// in a grid-wide sum:
// blocks write partial sums (float64), and the last block to finish adds them up in a
// fixed order and takes the scalar step, so results are deterministic.
// scalars (float64, CG_*); every kernel returns at once when DONE is set, so the host
// may queue iterations past convergence.
// ------------------------------------ hatching="follow": the texture turned per pixel --
// reference.structure_tensor: the products of the central differences of luma / 255
// (edges replicated), Jxx, Jxy, Jyy, averaged over a k x k box (edges replicated) by
// sliding sums in float64 (as OpenCV's boxFilter): rows here (3 planes of row sums, one
// thread per run of BOX_RUN pixels of a row), columns in hatch_texture.
#define BOX_RUN 32
struct Products { float xx, xy, yy; };
// unit[v] = v / 255 in float, as numpy's float32 division (a table: 8 divisions a pixel otherwise)
__device__ __forceinline__ Products products(const float* unit, const u8* __restrict__ luma, int height, int width,
                                             int y, int x) {
    const long long p = (long long)y * width + x;
    const float left = unit[luma[p - (x > 0)]], right = unit[luma[p + (x + 1 < width)]];
    const float up = unit[luma[p - (y > 0 ? width : 0)]], down = unit[luma[p + (y + 1 < height ? width : 0)]];
    const float gx = __fmul_rn(__fsub_rn(right, left), 0.5f), gy = __fmul_rn(__fsub_rn(down, up), 0.5f);
    return {__fmul_rn(gx, gx), __fmul_rn(gx, gy), __fmul_rn(gy, gy)};
}
extern "C" __global__ void structure_rows(const u8* __restrict__ luma, int height, int width, int k, float* __restrict__ rows) {
    __shared__ float unit[256];
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < 256; i += blockDim.x * blockDim.y) unit[i] = __fdiv_rn((float)i, 255.0f);
    __syncthreads();
    const int y = blockIdx.y * blockDim.y + threadIdx.y, x0 = (blockIdx.x * blockDim.x + threadIdx.x) * BOX_RUN;
    if (y >= height || x0 >= width) return;
    const long long plane = (long long)height * width, row = (long long)y * width;
    const int half = k / 2;
    double xx = 0.0, xy = 0.0, yy = 0.0;
    for (int i = -half; i <= half; ++i) {
        const Products q = products(unit, luma, height, width, y, min(max(x0 + i, 0), width - 1));
        xx += q.xx;
        xy += q.xy;
        yy += q.yy;
    }
    const int end = min(x0 + BOX_RUN, width);
    for (int x = x0; x < end; ++x) {
        rows[row + x] = (float)xx;
        rows[plane + row + x] = (float)xy;
        rows[2 * plane + row + x] = (float)yy;
        const Products in = products(unit, luma, height, width, y, min(x + half + 1, width - 1));
        const Products out = products(unit, luma, height, width, y, max(x - half, 0));
        xx += (double)in.xx - out.xx;
        xy += (double)in.xy - out.xy;
        yy += (double)in.yy - out.yy;
    }
}

// One bilinear sample of the tile at (u, v) in [0, side], edges wrapped, as OpenCV's remap
// (INTER_LINEAR, float image and maps) of OpenCV 5 in reference.sample_tile, which
// interpolates the float coordinates exactly (OpenCV 4 rounded them to 1/32 px).
__device__ __forceinline__ float remap_sample(const float* __restrict__ tile, int side, float u, float v) {
    const float fu = floorf(u), fv = floorf(v);
    const float ax = u - fu, ay = v - fv;
    const int x0 = (int)fu & (side - 1), y0 = (int)fv & (side - 1);
    const int x1 = (x0 + 1) & (side - 1), y1 = (y0 + 1) & (side - 1);
    const float top = tile[y0 * side + x0] + (tile[y0 * side + x1] - tile[y0 * side + x0]) * ax;
    const float bottom = tile[y1 * side + x0] + (tile[y1 * side + x1] - tile[y1 * side + x0]) * ax;
    return top + (bottom - top) * ay;
}

// reference.hatch_turn and oriented_texture: the column half of the box mean (rows from
// structure_rows, k x k, scaled by 1 / k^2), the turn of the hatching at each pixel, and
// the tile turned by the two nearest of HATCH_TURNS turns (cosines/sines), blended: H into
// `texture` and ln H into `log_h`, each when not null. One thread per run of HATCH_RUN rows of a
// column: shorter runs than the row sums', for enough threads to hide the per-pixel math.
#define HATCH_TURNS 8
#define HATCH_RUN 8
__device__ __forceinline__ float hatch_at(float jxx, float jxy, float jyy, int x, int y, const float* __restrict__ tile,
                                          int side, const float* __restrict__ cosines, const float* __restrict__ sines,
                                          float bias_share, float bias_floor, float own, float bias_x, float bias_y,
                                          float inverse_scale, float tile_mean, float h_min, float h_max) {
    const float dx = __fsub_rn(jyy, jxx), dy = __fmul_rn(-2.0f, jxy);
    const float isotropic = __fsub_rn(__fadd_rn(jxx, jyy), __fsqrt_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy))));
    const float bias = __fadd_rn(__fmul_rn(bias_share, isotropic), bias_floor);
    const float ux = __fadd_rn(dx, __fmul_rn(bias, bias_x));
    const float uy = __fadd_rn(dy, __fmul_rn(bias, bias_y));
    float turn = __fmul_rn(__fsub_rn(__fmul_rn(0.5f, atan2f(uy, ux)), own), (float)(HATCH_TURNS / 3.14159265358979323846));
    if (turn < 0.0f) turn = __fadd_rn(turn, (float)HATCH_TURNS);
    const float low = floorf(turn), fraction = __fsub_rn(turn, low);
    const int k0 = (int)low % HATCH_TURNS, k1 = (k0 + 1) % HATCH_TURNS;  // turn may round up to HATCH_TURNS
    const float fx = __fmul_rn((float)x, inverse_scale), fy = __fmul_rn((float)y, inverse_scale);
    const float s = (float)side, inv_side = 1.0f / (float)side;
    float sample[2];
    const int ks[2] = {k0, k1};
    for (int i = 0; i < 2; ++i) {
        const float c = cosines[ks[i]], sn = sines[ks[i]];
        float u = __fadd_rn(__fmul_rn(fx, c), __fmul_rn(fy, sn));
        float v = __fsub_rn(__fmul_rn(fy, c), __fmul_rn(fx, sn));
        // wrapped into the tile in float, as reference.sample_tile (1 / side is exact: a power of two)
        u = __fsub_rn(u, __fmul_rn(floorf(__fmul_rn(u, inv_side)), s));
        v = __fsub_rn(v, __fmul_rn(floorf(__fmul_rn(v, inv_side)), s));
        sample[i] = remap_sample(tile, side, u, v);
    }
    // reference.blend_hatchings: the variance-preserving mix of the two hatchings
    const float rest = __fsub_rn(1.0f, fraction);
    const float mixed = __fadd_rn(__fmul_rn(__fsub_rn(sample[0], tile_mean), rest), __fmul_rn(__fsub_rn(sample[1], tile_mean), fraction));
    const float spread = __fsqrt_rn(__fadd_rn(__fmul_rn(rest, rest), __fmul_rn(fraction, fraction)));
    return fminf(fmaxf(__fadd_rn(__fdiv_rn(mixed, spread), tile_mean), h_min), h_max);
}

extern "C" __global__ void hatch_texture(const float* __restrict__ rows, int height, int width, int k,
                                         const float* __restrict__ tile, int side, const float* __restrict__ cosines,
                                         const float* __restrict__ sines, float bias_share, float bias_floor, float own,
                                         float bias_x, float bias_y, float inverse_scale, float tile_mean, float h_min,
                                         float h_max, float* __restrict__ texture, float* __restrict__ log_h) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y0 = (blockIdx.y * blockDim.y + threadIdx.y) * HATCH_RUN;
    if (x >= width || y0 >= height) return;
    const long long plane = (long long)height * width;
    const int half = k / 2;
    const double scale = 1.0 / ((double)k * k);
    double xx = 0.0, xy = 0.0, yy = 0.0;
    for (int i = -half; i <= half; ++i) {
        const long long q = (long long)min(max(y0 + i, 0), height - 1) * width + x;
        xx += rows[q];
        xy += rows[plane + q];
        yy += rows[2 * plane + q];
    }
    const int end = min(y0 + HATCH_RUN, height);
    for (int y = y0; y < end; ++y) {
        const long long p = (long long)y * width + x;
        const float h = hatch_at((float)(xx * scale), (float)(xy * scale), (float)(yy * scale), x, y, tile, side, cosines,
                                 sines, bias_share, bias_floor, own, bias_x, bias_y, inverse_scale, tile_mean, h_min, h_max);
        if (texture) texture[p] = h;  // "fast" reads H
        if (log_h) log_h[p] = logf(h);  // "lu" reads ln H alone
        const long long in = (long long)min(y + half + 1, height - 1) * width + x, out = (long long)max(y - half, 0) * width + x;
        xx += (double)rows[in] - rows[out];
        xy += (double)rows[plane + in] - rows[plane + out];
        yy += (double)rows[2 * plane + in] - rows[2 * plane + out];
    }
}

#define CG_RR0 0
#define CG_THRESHOLD 1
#define CG_RZ 2
#define CG_ALPHA 3
#define CG_GAMMA 4
#define CG_DONE 5
#define CG_ITERATIONS 6
#define CG_TOLERANCE 7
#define CG_MAX_ITERATIONS 8
#define CG_BX 32
#define CG_BY 8
#define CG_THREADS (CG_BX * CG_BY)

struct Texture {
    const float* log_h;   // ln H: the tile (size, size), or with size 0 a plane over the image (height, width)
    int size;
    int width;
};
// The tile side is a power of two (gpu/pencil/cuda.py checks), so wrapping is a mask.
// A plane (hatching="follow": the texture turned at each pixel) is read as it is.
__device__ __forceinline__ int texture_index(int size, int width, int y, int x) {
    return size ? (y & (size - 1)) * size + (x & (size - 1)) : y * width + x;
}
__device__ __forceinline__ float log_texture(Texture t, int y, int x) { return t.log_h[texture_index(t.size, t.width, y, x)]; }

__device__ __forceinline__ int degree(int y, int x, int height, int width) {
    return (x > 0) + (x + 1 < width) + (y > 0) + (y + 1 < height);
}

__device__ __forceinline__ float preconditioner(float lh, int deg, float lambda) { return 1.0f / (lh * lh + lambda * (float)deg); }

// (A v)(y, x) for a plane v: diag(A) v - lambda (sum of the in-image neighbours), with
// diag(A) = ln^2 H + lambda deg = 1 / jacobi: so the iterations never read ln H.
__device__ __forceinline__ float apply_a(const float* v, long long p, int y, int x, int height, int width, float jacobi, float lambda) {
    const float here = v[p];
    float neighbours = 0.0f;
    if (x > 0) neighbours += v[p - 1];
    if (x + 1 < width) neighbours += v[p + 1];
    if (y > 0) neighbours += v[p - width];
    if (y + 1 < height) neighbours += v[p + width];
    return here / jacobi - lambda * neighbours;
}

// Sum up to 3 doubles over the block, in a fixed order; the result is valid in thread 0.
__device__ void block_sum3(double (&v)[3], int count) {
    __shared__ double warp_sums[3][CG_THREADS / 32];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int k = 0; k < count; ++k) {
        for (int offset = 16; offset > 0; offset >>= 1) v[k] += __shfl_down_sync(0xffffffffu, v[k], offset);
        if (lane == 0) warp_sums[k][warp] = v[k];
    }
    __syncthreads();
    if (tid == 0)
        for (int k = 0; k < count; ++k) {
            v[k] = 0.0;
            for (int w = 0; w < CG_THREADS / 32; ++w) v[k] += warp_sums[k][w];
        }
    __syncthreads();
}

// Writes this block's sums to partials[k * blocks + block]; returns true in every thread
// of the last block to finish, whose `total` then holds the grid-wide sums.
__device__ bool grid_sum3(double (&v)[3], int count, double* partials, unsigned int* arrivals, double (&total)[3]) {
    __shared__ bool last;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int blocks = gridDim.x * gridDim.y, block = blockIdx.y * gridDim.x + blockIdx.x;
    block_sum3(v, count);
    if (tid == 0) {
        for (int k = 0; k < count; ++k) partials[k * blocks + block] = v[k];
        __threadfence();
        last = atomicAdd(arrivals, 1u) == (unsigned int)blocks - 1;
    }
    __syncthreads();
    if (!last) return false;
    double s[3] = {0.0, 0.0, 0.0};
    for (int k = 0; k < count; ++k) {
        double lanes[4] = {0.0, 0.0, 0.0, 0.0};   // independent loads in flight
        int i = tid;
        for (; i + 3 * CG_THREADS < blocks; i += 4 * CG_THREADS)
            for (int u = 0; u < 4; ++u) lanes[u] += __ldcg(&partials[k * blocks + i + u * CG_THREADS]);
        for (; i < blocks; i += CG_THREADS) lanes[0] += __ldcg(&partials[k * blocks + i]);
        s[k] = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    }
    block_sum3(s, count);
    if (tid == 0) {
        for (int k = 0; k < count; ++k) total[k] = s[k];
        *arrivals = 0u;   // ready for the next launch
    }
    return true;
}

// beta0 = ln J / ln H (the per-pixel solution), r0 = b - A beta0 with b = ln H ln J.
// Then: threshold = (tolerance |b|)^2, rz = r0 . P r0; DONE when |r0|^2 <= threshold.
extern "C" __global__ void __launch_bounds__(CG_THREADS)
cg_start(const float* __restrict__ log_tone, const float* __restrict__ log_h, int tex_size, int height, int width, float lambda,
         float* __restrict__ beta, float* __restrict__ residual, float* __restrict__ jacobi, double* __restrict__ partials,
         unsigned int* arrivals, double* __restrict__ scalars) {
    const Texture tex{log_h, tex_size, width};
    double v[3] = {0.0, 0.0, 0.0};
    const int x = blockIdx.x * CG_BX + threadIdx.x;
    for (int y = blockIdx.y * CG_BY + threadIdx.y; x < width && y < height; y += gridDim.y * CG_BY) {
        const long long p = (long long)y * width + x;
        const float lh = log_texture(tex, y, x), lj = log_tone[p];
        const float b0 = lj / lh;
        float neighbours = 0.0f;
        if (x > 0) neighbours += log_tone[p - 1] / log_texture(tex, y, x - 1);
        if (x + 1 < width) neighbours += log_tone[p + 1] / log_texture(tex, y, x + 1);
        if (y > 0) neighbours += log_tone[p - width] / log_texture(tex, y - 1, x);
        if (y + 1 < height) neighbours += log_tone[p + width] / log_texture(tex, y + 1, x);
        const int deg = degree(y, x, height, width);
        const float b = lh * lj;
        const float r = b - (lh * lh * b0 + lambda * ((float)deg * b0 - neighbours));
        const float pre = preconditioner(lh, deg, lambda);
        beta[p] = b0;
        residual[p] = r;
        jacobi[p] = pre;
        v[0] += (double)b * b;
        v[1] += (double)r * r;
        v[2] += (double)r * r * pre;
    }
    double total[3];
    if (grid_sum3(v, 3, partials, arrivals, total) && threadIdx.x == 0 && threadIdx.y == 0) {
        const double tolerance = scalars[CG_TOLERANCE];
        const double threshold = tolerance * tolerance * total[0];
        scalars[CG_THRESHOLD] = threshold;
        scalars[CG_RR0] = total[1];
        scalars[CG_RZ] = total[2];
        scalars[CG_ITERATIONS] = 0.0;
        scalars[CG_DONE] = total[1] <= threshold ? 1.0 : 0.0;
    }
}

// d = P r + gamma d_previous (just P r on the first iteration); then alpha = rz / d.A d,
// DONE when d.A d <= 0. A d is computed here for the dot product, not stored: d is
// recomputed at the 4 neighbours from r and d_previous.
extern "C" __global__ void __launch_bounds__(CG_THREADS)
cg_direction(const float* __restrict__ residual, const float* __restrict__ previous, const float* __restrict__ jacobi,
             int height, int width, float lambda, double* __restrict__ scalars,
             float* __restrict__ direction, double* __restrict__ partials, unsigned int* arrivals) {
    if (scalars[CG_DONE] != 0.0) return;
    const bool first = scalars[CG_ITERATIONS] == 0.0;
    const float gamma = (float)scalars[CG_GAMMA];
    double v[3] = {0.0, 0.0, 0.0};
    const int x = blockIdx.x * CG_BX + threadIdx.x;
    for (int y = blockIdx.y * CG_BY + threadIdx.y; x < width && y < height; y += gridDim.y * CG_BY) {
        const long long p = (long long)y * width + x;
        auto d_at = [&](long long q) {
            const float z = residual[q] * jacobi[q];
            return first ? z : z + gamma * previous[q];
        };
        const float d = d_at(p);
        float neighbours = 0.0f;
        if (x > 0) neighbours += d_at(p - 1);
        if (x + 1 < width) neighbours += d_at(p + 1);
        if (y > 0) neighbours += d_at(p - width);
        if (y + 1 < height) neighbours += d_at(p + width);
        const float q = d / jacobi[p] - lambda * neighbours;  // (A d)(y, x), as apply_a
        direction[p] = d;
        v[0] += (double)d * q;
    }
    double total[3];
    if (grid_sum3(v, 1, partials, arrivals, total) && threadIdx.x == 0 && threadIdx.y == 0) {
        if (total[0] <= 0.0) scalars[CG_DONE] = 1.0;
        else scalars[CG_ALPHA] = scalars[CG_RZ] / total[0];
    }
}

// beta += alpha d, r -= alpha A d; then iterations += 1, DONE when |r|^2 <= threshold
// or at max_iterations, else gamma = rz_new / rz.
extern "C" __global__ void __launch_bounds__(CG_THREADS)
cg_update(const float* __restrict__ direction, const float* __restrict__ jacobi, int height, int width, float lambda, double* __restrict__ scalars, float* __restrict__ beta, float* __restrict__ residual,
          double* __restrict__ partials, unsigned int* arrivals) {
    if (scalars[CG_DONE] != 0.0) return;
    const float alpha = (float)scalars[CG_ALPHA];
    double v[3] = {0.0, 0.0, 0.0};
    const int x = blockIdx.x * CG_BX + threadIdx.x;
    for (int y = blockIdx.y * CG_BY + threadIdx.y; x < width && y < height; y += gridDim.y * CG_BY) {
        const long long p = (long long)y * width + x;
        const float pre = jacobi[p];
        beta[p] += alpha * direction[p];
        const float r = residual[p] - alpha * apply_a(direction, p, y, x, height, width, pre, lambda);
        residual[p] = r;
        const double rr = (double)r * r;
        v[0] += rr;
        v[1] += rr * pre;
    }
    double total[3];
    if (grid_sum3(v, 2, partials, arrivals, total) && threadIdx.x == 0 && threadIdx.y == 0) {
        const double iterations = scalars[CG_ITERATIONS] + 1.0;
        scalars[CG_ITERATIONS] = iterations;
        if (total[0] <= scalars[CG_THRESHOLD] || iterations >= scalars[CG_MAX_ITERATIONS]) {
            scalars[CG_DONE] = 1.0;
        } else {
            scalars[CG_GAMMA] = total[1] / scalars[CG_RZ];
            scalars[CG_RZ] = total[1];
        }
    }
}

// ------------------------------------- stage 5b-c: the strokes, deepened, and their means --
// reference.deepened_strokes: S_t = S ** (1 + deepening (1 - J)), S the normalised strokes
// (1 - (S' - low) / range) ** exponent. reference.stroke_darkness_means: D1 and D2, the
// k x k box means (edges replicated) of d = 1 - S_t and of d^2, by sliding sums in float64
// (as OpenCV's boxFilter): rows here (one thread per run of 32 pixels of a row, both sums
// into rows[0] and rows[1]), columns in stroke_columns (one thread per run of 8 rows of a
// column, blockIdx.z the plane).
// One powf: s ** (exponent (1 + deepening (1 - J))), where the reference raises S = s ** exponent
// to 1 + deepening (1 - J) (the same to float rounding).
__device__ __forceinline__ float deepened_stroke(float raw, float low, float range, float exponent, float tone,
                                                 float deepening) {
    const float s = 1.0f - (raw - low) / range;
    return powf(s, __fmul_rn(exponent, __fadd_rn(1.0f, __fmul_rn(deepening, __fsub_rn(1.0f, tone)))));
}
struct Darkness { double d, d2; };
__device__ __forceinline__ Darkness darkness_at(const float* row, const float* tone_row, int x, float low, float range,
                                                float exponent, float deepening) {
    const float d = 1.0f - deepened_stroke(row[x], low, range, exponent, tone_row[x], deepening);
    return {(double)d, (double)__fmul_rn(d, d)};
}
extern "C" __global__ void stroke_rows(const float* __restrict__ strokes, const u32* __restrict__ extrema, float floor_range,
                                       float exponent, const float* __restrict__ tone, float deepening, int height, int width,
                                       int k, float* __restrict__ rows) {
    const int y = blockIdx.y * blockDim.y + threadIdx.y, x0 = (blockIdx.x * blockDim.x + threadIdx.x) * 32;
    if (y >= height || x0 >= width) return;
    const float low = __uint_as_float(extrema[0]), range = fmaxf(__uint_as_float(extrema[1]) - low, floor_range);
    const float* row = strokes + (long long)y * width;
    const float* tone_row = tone + (long long)y * width;
    const long long plane = (long long)height * width;
    const int half = k / 2;
    double sum = 0.0, sum2 = 0.0;
    for (int i = -half; i <= half; ++i) {
        const Darkness v = darkness_at(row, tone_row, min(max(x0 + i, 0), width - 1), low, range, exponent, deepening);
        sum += v.d;
        sum2 += v.d2;
    }
    const int end = min(x0 + 32, width);
    for (int x = x0; x < end; ++x) {
        rows[(long long)y * width + x] = (float)sum;
        rows[plane + (long long)y * width + x] = (float)sum2;
        const Darkness in = darkness_at(row, tone_row, min(x + half + 1, width - 1), low, range, exponent, deepening);
        const Darkness out = darkness_at(row, tone_row, max(x - half, 0), low, range, exponent, deepening);
        sum += in.d - out.d;
        sum2 += in.d2 - out.d2;
    }
}
extern "C" __global__ void stroke_columns(const float* __restrict__ rows, int height, int width, int k, float* __restrict__ mean) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y0 = (blockIdx.y * blockDim.y + threadIdx.y) * 8;
    if (x >= width || y0 >= height) return;
    const long long plane = (long long)blockIdx.z * height * width;
    rows += plane;
    mean += plane;
    const int half = k / 2;
    const double scale = 1.0 / ((double)k * k);
    double sum = 0.0;
    for (int i = -half; i <= half; ++i) sum += rows[(long long)min(max(y0 + i, 0), height - 1) * width + x];
    const int end = min(y0 + 8, height);
    for (int y = y0; y < end; ++y) {
        mean[(long long)y * width + x] = (float)(sum * scale);
        sum += (double)rows[(long long)min(y + half + 1, height - 1) * width + x] - rows[(long long)max(y - half, 0) * width + x];
    }
}

// ------------------------------------------------------ stage 9: the cross-hatching --
// reference.crossed_log_texture: out = ln H + c(J) ln H_turned, c = clamp((start - J) /
// (start - full), 0, 1); ln H the tile (size > 0, wrapped) or a plane (size 0, hatching
// "follow"; out may be that plane), ln H_turned the turned tile (turned_size, wrapped).
extern "C" __global__ void cross_hatch(const float* log_h, int size, const float* __restrict__ log_turned, int turned_size,
                                       const float* __restrict__ tone, float start, float full, int height, int width,
                                       float* out) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    const long long p = (long long)y * width + x;
    const float c = fminf(fmaxf(__fdiv_rn(__fsub_rn(start, tone[p]), __fsub_rn(start, full)), 0.0f), 1.0f);
    const float turned = log_turned[texture_index(turned_size, width, y, x)];
    out[p] = __fadd_rn(log_h[texture_index(size, width, y, x)], __fmul_rn(c, turned));
}

// ------------------------------------------------------- stages 9-10 fused: merge --
// S_t as stroke_rows; the balance (reference.balance): with B = gamma (1 - J + budget), r = D2 / D1 (in
// [1e-6, 0.999]), p = 1 + ln min(B / D1, 1) / ln r in [1, thinning_max], E = D1 r^(p - 1),
// k = min(1, B / E): S_b = 1 - k (1 - S_t)^p, J_b = J / max(1 - k E, J); T_b = exp(beta ln H_x
// ln J_b / ln J) (lu, beta != nullptr; J clamped into [1/255, 254/255], J_b from 1/255) or
// exp((1 - J_b) ln H_x) (fast), ln H_x the cross-hatched plane; R = S_b T_b as uint8. channels_out 1: R. channels_out 3: R
// replaces Y of the photo's YCrCb (image has `channels_in` 3) or is repeated (a gray photo).
extern "C" __global__ void merge(const float* __restrict__ strokes, const u32* __restrict__ extrema, float floor_range,
                                 float exponent, float gamma, float deepening, float budget, float thinning_max,
                                 const float* __restrict__ means,
                                 const float* __restrict__ tone, const float* __restrict__ beta,
                                 const float* __restrict__ log_h, int height, int width,
                                 const u8* __restrict__ image, int channels_in, int channels_out, u8* __restrict__ out) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    const long long p = (long long)y * width + x;
    const float low = __uint_as_float(extrema[0]), high = __uint_as_float(extrema[1]);
    const float j = tone[p];
    const float stroke = deepened_stroke(strokes[p], low, fmaxf(high - low, floor_range), exponent, j, deepening);
    const float allowed = __fmul_rn(gamma, __fadd_rn(__fsub_rn(1.0f, j), budget));
    const float first = fmaxf(means[p], 1e-6f);
    const float ratio = fminf(fmaxf(means[(long long)height * width + p] / first, 1e-6f), 0.999f);
    const float excess = fminf(fmaxf(allowed / first, 1e-6f), 1.0f);
    const float power = fminf(fmaxf(1.0f + logf(excess) / logf(ratio), 1.0f), thinning_max);
    const float expected = first * powf(ratio, power - 1.0f);
    const float share = fminf(1.0f, allowed / expected);
    const float s = 1.0f - share * powf(1.0f - stroke, power);
    const float jb = j / fmaxf(1.0f - share * expected, j);
    float t;
    if (beta) {
        const float gain = logf(fmaxf(jb, 1.0f / 255.0f)) / logf(fminf(fmaxf(j, 1.0f / 255.0f), 254.0f / 255.0f));
        t = expf(beta[p] * gain * log_h[p]);
    } else {
        t = expf(__fmul_rn(1.0f - jb, log_h[p]));
    }
    const float v = s * t;
    const int drawn = (int)fminf(fmaxf(v * 255.0f + 0.5f, 0.0f), 255.0f);
    if (channels_out == 1) { out[p] = (u8)drawn; return; }
    if (channels_in == 1) { out[3 * p] = out[3 * p + 1] = out[3 * p + 2] = (u8)drawn; return; }
    const int r = image[3 * p], g = image[3 * p + 1], b = image[3 * p + 2];
    const int luma = luma_of(r, g, b);
    const int cr = clamp_u8(descale((r - luma) * 11682 + (128 << YCC_SHIFT))) - 128;
    const int cb = clamp_u8(descale((b - luma) * 9241 + (128 << YCC_SHIFT))) - 128;
    out[3 * p] = (u8)clamp_u8(drawn + descale(cr * 22987));
    out[3 * p + 1] = (u8)clamp_u8(drawn + descale(cb * -5636 + cr * -11698));
    out[3 * p + 2] = (u8)clamp_u8(drawn + descale(cb * 29049));
}
