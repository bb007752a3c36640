// A CPU emulation of the CUDA execution model, enough to run the kernels of gpu/*/*.cu on
// a machine without a GPU (tests/gpu/*/test_emulated.py). Each CUDA thread of a block
// is a std::thread; __syncthreads is a barrier of the block's threads and the warp
// intrinsics a barrier of the warp's 32 (so a divergent __syncthreads or shuffle
// deadlocks, as it may on the device: EmuWatchdog then ends the launch). Blocks run one
// after another on the same threads, shared memory refilled with garbage between them.
// Not a simulator of timing, memory ordering or bank conflicts: it checks the logic.
// A kernel source sees CUDA_EMULATION defined (and __CUDA_ARCH__ not): dynamic shared
// memory is shared_base(), static __shared__ arrays are function statics (one block runs
// at a time), inline PTX must sit behind #if defined(__CUDA_ARCH__). A cp.async wrapper
// calls emu_copy_async / emu_async_wait_all under CUDA_EMULATION (see below): its copies
// land late, at the wait, so a missing wait reads poison here as it may on the device.
#pragma once
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#define CUDA_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) double2 {
    double x, y;
};
#define __noinline__ __attribute__((noinline))
using std::abs;  // CUDA's abs has float and double overloads; C's takes an int
using std::isinf;
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline long long clock64() {  // a tick per call: spin loops end
    static thread_local long long ticks = 0;
    return ticks++;
}
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct EmuWarp {
    std::barrier<> bar{32};
    uint64_t slots[32];
};
struct EmuBlock {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<EmuWarp>> warps;
    std::atomic<int> or_flag{0};
    unsigned char* smem;
};

// Every byte of shared memory at a block's start, and of a cp.async destination before its
// wait: -12851 as int16 (a skip table read too early still moves forward, where 0xFF, -1,
// would stall the search kernels' loops), -23.2 as float16, -4.3e8 as bfloat16 and float32.
inline constexpr unsigned char EMU_GARBAGE = 0xCD;

inline thread_local dim3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim, gridDim;
// The thread's rank in its block (x fastest), as CUDA numbers lanes and warps.
inline unsigned emu_rank() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline thread_local EmuBlock* emu_block = nullptr;

inline unsigned char* shared_base() { return emu_block->smem; }
inline void __syncthreads() { emu_block->bar->arrive_and_wait(); }
inline int __syncthreads_or(int p) {
    __syncthreads();
    if (p) emu_block->or_flag.store(1);
    __syncthreads();
    const int r = emu_block->or_flag.load();
    __syncthreads();
    if (emu_rank() == 0) emu_block->or_flag.store(0);
    return r;
}
inline void emu_check_mask(unsigned mask) {
    if (mask != 0xffffffffu) {
        std::fprintf(stderr, "emulator: warp intrinsic with a partial mask\n");
        std::abort();
    }
}
template <class T>
inline T emu_exchange(T v, int src) {
    EmuWarp& w = *emu_block->warps[emu_rank() >> 5];
    const int lane = emu_rank() & 31;
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    w.slots[lane] = bits;
    w.bar.arrive_and_wait();
    const uint64_t got = w.slots[src];
    w.bar.arrive_and_wait();
    T r;
    std::memcpy(&r, &got, sizeof(T));
    return r;
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, int d) {
    emu_check_mask(mask);
    const int lane = emu_rank() & 31;
    return emu_exchange(v, lane >= d ? lane - d : lane);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int src) {  // src: bits 0..4 name the lane
    emu_check_mask(mask);
    return emu_exchange(v, src & 31);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int d) {
    emu_check_mask(mask);
    return emu_exchange(v, ((int)(emu_rank() & 31) ^ d) & 31);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, int d) {
    emu_check_mask(mask);
    const int lane = emu_rank() & 31;
    return emu_exchange(v, lane + d < 32 ? lane + d : lane);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu_check_mask(mask);
    EmuWarp& w = *emu_block->warps[emu_rank() >> 5];
    w.slots[emu_rank() & 31] = pred ? 1 : 0;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    for (int k = 0; k < 32; ++k) r |= (unsigned)(w.slots[k] & 1) << k;
    w.bar.arrive_and_wait();
    return r;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0u; }
inline void __syncwarp() { emu_block->warps[emu_rank() >> 5]->bar.arrive_and_wait(); }
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) { return (unsigned)(((((uint64_t)hi) << 32) | lo) >> (shift & 31)); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline int __ffs(int x) { return x == 0 ? 0 : __builtin_ctz((unsigned)x) + 1; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
    std::atomic_ref<unsigned> a(*p);
    unsigned old = a.load();
    while (v > old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T __ldg(const T* p) { return *p; }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
// IEEE single, round to nearest: the host's float arithmetic (SSE, no contraction
// without -mfma), as these intrinsics are on the GPU.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
template <class T>
inline T min(T a, T b) { return a < b ? a : b; }
template <class T>
inline T max(T a, T b) { return a > b ? a : b; }

// ---------------------------------------------- asynchronous copies (cp.async) --
// cp.async copies global to shared memory in the background: its destination holds
// nothing reliable until the issuing thread has waited for the copy's group. Here a copy
// reads its source at once, poisons its destination (every byte EMU_GARBAGE, what shared
// memory holds at a block's start) and writes the data only at the issuing thread's wait
// that covers it:
//   emu_copy_async(dst, src, bytes)   cp.async.{ca,cg}.shared.global [dst], [src], bytes
//   emu_async_commit()                cp.async.commit_group (the open copies become a group)
//   emu_async_wait_group(n)           cp.async.wait_group n (all but the n newest groups land)
//   emu_async_wait_all()              cp.async.wait_all (commit, then every group lands)
// So a read before its wait (a wait left out, or a group waited for too late) sees
// poison. Copies pending when the thread leaves its block are dropped: nothing can read
// them legally. Each thread keeps its own (thread_local) list, as each thread's waits cover
// only its own copies on the device; a __syncthreads after the waits publishes them.

struct EmuAsyncCopy {
    unsigned char* dst;
    unsigned char data[16];
    int bytes;
    long long group;  // the index of the commit that closes it (the open group: emu_async_committed)
};
inline thread_local std::vector<EmuAsyncCopy> emu_async_pending;
inline thread_local long long emu_async_committed = 0;  // groups committed in this block

inline void emu_copy_async(void* dst, const void* src, int bytes) {
    if (bytes != 4 && bytes != 8 && bytes != 16) {
        std::fprintf(stderr, "emulator: cp.async of %d bytes (4, 8 or 16)\n", bytes);
        std::abort();
    }
    if (((uintptr_t)dst | (uintptr_t)src) % (uintptr_t)bytes) {
        std::fprintf(stderr, "emulator: cp.async of %d bytes with an unaligned address\n", bytes);
        std::abort();
    }
    EmuAsyncCopy copy{(unsigned char*)dst, {}, bytes, emu_async_committed};
    std::memcpy(copy.data, src, bytes);
    std::memset(dst, EMU_GARBAGE, bytes);
    emu_async_pending.push_back(copy);
}
inline void emu_async_commit() { ++emu_async_committed; }
inline void emu_async_wait_group(int n) {
    const long long landed_below = emu_async_committed - n;  // groups older than the n newest
    std::vector<EmuAsyncCopy> still;
    for (const EmuAsyncCopy& c : emu_async_pending) {
        if (c.group < landed_below) std::memcpy(c.dst, c.data, c.bytes);
        else still.push_back(c);
    }
    emu_async_pending.swap(still);
}
inline void emu_async_wait_all() {
    emu_async_commit();
    emu_async_wait_group(0);
}
inline void emu_async_drop() {  // the block ends
    emu_async_pending.clear();
    emu_async_committed = 0;
}

// Ends the process (abort, with a message) when a launch runs past EMU_LAUNCH_LIMIT_S
// seconds (default 60; tests launch in well under a second): a hang (a divergent barrier,
// or a loop steered by data read before its wait) then fails at once, not at the test's
// timeout. One per launch: `EmuWatchdog watchdog(name);` before the threads start.
class EmuWatchdog {
  public:
    explicit EmuWatchdog(const char* what) : what_(what), thread_([this] { watch(); }) {}
    ~EmuWatchdog() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            done_ = true;
        }
        wake_.notify_one();
        thread_.join();
    }

  private:
    static double limit_s() {
        const char* text = std::getenv("EMU_LAUNCH_LIMIT_S");
        return text != nullptr && std::atof(text) > 0 ? std::atof(text) : 60.0;
    }
    void watch() {
        std::unique_lock<std::mutex> lock(mutex_);
        const double limit = limit_s();
        if (!wake_.wait_for(lock, std::chrono::duration<double>(limit), [this] { return done_; })) {
            std::fprintf(stderr, "emulator: %s ran past %.0f s (EMU_LAUNCH_LIMIT_S): a hang\n", what_, limit);
            std::fflush(stderr);
            std::abort();
        }
    }
    const char* what_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool done_ = false;
    std::thread thread_;  // last: starts once the members above exist
};

template <class... A>
int emu_arity(void (*)(A...), int* sizes) {
    const int s[] = {(int)sizeof(A)...};
    for (size_t k = 0; k < sizeof...(A); ++k) sizes[k] = s[k];
    return (int)sizeof...(A);
}

// The C entry point of a kernel library for ctypes (tests/gpu/emulator/launch.py):
// emu_launch(name, grid, block, shared bytes, argument pointers, argument sizes). After
// `#define KERNELS(X) X(kernel_a) X(kernel_b) ...`, write EMU_ENTRY_POINT(KERNELS).
// Returns 0, or -1 for an unknown kernel, -2 for a wrong argument count, -100 - k when
// argument k has the wrong size (a Python int where a 64-bit value is expected, ...).
#define EMU_TRY_KERNEL(K)                                          \
    if (emu_name == #K) {                                          \
        int s[64];                                                 \
        const int a = emu_arity(K, s);                             \
        if (a != nargs) return -2;                                 \
        for (int k = 0; k < a; ++k)                                \
            if (s[k] != sizes[k]) return -100 - k;                 \
        emu_run_dims(K, args, grid, block, smem, #K);              \
        return 0;                                                  \
    }
#define EMU_ENTRY_POINT(LIST)                                                                                                  \
    extern "C" int emu_launch(const char* name, unsigned grid_x, unsigned block_x, unsigned smem, void** args, const int* sizes, \
                              int nargs) {                                                                                     \
        const std::string emu_name(name);                                                                                      \
        const dim3 grid{grid_x, 1, 1}, block{block_x, 1, 1};                                                                   \
        LIST(EMU_TRY_KERNEL)                                                                                                   \
        return -1;                                                                                                             \
    }

// ------------------------------------------------ 2-D and 3-D grids and blocks --
// emu_run_dims runs every launch, 1-D ones (EMU_ENTRY_POINT) as dim3{n, 1, 1}
// (gpu/pencil/pencil.cu launches 32 x 8 blocks on 2-D grids): thread t of a block is
// (t % x, t / x % y, t / (x y)) and its warp t / 32, as on the device; blocks run one
// after another, x fastest (with EMU_BLOCK_ORDER=reverse in the environment, last first).
// EMU_DIMS_ENTRY_POINT(LIST) defines the C entry point emu_launch_dims(name, grid x, y, z,
// block x, y, z, shared bytes, argument pointers, argument sizes, count), with
// emu_launch's return codes (tests/gpu/emulator/library.py: launch_dims).
template <class... A>
void emu_run_dims(void (*kernel)(A...), void** args, dim3 grid, dim3 block, unsigned smem_bytes, const char* name = "a kernel") {
    EmuWatchdog watchdog(name);
    const unsigned threads = block.x * block.y * block.z, blocks = grid.x * grid.y * grid.z;
    // EMU_BLOCK_ORDER=reverse runs the last block first: a kernel whose blocks meet (the
    // last to arrive finishing the grid's work) must not depend on which one that is
    const char* order = std::getenv("EMU_BLOCK_ORDER");
    const bool reverse = order != nullptr && std::strcmp(order, "reverse") == 0;
    std::vector<unsigned char> smem(smem_bytes + 64);
    unsigned char* base = (unsigned char*)(((uintptr_t)smem.data() + 15) & ~(uintptr_t)15);
    EmuBlock blk;
    blk.bar = std::make_unique<std::barrier<>>(threads);
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) blk.warps.push_back(std::make_unique<EmuWarp>());
    blk.smem = base;
    std::vector<std::thread> workers;
    workers.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
        workers.emplace_back([&, t]() {
            threadIdx = dim3{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
            blockDim = block;
            gridDim = grid;
            emu_block = &blk;
            for (unsigned k = 0; k < blocks; ++k) {
                if (t == 0) std::memset(base, EMU_GARBAGE, smem_bytes);
                blk.bar->arrive_and_wait();
                const unsigned b = reverse ? blocks - 1 - k : k;
                blockIdx = dim3{b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y)};
                [&]<size_t... I>(std::index_sequence<I...>) {
                    kernel(*reinterpret_cast<std::remove_reference_t<A>*>(args[I])...);
                }(std::index_sequence_for<A...>{});
                emu_async_drop();
                blk.bar->arrive_and_wait();
            }
        });
    }
    for (auto& worker : workers) worker.join();
}

#define EMU_DIMS_ENTRY_POINT(LIST)                                                                                       \
    extern "C" int emu_launch_dims(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                                   unsigned bz, unsigned smem, void** args, const int* sizes, int nargs) {               \
        const std::string emu_name(name);                                                                                \
        const dim3 grid{gx, gy, gz}, block{bx, by, bz};                                                                  \
        LIST(EMU_TRY_KERNEL)                                                                                             \
        return -1;                                                                                                       \
    }
