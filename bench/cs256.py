"""Benchmark of CS256 SpMV (issue 7) with its anchors measured in the same run, on one GPU.

    python bench/cs256.py [--shapes 14336x4096,4096x14336,4096x4096] [--sparsities 0.5,0.66,0.75]
                          [--dtype float16] [--vec 8] [--vectors 1] [--repeats 50] [--tune]

For each shape (m x n: rows x columns, y = A x) and sparsity: i.i.d. normal weights pruned by
magnitude on the GPU (each tile keeps a multiple of vec), then the median GPU time over
--repeats runs, each starting with a cold L2 (gpu/cs256/anchors.py ColdTimer: the events
time the GPU, not Python), of

- CS256, the group kernel with its default plan, and split4 (the paper's appendix layout;
  one vector only),
- dense cuBLAS (cupy.matmul) on the same pruned matrix in the same dtype,
- cuSPARSE CSR (int32 indices) in the matrix's dtype when cuSPARSE takes it, else float32,
- the read floor (anchors.ReadFloor): the matrix's values, indices and tile counts read as
  one contiguous span per block, nothing computed: a plain streaming read of the same
  bytes; CS256 / floor says what its access pattern and arithmetic cost, dense / floor
  the speed-up such a read would show (on small shapes other orders of reading can be
  faster still: BENCHMARKS.md, 2026-11-24).

Bytes moved: every array of the format once plus x and y. Bandwidth: bytes / time, and its
fraction of the device-to-device copy bandwidth measured first (bytes read + written per
second) -- the issue's target is >= 80 % of it on CS256's bytes. Ratios: dense / CS256 (with
the byte-count ideal dense bytes / CS256 bytes beside it) and CSR / CS256. Each product is
checked against the float64 dense product (max relative error). --tune also times every
lanes x chunk x blocks-per-SM plan of the group kernel and prints the fastest.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu.cs256 import format as fmt
from gpu.cs256 import reference


def exact_product(cupy, dense, x, dtype: str) -> np.ndarray:
    """A x in float64 on the GPU, 4096 rows at a time."""
    x64 = fmt.to_float32(x, dtype).astype(cupy.float64)
    return cupy.concatenate(
        [fmt.to_float32(dense[r : r + 4096], dtype).astype(cupy.float64) @ x64 for r in range(0, dense.shape[0], 4096)]
    ).get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="14336x4096,4096x14336,4096x4096")
    parser.add_argument("--sparsities", default="0.5,0.66,0.75")
    parser.add_argument("--dtype", default="float16", choices=fmt.DTYPES)
    parser.add_argument("--vec", type=int, default=8, choices=fmt.VECS)
    parser.add_argument("--vectors", type=int, default=1, help="vectors per product (1: SpMV; 2..16: SpMM)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--tune", action="store_true", help="also time every lanes x chunk x blocks-per-SM plan")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import cupy

    from gpu import kernels
    from gpu.cs256 import anchors, cuda

    props = cupy.cuda.runtime.getDeviceProperties(0)
    copy_bw = anchors.copy_bandwidth()
    read_bw = anchors.read_bandwidth()
    timer = anchors.ColdTimer()
    dtype, k = args.dtype, args.vectors
    item = fmt.STORAGE[dtype].itemsize
    print(
        f"# CS256 benchmark: {props['name'].decode()}, {kernels.device_attribute('MultiProcessorCount')} SMs, "
        f"L2 {anchors.l2_bytes() / 2**20:.0f} MiB; "
        f"copy bandwidth {copy_bw / 1e9:.0f} GB/s (read + write), read-only kernel {read_bw / 1e9:.0f} GB/s; "
        f"{dtype}, vec {args.vec}, {k} vector(s); medians of {args.repeats} cold-L2 runs"
    )
    print(
        "shape | sparsity | CS256 MB (vs dense) | CS256 us | split4 us | dense us | CSR us (dtype) | "
        "read floor us (CS256/floor, dense/floor) | "
        "CS256 GB/s (% copy) | dense GB/s (% copy) | dense/CS256 (ideal) | CSR/CS256 | "
        "max rel err (CS256, split4, dense) | plan"
    )
    rng = cupy.random.default_rng(args.seed)
    summary = []
    for shape in args.shapes.split(","):
        m, n = (int(v) for v in shape.split("x"))
        weights = fmt.from_float(rng.standard_normal((m, n), dtype=cupy.float32), dtype)
        x = fmt.from_float(rng.standard_normal((n,) if k == 1 else (n, k), dtype=cupy.float32), dtype)
        for sparsity in (float(s) for s in args.sparsities.split(",")):
            start = time.perf_counter()
            cs = fmt.prune(weights, sparsity, args.vec, dtype)
            cupy.cuda.get_current_stream().synchronize()
            prune_s = time.perf_counter() - start
            dense = cs.to_dense()
            exact = exact_product(cupy, dense, x, dtype)
            plan = cuda.make_plan(cs, k)
            y = cuda.spmm(cs, x, plan)
            errors = [reference.relative_error(y.get(), exact, dtype)]
            cs_ms = timer.median_ms(lambda cs=cs, x=x, plan=plan: cuda.spmm(cs, x, plan), args.repeats)
            split_ms = float("nan")
            if k == 1:
                split = cuda.make_plan(cs, 1, variant="split4")
                errors.append(reference.relative_error(cuda.spmm(cs, x, split).get(), exact, dtype))
                split_ms = timer.median_ms(lambda cs=cs, x=x, split=split: cuda.spmm(cs, x, split), args.repeats)
            dense_out = anchors.dense_matmul(dense, x, dtype)
            errors.append(reference.relative_error(dense_out.get(), exact, dtype))
            dense_ms = timer.median_ms(lambda dense=dense, x=x: anchors.dense_matmul(dense, x, dtype), args.repeats)
            csr = anchors.CsrAnchor(dense, dtype)
            csr_ms = timer.median_ms(lambda csr=csr, x=x: csr(x), args.repeats)
            floor_ms = timer.median_ms(anchors.ReadFloor(cs), args.repeats)
            vectors_bytes = (m + n) * k * item
            cs_bytes = cuda.bytes_moved(cs, k)
            dense_bytes = m * n * item + vectors_bytes
            cs_bw, dense_bw = cs_bytes / (cs_ms * 1e-3), dense_bytes / (dense_ms * 1e-3)
            print(
                f"{m}x{n} | {sparsity:.2f} | {cs.nbytes / 1e6:.1f} ({cs.nbytes / (m * n * item):.3f}) | "
                f"{cs_ms * 1e3:.1f} | {split_ms * 1e3:.1f} | {dense_ms * 1e3:.1f} | "
                f"{csr_ms * 1e3:.1f} ({csr.dtype}) | {floor_ms * 1e3:.1f} ({cs_ms / floor_ms:.2f}, "
                f"{dense_ms / floor_ms:.2f}) | {cs_bw / 1e9:.0f} ({100 * cs_bw / copy_bw:.0f} %) | "
                f"{dense_bw / 1e9:.0f} ({100 * dense_bw / copy_bw:.0f} %) | "
                f"{dense_ms / cs_ms:.2f} ({dense_bytes / cs_bytes:.2f}) | {csr_ms / cs_ms:.2f} | "
                f"{', '.join(f'{e:.1e}' for e in errors)} | "
                f"lanes {plan.lanes}, chunk {plan.chunk}, grid {plan.grid}, {plan.blocks_per_sm}/SM, "
                f"prune {prune_s:.2f} s",
                flush=True,
            )
            summary.append((shape, sparsity, dense_ms / cs_ms, cs_bw / copy_bw, cs.nbytes / (m * n * item)))
            if args.tune:
                tune(cuda, timer, cs, x, k, cs_bytes, copy_bw, args.repeats)
            del cs, dense, csr
    print(
        "# targets (issue 7): dense/CS256 >= 1.6 at 66 %, >= 1.2 at 50 %; CS256 >= 80 % of copy bandwidth; "
        "memory <= 0.55 of dense at 66 %"
    )
    for shape, sparsity, speedup, fraction, memory in summary:
        goal = 1.6 if abs(sparsity - 0.66) < 0.005 else 1.2 if abs(sparsity - 0.5) < 0.005 else None
        checks = [
            f"speed-up {speedup:.2f}" + ("" if goal is None else f" {'meets' if speedup >= goal else 'MISSES'} {goal}"),
            f"bandwidth {100 * fraction:.0f} % {'meets' if fraction >= 0.8 else 'MISSES'} 80 %",
        ]
        if goal == 1.6:
            checks.append(f"memory {memory:.3f} {'meets' if memory <= 0.55 else 'MISSES'} 0.55")
        print(f"#   {shape} at {sparsity:.2f}: " + "; ".join(checks))


def tune(cuda, timer, cs, x, k: int, cs_bytes: int, copy_bw: float, repeats: int) -> None:
    """Time every lanes x chunk x blocks-per-SM plan of the group kernel; print them, fastest first."""
    rows = []
    for lanes, chunk, blocks in itertools.product(cuda.LANES[2:], cuda.CHUNKS, (1, 2, 3, 4)):
        if cs.vec % chunk:
            continue
        plan = cuda.make_plan(cs, k, lanes=lanes, chunk=chunk, blocks_per_sm=blocks)
        ms = timer.median_ms(lambda plan=plan: cuda.spmm(cs, x, plan), repeats)
        rows.append((ms, lanes, chunk, blocks))
    rows.sort()
    print(
        "    tune (us, lanes, chunk, blocks/SM, % copy): "
        + "; ".join(
            f"{ms * 1e3:.1f} {lanes} {chunk} {blocks} {100 * cs_bytes / (ms * 1e-3) / copy_bw:.0f}%"
            for ms, lanes, chunk, blocks in rows[:8]
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
