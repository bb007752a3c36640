// The bidiagonalization kernels of gpu/svd/svd.cu (SVD_SOURCE, its dynamic shared memory
// rewritten by tests/gpu/emulator/library.py) behind the emulator's C entry point
// (tests/gpu/emulator/emu.h: emu_launch), for tests/gpu/svd/test_emulated.py.
#include "emu.h"

#include SVD_SOURCE

#define KERNELS(X)                                                                                                       \
    X(first_column_f32) X(left_step_f32) X(right_step_f32) X(first_column_f64) X(left_step_f64) X(right_step_f64) \
    X(next_panel_kernel)

EMU_ENTRY_POINT(KERNELS)
