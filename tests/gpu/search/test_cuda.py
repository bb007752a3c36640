"""gpu/search/cuda.py (the kernels of search.cu) against gpu/search/reference.py: what
only the CUDA backend has.

CUDA only (marker `gpu`; skipped without a device). The fused pass on every case of the
issue (fresh random texts each run), what auto chose, the newline index; offsets past
2^31 and 2^32; uploads from host and file byte for byte; searches streamed in while they
run; a failed read; streams per lease; the resident LRU. Every device array a search
writes is filled with 0xFF first (gpu.kernels.POISON), so an entry a kernel forgot shows
up as -1. Every case with every algorithm x variant x stream count and granularity, the
positions modes and line numbers are tested on both backends by one body each:
test_backends.py.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from search_cases import CASE_NAMES, cases, english

from gpu.backend import cuda_devices
from gpu.search.params import SearchParams
from tests.gpu.search.checks import ALGORITHMS, VARIANTS, Expected, check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_devices(), reason="needs a CUDA device"),
    pytest.mark.pool(devices=[0], streams_per_device=4),  # one device: concurrent leases share its resident texts
]


@pytest.fixture(scope="module")
def cuda(poison):
    from gpu.search import cuda

    return cuda


@pytest.mark.parametrize("name", CASE_NAMES)
def test_fused_pass_matches_the_reference(cuda, lease, rng, name):
    text, patterns, built_for = cases(rng, size=100_000)[name]
    device_text, _ = cuda.text_from_host(text, lease)
    expected = Expected(text)
    subsets = [patterns, patterns[:1], patterns[::-1][:3], [patterns[-1]] * 2]
    for g in [None, 1, 16, 333, 2048] + ([built_for] if built_for else []):
        for subset in subsets:
            params = SearchParams(
                patterns=tuple(subset), fused=True, granularity=g, line_numbers=True, positions="files"
            )
            check(
                cuda.search_device(device_text, params, lease),
                expected,
                params,
                f"{name}: fused g={g} {len(subset)} patterns",
            )


def test_auto_runs_what_it_chose(cuda, lease, rng):
    text = english(50_000, rng)
    params = SearchParams(patterns=(b"aaaa", b"ACGTACGTAA", b"the", b"quick brown"), streams=2, positions="files")
    output = cuda.search_device(cuda.text_from_host(text, lease)[0], params, lease)
    assert [r.algorithm for r in output.patterns] == ["kmp", "rabin_karp", "kmp", "boyer_moore"]
    check(output, text, params, "auto")


def test_offsets_past_2_to_the_31_and_32(cuda, lease):
    """A 4.3 GB text (zeros, a few newlines) with a needle before, across and after the
    int32 and uint32 limits and at the very end: positions and lines exact."""
    import cupy

    n = (1 << 32) + (1 << 20) + 13
    needle = b"needle\x01\x02"
    m = len(needle)
    starts = [5, (1 << 31) - 3, (1 << 31) + 17, (1 << 32) - 4, (1 << 32) + 1000, n - m]
    newlines = [1, 1000, (1 << 31) + 9, (1 << 32) - 100, (1 << 32) + 999]
    assert not any(s <= p < s + m for s in starts for p in newlines), "a newline would break a needle"
    with cupy.cuda.Device(lease.device), lease.stream:
        data = cupy.zeros(cuda._round16(n) + cuda.TEXT_PAD, cupy.uint8)
        for s in starts:
            data[s : s + m] = cupy.asarray(np.frombuffer(needle, np.uint8))
        for p in newlines:
            data[p] = 10
        text = cuda.finish_text(data, n, lease)
    expected = np.asarray(starts, np.int64)
    expected_lines = np.asarray([1 + sum(p < s for p in newlines) for s in starts], np.int64)
    runs = [
        SearchParams(patterns=(needle, b"\x01\x02"), algorithm=a, variant=v, line_numbers=True, positions="files")
        for a in ALGORITHMS
        for v in VARIANTS
    ]
    runs.append(SearchParams(patterns=(needle, b"\x01\x02"), fused=True, line_numbers=True, positions="files"))
    for params in runs:
        output = cuda.search_device(text, params, lease)
        context = f"{params.algorithm}/{params.variant} fused={params.fused}"
        np.testing.assert_array_equal(output.patterns[0].positions, expected, err_msg=context)
        np.testing.assert_array_equal(output.patterns[0].lines, expected_lines, err_msg=context)
        np.testing.assert_array_equal(output.patterns[1].positions, expected + m - 2, err_msg=context)
    del text, data
    cupy.get_default_memory_pool().free_all_blocks()


def test_uploads_are_byte_exact(cuda, lease, rng, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda, "STREAM_PIECE", 1 << 20)  # many pieces, reader threads and ring slots reused
    monkeypatch.setattr(cuda, "STREAM_RING", 3)
    data = rng.integers(0, 256, 7 * (1 << 20) + 12_345, dtype=np.uint8).tobytes()
    path = tmp_path / "corpus.bin"
    path.write_bytes(data)
    for device_text, ms in (cuda.text_from_file(path, len(data), lease), cuda.text_from_host(data, lease)):
        host = device_text.data.get()
        assert device_text.n == len(data) and ms > 0
        assert host[: len(data)].tobytes() == data
        assert not host[len(data) :].any() and host.size >= len(data) + cuda.TEXT_PAD


def test_newline_index_counts_the_newlines_before_each_segment(cuda, lease, rng):
    """The index line numbers are read from (the lines themselves: test_backends.py)."""
    text = bytes(rng.choice(np.frombuffer(b"ab\n", np.uint8), 300_001, p=[0.45, 0.45, 0.1]))
    device_text, _ = cuda.text_from_host(text, lease)
    segment_before = device_text.segment_before(lease).get()
    counts = np.add.reduceat(np.frombuffer(text, np.uint8) == 10, np.arange(0, len(text), cuda.LINE_SEGMENT))
    np.testing.assert_array_equal(segment_before, np.concatenate([[0], np.cumsum(counts)[:-1]]))


@pytest.mark.parametrize("name", ["english", "boundaries", "runs", "long_pattern", "nul_bytes"])
def test_a_text_streamed_in_while_searched_finds_each_match_once(cuda, lease, rng, monkeypatch, name):
    """The first search of a corpus: the text streamed in by pieces of a few KiB (at
    random), count launches every chunk of one to three pieces, so that launches start at
    later blocks and matches cross the chunks' edges; every algorithm x variant, fused, and
    each positions mode; the text kept is byte exact and a search of it finds the same."""
    text, patterns, built_for = cases(rng, size=300_000)[name]
    piece = int(rng.integers(1000, 20_000))
    monkeypatch.setattr(cuda, "STREAM_PIECE", piece)
    monkeypatch.setattr(cuda, "STREAM_CHUNK", piece * int(rng.integers(1, 4)))
    monkeypatch.setattr(cuda, "STREAM_RING", 3)
    expected = Expected(text)
    array = np.frombuffer(text, np.uint8)
    modes = ("files", "json", "none")
    runs = [
        SearchParams(
            patterns=tuple(patterns),
            algorithm=a,
            variant=v,
            granularity=g,
            streams=3,
            line_numbers=True,
            positions=modes[k % 3],
            max_positions=int(rng.integers(0, 100)),
        )
        for k, (a, v, g) in enumerate(
            (a, v, g) for a in ALGORITHMS for v in VARIANTS for g in [None, 1] + ([built_for] if built_for else [])
        )
    ]
    runs.append(SearchParams(patterns=tuple(patterns), fused=True, line_numbers=True, positions="files"))
    for params in runs:
        context = f"{name} streamed by {piece} bytes: {params.algorithm}/{params.variant} g={params.granularity}"
        whole, output = cuda.search_streamed(cuda._host_reader(array), len(text), params, lease)
        check(output, expected, params, context)
        assert output.times_ms["upload"] > 0 and set(output.times_ms) == {"upload", "kernels", "download"}
    assert whole.data[: len(text)].get().tobytes() == text and not whole.data[len(text) :].get().any()
    check(cuda.search_device(whole, runs[0], lease), expected, runs[0], f"{name}: the streamed text, resident")


def test_a_failed_read_is_raised_and_the_next_search_is_right(cuda, lease, rng, tmp_path, monkeypatch):
    monkeypatch.setattr(cuda, "STREAM_PIECE", 1 << 16)
    text = english(1_000_000, rng)
    path = tmp_path / "short.txt"
    path.write_bytes(text[:700_000])  # shorter than the job says: the read fails at its end
    params = SearchParams(patterns=(b"the",), positions="files")
    with pytest.raises(OSError, match="ended at byte 700000"):
        cuda.search_file(lease, path, len(text), params)
    path.write_bytes(text)
    check(cuda.search_file(lease, path, len(text), params), text, params, "after a failed read")


def test_streams_are_distinct_and_per_lease(cuda, pool):
    with pool.lease() as a, pool.lease() as b:
        sa, sb = cuda.lease_streams(a, 8), cuda.lease_streams(b, 8)
        assert len({s.ptr for s in sa}) == 8 and not {s.ptr for s in sa} & {s.ptr for s in sb}
        assert [s.ptr for s in cuda.lease_streams(a, 3)] == [s.ptr for s in sa[:3]]
        assert (sa[0].ptr, sa[1].ptr) == (a.stream.ptr, a.side_stream.ptr)


def test_resident_corpora_skip_the_upload_and_are_evicted_lru(cuda, pool, rng, tmp_path):
    from gpu.search.residency import RESIDENT

    RESIDENT.clear()
    texts = {}
    for name in ("a", "b", "c"):
        texts[name] = english(2_000_000, rng)
        (tmp_path / name).write_bytes(texts[name])
    params = SearchParams(patterns=(b"the", b"Python"))
    with pool.lease() as lease:
        first = cuda.search_file(lease, tmp_path / "a", len(texts["a"]), params, key=("a", "1"))
        second = cuda.search_file(lease, tmp_path / "a", len(texts["a"]), params, key=("a", "1"))
        assert (first.resident, second.resident) == (False, True)
        assert first.times_ms["upload"] > 0 and second.times_ms["upload"] == 0
        check(second, texts["a"], params, "resident")
        # A budget for about two texts: the third evicts the least recently used.
        capacity = cuda.device_capacity(lease.device)
        RESIDENT.configure(2.5 * RESIDENT.used(lease.device) / capacity)
        try:
            cuda.search_file(lease, tmp_path / "b", len(texts["b"]), params, key=("b", "1"))
            cuda.search_file(lease, tmp_path / "a", len(texts["a"]), params, key=("a", "1"))  # a is now the most recent
            third = cuda.search_file(lease, tmp_path / "c", len(texts["c"]), params, key=("c", "1"))
            check(third, texts["c"], params, "c")
            assert RESIDENT.keys(lease.device) == [("a", "1"), ("c", "1")]
        finally:
            RESIDENT.configure(0.5)
        unkeyed = cuda.search_file(lease, tmp_path / "b", len(texts["b"]), params)
        assert unkeyed.resident is False and ("b", "1") not in RESIDENT.keys(lease.device)
    RESIDENT.clear()


def test_two_jobs_wanting_the_same_corpus_upload_it_once(cuda, pool, rng, tmp_path):
    from gpu.search.residency import RESIDENT

    RESIDENT.clear()
    text = english(20_000_000, rng)
    (tmp_path / "t").write_bytes(text)
    params = SearchParams(patterns=(b"the",))
    outputs = []

    def job():
        with pool.lease() as lease:
            outputs.append(cuda.search_file(lease, tmp_path / "t", len(text), params, key=("t", "1")))

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.resident for o in outputs) == [False, True]
    for output in outputs:
        check(output, text, params, "concurrent")
    RESIDENT.clear()
