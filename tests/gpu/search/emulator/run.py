"""Runs gpu/search/cuda.py on the emulated kernels against the reference, for
tests/gpu/search/test_emulated.py (in a subprocess, under a timeout: a kernel whose
threads miss a barrier would hang). Prints one line per mismatch and exits 1 if any.

    python run.py LIBRARY SEED SIZE [full]

Quick (the default, for CI): blocks of 64 threads (2 warps: the block scans still cross
warps), every case, every algorithm x variant at one granularity drawn from the case's
list (granularity 1, which makes one block per 64 positions, only in full), and a fused
pass. `full`: blocks of 256 threads and every granularity (minutes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[3])]  # fakecupy, search_cases, the repository


def main() -> int:
    import fakecupy  # both found through the sys.path entries above
    from search_cases import cases

    library, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    full = sys.argv[4:] == ["full"]
    cuda = fakecupy.install(library)
    from gpu import kernels
    from gpu.search import params as search_params
    from gpu.search import reference as ref
    from gpu.search.params import SearchParams

    kernels.POISON = True
    if not full:
        search_params.THREADS = 64

    lease = fakecupy.Lease()
    rng = np.random.default_rng(seed)
    failures = runs = 0
    for name, (text, patterns, built_for) in cases(rng, size).items():
        device_text, _ = cuda.text_from_host(text, lease)
        granularities = (
            [None, 16] + ([built_for] if built_for else []) + [int(rng.integers(2, 300))] + ([1] if full else [])
        )
        pick = (lambda options: options) if full else (lambda options: [options[int(rng.integers(0, len(options)))]])
        plans = [
            SearchParams(tuple(patterns), algorithm=a, variant=v, granularity=g, line_numbers=g is None)
            for a in ("rabin_karp", "kmp", "boyer_moore")
            for v in ("naive", "optimized")
            for g in pick(granularities)
        ]
        plans += [
            SearchParams(tuple(subset), fused=True, granularity=g, line_numbers=True)
            for g in pick([None, 16])
            for subset in pick([patterns, patterns[::-1][:3]])
        ]
        for params in plans:
            output = cuda.search_device(device_text, params, lease)
            runs += 1
            for pattern, result in zip(params.patterns, output.patterns, strict=True):
                expected = ref.find_all(text, pattern)
                lines_ok = not params.line_numbers or np.array_equal(result.lines, ref.line_numbers(text, expected))
                if not np.array_equal(result.positions, expected) or not lines_ok:
                    failures += 1
                    print(
                        f"MISMATCH {name}: {params.algorithm}/{params.variant} fused={params.fused} "
                        f"g={params.granularity} pattern {pattern[:24]!r} (m={len(pattern)}): "
                        f"{result.positions.size} positions {result.positions[:8].tolist()}, expected "
                        f"{expected.size} {expected[:8].tolist()}; lines ok: {lines_ok}"
                    )
    print(f"{runs} searches, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
