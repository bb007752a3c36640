// The kernels of gpu/cs256/cs256.cu (CS256_SOURCE) behind the emulator's C entry point
// (tests/gpu/emulator/emu.h: emu_launch), for tests/gpu/cs256/test_emulated.py.
#include "emu.h"

#include CS256_SOURCE

#define GROUP_K(X, TAG, W) \
    X(cs256_group_##TAG##_w##W##_k1) X(cs256_group_##TAG##_w##W##_k2) X(cs256_group_##TAG##_w##W##_k4) X(cs256_group_##TAG##_w##W##_k8) X(cs256_group_##TAG##_w##W##_k16)
#define SPLIT4_V(X, TAG) X(cs256_split4_##TAG##_v4) X(cs256_split4_##TAG##_v8) X(cs256_split4_##TAG##_v16)
#define KERNELS(X)                                                                                              \
    GROUP_K(X, f16, 4) GROUP_K(X, f16, 8) GROUP_K(X, bf16, 4) GROUP_K(X, bf16, 8) GROUP_K(X, f32, 4) GROUP_K(X, f32, 8) \
    SPLIT4_V(X, f16) SPLIT4_V(X, bf16) SPLIT4_V(X, f32) X(cs256_read_rows)

EMU_ENTRY_POINT(KERNELS)
