#!/usr/bin/env bash
# Nsight Compute on the two line passes and the CG kernels of one 2560x1920 render
# (hardware counters; clocks left as found). Writes $OUT/ncu-lines.txt.
set -uo pipefail
out=${OUT:-/tmp/pencil-gpu}; mkdir -p "$out"
export PYTHONPATH=$PWD
ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis -k "regex:line_|cg_direction|cg_update" -c 4 \
    python3 -c "
import cv2, skimage.data
from gpu.pencil import cuda
from gpu.pencil.params import PencilParams
from gpu.pool import DevicePool
image = cv2.resize(skimage.data.astronaut(), (2560, 1920), interpolation=cv2.INTER_CUBIC)
pool = DevicePool(streams_per_device=1)
pool.run(lambda lease: cuda.render_on(lease, image, PencilParams()))
" > "$out/ncu-lines.txt" 2>&1
grep -E "line_|cg_|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|L1/TEX Hit|Shared|Bank" "$out/ncu-lines.txt" | head -120
