// Golub-Reinsch SVD of Lahabar & Narayanan (2009) on the GPU: the kernels that cuBLAS does
// not provide. gpu/svd/reference.py is the definition; gpu/svd/cuda.py drives these kernels.
//
// Matrices are column-major (Fortran order) with a leading dimension `ld`, as cuBLAS wants
// them; vectors are contiguous. Every kernel is a template over the element type T
// (float, double) with one extern "C" wrapper per type at the end of the file.

template <typename T> struct Pair;
template <> struct Pair<float> { typedef float2 type; };
template <> struct Pair<double> { typedef double2 type; };

__device__ __forceinline__ float copysign_t(float a, float b) { return copysignf(a, b); }
__device__ __forceinline__ double copysign_t(double a, double b) { return copysign(a, b); }
__device__ __forceinline__ float hypot_t(float a, float b) { return hypotf(a, b); }
__device__ __forceinline__ double hypot_t(double a, double b) { return hypot(a, b); }
__device__ __forceinline__ float sqrt_t(float a) { return sqrtf(a); }
__device__ __forceinline__ double sqrt_t(double a) { return sqrt(a); }

template <typename T> struct Limits;
template <> struct Limits<float> {
    static __device__ __forceinline__ float eps() { return 1.1920928955078125e-07f; }    // numpy finfo(float32).eps
    static __device__ __forceinline__ float tiny() { return 1.1754943508222875e-38f; }   // smallest normal
    static __device__ __forceinline__ float huge() { return 3.4028234663852886e+38f; }
};
template <> struct Limits<double> {
    static __device__ __forceinline__ double eps() { return 2.220446049250313e-16; }
    static __device__ __forceinline__ double tiny() { return 2.2250738585072014e-308; }
    static __device__ __forceinline__ double huge() { return 1.7976931348623157e+308; }
};

// ------------------------------------------------------------- block reductions --
// blockDim.x is a multiple of 32, at most 1024; `scratch` holds 32 values.

template <typename T> __device__ T block_max(T v, T* scratch) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? scratch[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T> __device__ T block_sum(T v, T* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (blockDim.x >> 5) ? scratch[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ------------------------------------------------------------------ reflectors --
// reference.householder for x (len,), one block: v (len,) with v[0] = 1 and
// (I - tau v v^T) x = beta e_1; tau and beta stored at tau_out[0], beta_out[0].
// The norm is scaled by max |x_i| so that squaring cannot overflow.
template <typename T>
__device__ void householder(const T* __restrict__ x, int len, T* __restrict__ v, T* tau_out, T* beta_out) {
    __shared__ T scratch[32];
    T biggest = 0;
    for (int i = 1 + threadIdx.x; i < len; i += blockDim.x) biggest = max(biggest, abs(x[i]));
    biggest = block_max(biggest, scratch);
    T sum = 0;
    if (biggest > 0)
        for (int i = 1 + threadIdx.x; i < len; i += blockDim.x) {
            const T y = x[i] / biggest;
            sum += y * y;
        }
    sum = block_sum(sum, scratch);
    const T alpha = x[0];
    const T rest = biggest * sqrt_t(sum);
    if (rest == 0) {
        for (int i = threadIdx.x; i < len; i += blockDim.x) v[i] = i == 0 ? T(1) : T(0);
        if (threadIdx.x == 0) {
            *tau_out = 0;
            *beta_out = alpha;
        }
        return;
    }
    const T beta = -copysign_t(hypot_t(alpha, rest), alpha);
    const T denominator = alpha - beta;
    for (int i = threadIdx.x; i < len; i += blockDim.x) v[i] = i == 0 ? T(1) : x[i] / denominator;
    if (threadIdx.x == 0) {
        *tau_out = (beta - alpha) / beta;
        *beta_out = beta;
    }
}

// A sum, a maximum over the whole warp: every lane gets it.
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// True in every thread of the one block of the grid that arrives last, once each block
// has called it after writing its part (the others' writes are then visible to it through
// L2). `active` blocks call it; *arrivals is 0 before the launch and again after.
__device__ bool last_block_to_arrive(unsigned* arrivals, unsigned active) {
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        is_last = atomicAdd(arrivals, 1u) == active - 1;
        if (is_last) *arrivals = 0;
    }
    __syncthreads();
    return is_last != 0;
}

// ------------------------------------------------- reflectors from the blocks' parts --
// left_step and right_step make a reflector of x (len,) as `householder` does, but without
// a pass over x in one block: each block summarises the 32 entries of x it made, and the
// step's last block combines the summaries. For block b, over its entries x_j:
//   scale[b] = max |x_j| and ssq[b] = sum (x_j / scale[b])^2 over j >= 1 (x_0 = alpha is
//              not in the norm; the scaling is LAPACK nrm2's: no square overflows),
//   dots[b * width + k] = sum_j Y[j, k] x_j over all its j,
// from which the last block gets Y^T v for the next step: with v_0 = 1 and v_j = x_j /
// (alpha - beta), (Y^T v)_k = (sum_b dots[b, k] - beta Y[0, k]) / (alpha - beta).
template <typename T> struct ReflectorParts {
    T* scale;  // (blocks,)
    T* ssq;    // (blocks,)
    T* dots;   // (blocks, width), row-major
};

// One block's summary of the entries x_j, j = first + lane (xs: shared, 32 values, 0 past
// len), of x against Y[j, k] = y[j + k ld], k < width. The block's threads all call it.
template <typename T>
__device__ void summarise_part(const T* xs, int first, int len, const T* __restrict__ y, long long ld, int width,
                               ReflectorParts<T> parts) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int j = first + lane;
    const T x = j < len ? xs[lane] : T(0);
    if (warp == 0) {
        const T in_norm = j >= 1 ? x : T(0);
        const T biggest = warp_max(abs(in_norm));
        const T scaled = biggest > 0 ? in_norm / biggest : T(0);
        const T ssq = warp_sum(scaled * scaled);
        if (lane == 0) {
            parts.scale[blockIdx.x] = biggest;
            parts.ssq[blockIdx.x] = ssq;
        }
    }
    for (int k = warp; k < width; k += warps) {
        const T dot = warp_sum(j < len ? y[j + k * ld] * x : T(0));
        if (lane == 0) parts.dots[(long long)blockIdx.x * width + k] = dot;
    }
}

// The last block of a step: the reflector of x (len,) from `count` blocks' parts, as
// `householder` would make it (v into v_out with v[0] = 1, tau, beta), and out[k] =
// (Y^T v)_k for k < width (width <= blockDim.x), Y[0, k] = y_first[k ld]. Reads what the
// other blocks wrote through L2.
template <typename T>
__device__ void reflector_from_parts(const T* x, int len, ReflectorParts<T> parts, int count, const T* y_first, long long ld,
                                     int width, T* v, T* tau_out, T* beta_out, T* __restrict__ out) {
    __shared__ T scratch[32];
    __shared__ T sums[1024];  // dots summed by group of parts: (groups, width)
    T biggest = 0;
    for (int b = threadIdx.x; b < count; b += blockDim.x) biggest = max(biggest, __ldcg(parts.scale + b));
    biggest = block_max(biggest, scratch);
    T ssq = 0;
    if (biggest > 0)
        for (int b = threadIdx.x; b < count; b += blockDim.x) {
            const T scale = __ldcg(parts.scale + b);
            if (scale > 0) {
                const T ratio = scale / biggest;
                ssq += ratio * ratio * __ldcg(parts.ssq + b);
            }
        }
    ssq = block_sum(ssq, scratch);
    const int groups = blockDim.x / width, k = threadIdx.x % width, group = threadIdx.x / width;
    if (group < groups) {
        T dot = 0;
        for (int b = group; b < count; b += groups) dot += __ldcg(parts.dots + (long long)b * width + k);
        sums[group * width + k] = dot;
    }
    __syncthreads();
    const T alpha = __ldcg(x);
    const T rest = biggest * sqrt_t(ssq);
    const T beta = rest == 0 ? alpha : -copysign_t(hypot_t(alpha, rest), alpha);
    const T denominator = alpha - beta;
    for (int kk = threadIdx.x; kk < width; kk += blockDim.x) {
        const T first = __ldcg(y_first + kk * ld);
        if (rest == 0) {
            out[kk] = first;  // v = e_0
        } else {
            T total = 0;
            for (int g = 0; g < groups; ++g) total += sums[g * width + kk];
            out[kk] = (total - beta * first) / denominator;
        }
    }
    __syncthreads();  // Y's first row holds v[0]'s place (v is Y's next column): read it before v is written
    for (int j = threadIdx.x; j < len; j += blockDim.x) v[j] = j == 0 ? T(1) : rest == 0 ? T(0) : __ldcg(x + j) / denominator;
    if (threadIdx.x == 0) {
        *tau_out = rest == 0 ? T(0) : (beta - alpha) / beta;
        *beta_out = beta;
    }
}

// ---------------------------------------------------------- bidiagonalization --
// reference.bidiagonalize, one panel of nb columns at a time. A panel's launches are the
// same for every panel (gpu/svd/cuda.py captures them once in a CUDA graph and replays
// it): the panel's first column p is read from the device (*panel_start), the kernel
// for column i of the panel works on c = p + i, and blocks past the shrinking trailing
// matrix return at once. Per column two launches:
//   left_step   y = A[c:, c+1:]^T u (a warp per column), z and the updated row c, then in
//               the last block the row's reflector v and s = [Z V][c+1:, :]^T v
//   right_step  y = A[c+1:, c+1:] v (a block per 32 rows), w, then column c+1 brought up
//               to date on each block's rows, and in the last block its reflector u and
//               t = [U W][c+1:, :]^T u (not after the panel's last column: the rank-2L
//               update comes first; first_column makes a panel's first).
// UW = [U | W] (m, 2 nb) and ZV = [Z | V] (n, 2 nb) are the panel's reflectors and
// updates, zero where not made yet; A itself is updated once a panel, by GEMM.
struct Panel {
    int m, n, nb;            // the matrix and the panel width (the last panel may be narrower)
    int lda, ldu, ldz;       // leading dimensions of A, UW, ZV
    const int* panel_start;  // the panel's first column p
};

// The panel's first column c = p (one block): the GEMM has brought it up to date and the
// panel's [U W] is still zero, so its reflector u (into UW[c:, 0], tau_left[c], d[c]) and
// t = [U W][c:, :]^T u = (u . u, 0, ..., 0) (2 nb,) for left_step.
template <typename T>
__device__ void first_column(T* __restrict__ a, T* __restrict__ uw, Panel panel, T* __restrict__ tau_left, T* __restrict__ d,
                             T* __restrict__ t) {
    __shared__ T scratch[32];
    const int c = *panel.panel_start, width = 2 * panel.nb, len = panel.m - c;
    if (c >= panel.n) return;
    T* u = uw + c;
    householder(a + c + (long long)c * panel.lda, len, u, tau_left + c, d + c);
    __syncthreads();
    T dot = 0;
    for (int r = threadIdx.x; r < len; r += blockDim.x) dot += u[r] * u[r];
    dot = block_sum(dot, scratch);
    for (int k = threadIdx.x; k < width; k += blockDim.x) t[k] = k == 0 ? dot : T(0);
}

// Column c = p + i's left step (c < n - 1). Warp j of the grid takes column col = c + 1 + j
// of the trailing matrix (j < count = n - c - 1; blockDim.x = 1024, 32 columns a block):
//   y_j   = A[c:, col] . u                                    (u = UW[c:, i])
//   z_j   = tau_left[c] (y_j - ZV[col, :] . t)                -> ZV[col, i]
//   row_j = A[c, col] - ZV[col, :] . UW[c, :]                 (with the new z_j at i) -> row
// then each block's part of the row (Y = ZV[c+1:, :]), and the last block the row's
// reflector v (into ZV[c+1:, nb + i], tau_right[c], e[c]) and s = [Z V][c+1:, :]^T v.
template <typename T>
__device__ void left_step(const T* __restrict__ a, const T* __restrict__ uw, T* __restrict__ zv, Panel panel, int i,
                          const T* __restrict__ tau_left, const T* __restrict__ t, T* __restrict__ row, T* __restrict__ tau_right,
                          T* __restrict__ e, T* __restrict__ s, ReflectorParts<T> parts, unsigned* arrivals) {
    extern __shared__ unsigned char shared_bytes[];
    __shared__ T row_part[32];
    const int c = *panel.panel_start + i, width = 2 * panel.nb, count = panel.n - c - 1;
    if (i >= panel.nb || count <= 0) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned active = (count + 31) / 32;
    if (blockIdx.x >= active) return;
    T* t_s = reinterpret_cast<T*>(shared_bytes);
    T* uw_c = t_s + width;
    for (int k = threadIdx.x; k < width; k += blockDim.x) {
        t_s[k] = t[k];
        uw_c[k] = uw[c + (long long)k * panel.ldu];
    }
    __syncthreads();
    const int j = blockIdx.x * 32 + warp;
    T row_j = 0;
    if (j < count) {
        const int col = c + 1 + j;
        const T* column = a + c + (long long)col * panel.lda;
        const T* u = uw + c + (long long)i * panel.ldu;
        T y = 0;
#pragma unroll 4
        for (int r = lane; r < panel.m - c; r += 32) y += column[r] * u[r];
        y = warp_sum(y);
        T dot = 0;
        for (int k = lane; k < width; k += 32) dot += zv[col + (long long)k * panel.ldz] * t_s[k];
        const T z = tau_left[c] * (y - warp_sum(dot));
        T correction = 0;
        for (int k = lane; k < width; k += 32) correction += (k == i ? z : zv[col + (long long)k * panel.ldz]) * uw_c[k];
        row_j = column[0] - warp_sum(correction);
        if (lane == 0) {
            zv[col + (long long)i * panel.ldz] = z;
            row[j] = row_j;
        }
    }
    if (lane == 0) row_part[warp] = row_j;
    __syncthreads();
    summarise_part(row_part, blockIdx.x * 32, count, zv + c + 1, panel.ldz, width, parts);
    if (!last_block_to_arrive(arrivals, active)) return;
    reflector_from_parts(row, count, parts, active, zv + c + 1, panel.ldz, width, zv + (c + 1) + (long long)(panel.nb + i) * panel.ldz,
                         tau_right + c, e + c, s);
}

// Column c = p + i's right step (c < n - 1). Block b takes the 32 rows row = c + 1 + 32 b +
// lane, its warps splitting the columns of the trailing matrix:
//   y_r = A[row, c+1:] . v                                    (v = ZV[c+1:, nb + i])
//   w_r = tau_right[c] (y_r - UW[row, :] . s)                 -> UW[row, nb + i]
// and, unless c is the panel's last column, A[row, c+1] -= UW[row, :] . ZV[c+1, :] (with
// the new w_r), each block's part of that column (Y = UW[c+1:, :]), and the last block its
// reflector u (into UW[c+1:, i+1], tau_left[c+1], d[c+1]) and t = [U W][c+1:, :]^T u.
template <typename T>
__device__ void right_step(T* __restrict__ a, T* __restrict__ uw, const T* __restrict__ zv, Panel panel, int i,
                           const T* __restrict__ tau_right, const T* __restrict__ s, T* __restrict__ tau_left, T* __restrict__ d,
                           T* __restrict__ t, ReflectorParts<T> parts, unsigned* arrivals) {
    extern __shared__ unsigned char shared_bytes[];
    __shared__ T column_part[32];
    const int c = *panel.panel_start + i, width = 2 * panel.nb, rows = panel.m - c - 1, cols = panel.n - c - 1;
    if (i >= panel.nb || cols <= 0) return;
    const unsigned active = (rows + 31) / 32;
    if (blockIdx.x >= active) return;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    T* s_s = reinterpret_cast<T*>(shared_bytes);
    T* zv_next = s_s + width;                 // ZV[c+1, :]
    T* partial = zv_next + width;             // (warps, 32)
    for (int k = threadIdx.x; k < width; k += blockDim.x) {
        s_s[k] = s[k];
        zv_next[k] = zv[c + 1 + (long long)k * panel.ldz];
    }
    __syncthreads();
    const int r = blockIdx.x * 32 + lane, row = c + 1 + r;
    const bool inside = r < rows;
    const T* v = zv + (c + 1) + (long long)(panel.nb + i) * panel.ldz;
    T sum = 0;
    if (inside) {
        const T* a_row = a + row + (long long)(c + 1) * panel.lda;
#pragma unroll 4
        for (int j = warp; j < cols; j += warps) sum += a_row[(long long)j * panel.lda] * v[j];
        for (int k = warp; k < width; k += warps) sum -= uw[row + (long long)k * panel.ldu] * s_s[k];
    }
    partial[warp * 32 + lane] = sum;
    __syncthreads();
    if (warp == 0 && inside) {
        T total = 0;
        for (int w = 0; w < warps; ++w) total += partial[w * 32 + lane];
        uw[row + (long long)(panel.nb + i) * panel.ldu] = tau_right[c] * total;
    }
    if (i + 1 >= panel.nb) return;  // the panel's last column: the GEMM updates the next one
    __syncthreads();  // the new w_r is read below by other warps of the block
    T dot = 0;
    if (inside)
        for (int k = warp; k < width; k += warps) dot += uw[row + (long long)k * panel.ldu] * zv_next[k];
    partial[warp * 32 + lane] = dot;
    __syncthreads();
    if (warp == 0) {
        T updated = 0;
        if (inside) {
            T total = 0;
            for (int w = 0; w < warps; ++w) total += partial[w * 32 + lane];
            updated = a[row + (long long)(c + 1) * panel.lda] - total;
            a[row + (long long)(c + 1) * panel.lda] = updated;
        }
        column_part[lane] = updated;
    }
    __syncthreads();
    summarise_part(column_part, blockIdx.x * 32, rows, uw + c + 1, panel.ldu, width, parts);
    if (!last_block_to_arrive(arrivals, active)) return;
    reflector_from_parts(a + (c + 1) + (long long)(c + 1) * panel.lda, rows, parts, active, uw + c + 1, panel.ldu, width,
                         uw + (c + 1) + (long long)(i + 1) * panel.ldu, tau_left + c + 1, d + c + 1, t);
}

// The next panel: *panel_start += nb (the last node of a panel's graph).
__device__ void next_panel(int* panel_start, int nb) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *panel_start += nb;
}

// The T factor of compact WY (reference._wy_factor) for each panel, block p of the grid:
// gram (nb, nb) = Y^T Y of the panel, taus (nb,), out t (nb, nb) upper triangular with
// H_1 ... H_nb = I - Y T Y^T. All column-major, panels consecutive. Thread r owns row r:
// T[r, i] = -tau_i sum_{r <= k < i} T[r, k] G[k, i] depends on row r alone.
template <typename T>
__device__ void wy_factor(const T* __restrict__ gram, const T* __restrict__ taus, int nb, T* __restrict__ t) {
    const long long panel = blockIdx.x;
    gram += panel * nb * nb;
    taus += panel * nb;
    t += panel * nb * nb;
    for (int r = threadIdx.x; r < nb; r += blockDim.x) {
        for (int i = 0; i < nb; ++i) {
            T value = 0;
            if (i == r) {
                value = taus[i];
            } else if (i > r) {
                T dot = 0;
                for (int k = r; k < i; ++k) dot += t[r + (long long)k * nb] * gram[k + (long long)i * nb];
                value = -taus[i] * dot;
            }
            t[r + (long long)i * nb] = value;
        }
    }
}

// ------------------------------------------------------------ bidiagonal QR --
// reference.bidiagonal_svd, run by one warp: the scalar bulge chase is sequential. It is
// instantiated for double only, whatever the matrix's precision: the bidiagonal is 2n
// numbers, and a chase in float32 lost 6x (the NumPy reference) to 60x (this kernel) the
// accuracy that a float32 bidiagonalization allows, its rounding errors accumulating over
// ~n sweeps (graded 1500 x 1200 float32 matrix: 3.6e-7 of s_max allowed, 2.3e-6 and
// 2.4e-5 lost; cuSOLVER 4.7e-7). The
// rotations of each sweep are logged for gpu/svd/cuda.py to apply to U and V^T in
// batches. Resumable: the kernel stops when the log is full (status PAUSED) and the next
// launch carries on from `state`.

enum { STATE_HI, STATE_SWEEPS, STATE_OLD_LO, STATE_OLD_HI, STATE_FORWARD, STATE_STATUS, STATE_LOGGED, STATE_ROTATIONS,
       STATE_CHASED, STATE_TESTED, STATE_INTS };  // CHASED, TESTED: rotations and test steps, all launches
enum { STATUS_FRESH = 0, STATUS_PAUSED = 1, STATUS_DONE = 2, STATUS_NO_CONVERGENCE = 3 };
// A logged sweep: rotation t (0 <= t < count) acts on the pair (first + step t, first + step t + 1)
// of rows of V^T (and of U^T), as row_j <- c row_j + s row_{j+1}, row_{j+1} <- c row_{j+1} - s row_j,
// with (c, s) = rotations[offset + t]. step is +1 or -1.
struct Sweep { int first, count, step, offset; };

// The block lo..hi read top to bottom (forward) or as its reversed transpose: D(k), E(k)
// are d[lo + k], e[lo + k] or d[hi - k], e[hi - 1 - k].
template <typename T> struct Bidiagonal {
    T* d0;
    T* e0;
    int step;
    __device__ __forceinline__ Bidiagonal(T* d, T* e, int lo, int hi, bool forward)
        : d0(forward ? d + lo : d + hi), e0(forward ? e + lo : e + hi - 1), step(forward ? 1 : -1) {}
    __device__ __forceinline__ T& D(int k) const { return d0[k * step]; }
    __device__ __forceinline__ T& E(int k) const { return e0[k * step]; }
};

// 1 / sqrt(x) and 1 / x to about an ulp, without the IEEE-exact library sequences
// (--prec-sqrt, --prec-div): the chase is a chain of dependent operations, and its
// latency is the SVD's. The hardware approximation plus one Newton step; callers keep
// x normal. Rotations with c^2 + s^2 = 1 to an ulp or two keep U and V orthonormal to
// LAPACK's test threshold (tests/gpu/svd/test_cuda.py).
__device__ __forceinline__ float rsqrt_t(float x) {
    const float y = rsqrtf(x);
    return y * fmaf(-0.5f * x * y, y, 1.5f);
}
__device__ __forceinline__ double rsqrt_t(double x) {
    const double y = rsqrt(x);
    return y * fma(-0.5 * x * y, y, 1.5);
}
__device__ __forceinline__ float reciprocal_t(float x) {
    float y;
#if defined(__CUDA_ARCH__)
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
#else
    y = 1.0f / x;  // the CPU emulator (tests/gpu/emulator/emu.h)
#endif
    return y * fmaf(-x, y, 2.0f);
}
__device__ __forceinline__ double reciprocal_t(double x) {
    const double y = double(reciprocal_t(float(x)));
    const double once = y * fma(-x, y, 2.0);
    return once * fma(-x, once, 2.0);
}

// mu / (mu + e) for the convergence tests, the reciprocal's shortcut where it is safe
template <typename T> __device__ __forceinline__ T ratio_t(T mu, T sum) {
    return (sum >= T(1e-30) && sum <= T(1e30)) ? mu * reciprocal_t(sum) : mu / sum;
}

template <typename T> struct Rotation { T c, s, r; };

// reference.givens where f or g is zero, or their squares would under- or overflow
// (returned by value: out-parameters would put the fast path's results in local memory)
template <typename T> __device__ __noinline__ Rotation<T> givens_careful(T f, T g) {
    if (g == 0) return Rotation<T>{T(1), T(0), f};
    if (f == 0) return Rotation<T>{T(0), T(1), g};
    const T r = hypot_t(f, g);
    return Rotation<T>{f / r, g / r, r};
}

// reference.givens: [c s; -s c] [f; g] = [r; 0], r >= 0 on the fast path (also where one
// of f, g is zero but not both: c or s is then +-1, still a rotation). No branch taken
// unless the squares leave the safe range. Exact: r, c and s from IEEE sqrt and division.
// Else from the hardware reciprocal square root plus a Newton step, faster, but its
// errors do not cancel over a chase: harmless for float32 matrices, not for float64 ones
// (BENCHMARKS.md, "Issue 21: accuracy and speed against cuSOLVER").
template <typename T, bool Exact> __device__ __forceinline__ void givens(T f, T g, T& c, T& s, T& r) {
    const T squares = f * f + g * g;
    if (__builtin_expect(squares >= T(1e-30) && squares <= T(1e30), 1)) {
        if constexpr (Exact) {
            r = sqrt_t(squares);
            c = f / r;
            s = g / r;
        } else {
            const T inverse = rsqrt_t(squares);
            c = f * inverse;
            s = g * inverse;
            r = squares * inverse;
        }
    } else {
        const Rotation<T> careful = givens_careful(f, g);
        c = careful.c; s = careful.s; r = careful.r;
    }
}

// reference.smallest_singular_value_2x2
template <typename T> __device__ T smallest_singular_value_2x2(T f, T g, T h) {
    const T fa = abs(f), ga = abs(g), ha = abs(h);
    const T lo = min(fa, ha), hi = max(fa, ha);
    if (lo == 0) return lo;
    const T plus = 1 + lo / hi, minus = (hi - lo) / hi;
    if (ga < hi) {
        const T ratio = (ga / hi) * (ga / hi);
        return lo * (2 / (sqrt_t(plus * plus + ratio) + sqrt_t(minus * minus + ratio)));
    }
    const T ratio = hi / ga;
    if (ratio == 0) return (lo * hi) / ga;
    return 2 * (lo * ratio / (sqrt_t(1 + (plus * ratio) * (plus * ratio)) + sqrt_t(1 + (minus * ratio) * (minus * ratio))));
}

// reference.svd_2x2 as rotations: left = [cl sl; -sl cl], right = [cr sr; -sr cr].
template <typename T> __device__ void svd_2x2(T f, T g, T h, T& cl, T& sl, T& cr, T& sr, T& s1, T& s2) {
    const T r = hypot_t(f + h, g);
    T c1 = 1, s1_ = 0;
    if (r != 0) { c1 = (f + h) / r; s1_ = g / r; }
    const T p = c1 * f, q = s1_ * f, t = s1_ * g + c1 * h;
    T c2 = 1, s2_ = 0, tangent = 0;
    if (q != 0) {
        const T zeta = (t - p) / (2 * q);
        tangent = isinf(zeta) ? T(0) : copysign_t(T(1), zeta) / (abs(zeta) + hypot_t(T(1), zeta));
        c2 = 1 / hypot_t(T(1), tangent);
        s2_ = tangent * c2;
    }
    cr = c2; sr = s2_;
    // left = [c1 s1; -s1 c1] @ right
    cl = c1 * c2 + s1_ * (-s2_);
    sl = c1 * s2_ + s1_ * c2;
    s1 = p - tangent * q;
    s2 = t + tangent * q;
}

// One implicit QR sweep on the block, top to bottom in its own reading (reference._sweep);
// rotation k of the sweep is logged through `log_rotation(k, cr, sr, cl, sl)`. The values
// carried from one step to the next stay in registers, and each step's loads are issued
// before its stores, so the chain of dependent arithmetic is all that sets the pace.
// `spare` is a writable slot outside d and e (for the e[-1] of step 0), and E(k_end) must
// be readable (its value is not used).
template <typename T, bool Exact, typename Log>
__device__ void sweep(const Bidiagonal<T>& b, int k_end, T shift, T* spare, Log log_rotation) {
    if (shift == 0) {
        T c = 1, old_c = 1, old_s = 0, s, r;
        T d_i = b.D(0), e_i = b.E(0);
        for (int i = 0; i < k_end; ++i) {
            const T d_next = b.D(i + 1);
            const T e_next = b.E(i + 1);
            givens<T, Exact>(d_i * c, e_i, c, s, r);
            *(i > 0 ? &b.E(i - 1) : spare) = old_s * r;
            T d_new;
            givens<T, Exact>(old_c * r, d_next * s, old_c, old_s, d_new);
            b.D(i) = d_new;
            log_rotation(i, c, s, old_c, old_s);
            d_i = d_next;
            e_i = e_next;
        }
        const T h = d_i * c;
        b.D(k_end) = h * old_c;
        b.E(k_end - 1) = h * old_s;
        return;
    }
    T d_i = b.D(0), e_i = b.E(0);
    T f = (abs(d_i) - shift) * (copysign_t(T(1), d_i) + shift / d_i);
    T g = e_i;
    for (int i = 0; i < k_end; ++i) {
        T d_next = b.D(i + 1);
        const T e_next = b.E(i + 1);
        T c, s, r;
        givens<T, Exact>(f, g, c, s, r);
        *(i > 0 ? &b.E(i - 1) : spare) = r;
        f = c * d_i + s * e_i;
        const T e_rotated = c * e_i - s * d_i;
        g = s * d_next;
        d_next = c * d_next;
        const T cr = c, sr = s;
        givens<T, Exact>(f, g, c, s, r);
        b.D(i) = r;
        f = c * e_rotated + s * d_next;
        d_i = c * d_next - s * e_rotated;  // d[i+1], the next step's d_i
        g = s * e_next;
        e_i = c * e_next;                    // e[i+1], the next step's e_i
        log_rotation(i, cr, sr, c, s);
    }
    b.D(k_end) = d_i;
    b.E(k_end - 1) = f;
}

constexpr unsigned FULL_WARP = 0xffffffffu;

// The smallest lo <= hi with |e[j]| > thresh for lo <= j < hi: the unreduced block that
// ends at hi. The warp tests 32 entries at a time.
template <typename T> __device__ int block_start(const T* e, int hi, T thresh, int lane) {
    for (int top = hi - 1;; top -= 32) {
        const int j = top - lane;
        const bool negligible = j < 0 || !(abs(e[j]) > thresh);
        const unsigned found = __ballot_sync(FULL_WARP, negligible);
        if (found) return top - (__ffs(found) - 1) + 1;
    }
}

// Demmel & Kahan's convergence test along the block (reference.bidiagonal_svd): with
// mu_0 = |D(0)|, mu_{k+1} = |D(k+1)| mu_k / (mu_k + |E(k)|), the first k with
// |E(k)| <= tol mu_k (returned; -1 if none) and smin = min mu_k. In x = 1/mu the
// recurrence is affine, x_{k+1} = (|E(k)| x_k + 1) / |D(k+1)|, so the warp takes 32 steps
// at once as a prefix scan of affine maps. Where a D is zero or x leaves the floating-point
// range, the exact sequential recurrence is used instead.
template <typename T> __device__ int first_negligible(const Bidiagonal<T>& b, int last, T tol, T& smin, int lane, long long& tested) {
    const T d0 = abs(b.D(0));
    bool sequential = !(d0 > 0 && d0 <= T(1e30));
    T carry = sequential ? T(0) : reciprocal_t(d0);  // x_0
    T largest = carry;
    for (int base = 0; !sequential && base <= last; base += 32) {
        const int k = base + lane;
        const bool valid = k <= last;
        const T e_k = valid ? abs(b.E(k)) : T(0);
        const T d_next = valid ? abs(b.D(k + 1)) : T(1);
        const bool fine = d_next >= T(1e-30) && d_next <= T(1e30);
        const T inverse = fine ? reciprocal_t(d_next) : T(0);
        T a = valid ? e_k * inverse : T(1), c = valid ? inverse : T(0);  // x -> a x + c
        for (int o = 1; o < 32; o <<= 1) {
            const T a_before = __shfl_up_sync(FULL_WARP, a, o), c_before = __shfl_up_sync(FULL_WARP, c, o);
            if (lane >= o) {
                c = fma(a, c_before, c);
                a = a * a_before;
            }
        }
        const T x_next = fma(a, carry, c);  // x_{k+1}
        T x_k = __shfl_up_sync(FULL_WARP, x_next, 1);
        if (lane == 0) x_k = carry;
        const bool bad = valid && (!fine || !(x_next <= T(1e30)) || !(x_k <= T(1e30)));
        if (__ballot_sync(FULL_WARP, bad)) {
            sequential = true;
            break;
        }
        const unsigned split = __ballot_sync(FULL_WARP, valid && e_k * x_k <= tol);
        if (split) {
            tested += __ffs(split);
            return base + __ffs(split) - 1;
        }
        tested += min(32, last + 1 - base);
        largest = max(largest, warp_max(valid ? x_next : T(0)));
        carry = __shfl_sync(FULL_WARP, x_next, 31);
    }
    if (!sequential) {
        smin = reciprocal_t(largest);
        return -1;
    }
    T mu = abs(b.D(0));
    smin = mu;
    for (int k = 0; k <= last; ++k) {
        ++tested;
        if (abs(b.E(k)) <= tol * mu) return k;
        mu = abs(b.D(k + 1)) * (mu / (mu + abs(b.E(k))));
        smin = min(smin, mu);
    }
    return -1;
}

// Multishift: P sweeps in flight at once, sweep q on lane q lagging sweep q-1 by three
// steps (by then q-1 has left the entries q reads), each with its own shift: the P
// singular values of the block's trailing P x P bidiagonal. Each sweep is exactly the
// sequential shifted sweep on what the sweep before left, so the arithmetic is that of P
// consecutive sweeps; only the shifts are chosen once for all P (small-bulge multishift
// QR, as LAPACK's xLAQR5 does for Hessenberg matrices). P sweeps cost about one sweep's
// latency, the chase's critical path.

// The number of singular values below x of the trailing p x p bidiagonal of the block
// (D(first..), E(first..)): a Sturm count on its Golub-Kahan tridiagonal (zero diagonal,
// off-diagonals d_0, e_0, d_1, ..., eigenvalues +-sigma).
template <typename T> __device__ int singular_values_below(const Bidiagonal<T>& b, int first, int p, T x) {
    int negatives = 0;
    T q = -x;
    const T pivmin = Limits<T>::tiny() * T(1e4);
    for (int k = 0; k < 2 * p; ++k) {
        if (q < 0) ++negatives;
        if (k == 2 * p - 1) break;
        const T off = (k & 1) ? b.E(first + (k >> 1)) : b.D(first + (k >> 1));
        if (abs(q) < pivmin) q = -pivmin;
        if constexpr (sizeof(T) == 4) {
            q = -x - off * off * reciprocal_t(q);  // the fast reciprocal takes any normal float
        } else {
            q = -x - off * off / q;  // reciprocal_t(double) starts from a float: out of range here
        }
    }
    return negatives - p;
}

// Lane j < p: the j-th smallest singular value of the trailing p x p (bisection, to about
// 2^-30 of the largest): the shift of sweep j.
template <typename T> __device__ T trailing_singular_value(const Bidiagonal<T>& b, int length, int p, int lane) {
    const int first = length - p;
    T bound = 0;
    for (int k = 0; k < p; ++k) bound = max(bound, abs(b.D(first + k)) + (k + 1 < p ? abs(b.E(first + k)) : T(0)) + (k > 0 ? abs(b.E(first + k - 1)) : T(0)));
    T low = 0, high = bound;
    for (int iteration = 0; iteration < 30; ++iteration) {
        const T middle = T(0.5) * (low + high);
        if (singular_values_below(b, first, p, middle) > lane) high = middle; else low = middle;
    }
    return T(0.5) * (low + high);
}

// P pipelined shifted sweeps over the block (k_end rotations each), lane q < P running
// sweep q with `shift` (its own). log_rotation(q, k, cr, sr, cl, sl) as in `sweep`.
template <typename T, bool Exact, typename Log>
__device__ void pipelined_sweeps(const Bidiagonal<T>& b, int k_end, T shift, int lanes, int lane, T* spare, Log log_rotation) {
    constexpr int LAG = 3;
    const bool mine = lane < lanes;
    T d_i = 0, e_i = 0, f = 0, g = 0;
    const int total = k_end + LAG * (lanes - 1);
    for (int t = 0; t < total; ++t) {
        const int i = t - LAG * lane;
        if (mine && i >= 0 && i < k_end) {
            if (i == 0) {
                d_i = b.D(0);
                e_i = b.E(0);
                f = (abs(d_i) - shift) * (copysign_t(T(1), d_i) + shift / d_i);
                g = e_i;
            }
            T d_next = b.D(i + 1);
            const T e_next = b.E(i + 1);
            T c, s, r;
            givens<T, Exact>(f, g, c, s, r);
            *(i > 0 ? &b.E(i - 1) : spare) = r;
            f = c * d_i + s * e_i;
            const T e_rotated = c * e_i - s * d_i;
            g = s * d_next;
            d_next = c * d_next;
            const T cr = c, sr = s;
            givens<T, Exact>(f, g, c, s, r);
            b.D(i) = r;
            f = c * e_rotated + s * d_next;
            d_i = c * d_next - s * e_rotated;
            g = s * e_next;
            e_i = c * e_next;
            log_rotation(lane, i, cr, sr, c, s);
            if (i == k_end - 1) {
                b.D(k_end) = d_i;
                b.E(k_end - 1) = f;
            }
        }
        __syncwarp();
    }
}

// How many sweeps to run at once on a block of `length` diagonal entries (1: one sweep).
__device__ __forceinline__ int multishift_lanes(int length, int max_lanes) {
    return length < 96 ? 1 : min(max_lanes, length / 24);
}

// d (n,), e (n-1,) in global memory (worked on in shared memory, written back at exit).
// state: STATE_INTS ints, all 0 for a fresh start; thresh_io: the negligibility threshold.
// Logs at most sweep_capacity sweeps and rotation_capacity rotations per launch when
// `log` is not null (vectors wanted); without a log the chase runs to the end.
// One warp: the 32 lanes run the sequential parts in lockstep on the same values (only
// lane 0 writes to global memory) and share the parallel ones (the block search, the
// convergence test, the largest entry).
template <typename T, bool Exact>
__device__ void bidiagonal_qr(T* __restrict__ d_global, T* __restrict__ e_global, int n, int* __restrict__ state, T* __restrict__ thresh_io,
                              Sweep* __restrict__ log, int sweep_capacity, typename Pair<T>::type* __restrict__ rot_vt,
                              typename Pair<T>::type* __restrict__ rot_u, int rotation_capacity, int max_sweeps, int max_lanes,
                              T tol, long long* __restrict__ cycles) {
    extern __shared__ unsigned char shared_bytes[];
    T* d = reinterpret_cast<T*>(shared_bytes);
    T* e = d + n;       // n - 1 entries, then one more that the sweeps read past the end of a block
    T* spare = e + n;   // written, never read
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = d_global[i];
    for (int i = threadIdx.x; i < n; i += blockDim.x) e[i] = i < n - 1 ? e_global[i] : T(0);
    __syncthreads();
    if (threadIdx.x >= 32) return;
    typedef typename Pair<T>::type T2;
    const int lane = threadIdx.x;
    const bool writer = lane == 0;
    const T eps = Limits<T>::eps();
    int hi, sweeps, old_lo, old_hi;
    bool forward;
    T thresh;
    if (state[STATE_STATUS] == STATUS_FRESH) {
        T mu = abs(d[0]), smin = mu;
        for (int i = 1; i < n; ++i) {
            if (smin == 0) break;
            mu = abs(d[i]) * (mu / (mu + abs(e[i - 1])));
            smin = min(smin, mu);
        }
        thresh = max(tol * smin / sqrt_t(T(n)), T(6) * T(n) * T(n) * Limits<T>::tiny());
        hi = n - 1; sweeps = 0; old_lo = -1; old_hi = -1; forward = true;
    } else {
        hi = state[STATE_HI]; sweeps = state[STATE_SWEEPS];
        old_lo = state[STATE_OLD_LO]; old_hi = state[STATE_OLD_HI]; forward = state[STATE_FORWARD] != 0;
        thresh = *thresh_io;
    }
    int logged = 0, rotations = 0, status = STATUS_DONE;
    long long chased = 0, tested = 0;  // for the benchmark's account of where the time goes
    long long scan_cycles = 0, test_cycles = 0, sweep_cycles = 0;
    while (hi > 0) {
        const long long mark = clock64();
        const int lo = block_start(e, hi, thresh, lane);
        if (lo > 0) e[lo - 1] = 0;
        scan_cycles += clock64() - mark;
        if (lo == hi) { --hi; continue; }
        if (log != nullptr && (logged == sweep_capacity || rotations + (hi - lo) > rotation_capacity)) {
            status = STATUS_PAUSED;  // the log is full: the host applies it and relaunches
            break;
        }
        if (lo == hi - 1) {
            T cl, sl, cr, sr, s1, s2;
            svd_2x2(d[lo], e[lo], d[hi], cl, sl, cr, sr, s1, s2);
            __syncwarp();
            d[lo] = s1; d[hi] = s2; e[lo] = 0;
            if (log != nullptr && writer) {  // V^T <- right^T V^T, U^T <- left^T U^T: the sines change sign
                log[logged] = Sweep{lo, 1, 1, rotations};
                rot_vt[rotations] = T2{cr, -sr};
                rot_u[rotations] = T2{cl, -sl};
            }
            if (log != nullptr) { ++logged; ++rotations; }
            hi -= 2;
            continue;
        }
        if (lo > old_hi || hi < old_lo) forward = abs(d[lo]) >= abs(d[hi]);
        const Bidiagonal<T> b(d, e, lo, hi, forward);
        const int last = hi - lo - 1;  // index of the last e in the block's reading
        if (abs(b.E(last)) <= tol * abs(b.D(last + 1))) {
            __syncwarp();
            b.E(last) = 0;
            continue;
        }
        T smin;
        const int negligible = first_negligible(b, last, tol, smin, lane, tested);
        const long long tested_at = clock64();
        test_cycles += tested_at - mark;
        if (negligible >= 0) {
            __syncwarp();
            b.E(negligible) = 0;
            continue;
        }
        if (sweeps >= max_sweeps) { status = STATUS_NO_CONVERGENCE; break; }
        old_lo = lo; old_hi = hi;
        T smax = 0;
        for (int k = lane; k <= hi - lo; k += 32) smax = max(smax, max(abs(d[lo + k]), k < hi - lo ? abs(e[lo + k]) : T(0)));
        smax = warp_max(smax);
        T shift = 0;
        const bool shifted = !(T(n) * tol * (smin / smax) <= max(eps, tol / 100));
        int lanes = shifted ? multishift_lanes(hi - lo + 1, max_lanes) : 1;
        if (log != nullptr) lanes = min(lanes, min(sweep_capacity - logged, (rotation_capacity - rotations) / (hi - lo)));
        if (lanes >= 2) {
            if (lane < lanes) {
                shift = trailing_singular_value(b, hi - lo + 1, lanes, lane);
                const T relative = shift / abs(b.D(0));
                if (relative * relative < eps) shift = 0;
            }
            __syncwarp();
            const int count = hi - lo, offset = rotations + lane * count;
            const T sign = forward ? T(1) : T(-1);
            if (log != nullptr && lane < lanes) log[logged + lane] = forward ? Sweep{lo, count, 1, offset} : Sweep{hi - 1, count, -1, offset};
            pipelined_sweeps<T, Exact>(b, count, shift, lanes, lane, spare, [&](int q, int k, T cr, T sr, T cl, T sl) {
                if (log != nullptr) {
                    rot_vt[rotations + q * count + k] = forward ? T2{cr, sr} : T2{cl, sign * sl};
                    rot_u[rotations + q * count + k] = forward ? T2{cl, sl} : T2{cr, sign * sr};
                }
            });
            if (log != nullptr) {
                logged += lanes;
                rotations += lanes * count;
            }
            sweeps += lanes;
            chased += (long long)lanes * count;
            sweep_cycles += clock64() - tested_at;
            if (abs(b.E(last)) <= thresh) b.E(last) = 0;
            continue;
        }
        if (shifted) {
            shift = smallest_singular_value_2x2(b.D(last), b.E(last), b.D(last + 1));
            const T relative = shift / abs(b.D(0));
            if (relative * relative < eps) shift = 0;
        }
        __syncwarp();
        if (log != nullptr) {
            const int offset = rotations, count = hi - lo;
            if (writer) log[logged] = forward ? Sweep{lo, count, 1, offset} : Sweep{hi - 1, count, -1, offset};
            // forward: right rotations to V^T, left ones to U^T; reversed: the roles swap
            // and the pair turns around, so the sines change sign. Lane k % 32 keeps step k's
            // rotations, and every 32 steps the warp stores them with one coalesced write.
            const T sign = forward ? T(1) : T(-1);
            T2 pending_vt{}, pending_u{};
            sweep<T, Exact>(b, count, shift, spare, [&](int k, T cr, T sr, T cl, T sl) {
                const int slot = k & 31;
                if (lane == slot) {
                    pending_vt = forward ? T2{cr, sr} : T2{cl, sign * sl};
                    pending_u = forward ? T2{cl, sl} : T2{cr, sign * sr};
                }
                if (slot == 31 || k == count - 1) {
                    if (lane <= slot) {
                        rot_vt[offset + k - slot + lane] = pending_vt;
                        rot_u[offset + k - slot + lane] = pending_u;
                    }
                }
            });
            ++logged;
            rotations += count;
        } else {
            sweep<T, Exact>(b, hi - lo, shift, spare, [](int, T, T, T, T) {});
        }
        ++sweeps;
        chased += hi - lo;
        sweep_cycles += clock64() - tested_at;
        if (abs(b.E(last)) <= thresh) b.E(last) = 0;
    }
    __syncwarp();
    if (writer) {
        state[STATE_HI] = hi; state[STATE_SWEEPS] = sweeps;
        state[STATE_OLD_LO] = old_lo; state[STATE_OLD_HI] = old_hi; state[STATE_FORWARD] = forward;
        state[STATE_STATUS] = status; state[STATE_LOGGED] = logged; state[STATE_ROTATIONS] = rotations;
        state[STATE_CHASED] += int(chased); state[STATE_TESTED] += int(tested);
        if (cycles != nullptr) {  // clock64 ticks spent finding the block, testing it and sweeping
            cycles[0] += scan_cycles; cycles[1] += test_cycles; cycles[2] += sweep_cycles;
        }
        *thresh_io = thresh;
    }
    __syncwarp();
    for (int i = lane; i < n; i += 32) d_global[i] = d[i];
    for (int i = lane; i < n - 1; i += 32) e_global[i] = e[i];
}

// ------------------------------------------------------- applying the rotations --
// A batch of up to S logged sweeps, all with the same step, applied to the rows of a
// row-major matrix X (rows, width; row stride ld): each thread owns one column and keeps
// a window of 2S of its elements in registers, so X is read and written once per batch
// instead of once per sweep. In the batch's own coordinates (element k = row first_row + k
// for step +1, first_row + elements - 1 - k for step -1) every sweep runs upwards in k, and sweep
// q applies its rotation at pair (k, k+1) at time k + 2q: by then sweep q-1 is done with
// k, k+1 and k+2, and the rotations of one time touch disjoint pairs.
// Sweeps per pass: as many as the registers hold (a ring of 2 S elements and two sets of
// S rotations per thread). Mirrored in cuda.py.
template <typename T> struct SweepsPerBatch;
template <> struct SweepsPerBatch<float> { static constexpr int value = 16; };
template <> struct SweepsPerBatch<double> { static constexpr int value = 8; };

template <typename T, int S>
__device__ void apply_sweeps(T* __restrict__ x, int width, long long ld, int first_row, int elements, int step,
                             const Sweep* __restrict__ sweeps, int count, const typename Pair<T>::type* __restrict__ rotations) {
    constexpr int W = 2 * S;
    const int column = blockIdx.x * blockDim.x + threadIdx.x;
    // where each sweep's first rotation falls in batch coordinates, and its length
    int start[S], length[S], offset[S];
#pragma unroll
    for (int q = 0; q < S; ++q) {
        if (q < count) {
            const Sweep sw = sweeps[q];
            start[q] = step > 0 ? sw.first - first_row : (first_row + elements - 1) - sw.first - 1;
            length[q] = sw.count;
            offset[q] = sw.offset;
        } else {
            start[q] = 0; length[q] = 0; offset[q] = 0;
        }
    }
    if (column >= width) return;
    typedef typename Pair<T>::type T2;
    T* base = x + column + (step > 0 ? (long long)first_row * ld : (long long)(first_row + elements - 1) * ld);
    const long long stride = step > 0 ? ld : -ld;
    // mirrored, the pair (row j, row j+1) is (k+1, k): the same rotation with -s
    const T sign = step > 0 ? T(1) : T(-1);
    // The S rotations of one time, the identity where a sweep is not at a pair then (an
    // exact no-op), so the arithmetic has no branches. The next time's rotations are
    // loaded while this time's are applied: the loads' latency stays off the chain.
    auto gather = [&](int time, T2 (&cs)[S]) {
#pragma unroll
        for (int q = 0; q < S; ++q) {
            const int t = time - 2 * q - start[q];
            const bool live = t >= 0 && t < length[q];
            const T2 value = live ? __ldg(&rotations[offset[q] + t]) : T2{T(1), T(0)};
            cs[q] = T2{value.x, sign * value.y};
        }
    };
    T ring[W];
#pragma unroll
    for (int k = 0; k < W; ++k) ring[k] = 0;  // identity rotations also touch slots not loaded yet: keep them finite
    T2 current[S], upcoming[S];
    ring[0] = base[0];
    gather(0, current);
    const int steps = elements + 2 * S - 2;  // the last one stores element `elements - 1`
    for (int time0 = 0; time0 < steps; time0 += W) {
#pragma unroll
        for (int u = 0; u < W; ++u) {
            const int time = time0 + u;
            if (time + 1 < elements) ring[(u + 1) % W] = base[(time + 1) * stride];
            gather(time + 1, upcoming);
#pragma unroll
            for (int q = 0; q < S; ++q) {
                T& a = ring[((u - 2 * q) % W + W) % W];
                T& b = ring[((u - 2 * q + 1) % W + W) % W];
                const T upper = a;
                a = current[q].x * upper + current[q].y * b;
                b = current[q].x * b - current[q].y * upper;
            }
            const int done = time - (2 * S - 2);
            if (done >= 0 && done < elements) base[done * stride] = ring[((u - (2 * S - 2)) % W + W) % W];
#pragma unroll
            for (int q = 0; q < S; ++q) current[q] = upcoming[q];
        }
    }
}

// ------------------------------------------------------------ entry points --
// A Panel as kernel arguments (CuPy passes scalars and pointers, not structs).
#define STEP_THREADS 1024  // the bidiagonalization's blocks (gpu/svd/cuda.py: STEP_THREADS)
#define PANEL_PARAMETERS int m, int n, int nb, int lda, int ldu, int ldz, const int* panel_start
#define PANEL (Panel{m, n, nb, lda, ldu, ldz, panel_start})
#define PARTS_PARAMETERS(T) T *part_scale, T *part_ssq, T *part_dots
#define PARTS(T) (ReflectorParts<T>{part_scale, part_ssq, part_dots})
extern "C" __global__ void next_panel_kernel(int* panel_start, int nb) { next_panel(panel_start, nb); }
#define SVD_KERNELS(T, SUFFIX)                                                                                                      \
    extern "C" __global__ void __launch_bounds__(STEP_THREADS, 1) first_column_##SUFFIX(T* a, T* uw, PANEL_PARAMETERS, T* tau_left,  \
                                                                                     T* d, T* t) {                                     \
        first_column<T>(a, uw, PANEL, tau_left, d, t);                                                                               \
    }                                                                                                                                \
    extern "C" __global__ void __launch_bounds__(STEP_THREADS, 1) left_step_##SUFFIX(const T* a, const T* uw, T* zv, PANEL_PARAMETERS, int i, const T* tau_left,        \
                                                  const T* t, T* row, T* tau_right, T* e, T* s, PARTS_PARAMETERS(T),                 \
                                                  unsigned* arrivals) {                                                               \
        left_step<T>(a, uw, zv, PANEL, i, tau_left, t, row, tau_right, e, s, PARTS(T), arrivals);                                    \
    }                                                                                                                                \
    extern "C" __global__ void __launch_bounds__(STEP_THREADS, 1) right_step_##SUFFIX(T* a, T* uw, const T* zv, PANEL_PARAMETERS, int i, const T* tau_right,             \
                                                   const T* s, T* tau_left, T* d, T* t, PARTS_PARAMETERS(T), unsigned* arrivals) {   \
        right_step<T>(a, uw, zv, PANEL, i, tau_right, s, tau_left, d, t, PARTS(T), arrivals);                                        \
    }                                                                                                                                \
    extern "C" __global__ void wy_factor_##SUFFIX(const T* gram, const T* taus, int nb, T* t) { wy_factor<T>(gram, taus, nb, t); }     \
    extern "C" __global__ void apply_sweeps_##SUFFIX(T* vt, int vt_width, T* ut, int ut_width, long long ld_vt, long long ld_ut,      \
                                                     int first_row, int elements, int step, const Sweep* sweeps, int count,          \
                                                     const Pair<T>::type* rot_vt, const Pair<T>::type* rot_u) {                      \
        if (blockIdx.y == 0)                                                                                                         \
            apply_sweeps<T, SweepsPerBatch<T>::value>(vt, vt_width, ld_vt, first_row, elements, step, sweeps, count, rot_vt);               \
        else                                                                                                                         \
            apply_sweeps<T, SweepsPerBatch<T>::value>(ut, ut_width, ld_ut, first_row, elements, step, sweeps, count, rot_u);                \
    }


SVD_KERNELS(float, f32)
SVD_KERNELS(double, f64)

// The chase, in double for both precisions (see "bidiagonal QR" above): with the fast
// rotations for float32 matrices, with the exact ones for float64 matrices ("givens").
#define BIDIAGONAL_QR(NAME, EXACT)                                                                                                  \
    extern "C" __global__ void NAME(double* d, double* e, int n, int* state, double* thresh, Sweep* log, int sweep_capacity,        \
                                    double2* rot_vt, double2* rot_u, int rotation_capacity, int max_sweeps, int max_lanes,          \
                                    double tol, long long* cycles) {                                                                \
        bidiagonal_qr<double, EXACT>(d, e, n, state, thresh, log, sweep_capacity, rot_vt, rot_u, rotation_capacity, max_sweeps,     \
                                     max_lanes, tol, cycles);                                                                       \
    }
BIDIAGONAL_QR(bidiagonal_qr_f64_fast, false)
BIDIAGONAL_QR(bidiagonal_qr_f64_exact, true)
