"""Times the CS256 group kernel built with other values of its tuning knobs (cs256.cu:
CS256_RING, CS256_L2_FETCH, CS256_MIN_BLOCKS) against the build cuda.py runs, on the
issue's shapes, fp16, one vector, cold L2 as in bench/cs256.py:

    python bench/cs256_tune.py [--shapes 4096x14336,...] [--sparsity 0.66] \
        [--configs ring:l2:min_blocks,...] [--lanes 8,16,32]

The read of the same bytes (anchors.ReadFloor) is timed beside the default build; its
last column is then the default build's time over the floor's.

Every variant's y is checked against the default kernel's: bit for bit with the same lanes
(the knobs change how loads are issued, not the order of the arithmetic), to 1e-3 of its
largest magnitude with other lanes (the row's sum is split differently).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KERNEL = "cs256_group_f16_w8_k1"
ENTRY = "GROUP_ENTRY(cs256_group_f16_w8_k1, F16, 8, 1)"


def variant_function(ring: int, l2: int, min_blocks: int):
    """The one kernel this tool times, built from cs256.cu with the knobs set (the other
    entry points left out: NVRTC then compiles one kernel, not forty)."""
    import cupy

    from gpu import kernels
    from gpu.cs256 import cuda

    source = cuda.SOURCE.read_text()
    head = source[: source.index("#define GROUP_ENTRIES(")]
    options = (
        *kernels.COMPILE_OPTIONS,
        f"-DCS256_RING={ring}",
        f"-DCS256_L2_FETCH={l2}",
        f"-DCS256_MIN_BLOCKS={min_blocks}",
    )
    module = cupy.RawModule(code=head + "\n" + ENTRY + "\n", options=options)
    function = module.get_function(KERNEL)
    function.max_dynamic_shared_size_bytes = kernels.max_shared_bytes() - function.shared_size_bytes
    return function


def group_launch(function, grid: int, cs, x, y, plan, lanes: int):
    """A call that queues one launch of the group kernel `function` on `grid` blocks with
    `lanes` lanes per row and the plan's chunk, x slices and shared memory."""
    from gpu.cs256 import cuda

    args = cuda.group_args(cs, x, y, plan.chunk, lanes, plan.slice_tiles)
    return lambda: function((grid,), (cuda.GROUP_BLOCK,), args, shared_mem=plan.shared_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4096x14336,14336x4096,4096x4096")
    parser.add_argument("--sparsity", type=float, default=0.66)
    parser.add_argument("--configs", default="0:0:2,0:128:2,0:256:2,2:0:2,2:256:2,4:256:1,8:0:1,8:256:1")
    parser.add_argument("--lanes", default="", help="lanes to try besides the default plan's (comma-separated)")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    import cupy
    import numpy as np

    from gpu import kernels
    from gpu.cs256 import anchors, cuda
    from gpu.cs256 import format as fmt

    sms = kernels.device_attribute("MultiProcessorCount")
    copy_bw = anchors.copy_bandwidth()
    timer = anchors.ColdTimer()
    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
    functions = {c: variant_function(*c) for c in configs}
    for c, f in functions.items():
        print(
            f"# ring {c[0] or 'default'}, L2 fetch {c[1] or 'default'}, min blocks {c[2]}: {f.num_regs} "
            f"registers, {f.local_size_bytes} B local",
            flush=True,
        )
    rng = cupy.random.default_rng(7)
    print("shape | lanes | ring:l2:min_blocks | blocks/SM | us | % copy | vs default build")
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        cs = fmt.prune(
            fmt.from_float(rng.standard_normal((m, n), dtype=cupy.float32), "float16"), args.sparsity, 8, "float16"
        )
        x = fmt.from_float(rng.standard_normal(n, dtype=cupy.float32), "float16")
        base = cuda.make_plan(cs, 1)
        expected = cuda.spmm(cs, x, base).get()
        scale = float(np.abs(expected.astype(np.float32)).max())
        # the default build launched as the variants are (no spmm around it: its host work
        # is then not in the comparison)
        base_ms = timer.median_ms(
            group_launch(
                kernels.kernel(cuda.SOURCE, base.kernel), base.grid, cs, x, cupy.empty(m, cupy.uint16), base, base.lanes
            ),
            args.repeats,
        )
        moved = cuda.bytes_moved(cs, 1)
        floor_ms = timer.median_ms(anchors.ReadFloor(cs, base.blocks_per_sm), args.repeats)
        print(
            f"{shape} | - | read floor | {base.blocks_per_sm} | {floor_ms * 1e3:.1f} | "
            f"{100 * moved / (floor_ms * 1e-3) / copy_bw:.0f} | {base_ms / floor_ms:.2f}",
            flush=True,
        )
        print(
            f"{shape} | {base.lanes} | cuda.py build | {base.blocks_per_sm} | {base_ms * 1e3:.1f} | "
            f"{100 * moved / (base_ms * 1e-3) / copy_bw:.0f} | 1.00",
            flush=True,
        )
        lanes_options = sorted({base.lanes, *(int(v) for v in args.lanes.split(",") if v)})
        for config, function in functions.items():
            resident = kernels.blocks_per_sm(function, cuda.GROUP_BLOCK, base.shared_bytes)
            for lanes in lanes_options:
                grid = max(1, min(-(-m // (cuda.GROUP_BLOCK // lanes)), resident * sms))
                y = cupy.full(m, 0xFFFF, cupy.uint16)
                run = group_launch(function, grid, cs, x, y, base, lanes)
                run()
                got = y.get().view(np.float16)
                # the same lanes: the same order of arithmetic, the same bits; other lanes sum in another order
                same = (
                    np.array_equal(got.view(np.uint16), expected.view(np.uint16))
                    if lanes == base.lanes
                    else float(np.abs(got.astype(np.float32) - expected.astype(np.float32)).max()) <= 1e-3 * scale
                )
                if not same:
                    print(f"{shape} | {lanes} | {':'.join(map(str, config))} | WRONG RESULT", flush=True)
                    continue
                ms = timer.median_ms(run, args.repeats)
                print(
                    f"{shape} | {lanes} | {':'.join(map(str, config))} | {resident} | {ms * 1e3:.1f} | "
                    f"{100 * moved / (ms * 1e-3) / copy_bw:.0f} | {base_ms / ms:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
