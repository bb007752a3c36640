// The kernels of gpu/pencil/pencil.cu (PENCIL_SOURCE, its dynamic shared memory read
// through shared_base(): tests/gpu/emulator/library.py with_dynamic_shared) behind the
// emulator's 2-D entry point (tests/gpu/emulator/emu.h: emu_launch_dims), for
// tests/gpu/pencil/test_emulated.py.
#include "emu.h"

#include PENCIL_SOURCE

#define KERNELS(X)                                                                                                 \
    X(luma_histogram) X(median_gradient) X(line_label_tiled) X(line_label_global) X(line_strokes_tiled)            \
    X(line_strokes_global) X(matching_lut) X(fit_tone) X(tone_columns) X(tone_rows) X(structure_rows)              \
    X(hatch_texture) X(stroke_rows) X(stroke_columns) X(cg_start) X(cg_direction) X(cg_update) X(cross_hatch) X(merge)

EMU_DIMS_ENTRY_POINT(KERNELS)
