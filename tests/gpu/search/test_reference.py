"""The string-search reference (gpu/search/reference.py) and parameters (params.py) on
the CPU: the pattern tables against their definitions, the three algorithms in the
chunked scheme against brute force on every case of the issue, line numbers, the CPU
backend's blocks, progress and mmap, the launch plan, and the validation of every
parameter. The CPU backend on every case and each positions mode, by the same bodies as
the CUDA backend: test_backends.py."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from search_cases import CASE_NAMES, boundary_text, cases, english

from gpu.search import reference as ref
from gpu.search.params import (
    GRANULARITY_MAX,
    MAX_PATTERN_BYTES,
    READ_MARGIN,
    RK_BASE,
    SLOTS_MAX,
    THREADS,
    TILE_BYTES,
    ParamError,
    SearchParams,
    blocks_ready,
    choose_algorithm,
    default_granularity,
    odd_multiple_of_16,
    plan_launch,
)
from tests.gpu.search.checks import ALGORITHMS, VARIANTS


def random_pattern(rng, alphabet: bytes, low: int = 1, high: int = 12) -> bytes:
    m = int(rng.integers(low, high + 1))
    return bytes(np.frombuffer(alphabet, np.uint8)[rng.integers(0, len(alphabet), m)])


# ------------------------------------------------------------------- tables --


def test_lps_table_is_the_longest_proper_border_of_each_prefix(rng):
    for _ in range(300):
        p = random_pattern(rng, b"ab" if rng.random() < 0.5 else b"abc")
        expected = [max(k for k in range(j + 1) if p[:k] == p[j + 1 - k : j + 1]) for j in range(len(p))]
        assert ref.lps_table(p).tolist() == expected, p


def test_bad_character_table_is_the_last_occurrence_of_each_byte(rng):
    for _ in range(100):
        p = bytes(rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8))
        table = ref.bad_character_table(p)
        assert table.dtype == np.int16 and table.shape == (256,)
        for c in range(256):
            assert table[c] == p.rfind(bytes([c])), (p, c)


def good_suffix_by_definition(p: bytes) -> list[int]:
    """shift[j + 1] after a mismatch at j: the least s >= 1 with p[k - s] == p[k] for every
    matched k > j that stays in the pattern, and p[j - s] != p[j] (or j - s < 0);
    shift[0]: the least s >= 1 with p[k - s] == p[k] wherever k - s >= 0 (the period)."""
    m = len(p)
    out = []
    for i in range(m + 1):
        j = i - 1
        for s in range(1, m + 1):
            if all(k - s < 0 or p[k - s] == p[k] for k in range(max(i, 0), m)) and (
                i == 0 or j - s < 0 or p[j - s] != p[j]
            ):
                break
        out.append(s)
    return out


def test_good_suffix_table_is_the_strong_good_suffix_rule(rng):
    for _ in range(400):
        p = random_pattern(rng, b"ab" if rng.random() < 0.5 else b"abc", 1, 10)
        assert ref.good_suffix_table(p).tolist() == good_suffix_by_definition(p), p


def test_rabin_karp_hash_and_its_roll(rng):
    data = rng.integers(0, 256, 200, dtype=np.uint8).tobytes()
    m = 37
    assert ref.rk_hash(data[:m]) == sum(b * pow(RK_BASE, m - 1 - i, 2**32) for i, b in enumerate(data[:m])) % 2**32
    h, power = ref.rk_hash(data[:m]), ref.rk_power(m)
    for i in range(len(data) - m):
        h = (h * RK_BASE + data[i + m] - power * data[i]) & 0xFFFFFFFF
        assert h == ref.rk_hash(data[i + 1 : i + 1 + m]), i


# ------------------------------------------------- the algorithms, chunked --


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_chunked_algorithms_find_what_brute_force_finds(rng, name, algorithm):
    text, patterns, built_for = cases(rng, size=6000)[name]
    granularities = sorted({1, 7, 16, 333, 6001} | ({built_for} if built_for else set()))
    for pattern in patterns:
        expected = ref.brute_force(text, pattern)
        if algorithm == "boyer_moore" and expected.size * len(pattern) > 300_000:
            # Python Boyer-Moore compares every byte of each of these matches: minutes; the GPU tests cover them
            continue
        for g in granularities:
            if g < 16 and len(pattern) > 256:
                continue  # each one-to-few-position chunk hashes or scans 4 KB in Python: slow, and g = 16 covers it
            got = ref.search_chunked(text, pattern, algorithm, g)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(
                got, expected, err_msg=f"{name}: {algorithm} g={g} pattern={pattern[:40]!r} (m={len(pattern)})"
            )


def test_chunked_algorithms_on_random_small_cases(rng):
    """Short texts over 2 letters: every overlap, border and chunk edge, many times."""
    for _ in range(300):
        text = random_pattern(rng, b"ab", 0, 60)
        pattern = random_pattern(rng, b"ab", 1, 7)
        expected = ref.brute_force(text, pattern)
        for algorithm in ALGORITHMS:
            for g in (1, 2, 3, 5, 64):
                np.testing.assert_array_equal(
                    ref.search_chunked(text, pattern, algorithm, g),
                    expected,
                    err_msg=f"{algorithm} g={g} {text!r} {pattern!r}",
                )


def test_overlapping_occurrences_are_all_found():
    for algorithm in ALGORITHMS:
        assert ref.search_chunked(b"aaaaaaa", b"aaaa", algorithm, 2).tolist() == [0, 1, 2, 3]
        assert ref.search_chunked(b"abababa", b"aba", algorithm, 1).tolist() == [0, 2, 4]
    assert ref.find_all(b"aaaaaaa", b"aaaa").tolist() == [0, 1, 2, 3]


def test_boundary_case_straddles_every_chunk_boundary(rng):
    text, pattern = boundary_text(80, 16, 24_000, rng)
    starts = ref.brute_force(text, pattern)
    offsets = {int(80 - s % 80) % 80 for s in starts if 0 < 80 - s % 80 < 16}  # bytes before the boundary
    assert offsets == set(range(1, 16)), sorted(offsets)


# ------------------------------------------------------------- CPU backend --


def test_line_numbers_count_the_newlines_before_each_position(rng, monkeypatch):
    monkeypatch.setattr(ref, "BLOCK_BYTES", 1000)  # many blocks
    text = english(20_000, rng)
    for pattern in (b"\n", b"the", b"e"):
        positions = ref.brute_force(text, pattern)
        expected = np.asarray([text.count(b"\n", 0, p) + 1 for p in positions], np.int64)
        np.testing.assert_array_equal(ref.line_numbers(text, positions), expected)
    assert ref.line_numbers(b"abc\n\ndef", np.asarray([0, 3, 4, 5], np.int64)).tolist() == [1, 1, 2, 3]
    assert ref.line_numbers(b"abc", np.zeros(0, np.int64)).tolist() == []


@pytest.mark.parametrize("use_mmap", [False, True])
def test_cpu_backend_searches_block_by_block_with_progress(rng, monkeypatch, tmp_path, use_mmap):
    monkeypatch.setattr(ref, "BLOCK_BYTES", 997)  # blocks much smaller than the text: matches straddle them
    text, patterns, _ = cases(rng)["english"]
    params = SearchParams(patterns=tuple(patterns), line_numbers=True, positions="files")
    seen = []
    path = tmp_path / "corpus.bin"
    path.write_bytes(text)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        output = ref.search(mm if use_mmap else text, params, progress=seen.append)
    assert output.text_bytes == len(text)
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)
    for pattern, result in zip(patterns, output.patterns, strict=True):
        expected = ref.brute_force(text, pattern)
        np.testing.assert_array_equal(result.positions, expected, err_msg=repr(pattern))
        np.testing.assert_array_equal(result.lines, [text.count(b"\n", 0, p) + 1 for p in expected])
        assert result.algorithm == ref.CPU_ALGORITHM


def test_cpu_backend_progress_can_cancel(rng, monkeypatch):
    monkeypatch.setattr(ref, "BLOCK_BYTES", 1000)

    class Stop(Exception):
        pass

    def progress(fraction):
        if fraction > 0.3:
            raise Stop

    with pytest.raises(Stop):
        ref.search(english(10_000, rng), SearchParams(patterns=(b"the",)), progress)


# ------------------------------------------------------------------ params --


def test_params_defaults_and_stream_count():
    params = SearchParams(patterns=(b"a", b"bc"))
    assert (
        params.algorithm,
        params.variant,
        params.granularity,
        params.max_positions,
        params.line_numbers,
        params.fused,
        params.positions,
    ) == ("auto", "optimized", None, 1000, False, False, "json")
    assert params.positions_wanted == 1000
    assert SearchParams(patterns=(b"a",), positions="none", max_positions=7).positions_wanted == 0
    assert SearchParams(patterns=(b"a",), positions="files", max_positions=7).positions_wanted is None
    assert params.stream_count == 2
    assert SearchParams(patterns=(b"x",) * 8).stream_count == 4
    assert SearchParams(patterns=(b"x",) * 8, streams=8).stream_count == 8
    assert SearchParams(patterns=(b"x",) * 8, fused=True).stream_count == 1
    assert SearchParams(patterns=[bytearray(b"ab")]).patterns == (b"ab",)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"patterns": ()}, "patterns"),
        ({"patterns": (b"a",) * 9}, "patterns"),
        ({"patterns": b"abc"}, "patterns"),
        ({"patterns": (b"",)}, "patterns[0]"),
        ({"patterns": (b"a", b"x" * (MAX_PATTERN_BYTES + 1))}, "patterns[1]"),
        ({"patterns": ("text",)}, "patterns[0]"),
        ({"algorithm": "aho_corasick"}, "algorithm"),
        ({"variant": "fast"}, "variant"),
        ({"granularity": 0}, "granularity"),
        ({"granularity": GRANULARITY_MAX["optimized"] + 1}, "granularity"),
        ({"granularity": GRANULARITY_MAX["naive"] + 1, "variant": "naive"}, "granularity"),
        ({"granularity": 2.5}, "granularity"),
        ({"granularity": True}, "granularity"),
        ({"streams": 0}, "streams"),
        ({"streams": 9}, "streams"),
        ({"max_positions": -1}, "max_positions"),
        ({"max_positions": 100_001}, "max_positions"),
        ({"line_numbers": 1}, "line_numbers"),
        ({"fused": True, "algorithm": "kmp"}, "fused"),
        ({"fused": True, "variant": "naive"}, "fused"),
        ({"positions": "all"}, "positions"),
        ({"positions": None}, "positions"),
    ],
)
def test_bad_params_name_the_parameter(kwargs, name):
    kwargs = {"patterns": (b"abc",), **kwargs}
    with pytest.raises(ParamError) as caught:
        SearchParams(**kwargs)
    assert caught.value.field == name
    assert str(caught.value).startswith(f"{name}: ")


def test_auto_chooses_by_alphabet_and_length():
    assert choose_algorithm(b"aaaa") == "kmp"
    assert choose_algorithm(b"a") == "kmp"
    assert choose_algorithm(b"ACGTTGCA") == "rabin_karp"
    assert choose_algorithm(b"the") == "kmp"
    assert choose_algorithm(b"the quick brown fox") == "boyer_moore"
    assert choose_algorithm(b"ACGT") == "boyer_moore"  # too short to say the alphabet is small
    params = SearchParams(patterns=(b"aaaa", b"ACGTACCA", b"quick brown"))
    assert [params.algorithm_for(p) for p in params.patterns] == ["kmp", "rabin_karp", "boyer_moore"]
    assert SearchParams(patterns=(b"quick brown",), algorithm="kmp").algorithm_for(b"quick brown") == "kmp"
    assert SearchParams(patterns=(b"quick brown",), fused=True).algorithm_for(b"quick brown") == "rabin_karp"


def test_odd_multiple_of_16():
    assert [odd_multiple_of_16(v) for v in (1, 16, 17, 32, 33, 48, 49, 2048)] == [16, 16, 48, 48, 48, 48, 80, 2064]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("m", [1, 4, 16, 64, 256, 1000, 4096])
@pytest.mark.parametrize("granularity", [None, 1, 15, 100, 1024, 2048])
def test_launch_plan_geometry(variant, algorithm, m, granularity):
    params = SearchParams(patterns=(b"x" * m,), algorithm=algorithm, variant=variant, granularity=granularity)
    launch = plan_launch(params, algorithm, m)
    requested = granularity or default_granularity(variant, algorithm, m)
    assert launch.threads % 32 == 0 and 32 <= launch.threads <= THREADS
    assert 16 <= launch.slots <= SLOTS_MAX
    assert launch.block_positions == launch.threads * launch.granularity < 2**24  # block-relative offsets have 24 bits
    if variant == "optimized":
        assert launch.granularity % 32 == 16 and requested <= launch.granularity < requested + 32
        assert launch.block_positions <= max(TILE_BYTES, 32 * launch.granularity)
    else:
        assert launch.granularity == requested and launch.threads == THREADS
    assert launch.blocks(1) == 1 and launch.blocks(launch.block_positions + 1) == 2


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", [1, 7, 64, 4096])
def test_blocks_ready_only_once_their_windows_have_arrived(rng, variant, m):
    """Uploads that end anywhere: the blocks counted so far only ever grow, each reads only
    bytes that have arrived (its windows and READ_MARGIN), and a block is held back only
    while they have not: so every start position is counted exactly once, by its block,
    after the bytes of its window are on the device."""
    params = SearchParams(patterns=(b"x" * m,), variant=variant, granularity=int(rng.integers(1, 300)))
    launch = plan_launch(params, "kmp", m)
    n = int(rng.integers(m, 40 * launch.block_positions))
    end = n - m + 1
    blocks = launch.blocks(end)
    counted = 0
    for uploaded in sorted(rng.integers(0, n, 30).tolist()) + [n]:
        ready = blocks_ready(uploaded, n, launch, m, blocks)
        assert counted <= ready <= blocks, (uploaded, ready)
        if ready < blocks:
            reads_up_to = ready * launch.block_positions + m - 1 + READ_MARGIN  # exclusive, block ready - 1
            assert ready == 0 or reads_up_to <= uploaded, (uploaded, ready)
            next_needs = (ready + 1) * launch.block_positions + m - 1 + READ_MARGIN
            assert next_needs > uploaded, (uploaded, ready)  # the next block waits only for missing bytes
        counted = ready
    assert counted == blocks
