// The kernels of gpu/search/search.cu (SEARCH_SOURCE) behind the emulator's C entry point
// (tests/gpu/emulator/emu.h: emu_launch).
#include "emu.h"

#include SEARCH_SOURCE

#define KERNELS(X)                                                                                                             \
    X(count_rabin_karp_naive) X(write_rabin_karp_naive) X(count_rabin_karp_optimized) X(write_rabin_karp_optimized)            \
    X(count_kmp_naive) X(write_kmp_naive) X(count_kmp_optimized) X(write_kmp_optimized) X(count_boyer_moore_naive)             \
    X(write_boyer_moore_naive) X(count_boyer_moore_optimized) X(write_boyer_moore_optimized) X(count_fused) X(write_fused)     \
    X(newline_counts) X(line_numbers) X(block_offsets)

EMU_ENTRY_POINT(KERNELS)
