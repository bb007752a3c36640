"""Runs gpu/search/cuda.py on the emulated kernels against the reference, for
tests/gpu/search/test_emulated.py (in a subprocess, under a timeout: a kernel whose
threads miss a barrier would hang). Prints one line per mismatch, then
"<runs> searches, <failures> mismatches", and exits 1 if any.

    python run.py LIBRARY SEED SIZE [full]

Blocks of the production size (params.THREADS, 256 threads). Quick (the default, for CI):
every case, every algorithm x variant at one granularity drawn from the case's list
(granularity 1, which makes one block per 256 positions, only in full), a fused pass,
and searches streamed in while they run (search_streamed, as a first search of a corpus:
small pieces and chunks, so that count launches start at later blocks and matches cross
the chunks' edges; a `positions` mode drawn), and a check that a count launch which does
not wait for its upload is noticed (copies land late), and a failed read. `full`: every
granularity (minutes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[3])]  # fakecupy, search_cases, the repository


def mismatch(name: str, params, output, text: bytes) -> list[str]:
    """What the output got wrong against the reference, one line per pattern."""
    from gpu.search import reference as ref

    lines = []
    wanted = params.positions_wanted
    for pattern, result in zip(params.patterns, output.patterns, strict=True):
        expected = ref.find_all(text, pattern)
        listed = expected[:wanted]
        lines_ok = (
            not params.line_numbers or wanted == 0 or np.array_equal(result.lines, ref.line_numbers(text, listed))
        )
        if np.array_equal(result.positions, listed) and result.count == expected.size and lines_ok:
            continue
        lines.append(
            f"MISMATCH {name}: {params.algorithm}/{params.variant} fused={params.fused} g={params.granularity} "
            f"positions={params.positions} pattern {pattern[:24]!r} (m={len(pattern)}): count {result.count}, "
            f"{result.positions.size} positions {result.positions[:8].tolist()}, expected {expected.size} "
            f"{expected[:8].tolist()}; lines ok: {lines_ok}"
        )
    return lines


def a_missing_wait_is_seen(cuda, lease, text: bytes) -> bool:
    """The harness's own check: with the count launches no longer waiting for the upload
    of their bytes (the copies land late, fakecupy), a streamed search must go wrong."""
    from gpu.search.params import SearchParams

    def count_without_waiting(search, uploaded, arrived=None):
        for p in search.passes:
            with p.stream:
                p.count_ready(uploaded)

    cuda.STREAM_PIECE = cuda.STREAM_CHUNK = 700
    params = SearchParams(patterns=(b"e",), variant="naive", granularity=1, positions="none")
    honest = cuda._Search.count_ready
    cuda._Search.count_ready = count_without_waiting
    try:
        _, output = cuda.search_streamed(cuda._host_reader(np.frombuffer(text, np.uint8)), len(text), params, lease)
    finally:
        cuda._Search.count_ready = honest
    return output.patterns[0].count != text.count(b"e")


def a_failed_read_is_raised_and_the_next_search_is_right(cuda, lease, text: bytes) -> bool:
    """A read that fails on the third piece raises out of the streamed search; the next
    streamed search (same ring, same reader threads) finds what the reference finds."""
    from gpu.search import reference as ref
    from gpu.search.params import SearchParams

    cuda.STREAM_PIECE = cuda.STREAM_CHUNK = 500
    array = np.frombuffer(text, np.uint8)
    honest = cuda._host_reader(array)

    def failing(view, offset):
        if offset == 2 * cuda.STREAM_PIECE:
            raise OSError("the disk went away")
        honest(view, offset)

    params = SearchParams(patterns=(b"e",), positions="files")
    try:
        cuda.search_streamed(failing, len(text), params, lease)
        return False
    except OSError as exc:
        if "went away" not in str(exc):
            return False
    _, output = cuda.search_streamed(honest, len(text), params, lease)
    return np.array_equal(output.patterns[0].positions, ref.find_all(text, b"e"))


def report(lines: list[str]) -> int:
    for line in lines:
        print(line)
    return len(lines)


def main() -> int:
    import fakecupy  # both found through the sys.path entries above
    from search_cases import cases

    library, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    full = sys.argv[4:] == ["full"]
    cuda = fakecupy.install(library)
    from gpu import kernels
    from gpu.search.params import SearchParams

    kernels.POISON = True
    lease = fakecupy.Lease()
    rng = np.random.default_rng(seed)
    failures = runs = 0
    for name, (text, patterns, built_for) in cases(rng, size).items():
        device_text, _ = cuda.text_from_host(text, lease)
        if device_text.data[: len(text)].tobytes() != text:
            print(f"MISMATCH {name}: the uploaded text differs")
            failures += 1
        granularities = (
            [None, 16] + ([built_for] if built_for else []) + [int(rng.integers(2, 300))] + ([1] if full else [])
        )
        pick = (lambda options: options) if full else (lambda options: [options[int(rng.integers(0, len(options)))]])
        plans = [
            SearchParams(
                patterns=tuple(patterns),
                algorithm=a,
                variant=v,
                granularity=g,
                line_numbers=g is None,
                positions="files",
            )
            for a in ("rabin_karp", "kmp", "boyer_moore")
            for v in ("naive", "optimized")
            for g in pick(granularities)
        ]
        plans += [
            SearchParams(patterns=tuple(subset), fused=True, granularity=g, line_numbers=True, positions="files")
            for g in pick([None, 16])
            for subset in pick([patterns, patterns[::-1][:3]])
        ]
        for params in plans:
            runs += 1
            lines = mismatch(name, params, cuda.search_device(device_text, params, lease), text)
            failures += report(lines)

        # Streamed in while searched: pieces of a few hundred bytes, a count launch every
        # chunk of one or two pieces, a ring of three pieces (reused: its waits matter);
        # up to 3 patterns in one pass per pattern (a `positions` mode drawn), and fused.
        cuda.STREAM_PIECE = int(rng.integers(600, 1500))
        cuda.STREAM_CHUNK = cuda.STREAM_PIECE * int(rng.integers(1, 3))
        cuda.STREAM_RING = 3
        streamed = [
            SearchParams(
                patterns=tuple(patterns[:3]),
                algorithm=("rabin_karp", "kmp", "boyer_moore")[int(rng.integers(0, 3))],
                variant=("naive", "optimized")[int(rng.integers(0, 2))],
                granularity=int(rng.integers(1, 17)),  # naive: blocks of 256 .. 4096 positions
                line_numbers=True,
                positions=("none", "json", "files")[int(rng.integers(0, 3))],
                max_positions=int(rng.integers(0, 50)),
            ),
            SearchParams(patterns=tuple(patterns), fused=True, granularity=16, line_numbers=True, positions="files"),
        ]
        array = np.frombuffer(text, np.uint8)
        for params in streamed:
            runs += 1
            whole, output = cuda.search_streamed(cuda._host_reader(array), len(text), params, lease)
            lines = mismatch(f"{name} streamed (pieces of {cuda.STREAM_PIECE})", params, output, text)
            if whole.data[: len(text)].tobytes() != text:
                lines.append(f"MISMATCH {name}: the streamed text differs")
            failures += report(lines)
    if not a_missing_wait_is_seen(cuda, lease, cases(rng, size)["english"][0]):
        print("MISMATCH the harness: count launches that do not wait for their upload went unnoticed")
        failures += 1
    if not a_failed_read_is_raised_and_the_next_search_is_right(cuda, lease, cases(rng, size)["english"][0]):
        print("MISMATCH a failed read: not raised, or the next streamed search went wrong")
        failures += 1
    print(f"{runs} searches, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
