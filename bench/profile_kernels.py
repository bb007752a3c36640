"""Runs the kernels worth profiling once each, for Nsight Compute to read on the GPU machine:

    ncu -k regex:'cs256_(group|split4|read_rows)|_fused' --section SpeedOfLight --section WarpStateStats \
        python3 bench/profile_kernels.py [--cs256 4096x14336@0.66,...] [--variants group,split4] [--search-mib 256]

CS256 SpMV (fp16, vec 8, each variant's default plan; then the read floor,
cs256_read_rows, on the same matrix) on each shape@sparsity, then the
fused 8-pattern search of bench/search.py on `--search-mib` MiB of its English text.
Prints each launch's plan and its CUDA-event time, so the profile can be read against them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def profile_cs256(specs: str, variants: list[str]) -> None:
    import cupy

    from gpu.cs256 import anchors, cuda
    from gpu.cs256 import format as fmt

    rng = cupy.random.default_rng(1)
    for spec in specs.split(","):
        shape, sparsity = spec.split("@")
        m, n = (int(v) for v in shape.split("x"))
        weights = fmt.from_float(rng.standard_normal((m, n), dtype=cupy.float32), "float16")
        cs = fmt.prune(weights, float(sparsity), 8, "float16")
        x = fmt.from_float(rng.standard_normal(n, dtype=cupy.float32), "float16")
        for variant in variants:
            plan = cuda.make_plan(cs, 1, variant=variant)
            cuda.spmm(cs, x, plan)
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            cuda.spmm(cs, x, plan)
            stop.record()
            stop.synchronize()
            print(
                f"cs256 {spec} {variant}: {cs.nbytes / 1e6:.1f} MB, lanes {plan.lanes}, chunk {plan.chunk}, "
                f"grid {plan.grid}: "
                f"{cupy.cuda.get_elapsed_time(start, stop) * 1e3:.1f} us (warm L2)",
                flush=True,
            )
        anchors.ReadFloor(cs)()  # cs256_read_rows: the same bytes read in one span per block


def profile_search(mib: int) -> None:
    import bench.search as search_bench
    from gpu.search.params import SearchParams

    text = search_bench.english_text(mib << 20)
    gpu = search_bench.Gpu(text)
    params = SearchParams(patterns=tuple(search_bench.eight_patterns(text)), fused=True)
    ms, counts = gpu.resident_ms(params, 1)
    print(f"fused search, {mib} MiB: {ms:.3f} ms, counts {counts}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cs256", default="4096x14336@0.66,14336x4096@0.66,4096x4096@0.66")
    parser.add_argument("--variants", default="group", help="CS256 kernels to run (comma-separated: group, split4)")
    parser.add_argument("--search-mib", type=int, default=256, help="0: no search")
    args = parser.parse_args()
    if args.cs256:
        profile_cs256(args.cs256, args.variants.split(","))
    if args.search_mib:
        profile_search(args.search_mib)


if __name__ == "__main__":
    main()
