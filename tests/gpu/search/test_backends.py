"""Exact string search against brute force, each test written once and run on both
backends: the NumPy reference (gpu/search/reference.py's `search`, the CPU backend) and
the CUDA kernels (gpu/search/cuda.py on a lease, the text uploaded from the host; marker
`gpu`, skipped without a device). Every case of the issue (fresh random texts each run)
with every algorithm x variant, stream count and several granularities (chunk and block
boundaries everywhere: the CPU backend runs one algorithm whatever is asked), the
positions each `positions` mode brings back, and line numbers. Every device array a
search writes is filled with 0xFF first (gpu.kernels.POISON), so an entry a kernel forgot
shows up as -1.

What only one backend has is tested beside it: test_reference.py (the tables, the
algorithms chunk by chunk, the CPU backend's blocks, progress and mmap, the parameters
and the launch plan) and test_cuda.py (the fused pass, uploads, offsets past 2^32,
streamed searches, streams, residency).
"""

from __future__ import annotations

import numpy as np
import pytest
from search_cases import CASE_NAMES, cases, english

from gpu.backend import cuda_devices
from gpu.search import reference as ref
from gpu.search.params import SearchParams
from tests.gpu.search.checks import ALGORITHMS, NUMPY, STREAMS, VARIANTS, Expected, check, on_the_gpu

pytestmark = pytest.mark.pool(devices=[0], streams_per_device=4)  # as test_cuda.py's

ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device")]


@pytest.fixture
def backend(request):
    """The backend named by the test's `backend` parameter (see `on_both`, `per_backend`)."""
    if request.param == "numpy":
        return NUMPY
    request.getfixturevalue("poison")
    return on_the_gpu(request.getfixturevalue("lease"))


on_both = pytest.mark.parametrize("backend", ["numpy", pytest.param("cuda", marks=ON_CUDA)], indirect=True)


def per_backend(names: str, numpy: list[tuple], cuda: list[tuple]):
    """Parametrize ("backend", *names) with each backend's own cases: the NumPy
    reference's and the GPU's (marked `gpu`)."""
    cases = [pytest.param("numpy", *case) for case in numpy]
    cases += [pytest.param("cuda", *case, marks=ON_CUDA) for case in cuda]
    return pytest.mark.parametrize(("backend", *names.split(",")), cases, indirect=["backend"])


@per_backend(
    "name,algorithm,variant,size",
    # The CPU backend finds the same whatever the algorithm and variant: one of each per case.
    numpy=[(name, ("auto", *ALGORITHMS)[i % 4], VARIANTS[i % 2], 24_000) for i, name in enumerate(CASE_NAMES)],
    cuda=[(name, a, v, 100_000) for name in CASE_NAMES for a in ALGORITHMS for v in VARIANTS],
)
def test_every_case_finds_what_brute_force_finds(backend, rng, name, algorithm, variant, size):
    text, patterns, built_for = cases(rng, size=size)[name]
    loaded = backend.load(text)
    expected = Expected(text, ref.brute_force)
    granularities = [None, 1, 16, 1000] + ([built_for] if built_for else []) + [int(rng.integers(2, 2048))]
    for streams in STREAMS:
        for g in granularities:
            params = SearchParams(
                patterns=tuple(patterns),
                algorithm=algorithm,
                variant=variant,
                granularity=g,
                streams=streams,
                line_numbers=(g is None),
                positions="files",
            )
            output = backend.search(loaded, params)
            check(output, expected, params, f"{name}: {algorithm}/{variant} streams={streams} g={g}")
            if backend.timed:
                assert output.times_ms["kernels"] > 0 and output.launch["streams"] == streams
            else:
                assert [r.algorithm for r in output.patterns] == [ref.CPU_ALGORITHM] * len(patterns)


@on_both
def test_each_positions_mode_returns_the_positions_asked_for(backend, rng):
    """none: counts only; json: the first max_positions; files: all; each with its lines."""
    text = english(30_000, rng)
    loaded = backend.load(text)
    expected = ref.find_all(text, b"e")
    assert expected.size > 100
    for mode, listed in (("none", 0), ("json", 40), ("files", expected.size)):
        params = SearchParams(patterns=(b"e",), positions=mode, max_positions=40, line_numbers=True)
        (result,) = backend.search(loaded, params).patterns
        assert result.count == expected.size, mode
        np.testing.assert_array_equal(result.positions, expected[:listed], err_msg=mode)
        if mode == "none":
            assert result.lines is None  # on both backends: no lines where no position is wanted
        else:
            np.testing.assert_array_equal(result.lines, ref.line_numbers(text, expected[:listed]), err_msg=mode)


@on_both
def test_line_numbers_of_a_text_of_many_lines(backend, rng):
    """A text of one newline in ten bytes: the lines of every occurrence, of newlines too
    and of a pattern that spans one."""
    text = bytes(rng.choice(np.frombuffer(b"ab\n", np.uint8), 300_001, p=[0.45, 0.45, 0.1]))
    params = SearchParams(patterns=(b"a", b"\n", b"ab\nb"), line_numbers=True, positions="files")
    check(backend.search(backend.load(text), params), Expected(text, ref.brute_force), params, "lines")
