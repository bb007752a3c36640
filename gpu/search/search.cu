// Exact string search on the GPU: Rabin-Karp, Knuth-Morris-Pratt and Boyer-Moore in the
// divide-and-conquer scheme (each thread scans `granularity` start positions and reads
// pattern_length - 1 bytes past them), and a fused multi-pattern pass. Launched from
// gpu/search/cuda.py; gpu/search/reference.py is the definition they are tested against.
//
// Two passes per search, so that matches are compacted on the device:
//   count_*  each block counts its matches (counts[block]) and keeps up to `slots` of
//            them (block-relative offsets, in order); one launch over every block of a
//            resident text, or, while a text is streamed to the device, one per uploaded
//            chunk over the blocks whose bytes have all arrived (first_block onwards: a
//            block owns its start positions, so a match across a chunk edge is counted
//            once, by the block it starts in); flags[block] says which:
//            BLOCK_EMPTY (no match), BLOCK_KEPT, or BLOCK_RESCAN (the block found more
//            than `slots`, or, single pattern, a thread more than it keeps);
//   offsets  inclusive prefix sums of counts (CUB through CuPy for one pattern,
//            `block_offsets` for several), total = offsets[last];
//   write_*  a grid of a few waves, each CUDA block over a range of the count pass's
//            blocks: it reads their flags in one coalesced load and visits only the busy
//            ones; a kept block's matches are copied to out[offsets[b] - counts[b] ...],
//            a flagged one is scanned again: count per thread (fused: per warp and
//            pattern), block prefix sum, scan once more writing positions.
// Positions are int64 everywhere: texts may exceed 2^31 bytes.
//
// Variants:
//   naive      text, pattern and tables read from global memory, a byte at a time;
//   optimized  the block's text (its start positions + longest pattern - 1 bytes) staged
//              in shared memory with coalesced 16-byte loads, pattern and tables copied to
//              shared memory; threads read their chunk 16 bytes at a time (the chunk is an
//              odd multiple of 16 bytes: a quarter-warp's 16-byte loads hit distinct banks),
//              Rabin-Karp rolls its hash over 16 positions per pair of loads, KMP skips to
//              the next byte equal to the pattern's first byte 16 bytes at a time.
//
// Shared memory of a block (offsets computed by `layout`, mirrored in cuda.py):
//   records  RECORDS_PER_THREAD u32 per thread   matches kept during the count pass
//            (fused: a pool of POOL_CHUNKS chunks of the block's kept matches, then
//            WARP_WORDS u32 per warp: its candidate queue, per-pattern counts, chunk list)
//   scratch  SCRATCH_BYTES                       block scans
//   pattern  (optimized) the pattern bytes (fused: none, its patterns stay in global memory)
//   table    (optimized) KMP: lps int16[m]; Boyer-Moore: bad int16[256] + good int16[m + 1];
//            fused: hash filter u8[FILTER_SIZE] + coarse bitmap u32[32] + meta int32[META_INTS]
//   tile     (optimized) threads * granularity + m_max - 1 bytes of text, + TILE_PAD

typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;

#define RK_BASE 16777619u
#define RECORDS_PER_THREAD 4  // single pattern: at most one match per start position
#define SCRATCH_BYTES 512
#define TILE_PAD 64
#define FUSED_MAX 8
#define SLOTS_MAX 256  // matches a block keeps for the write pass (params.SLOTS_MAX)
// The fused pass's warps keep their matches in a pool shared by the block, taking chunks
// of POOL_CHUNK records as they need them (a warp's k-th record lies in its k / POOL_CHUNK-th
// chunk), so that one warp may keep up to SLOTS_MAX while the block keeps SLOTS_MAX in all.
// POOL_CHUNKS covers SLOTS_MAX records whatever their split over FUSED_WARPS_MAX warps (a
// partly filled chunk per warp); a block that takes more (only possible with more warps)
// is rescanned.
#define FUSED_WARPS_MAX 8  // warps of a fused block the pool is sized for (params.THREADS / 32)
#define POOL_CHUNK 8
#define WARP_CHUNKS (SLOTS_MAX / POOL_CHUNK)
#define POOL_CHUNKS (WARP_CHUNKS + FUSED_WARPS_MAX)
#define POOL_WORDS (POOL_CHUNKS * POOL_CHUNK + 4)  // the chunks, then the count of chunks taken (and padding)
#define QUEUE_CAP 64  // fused: candidates a warp queues for verification
#define WARP_WORDS (QUEUE_CAP + FUSED_MAX + WARP_CHUNKS / 4)  // fused: queue, per-pattern counts, u8 chunk list
#define FILTER_BITS 12
#define FILTER_SIZE (1 << FILTER_BITS)
#define LANE_MUL 2654435761u  // the filters' two hashes of a prefix key: the high words of
#define BIT_MUL 2246822507u   // key * LANE_MUL and key * BIT_MUL (their low bits mix every key bit)
#define COARSE_BITS 10  // the coarse bitmap: 1024 bits, one word per lane of a warp
#define COARSE_BYTES (4 << (COARSE_BITS - 5))
#define META_INTS (3 + 4 * FUSED_MAX)  // P, prefix bytes k, m_max, m[8], offset[8], head[8][2]
#define REL_BITS 24
#define REL_MASK ((1u << REL_BITS) - 1u)
#define FULL_MASK 0xffffffffu
#define MAX_THREADS 1024

enum { BLOCK_EMPTY = 0, BLOCK_KEPT = 1, BLOCK_RESCAN = 2 };  // flags[block] of the count pass

enum { RABIN_KARP = 0, KMP = 1, BOYER_MOORE = 2, FUSED = 3 };

// The records region of a block's shared memory, in u32: the matches each thread keeps
// during a single-pattern count pass (a thread that finds more sends its block to a
// rescan), or the fused pass's pool and its warps' queues, counts and chunk lists.
__host__ __device__ constexpr int record_words(int algo, int threads) {
    return algo == FUSED ? POOL_WORDS + (threads / 32) * WARP_WORDS : threads * RECORDS_PER_THREAD;
}

#ifndef CUDA_EMULATION
__device__ __forceinline__ u8* shared_base() {
    extern __shared__ uint4 search_shared[];
    return reinterpret_cast<u8*>(search_shared);
}
#endif

// ----------------------------------------------------------------- shared layout --

struct Layout {
    u32 records, scratch, pattern, table, tile, tile_bytes;
};

__device__ __forceinline__ u32 round16(u32 x) { return (x + 15u) & ~15u; }

__device__ __forceinline__ Layout layout(int threads, int words, int granularity, int pattern_bytes, int table_bytes, int m_max, bool staged) {
    Layout l;
    l.records = 0;
    l.scratch = round16((u32)words * 4u);
    l.pattern = l.scratch + SCRATCH_BYTES;
    if (!staged) {
        l.table = l.tile = l.pattern;
        l.tile_bytes = 0;
        return l;
    }
    l.table = l.pattern + round16((u32)pattern_bytes);
    l.tile = l.table + round16((u32)table_bytes);
    l.tile_bytes = round16((u32)threads * (u32)granularity + (u32)m_max - 1u) + TILE_PAD;
    return l;
}

__device__ __forceinline__ int table_bytes_of(int algo, int m) {
    return algo == KMP ? 2 * m : algo == BOYER_MOORE ? 2 * (256 + m + 1) : algo == FUSED ? FILTER_SIZE + COARSE_BYTES + 4 * META_INTS : 0;
}

// ------------------------------------------------------------------ small helpers --

// A 16-byte copy from global to shared memory that does not wait for the load (cp.async);
// copies_wait() waits for all of the thread's. Both addresses 16-byte aligned.
// Before sm_80 a plain copy; the CPU emulation lands it late, at copies_wait
// (tests/gpu/emulator/emu.h).
__device__ __forceinline__ void copy16_async(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((u32)__cvta_generic_to_shared(shared_dst)), "l"(global_src) : "memory");
#elif defined(CUDA_EMULATION)
    emu_copy_async(shared_dst, global_src, 16);
#else
    *reinterpret_cast<uint4*>(shared_dst) = *reinterpret_cast<const uint4*>(global_src);
#endif
}

__device__ __forceinline__ void copies_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#elif defined(CUDA_EMULATION)
    emu_async_wait_all();
#endif
}

__device__ __forceinline__ uint4 lds16(const u8* s, int offset) {  // offset: a multiple of 16
    return *reinterpret_cast<const uint4*>(s + offset);
}

__device__ __forceinline__ u32 word_of(const uint4& v, int k) {  // k known at compile time
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

__device__ __forceinline__ u32 byte_of(const uint4& v, int k) {  // k known at compile time
    return (word_of(v, k >> 2) >> ((k & 3) * 8)) & 0xffu;
}

// 16 bytes at any offset of shared memory: two aligned loads, realigned. The offset's
// remainder is the same for every thread of a call site, so the switch does not diverge.
__device__ __forceinline__ uint4 lds16_any(const u8* s, int offset) {
    const int base = offset & ~15, r = offset & 15;
    const uint4 a = lds16(s, base), b = lds16(s, base + 16);
    u32 w0, w1, w2, w3, w4;
    switch (r >> 2) {
        case 0: w0 = a.x; w1 = a.y; w2 = a.z; w3 = a.w; w4 = b.x; break;
        case 1: w0 = a.y; w1 = a.z; w2 = a.w; w3 = b.x; w4 = b.y; break;
        case 2: w0 = a.z; w1 = a.w; w2 = b.x; w3 = b.y; w4 = b.z; break;
        default: w0 = a.w; w1 = b.x; w2 = b.y; w3 = b.z; w4 = b.w; break;
    }
    const u32 shift = (u32)(r & 3) * 8u;
    return make_uint4(__funnelshift_r(w0, w1, shift), __funnelshift_r(w1, w2, shift), __funnelshift_r(w2, w3, shift), __funnelshift_r(w3, w4, shift));
}

// 0x80 in each byte of x that is zero, 0 elsewhere (exact: no borrow between bytes).
__device__ __forceinline__ u32 zero_bytes(u32 x) {
    return ~(((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & 0x80808080u;
}

// The 4 high bits of the 4 bytes of z (each 0x80 or 0) as a 4-bit mask, byte 0 -> bit 0.
__device__ __forceinline__ u32 pack4(u32 z) {
    return (((z >> 7) * 0x10204080u) >> 28);
}

// Bit k set where byte k of the 16 is equal to the byte repeated in `rep`.
__device__ __forceinline__ u32 equal_mask16(const uint4& v, u32 rep) {
    return pack4(zero_bytes(v.x ^ rep)) | (pack4(zero_bytes(v.y ^ rep)) << 4) | (pack4(zero_bytes(v.z ^ rep)) << 8) | (pack4(zero_bytes(v.w ^ rep)) << 12);
}

// The exclusive prefix sum over the lanes of `value`; *total gets the warp's sum.
// Every lane of the warp must call it.
template <class V>
__device__ __forceinline__ V warp_exclusive_scan(V value, V* total) {
    const int lane = threadIdx.x & 31;
    V x = value;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const V y = __shfl_up_sync(FULL_MASK, x, d);
        if (lane >= d) x += y;
    }
    *total = __shfl_sync(FULL_MASK, x, 31);
    return x - value;
}

// Exclusive prefix sum over the block of one value per thread; *total gets the sum.
// Every thread of the block must call it. Uses scratch[0..32].
template <class V>
__device__ V block_exclusive_scan(V value, V* scratch, V* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    V warp_total;
    const V within = warp_exclusive_scan(value, &warp_total);
    if (lane == 0) scratch[warp] = warp_total;
    __syncthreads();
    if (threadIdx.x == 0) {
        V run = 0;
        for (int w = 0; w < warps; ++w) {
            const V v = scratch[w];
            scratch[w] = run;
            run += v;
        }
        scratch[32] = run;
    }
    __syncthreads();
    const V before = scratch[warp] + within;
    *total = scratch[32];
    __syncthreads();  // scratch may be reused at once
    return before;
}

// Exclusive prefix sum over the block's warps of one value per warp (the same in every
// lane); *total gets the block's sum. Every thread of the block must call it.
__device__ __forceinline__ u32 warps_exclusive_scan(u32 value, u32* scratch, u32* total) {
    return __shfl_sync(FULL_MASK, block_exclusive_scan((threadIdx.x & 31) == 0 ? value : 0u, scratch, total), 0);
}

// ---------------------------------------------------------------------- emitters --
// A single-pattern scan calls emit(0, rel) for each match at block-relative offset rel,
// in increasing order of rel, in the thread that finds it (the fused scan's emitters,
// which take a warp's matches at once, follow the fused pass).

struct CountEmit {  // count pass: count, keep the first `cap` as (q << 24 | rel)
    u32 count;
    u32 cap;
    u32* records;
    __device__ void operator()(int q, u32 rel) {
        if (count < cap) records[count] = ((u32)q << REL_BITS) | rel;
        ++count;
    }
};

struct TallyEmit {  // write pass, first scan of a flagged block: the thread's count
    u32 count;
    __device__ void operator()(int, u32) { ++count; }
};

struct WriteEmit {  // write pass, second scan: positions to their places
    i64* out;
    i64 next;
    i64 base;
    __device__ void operator()(int, u32 rel) { out[next++] = base + (i64)rel; }
};

// ------------------------------------------------------------- naive algorithms --
// s: text from the block's first start position; lo <= i < hi: this thread's start
// positions (block-relative); reads s[lo .. hi + m - 1).

template <class Emit>
__device__ void rabin_karp_naive(const u8* s, int lo, int hi, const u8* p, int m, u32 target, u32 power, Emit& emit) {
    if (lo >= hi) return;
    u32 h = 0;
    for (int k = 0; k < m; ++k) h = h * RK_BASE + s[lo + k];
    for (int i = lo;; ++i) {
        if (h == target) {
            int k = 0;
            while (k < m && s[i + k] == p[k]) ++k;
            if (k == m) emit(0, (u32)i);
        }
        if (i + 1 >= hi) break;
        h = h * RK_BASE + s[i + m] - power * s[i];
    }
}

// One KMP step: the length of the pattern prefix matched after byte c at text position i,
// from j before it (emits the match that ends at i).
template <class Emit>
__device__ __forceinline__ int kmp_step(u8 c, int i, int j, const u8* p, int m, const short* lps, Emit& emit) {
    while (j > 0 && p[j] != c) j = lps[j - 1];
    if (p[j] == c) ++j;
    if (j == m) {
        emit(0, (u32)(i - m + 1));
        j = lps[m - 1];
    }
    return j;
}

template <class Emit>
__device__ void kmp_naive(const u8* s, int lo, int hi, const u8* p, int m, const short* lps, Emit& emit) {
    if (lo >= hi) return;
    const int last = hi + m - 1;
    int j = 0;
    for (int i = lo; i < last; ++i) j = kmp_step(s[i], i, j, p, m, lps, emit);
}

// One Boyer-Moore alignment at `shift`, pattern bytes j, j-1, .. 0 still to compare (those
// above j are known to match): emits a match; returns how far to move, the larger of the
// (strong) good-suffix and the bad-character shifts.
template <class Emit>
__device__ __forceinline__ int boyer_moore_step(const u8* s, int shift, int j, const u8* p, const short* bad, const short* good, Emit& emit) {
    while (j >= 0 && p[j] == s[shift + j]) --j;
    if (j < 0) {
        emit(0, (u32)shift);
        return good[0];
    }
    return max((int)good[j + 1], j - (int)bad[s[shift + j]]);
}

template <class Emit>
__device__ void boyer_moore_naive(const u8* s, int lo, int hi, const u8* p, int m, const short* bad, const short* good, Emit& emit) {
    for (int shift = lo; shift < hi;) shift += boyer_moore_step(s, shift, m - 1, p, bad, good, emit);
}

// --------------------------------------------------------- optimized algorithms --
// s: the block's tile in shared memory (16-byte aligned); lo is a multiple of 16.

template <class Emit>
__device__ __forceinline__ void rabin_karp_verify(const u8* s, int i, const u8* p, int m, Emit& emit) {
    int k = 0;
    while (k < m && s[i + k] == p[k]) ++k;
    if (k == m) emit(0, (u32)i);
}

template <class Emit>
__device__ void rabin_karp_optimized(const u8* s, int lo, int hi, const u8* p, int m, u32 target, u32 power, Emit& emit) {
    if (lo >= hi) return;
    u32 h = 0;
    int k = 0;
    for (; k + 16 <= m; k += 16) {
        const uint4 v = lds16(s, lo + k);
#pragma unroll
        for (int b = 0; b < 16; ++b) h = h * RK_BASE + byte_of(v, b);
    }
    for (; k < m; ++k) h = h * RK_BASE + s[lo + k];
    int i = lo;
    for (; i + 16 <= hi; i += 16) {
        const uint4 out = lds16(s, i);          // bytes leaving the window
        const uint4 in = lds16_any(s, i + m);   // bytes entering it
#pragma unroll
        for (int b = 0; b < 16; ++b) {
            if (h == target) rabin_karp_verify(s, i + b, p, m, emit);
            h = h * RK_BASE + byte_of(in, b) - power * byte_of(out, b);
        }
    }
    for (; i < hi; ++i) {
        if (h == target) rabin_karp_verify(s, i, p, m, emit);
        h = h * RK_BASE + s[i + m] - power * s[i];
    }
}

template <class Emit>
__device__ void kmp_optimized(const u8* s, int lo, int hi, const u8* p, int m, const short* lps, Emit& emit) {
    if (lo >= hi) return;
    const int last = hi + m - 1;  // bytes lo .. last - 1 are read
    const u32 first = (u32)p[0] * 0x01010101u;
    int j = 0, i = lo;
    while (i < last) {
        if (j == 0) {
            // Skip to the next byte equal to p[0], 16 bytes at a time.
            int group = i & ~15;
            uint4 v = lds16(s, group);
            u32 mask = equal_mask16(v, first) & (0xffffu << (i - group));
            while (mask == 0) {
                group += 16;
                if (group >= last) return;
                v = lds16(s, group);
                const u32 any = zero_bytes(v.x ^ first) | zero_bytes(v.y ^ first) | zero_bytes(v.z ^ first) | zero_bytes(v.w ^ first);
                if (any != 0) mask = equal_mask16(v, first);
            }
            i = group + __ffs(mask) - 1;
            if (i >= last) return;
            if (m == 1) {
                emit(0, (u32)i);
            } else {
                j = 1;
            }
            ++i;
            continue;
        }
        j = kmp_step(s[i], i, j, p, m, lps, emit);
        ++i;
    }
}

template <class Emit>
__device__ void boyer_moore_optimized(const u8* s, int lo, int hi, const u8* p, int m, const short* bad, const short* good, Emit& emit) {
    const u8 last = p[m - 1];
    const int last_shift = good[m];  // good-suffix shift after a mismatch at the last byte
    int shift = lo;
    while (shift < hi) {
        const u8 c = s[shift + m - 1];
        if (c != last) {  // the common case, in a tight loop: mismatch at j = m - 1
            shift += max(last_shift, m - 1 - (int)bad[c]);
            continue;
        }
        shift += boyer_moore_step(s, shift, m - 2, p, bad, good, emit);
    }
}

// --------------------------------------------------------------- fused pass --
// All patterns in one scan: at each start position the first k = min(4, shortest
// pattern) bytes form a key, hashed twice, a = umulhi(key, LANE_MUL) and b =
// umulhi(key, BIT_MUL), and looked up twice:
//   coarse  a 1024-bit bitmap of the patterns' prefix hashes, held one word per lane of
//           the warp: bit b mod 32 of lane a mod 32's word, read with a shuffle (no shared
//           memory, no bank conflicts) in the hot loop of every position. The shuffle
//           and the rotate take their 5 bits from the low bits of a and b as they are:
//           per position a funnel shift (the key), two multiplies, a shuffle, a rotate
//           and a funnel shift (into the mask), the fewest ALU operations found;
//   fine    a candidate (rare) reads entry fine_index(a, b) (the coarse bucket and 2 more
//           bits of a) of a FILTER_SIZE-entry byte table in shared memory, bit q set for
//           pattern q; each flagged pattern's first min(m, 8) bytes are compared with the
//           text's 8 bytes there as two words (which settles every pattern of up to 8
//           bytes), and a longer one's remaining bytes 4 at a time.
// The text is read once for all. The work is by warp: a warp owns 32 g consecutive start
// positions of its block and scans them 512 at a time, 16 per lane, lane order being
// position order. Candidates go to a queue of the warp in shared memory, in position
// order, and are verified 32 at a time, one per lane: a candidate costs a lane, not a
// whole warp's pass through the verification (they are rare, about one in 300 positions
// of English for 8 patterns, so a warp's step of 512 positions has one or two).

struct Fused {
    const u8* filter;    // the table in shared memory: fine filter, coarse bitmap, meta ints
    const u8* patterns;  // in global memory
    u32 prefix_mask;     // the key's bytes
    u32 coarse;          // this lane's word of the coarse bitmap
    // The meta ints (read when needed, not held in registers): P, k, m_max, then per pattern
    // its length, its offset in `patterns` (a multiple of 4), its bytes 0..3 and 4..7
    // (little-endian words, zeros past its end).
    __device__ const int* meta() const { return reinterpret_cast<const int*>(filter + FILTER_SIZE + COARSE_BYTES); }
    __device__ int P() const { return meta()[0]; }
    __device__ int k() const { return meta()[1]; }
    __device__ int length(int q) const { return meta()[3 + q]; }
    __device__ int offset(int q) const { return meta()[3 + FUSED_MAX + q]; }
    __device__ u32 head(int q, int half) const { return (u32)meta()[3 + 2 * FUSED_MAX + 2 * q + half]; }
};

__device__ __forceinline__ u32 fine_index(u32 key) {
    const u32 a = __umulhi(key, LANE_MUL), b = __umulhi(key, BIT_MUL);
    return (a & 31u) | ((b & 31u) << 5) | (((a >> 5) & ((1u << (FILTER_BITS - 10)) - 1u)) << 10);
}

// 4 bytes at any offset of shared memory (two aligned loads, realigned).
__device__ __forceinline__ u32 lds4_any(const u8* s, int offset) {
    const int base = offset & ~3;
    const u32 a = *reinterpret_cast<const u32*>(s + base), b = *reinterpret_cast<const u32*>(s + base + 4);
    return __funnelshift_r(a, b, (u32)(offset & 3) * 8u);
}

// The low `bytes` bytes of a word set (bytes >= 4: all).
__device__ __forceinline__ u32 low_bytes_mask(int bytes) {
    return bytes >= 4 ? FULL_MASK : bytes <= 0 ? 0u : (1u << (8 * bytes)) - 1u;
}

// Whether text bytes s[i + 8 .. i + m) equal p[8 .. m) (p 4-byte aligned, readable to a
// multiple of 4 bytes; the tile is readable 3 bytes past i + m).
__device__ __forceinline__ bool tail_equal(const u8* s, int i, const u8* p, int m) {
    for (int k = 8; k < m; k += 4) {
        const u32 text = lds4_any(s, i + k), pattern = *reinterpret_cast<const u32*>(p + k);
        if ((text ^ pattern) & low_bytes_mask(m - k)) return false;
    }
    return true;
}

// The patterns that start at tile offset i (text position `position`), as a bit mask:
// the fine filter's entry for the key there, each flagged pattern checked in full.
__device__ __forceinline__ u32 fused_matches(const u8* s, int i, i64 position, i64 n, const Fused& f) {
    const u32 head0 = lds4_any(s, i), head1 = lds4_any(s, i + 4);
    u32 matched = 0u;
    for (u32 rest = f.filter[fine_index(head0 & f.prefix_mask)]; rest != 0u; rest &= rest - 1u) {
        const int q = __ffs((int)rest) - 1;
        const int m = f.length(q);
        if (position + m > n) continue;
        const u32 differ = ((head0 ^ f.head(q, 0)) & low_bytes_mask(m)) | ((head1 ^ f.head(q, 1)) & low_bytes_mask(m - 4));
        if (differ != 0u) continue;
        if (m > 8 && !tail_equal(s, i, f.patterns + f.offset(q), m)) continue;
        matched |= 1u << q;
    }
    return matched;
}

// Verifies the first min(32, queued) candidates of the warp's queue (tile offsets, in
// position order), one per lane, hands the warp's matches to emit.round, and moves the
// rest of the queue to its front. Every lane of the warp calls it; returns the new length.
template <class WarpEmit>
__device__ int fused_verify_round(const u8* s, int queued, i64 block_start, i64 n, const Fused& f, u32* queue, WarpEmit& emit) {
    const int lane = threadIdx.x & 31, taken = min(queued, 32), left = queued - taken;
    u32 rel = 0u, matched = 0u;
    if (lane < taken) {
        rel = queue[lane];
        matched = fused_matches(s, (int)rel, block_start + rel, n, f);
    }
    const u32 moved = lane < left ? queue[taken + lane] : 0u;
    __syncwarp();
    if (lane < left) queue[lane] = moved;
    __syncwarp();
    emit.round(rel, matched);
    return left;
}

// The warp's scan of its 32 g start positions of the block (tile offsets warp * 32 g ..,
// those at or past `span` masked off). Each step: 16 positions per lane in a short
// branch-free loop, their coarse bits folded into a mask of candidates, which are
// appended to the queue (QUEUE_CAP entries) in position order; every 32 queued are
// verified. The tile is readable past `span`. FULL_KEY: k = 4, the key is the 4 bytes as
// they are (no mask).
template <bool FULL_KEY, class WarpEmit>
__device__ void fused_scan(const u8* s, int span, int g, i64 block_start, i64 n, const Fused& f, u32* queue, WarpEmit& emit) {
    const int lane = threadIdx.x & 31;
    const int first = (threadIdx.x >> 5) * 32 * g, last = min(first + 32 * g, span);
    int queued = 0;  // the same in every lane
    for (int step = first; step < last; step += 512) {
        const int i = step + 16 * lane;
        const uint4 a = lds16(s, i);
        const u32 w[5] = {a.x, a.y, a.z, a.w, *reinterpret_cast<const u32*>(s + i + 16)};
        u32 hits = 0u;  // position t's coarse bit lands in bit 16 + t
#pragma unroll
        for (int t = 0; t < 16; ++t) {
            u32 key = __funnelshift_r(w[t >> 2], w[(t >> 2) + 1], (u32)(t & 3) * 8u);
            if (!FULL_KEY) key &= f.prefix_mask;
            const u32 word = __shfl_sync(FULL_MASK, f.coarse, (int)__umulhi(key, LANE_MUL));  // lane: the low 5 bits
            const u32 b = __umulhi(key, BIT_MUL);
            hits = __funnelshift_r(hits, __funnelshift_r(word, word, b), 1u);  // bit b mod 32 of the word, into bit 31
        }
        const int valid = last - i;
        const u32 candidates = (hits >> 16) & (valid >= 16 ? 0xffffu : valid <= 0 ? 0u : (1u << valid) - 1u);
        if (!__any_sync(FULL_MASK, candidates != 0u)) continue;
        // This lane's candidates are numbered before .. before + popc - 1 among the step's.
        u32 total;
        const u32 before = warp_exclusive_scan((u32)__popc(candidates), &total);
        for (u32 done = 0; done < total;) {  // once, unless the step has more than the queue holds
            const u32 room = (u32)(QUEUE_CAP - queued), put = min(room, total - done);
            u32 k = before;
            for (u32 rest = candidates; rest != 0u; rest &= rest - 1u, ++k)
                if (k - done < put) queue[queued + (k - done)] = (u32)(i + __ffs((int)rest) - 1);  // k < done wraps: skipped
            queued += (int)put;
            done += put;
            __syncwarp();
            while (queued >= 32) queued = fused_verify_round(s, queued, block_start, n, f, queue, emit);
        }
    }
    while (queued > 0) queued = fused_verify_round(s, queued, block_start, n, f, queue, emit);
}

// ------------------------------------------------------------ warp emitters --
// The fused scan calls emit.round(rel, matched) in every lane of a warp: lane by lane in
// position order, the block-relative offset of a candidate and the patterns found there
// (a bit mask, 0 for a lane without a candidate or a match).

struct WarpTallyEmit {  // per-pattern counts of the warp: lane q holds pattern q's
    u32 pattern_count;
    __device__ void round(u32, u32 matched) {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int q = 0; q < FUSED_MAX; ++q) {
            const u32 c = (u32)__popc(__ballot_sync(FULL_MASK, (matched >> q) & 1u));
            if (lane == q) pattern_count += c;
        }
    }
};

struct WarpCountEmit : WarpTallyEmit {  // count pass: also keep the first SLOTS_MAX as (q << 24 | rel)
    u32 count;  // the warp's matches (the same in every lane)
    u32* pool;  // the block's pool of kept matches, then the count of its chunks taken
    u32* warp;  // the warp's region: queue, per-pattern counts, then its chunks in order (u8; POOL_CHUNKS or more: none)
    __device__ u8* chunks() const {  // chunk numbers past 254 are stored as 255: none, like any >= POOL_CHUNKS
        return reinterpret_cast<u8*>(warp + QUEUE_CAP + FUSED_MAX);
    }
    __device__ u32* slot(u32 k) const {  // where the warp's k-th record goes (null: nowhere)
        const u32 chunk = k < (u32)SLOTS_MAX ? chunks()[k / POOL_CHUNK] : (u32)POOL_CHUNKS;
        return chunk < (u32)POOL_CHUNKS ? pool + chunk * POOL_CHUNK + k % POOL_CHUNK : nullptr;
    }
    __device__ u32 record(u32 k) const { return *slot(k); }
    __device__ void round(u32 rel, u32 matched) {
        WarpTallyEmit::round(rel, matched);
        const int lane = threadIdx.x & 31;
        u32 total;
        u32 k = count + warp_exclusive_scan((u32)__popc(matched), &total);
        const u32 have = (min(count, (u32)SLOTS_MAX) + POOL_CHUNK - 1) / POOL_CHUNK;
        const u32 need = (min(count + total, (u32)SLOTS_MAX) + POOL_CHUNK - 1) / POOL_CHUNK;
        if (need > have) {  // more chunks, numbered from the pool's count (lane `have` .. `need` - 1 each lists one)
            u32 first = 0u;
            if (lane == 0) first = atomicAdd(pool + POOL_CHUNKS * POOL_CHUNK, need - have);
            first = __shfl_sync(FULL_MASK, first, 0);
            if ((u32)lane >= have && (u32)lane < need) chunks()[lane] = (u8)min(first + (u32)lane - have, 255u);
            __syncwarp();
        }
        for (u32 rest = matched; rest != 0u; rest &= rest - 1u, ++k) {
            u32* const place = slot(k);
            if (place != nullptr) *place = ((u32)(__ffs((int)rest) - 1) << REL_BITS) | rel;
        }
        count += total;
    }
};

struct WarpWriteEmit {  // write pass (a rescan's second scan, a kept block's records): positions to their places
    i64* const* outs;
    i64 next;  // lane q: where pattern q's next position goes
    i64 base;
    __device__ void round(u32 rel, u32 matched) {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int q = 0; q < FUSED_MAX; ++q) {
            const u32 ballot = __ballot_sync(FULL_MASK, (matched >> q) & 1u);
            if (ballot == 0u) continue;
            const i64 first = __shfl_sync(FULL_MASK, next, q);
            if ((matched >> q) & 1u) outs[q][first + __popc(ballot & ((1u << lane) - 1u))] = base + (i64)rel;
            if (lane == q) next += __popc(ballot);
        }
    }
};

// ------------------------------------------------------------- block plumbing --

template <int ALGO, bool OPT>
struct Block {
    const u8* s;        // text of the block (tile in shared memory, or global)
    const u8* p;        // pattern(s)
    const short* table; // single-pattern tables
    Fused fused;
    u32* records;       // this thread's (single pattern) or the block's pool (fused)
    u32* queue;         // fused: the warp's candidate queue, then its per-pattern counts and chunk list
    u32* scratch;
    i64 start;          // first start position of the block
    int span;           // start positions in the block
    int g;              // start positions per thread (fused: 32 g per warp)
    int lo, hi;         // this thread's (single pattern; the fused scan works by warps)
};

// Sets up the block: shared layout, staging of pattern, tables and text (optimized),
// the thread's chunk. Ends with a __syncthreads.
template <int ALGO, bool OPT>
__device__ Block<ALGO, OPT> setup(int b, const u8* text, i64 n, i64 end, int g, const u8* pat, int pattern_bytes, int m_max, const void* table_global) {
    Block<ALGO, OPT> blk;
    u8* sm = shared_base();
    const int T = blockDim.x, t = threadIdx.x;
    const int table_bytes = table_bytes_of(ALGO, ALGO == FUSED ? 0 : m_max);
    // The fused pass reads its patterns only to verify filter hits: from global memory
    // (cached), not staged, so that 8 long patterns do not cost every block 32 KB.
    const int staged_pattern = ALGO == FUSED ? 0 : pattern_bytes;
    const Layout l = layout(T, record_words(ALGO, T), g, staged_pattern, table_bytes, m_max, OPT);
    if (ALGO == FUSED) {
        blk.records = reinterpret_cast<u32*>(sm + l.records);
        blk.queue = blk.records + POOL_WORDS + (t >> 5) * WARP_WORDS;
        if (t == 0) blk.records[POOL_CHUNKS * POOL_CHUNK] = 0u;  // no chunk taken
    } else {
        blk.records = reinterpret_cast<u32*>(sm + l.records) + t * RECORDS_PER_THREAD;
        blk.queue = nullptr;
    }
    blk.scratch = reinterpret_cast<u32*>(sm + l.scratch);
    blk.start = (i64)b * T * g;
    const i64 remaining = end - blk.start;
    blk.span = remaining <= 0 ? 0 : (int)(remaining < (i64)T * g ? remaining : (i64)T * g);
    blk.g = g;
    blk.lo = t * g;
    blk.hi = min(blk.lo + g, blk.span);
    if (OPT) {
        // Pattern and table in 16-byte copies (the host pads both to a multiple of 16).
        u8* p_sh = sm + l.pattern;
        const uint4* pat4 = reinterpret_cast<const uint4*>(pat);
        for (int k = t; k < (staged_pattern + 15) >> 4; k += T) copy16_async(reinterpret_cast<uint4*>(p_sh) + k, pat4 + k);
        const uint4* tab4 = reinterpret_cast<const uint4*>(table_global);
        u8* tab_sh = sm + l.table;
        for (int k = t; k < (table_bytes + 15) >> 4; k += T) copy16_async(reinterpret_cast<uint4*>(tab_sh) + k, tab4 + k);
        // The text: start positions of the block + m_max - 1 bytes (never past n), in
        // 16-byte copies all in flight at once; the rest of the tile is zeroed (read,
        // never matched).
        const i64 want = blk.span > 0 ? (i64)blk.span + m_max - 1 : 0;
        const i64 have = n - blk.start;
        const int bytes = (int)(want < have ? want : (have > 0 ? have : 0));
        const int groups = (bytes + 15) >> 4;
        const uint4* src = reinterpret_cast<const uint4*>(text + blk.start);
        uint4* tile4 = reinterpret_cast<uint4*>(sm + l.tile);
        for (int k = t; k < groups; k += T) copy16_async(tile4 + k, src + k);
        const int tile_groups = (int)(l.tile_bytes >> 4);
        for (int k = groups + t; k < tile_groups; k += T) tile4[k] = make_uint4(0u, 0u, 0u, 0u);
        copies_wait();
        blk.s = sm + l.tile;
        blk.p = ALGO == FUSED ? pat : p_sh;
        blk.table = reinterpret_cast<const short*>(tab_sh);
    } else {
        blk.s = text + blk.start;
        blk.p = pat;
        blk.table = reinterpret_cast<const short*>(table_global);
    }
    if (ALGO == FUSED) {
        const u8* tab = OPT ? sm + l.table : reinterpret_cast<const u8*>(table_global);
        blk.fused.filter = tab;
        blk.fused.patterns = blk.p;
    }
    __syncthreads();
    if (ALGO == FUSED) {
        const int k = blk.fused.k();
        blk.fused.prefix_mask = k >= 4 ? 0xffffffffu : ((1u << (8 * k)) - 1u);
        blk.fused.coarse = reinterpret_cast<const u32*>(blk.fused.filter + FILTER_SIZE)[t & 31];
    }
    return blk;
}

template <int ALGO, bool OPT, class Emit>
__device__ __forceinline__ void scan(const Block<ALGO, OPT>& blk, i64 n, int m, u32 target, u32 power, Emit& emit) {
    if constexpr (ALGO == FUSED) {  // every thread: the scan works by warps (emit: a warp emitter)
        if (blk.fused.k() >= 4) fused_scan<true>(blk.s, blk.span, blk.g, blk.start, n, blk.fused, blk.queue, emit);
        else fused_scan<false>(blk.s, blk.span, blk.g, blk.start, n, blk.fused, blk.queue, emit);
        return;
    }
    if (blk.lo >= blk.hi) return;
    if constexpr (ALGO == RABIN_KARP) {
        if constexpr (OPT) rabin_karp_optimized(blk.s, blk.lo, blk.hi, blk.p, m, target, power, emit);
        else rabin_karp_naive(blk.s, blk.lo, blk.hi, blk.p, m, target, power, emit);
    } else if constexpr (ALGO == KMP) {
        if constexpr (OPT) kmp_optimized(blk.s, blk.lo, blk.hi, blk.p, m, blk.table, emit);
        else kmp_naive(blk.s, blk.lo, blk.hi, blk.p, m, blk.table, emit);
    } else if constexpr (ALGO == BOYER_MOORE) {
        if constexpr (OPT) boyer_moore_optimized(blk.s, blk.lo, blk.hi, blk.p, m, blk.table, blk.table + 256, emit);
        else boyer_moore_naive(blk.s, blk.lo, blk.hi, blk.p, m, blk.table, blk.table + 256, emit);
    }
}

// Count pass over the logical blocks first_block .. first_block + gridDim.x - 1 (a
// launch may cover all of them, or, while a text is being uploaded, those whose bytes
// have arrived). counts: [patterns][blocks] (int32); flags, slots: per logical block.
template <int ALGO, bool OPT>
__device__ void count_pass(const u8* text, i64 n, i64 end, int g, const u8* pat, int pattern_bytes, int m, int m_max, const void* table,
                           u32 target, u32 power, int* counts, int blocks, u8* flags, u32* slots, int K, int first_block) {
    const int b = first_block + (int)blockIdx.x;
    Block<ALGO, OPT> blk = setup<ALGO, OPT>(b, text, n, end, g, pat, pattern_bytes, m_max, table);
    const int t = threadIdx.x;
    u32* const block_slots = slots + (i64)b * K;
    if constexpr (ALGO == FUSED) {
        const int lane = t & 31;
        WarpCountEmit emit;
        emit.pattern_count = 0u;
        emit.count = 0u;
        emit.pool = blk.records;
        emit.warp = blk.queue;
        scan(blk, n, m, target, power, emit);
        u32* const warp_counts = blk.queue + QUEUE_CAP;  // read by warp 0 after the block scan's barriers
        if (lane < FUSED_MAX) warp_counts[lane] = emit.pattern_count;
        u32 total;
        const u32 before = warps_exclusive_scan(emit.count, blk.scratch, &total);
        // total <= K <= SLOTS_MAX: the pool held every record (see POOL_CHUNKS), with at
        // most FUSED_WARPS_MAX warps; the second test covers more
        const bool overflow = total > (u32)K || blk.records[POOL_CHUNKS * POOL_CHUNK] > (u32)POOL_CHUNKS;
        if (!overflow) {
            for (u32 k = lane; k < emit.count; k += 32) block_slots[before + k] = emit.record(k);
        }
        if (t == 0) flags[b] = total == 0u ? BLOCK_EMPTY : overflow ? BLOCK_RESCAN : BLOCK_KEPT;
        if (t < blk.fused.P()) {  // warp 0: the block's count of pattern t
            u32 sum = 0u;
            for (int w = 0; w < (int)(blockDim.x >> 5); ++w) sum += warp_counts[w * WARP_WORDS + t];
            counts[(i64)t * blocks + b] = (int)sum;
        }
    } else {
        CountEmit emit{0u, RECORDS_PER_THREAD, blk.records};
        scan(blk, n, m, target, power, emit);
        u32 total;
        const u32 before = block_exclusive_scan(emit.count, blk.scratch, &total);
        const bool overflow = __syncthreads_or(emit.count > RECORDS_PER_THREAD) || total > (u32)K;
        if (!overflow) {
            for (u32 k = 0; k < emit.count; ++k) block_slots[before + k] = emit.records[k];
        }
        if (t == 0) {
            flags[b] = total == 0u ? BLOCK_EMPTY : overflow ? BLOCK_RESCAN : BLOCK_KEPT;
            counts[b] = (int)total;
        }
    }
}

// Write pass of a kept logical block b (its matches are in slots, in position order): by
// one warp. offsets: inclusive prefix sums of counts, per pattern; outs: per pattern.
// Fused: the records mix patterns; 32 at a time go through the rescan's WarpWriteEmit,
// which ranks each among those of its pattern.
template <int ALGO>
__device__ void write_kept(int b, int g, const int* counts, int blocks, const u32* slots, int K, const i64* offsets, i64* const* outs, int P) {
    const int lane = threadIdx.x & 31;
    const i64 block_start = (i64)b * blockDim.x * g;
    const u32* records = slots + (i64)b * K;
    if (ALGO != FUSED) {
        const int total = counts[b];
        const i64 first = offsets[b] - total;
        for (int k = lane; k < total; k += 32) outs[0][first + k] = block_start + (i64)(records[k] & REL_MASK);
        return;
    }
    WarpWriteEmit write{outs, 0, block_start};
    int total = 0;
    for (int q = 0; q < P; ++q) {
        const int c = counts[(i64)q * blocks + b];
        if (lane == q) write.next = offsets[(i64)q * blocks + b] - c;
        total += c;
    }
    for (int base = 0; base < total; base += 32) {
        const int k = base + lane;
        const u32 record = k < total ? records[k] : 0u;
        write.round(record & REL_MASK, k < total ? 1u << (record >> REL_BITS) : 0u);
    }
}

// Write pass of a flagged logical block b: scan its text again, count per thread (fused:
// per warp and pattern), place, scan once more writing. Every thread of the block calls
// it with the same b.
template <int ALGO, bool OPT>
__device__ void write_rescan(int b, const u8* text, i64 n, i64 end, int g, const u8* pat, int pattern_bytes, int m, int m_max, const void* table,
                             u32 target, u32 power, const int* counts, int blocks, const i64* offsets, i64* const* outs, int P) {
    Block<ALGO, OPT> blk = setup<ALGO, OPT>(b, text, n, end, g, pat, pattern_bytes, m_max, table);
    if constexpr (ALGO == FUSED) {
        const int lane = threadIdx.x & 31;
        WarpTallyEmit tally{0u};
        scan(blk, n, m, target, power, tally);
        WarpWriteEmit write;
        write.outs = outs;
        write.next = 0;
        write.base = blk.start;
        for (int q = 0; q < P; ++q) {  // the warps' counts of pattern q, in order
            const u32 mine = __shfl_sync(FULL_MASK, tally.pattern_count, q);
            u32 sum;
            const u32 before = warps_exclusive_scan(mine, blk.scratch, &sum);
            if (lane == q) write.next = offsets[(i64)q * blocks + b] - counts[(i64)q * blocks + b] + before;
        }
        scan(blk, n, m, target, power, write);
    } else {
        TallyEmit tally{0u};
        scan(blk, n, m, target, power, tally);
        u32 sum;
        const u32 before = block_exclusive_scan(tally.count, blk.scratch, &sum);
        WriteEmit write{outs[0], offsets[b] - counts[b] + before, blk.start};
        scan(blk, n, m, target, power, write);
    }
    __syncthreads();  // the next logical block may stage over this one's shared memory
}

// The write kernel: a grid of a few waves instead of one CUDA block per logical block,
// most of which, for a rare pattern, have nothing to write. Each CUDA block takes a
// contiguous range of logical blocks, T at a time: their flags in one coalesced load, the
// busy ones listed in order (a block scan); then the kept ones a warp each, the flagged
// ones (rare) the whole block each.
template <int ALGO, bool OPT>
__device__ void write_pass(const u8* text, i64 n, i64 end, int g, const u8* pat, int pattern_bytes, int m, int m_max, const void* table,
                           u32 target, u32 power, const int* counts, int blocks, const u8* flags, const u32* slots, int K,
                           const i64* offsets, i64* const* outs, int P) {
    __shared__ int busy[MAX_THREADS];
    __shared__ u32 busy_scratch[33];
    const int t = threadIdx.x, T = blockDim.x, warp = t >> 5, warps = T >> 5;
    const int per = (blocks + gridDim.x - 1) / gridDim.x;
    const int first = min((int)blockIdx.x * per, blocks), last = min(first + per, blocks);
    for (int base = first; base < last; base += T) {
        const int b = base + t;
        const u8 flag = b < last ? flags[b] : (u8)BLOCK_EMPTY;
        u32 busy_count;
        const u32 slot = block_exclusive_scan(flag != BLOCK_EMPTY ? 1u : 0u, busy_scratch, &busy_count);
        if (flag != BLOCK_EMPTY) busy[slot] = flag == BLOCK_KEPT ? b : -1 - b;  // flagged: -1 - b
        const bool any_rescan = __syncthreads_or(flag == BLOCK_RESCAN);
        for (u32 k = warp; k < busy_count; k += warps)
            if (busy[k] >= 0) write_kept<ALGO>(busy[k], g, counts, blocks, slots, K, offsets, outs, P);
        if (any_rescan) {
            for (u32 k = 0; k < busy_count; ++k)
                if (busy[k] < 0)
                    write_rescan<ALGO, OPT>(-1 - busy[k], text, n, end, g, pat, pattern_bytes, m, m_max, table, target, power, counts, blocks, offsets, outs, P);
        }
        __syncthreads();  // busy[] is rewritten by the next round
    }
}

// Inclusive prefix sums of each pattern's per-block counts (the fused pass; one pattern
// uses CUB): offsets[q][b] = counts[q][0] + .. + counts[q][b] (int64), totals[q] = the
// last. `segments` CUDA blocks per pattern, so that the work spreads over the SMs: each
// sums the counts before its segment itself (coalesced reads of at most the whole row,
// which is small: 4 bytes per logical block), then scans its segment a block-width of
// counts at a time.
extern "C" __global__ void block_offsets(const int* counts, int blocks, int segments, i64* offsets, i64* totals) {
    __shared__ i64 scratch[33];
    const int t = threadIdx.x, T = blockDim.x;
    const int pattern = blockIdx.x / segments, segment = blockIdx.x % segments;
    const int* row = counts + (i64)pattern * blocks;
    i64* out = offsets + (i64)pattern * blocks;
    const int per = (blocks + segments - 1) / segments;
    const int lo = min(segment * per, blocks), hi = min(lo + per, blocks);
    i64 sum = 0;
#pragma unroll 4
    for (int b = t; b < lo; b += T) sum += row[b];
    i64 run;
    block_exclusive_scan(sum, scratch, &run);  // run: the counts before the segment
    for (int base = lo; base < hi; base += T) {
        const int b = base + t;
        const i64 count = b < hi ? row[b] : 0;
        i64 tile;
        const i64 before = block_exclusive_scan(count, scratch, &tile);
        if (b < hi) out[b] = run + before + count;
        run += tile;
    }
    if (segment == segments - 1 && t == 0) totals[pattern] = run;
}

// ------------------------------------------------------------------ entry points --

#define SINGLE_KERNELS(NAME, ALGO, OPT)                                                                                          \
    extern "C" __global__ void count_##NAME(const u8* text, i64 n, i64 end, int g, const u8* pat, int m, const short* table,      \
                                            u32 target, u32 power, int* counts, int blocks, u8* flags, u32* slots, int K,          \
                                            int first_block) {                                                                    \
        count_pass<ALGO, OPT>(text, n, end, g, pat, m, m, m, table, target, power, counts, blocks, flags, slots, K, first_block); \
    }                                                                                                                             \
    extern "C" __global__ void write_##NAME(const u8* text, i64 n, i64 end, int g, const u8* pat, int m, const short* table,      \
                                            u32 target, u32 power, const int* counts, int blocks, const u8* flags,                 \
                                            const u32* slots, int K, const i64* offsets, i64* out) {                               \
        i64* outs[1] = {out};                                                                                                     \
        write_pass<ALGO, OPT>(text, n, end, g, pat, m, m, m, table, target, power, counts, blocks, flags, slots, K, offsets, outs, 1); \
    }

SINGLE_KERNELS(rabin_karp_naive, RABIN_KARP, false)
SINGLE_KERNELS(rabin_karp_optimized, RABIN_KARP, true)
SINGLE_KERNELS(kmp_naive, KMP, false)
SINGLE_KERNELS(kmp_optimized, KMP, true)
SINGLE_KERNELS(boyer_moore_naive, BOYER_MOORE, false)
SINGLE_KERNELS(boyer_moore_optimized, BOYER_MOORE, true)

// Fused: patterns concatenated (pattern_bytes in all), table = filter u8[FILTER_SIZE] +
// coarse u32[32] + meta int32[META_INTS]; end = n - shortest + 1; counts, offsets: [P][blocks].
extern "C" __global__ void count_fused(const u8* text, i64 n, i64 end, int g, const u8* patterns, int pattern_bytes, int m_max,
                                       const u8* table, int* counts, int blocks, u8* flags, u32* slots, int K, int first_block) {
    count_pass<FUSED, true>(text, n, end, g, patterns, pattern_bytes, 0, m_max, table, 0u, 0u, counts, blocks, flags, slots, K, first_block);
}

// out: every pattern's positions, pattern after pattern (pattern q's totals[q] of them
// after those of patterns 0 .. q - 1).
extern "C" __global__ void write_fused(const u8* text, i64 n, i64 end, int g, const u8* patterns, int pattern_bytes, int m_max,
                                       const u8* table, const int* counts, int blocks, const u8* flags, const u32* slots, int K,
                                       const i64* offsets, const i64* totals, i64* out, int P) {
    __shared__ i64* outs[FUSED_MAX];  // shared, not a local array: indexed by pattern at run time
    if (threadIdx.x == 0) {
        i64 start = 0;
        for (int q = 0; q < P; ++q) {
            outs[q] = out + start;
            start += totals[q];
        }
    }
    __syncthreads();
    write_pass<FUSED, true>(text, n, end, g, patterns, pattern_bytes, 0, m_max, table, 0u, 0u, counts, blocks, flags, slots, K, offsets, outs, P);
}

// ------------------------------------------------------------------ line numbers --
// Newlines per segment of LINE_SEGMENT bytes (one warp per segment, a 16-byte load per
// lane); the host turns them into an exclusive prefix sum; then the line of a position is
// 1 + newlines before its segment + newlines in its segment before it.

#define LINE_SEGMENT 512

__device__ __forceinline__ u32 newlines16(const u8* text, i64 offset, i64 limit) {  // in [offset, min(offset + 16, limit))
    if (offset >= limit) return 0u;
    u32 mask = equal_mask16(*reinterpret_cast<const uint4*>(text + offset), 0x0a0a0a0au);
    const i64 valid = limit - offset;
    if (valid < 16) mask &= (1u << (u32)valid) - 1u;
    return (u32)__popc(mask);
}

extern "C" __global__ void newline_counts(const u8* text, i64 n, int* segment_counts, i64 segments) {
    const i64 segment = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (segment >= segments) return;  // whole warps
    u32 c = newlines16(text, segment * LINE_SEGMENT + lane * 16, n);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) c += __shfl_xor_sync(FULL_MASK, c, d);
    if (lane == 0) segment_counts[segment] = (int)c;
}

extern "C" __global__ void line_numbers(const u8* text, const i64* positions, i64 count, const i64* segment_before, i64* lines) {
    const i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= count) return;
    const i64 p = positions[k];
    const i64 segment = p / LINE_SEGMENT;
    i64 line = 1 + segment_before[segment];
    for (i64 offset = segment * LINE_SEGMENT; offset < p; offset += 16) line += newlines16(text, offset, p);
    lines[k] = line;
}
