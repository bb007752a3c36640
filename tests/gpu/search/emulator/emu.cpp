// The kernels of gpu/search/search.cu (SEARCH_SOURCE) behind one C entry point for
// ctypes: emu_launch(name, grid, block, shared bytes, argument pointers, argument sizes).
// Returns 0, or -1 for an unknown kernel, -2 for a wrong argument count, -100 - k when
// argument k has the wrong size (a Python int where a 64-bit value is expected, ...).
#include "emu.h"

#include <string>

#include SEARCH_SOURCE

#define KERNELS(X)                                                                                                             \
    X(count_rabin_karp_naive) X(write_rabin_karp_naive) X(count_rabin_karp_optimized) X(write_rabin_karp_optimized)            \
    X(count_kmp_naive) X(write_kmp_naive) X(count_kmp_optimized) X(write_kmp_optimized) X(count_boyer_moore_naive)             \
    X(write_boyer_moore_naive) X(count_boyer_moore_optimized) X(write_boyer_moore_optimized) X(count_fused) X(write_fused)     \
    X(newline_counts) X(line_numbers)

extern "C" int emu_launch(const char* name, unsigned grid, unsigned block, unsigned smem, void** args, const int* sizes, int nargs) {
    const std::string n(name);
#define TRY(K)                                                    \
    if (n == #K) {                                                \
        int s[64];                                                \
        const int a = emu_arity(K, s);                            \
        if (a != nargs) return -2;                                \
        for (int k = 0; k < a; ++k)                               \
            if (s[k] != sizes[k]) return -100 - k;                \
        emu_run(K, args, grid, block, smem);                      \
        return 0;                                                 \
    }
    KERNELS(TRY)
    return -1;
}
