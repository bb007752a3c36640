"""What the string-search tests check of a search, on either backend: a `Backend` (the
NumPy reference, gpu/search/reference.py's CPU backend, or gpu/search/cuda.py on a lease)
loads a text and searches it; `check` holds each result to the expected positions and
lines (`Expected`: every occurrence by brute force or by the reference's find_all, and
1 + the newlines before each). The algorithms and variants the kernels run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu.search import reference as ref
from gpu.search.params import SearchOutput, SearchParams

ALGORITHMS = ("rabin_karp", "kmp", "boyer_moore")  # the kernels' ("auto" picks one of them)
VARIANTS = ("naive", "optimized")
STREAMS = (1, 3, 8)


@dataclass(frozen=True)
class Backend:
    """name: "numpy" or "cuda". load(text) -> what search takes (the bytes; a DeviceText,
    uploaded, on the GPU). search(loaded, params) -> SearchOutput. timed: whether it times
    its kernels and reports its launch (times_ms["kernels"], launch["streams"])."""

    name: str
    load: Callable[[bytes], Any]
    search: Callable[[Any, SearchParams], SearchOutput]
    timed: bool


NUMPY = Backend("numpy", load=lambda text: text, search=ref.search, timed=False)


def on_the_gpu(lease) -> Backend:
    """gpu/search/cuda.py on `lease`: the text uploaded from the host, searched where it lies."""
    from gpu.search import cuda

    return Backend(
        "cuda",
        load=lambda text: cuda.text_from_host(text, lease)[0],
        search=lambda device_text, params: cuda.search_device(device_text, params, lease),
        timed=True,
    )


class Expected:
    """The positions and lines of each pattern in one text, computed once: the positions
    by `find` (the reference's find_all, or brute_force where the backend under test is
    the reference itself), the line of each 1 + the newlines before it (counted here, not
    by the reference's line_numbers)."""

    def __init__(self, text: bytes, find: Callable[[bytes, bytes], np.ndarray] = ref.find_all):
        self.text, self._find, self._positions, self._lines = text, find, {}, {}
        self._newlines_before: np.ndarray | None = None

    def positions(self, pattern: bytes) -> np.ndarray:
        if pattern not in self._positions:
            self._positions[pattern] = self._find(self.text, pattern)
        return self._positions[pattern]

    def lines(self, pattern: bytes) -> np.ndarray:
        if pattern not in self._lines:
            if self._newlines_before is None:  # [i]: the newlines in text[:i]
                newline = np.frombuffer(self.text, np.uint8) == ord("\n")
                self._newlines_before = np.concatenate([[0], np.cumsum(newline, dtype=np.int64)])
            self._lines[pattern] = 1 + self._newlines_before[self.positions(pattern)]
        return self._lines[pattern]


def check(output: SearchOutput, expected: Expected | bytes, params: SearchParams, context: str) -> None:
    """Every count, and the positions the search was asked to bring back (all, the first
    max_positions or none: params.positions_wanted) with their lines."""
    expected = expected if isinstance(expected, Expected) else Expected(expected)
    assert len(output.patterns) == len(params.patterns), context
    wanted = params.positions_wanted
    for i, (pattern, result) in enumerate(zip(params.patterns, output.patterns, strict=True)):
        where = f"{context}, pattern {i} {pattern[:24]!r} (m={len(pattern)}), positions {params.positions}"
        assert result.positions.dtype == np.int64, where
        assert result.count == expected.positions(pattern).size, where
        np.testing.assert_array_equal(result.positions, expected.positions(pattern)[:wanted], err_msg=where)
        if params.line_numbers and wanted != 0:
            np.testing.assert_array_equal(result.lines, expected.lines(pattern)[:wanted], err_msg=where)
        else:
            assert result.lines is None, where
