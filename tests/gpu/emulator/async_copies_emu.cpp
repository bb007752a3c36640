// Kernels that exercise the emulator's cp.async stand-in (emu.h) itself, for
// tests/gpu/emulator/test_async_copies.py: what a thread reads of its copies' destinations
// before and after its waits.
#include "emu.h"

// Each thread copies its 16 bytes of src into shared memory in two groups (the first 8
// bytes, then the last 8) and records what it reads there: before any wait (seen[0]),
// after wait_group(1) (seen[1]: the first group landed, the second not), after wait_all
// (seen[2]: both). seen: (3, threads, 16) bytes.
extern "C" __global__ void stage_in_groups(const unsigned char* src, unsigned char* seen) {
    unsigned char* mine = shared_base() + threadIdx.x * 16;
    const unsigned char* from = src + threadIdx.x * 16;
    emu_copy_async(mine, from, 8);
    emu_async_commit();
    emu_copy_async(mine + 8, from + 8, 8);
    emu_async_commit();
    const unsigned stride = blockDim.x * 16;
    std::memcpy(seen + threadIdx.x * 16, mine, 16);
    emu_async_wait_group(1);
    std::memcpy(seen + stride + threadIdx.x * 16, mine, 16);
    emu_async_wait_all();
    std::memcpy(seen + 2 * stride + threadIdx.x * 16, mine, 16);
}

// Copies issued and never waited for: they end with their block, never landing, not even
// at the next block's first wait (after which it reads the destination).
// seen: (blocks, threads, 16) bytes.
extern "C" __global__ void never_waited(const unsigned char* src, unsigned char* seen) {
    unsigned char* mine = shared_base() + threadIdx.x * 16;
    emu_async_wait_all();
    std::memcpy(seen + (blockIdx.x * blockDim.x + threadIdx.x) * 16, mine, 16);
    emu_copy_async(mine, src + threadIdx.x * 16, 16);
}

#define KERNELS(X) X(stage_in_groups) X(never_waited)
EMU_ENTRY_POINT(KERNELS)
