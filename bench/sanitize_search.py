"""A few small fused searches, for compute-sanitizer's racecheck (the test suite's fused
cases take minutes under it):

    compute-sanitizer --tool racecheck python bench/sanitize_search.py

The cases of tests/gpu/search/search_cases.py that stress the fused pass's shared memory
most: runs of one byte (a candidate at every position: the queue's overflow steps, the
pool, rescans), English and a 4-letter alphabet, at the default granularity and at 16.
Each result is compared with the reference; prints the number of mismatches, the
sanitizer prints its own summary.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gpu" / "search")]

from search_cases import cases  # noqa: E402

from gpu.pool import DevicePool  # noqa: E402
from gpu.search import cuda  # noqa: E402
from gpu.search import reference as ref  # noqa: E402
from gpu.search.params import SearchParams  # noqa: E402


def main() -> int:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed}")
    all_cases = cases(np.random.default_rng(seed), 20_000)
    lease = DevicePool([0], streams_per_device=2).acquire()
    mismatches = 0
    for name in ("runs", "english", "dna"):
        text, patterns, _ = all_cases[name]
        device_text, _ = cuda.text_from_host(text, lease)
        for granularity in (None, 16):
            params = SearchParams(patterns=tuple(patterns[:8]), fused=True, granularity=granularity, positions="files")
            output = cuda.search_device(device_text, params, lease)
            for pattern, result in zip(params.patterns, output.patterns, strict=True):
                if not np.array_equal(result.positions, ref.find_all(text, pattern)):
                    mismatches += 1
                    print(f"MISMATCH {name} g={granularity} pattern {pattern[:24]!r}")
    print(f"mismatches {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
