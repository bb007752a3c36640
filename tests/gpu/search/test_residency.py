"""The device-resident corpus cache (gpu/search/residency.py) without a GPU: entries are
plain objects with an nbytes. LRU order, the per-device budget, eviction by key, by
predicate and by device, and the loading lock that makes concurrent jobs upload once."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from gpu.search.residency import Residency


@dataclass
class Text:
    nbytes: int


def test_least_recently_used_is_evicted_first():
    cache = Residency(fraction=0.5)
    capacity = 2000  # budget 1000 bytes
    assert cache.put(0, "a", Text(400), capacity) == []
    assert cache.put(0, "b", Text(400), capacity) == []
    assert cache.get(0, "a").nbytes == 400  # a is now the most recent
    assert cache.put(0, "c", Text(400), capacity) == ["b"]
    assert cache.keys(0) == ["a", "c"] and cache.used(0) == 800
    assert cache.get(0, "b") is None
    assert cache.put(0, "d", Text(1000), capacity) == ["a", "c"]  # exactly the budget
    assert cache.keys(0) == ["d"]


def test_a_text_larger_than_the_budget_is_not_kept_and_evicts_nothing():
    cache = Residency(fraction=0.5)
    cache.put(0, "a", Text(300), 1000)
    assert cache.put(0, "huge", Text(501), 1000) == []
    assert cache.keys(0) == ["a"] and cache.get(0, "huge") is None


def test_devices_are_separate_and_eviction_by_key_predicate_and_device():
    cache = Residency(fraction=1.0)
    for device in (0, 1):
        cache.put(device, ("c1", "sha"), Text(10), 100)
        cache.put(device, ("c2", "sha"), Text(10), 100)
    assert cache.resident_devices(lambda key: key[0] == "c1") == [0, 1]
    assert cache.evict(("c1", "sha")) == 2
    assert cache.resident_devices(lambda key: key[0] == "c1") == []
    cache.put(1, ("c3", "x"), Text(10), 100)
    assert cache.evict_matching(lambda key: key[1] == "x") == 1
    assert cache.evict_device(0) == 10 and cache.keys(0) == [] and cache.keys(1) == [("c2", "sha")]
    cache.clear()
    assert cache.keys(1) == []


def test_putting_a_key_again_replaces_it():
    cache = Residency(fraction=1.0)
    cache.put(0, "a", Text(60), 100)
    cache.put(0, "a", Text(70), 100)  # not 60 + 70 > 100: the old entry is replaced
    assert cache.keys(0) == ["a"] and cache.used(0) == 70


def test_configure_checks_the_fraction():
    cache = Residency()
    cache.configure(0.25)
    assert cache.fraction == 0.25
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            cache.configure(bad)


def test_loading_serialises_uploads_of_one_key_only():
    cache = Residency(fraction=1.0)
    uploads, order = [], []

    def job(key):
        with cache.loading(0, key):
            if cache.get(0, key) is None:
                uploads.append(key)
                time.sleep(0.05)
                cache.put(0, key, Text(1), 100)
            order.append(key)

    threads = [threading.Thread(target=job, args=(key,)) for key in ("a", "a", "a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(uploads) == ["a", "b"] and sorted(order) == ["a", "a", "a", "b"]


def test_evicting_a_key_drops_its_upload_lock_too():
    """A deleted corpus leaves nothing behind: neither its texts nor its upload locks."""
    cache = Residency(fraction=1.0)
    for device in (0, 1):
        with cache.loading(device, ("gone", "sha")):
            cache.put(device, ("gone", "sha"), Text(10), 100)
        with cache.loading(device, ("kept", "sha")):
            cache.put(device, ("kept", "sha"), Text(10), 100)
    assert cache.evict_matching(lambda key: key[0] == "gone") == 2
    assert sorted(cache._loading) == [(0, ("kept", "sha")), (1, ("kept", "sha"))]
    assert cache.keys(0) == [("kept", "sha")] and cache.keys(1) == [("kept", "sha")]
