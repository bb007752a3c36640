// A CPU emulation of the CUDA execution model, enough to run gpu/search/search.cu on a
// machine without a GPU (tests/gpu/search/test_emulated.py). Each CUDA thread of a block
// is a std::thread; __syncthreads is a barrier of the block's threads and the warp
// intrinsics a barrier of the warp's 32 (so a divergent __syncthreads or shuffle
// deadlocks, as it may on the device: the test runs under a timeout). Blocks run one
// after another on the same threads, shared memory refilled with garbage between them.
// Not a simulator of timing, memory ordering or bank conflicts: it checks the logic.
#pragma once
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#define SEARCH_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
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

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
inline thread_local EmuBlock* emu_block = nullptr;

inline unsigned char* shared_base() { return emu_block->smem; }
inline void __syncthreads() { emu_block->bar->arrive_and_wait(); }
inline int __syncthreads_or(int p) {
    __syncthreads();
    if (p) emu_block->or_flag.store(1);
    __syncthreads();
    const int r = emu_block->or_flag.load();
    __syncthreads();
    if (threadIdx.x == 0) emu_block->or_flag.store(0);
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
    EmuWarp& w = *emu_block->warps[threadIdx.x >> 5];
    const int lane = threadIdx.x & 31;
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
    const int lane = threadIdx.x & 31;
    return emu_exchange(v, lane >= d ? lane - d : lane);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int d) {
    emu_check_mask(mask);
    return emu_exchange(v, ((int)(threadIdx.x & 31) ^ d) & 31);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    emu_check_mask(mask);
    EmuWarp& w = *emu_block->warps[threadIdx.x >> 5];
    w.slots[threadIdx.x & 31] = pred ? 1 : 0;
    w.bar.arrive_and_wait();
    unsigned r = 0;
    for (int k = 0; k < 32; ++k) r |= (unsigned)(w.slots[k] & 1) << k;
    w.bar.arrive_and_wait();
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) { return (unsigned)(((((uint64_t)hi) << 32) | lo) >> (shift & 31)); }
inline int __ffs(int x) { return x == 0 ? 0 : __builtin_ctz((unsigned)x) + 1; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
template <class T>
inline T min(T a, T b) { return a < b ? a : b; }
template <class T>
inline T max(T a, T b) { return a > b ? a : b; }

template <class... A>
void emu_run(void (*kernel)(A...), void** args, unsigned grid, unsigned block, unsigned smem_bytes) {
    std::vector<unsigned char> smem(smem_bytes + 64);
    unsigned char* base = (unsigned char*)(((uintptr_t)smem.data() + 15) & ~(uintptr_t)15);
    EmuBlock blk;
    blk.bar = std::make_unique<std::barrier<>>(block);
    for (unsigned w = 0; w < block / 32; ++w) blk.warps.push_back(std::make_unique<EmuWarp>());
    blk.smem = base;
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned t = 0; t < block; ++t) {
        threads.emplace_back([&, t]() {
            threadIdx.x = t;
            blockDim.x = block;
            gridDim.x = grid;
            emu_block = &blk;
            for (unsigned b = 0; b < grid; ++b) {
                if (t == 0) std::memset(base, 0xCD, smem_bytes);
                blk.bar->arrive_and_wait();
                blockIdx.x = b;
                [&]<size_t... I>(std::index_sequence<I...>) {
                    kernel(*reinterpret_cast<std::remove_reference_t<A>*>(args[I])...);
                }(std::index_sequence_for<A...>{});
                blk.bar->arrive_and_wait();
            }
        });
    }
    for (auto& th : threads) th.join();
}

template <class... A>
int emu_arity(void (*)(A...), int* sizes) {
    const int s[] = {(int)sizeof(A)...};
    for (size_t k = 0; k < sizeof...(A); ++k) sizes[k] = s[k];
    return (int)sizeof...(A);
}
