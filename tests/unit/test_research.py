"""The knowledge cache rules: key normalisation, TTL, LRU eviction."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bso.research import CacheIndex, cache_key, insert, lookup, touch

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_cache_key_ignores_case_and_spacing():
    assert cache_key("How to  use FastAPI?") == cache_key("how to use fastapi?")


def test_entries_expire_after_the_ttl():
    index, _ = insert(CacheIndex(), "q", "a", T0, 10)
    assert lookup(index, "q", T0 + timedelta(days=30), 30) is not None
    assert lookup(index, "q", T0 + timedelta(days=30, seconds=1), 30) is None


def test_least_recently_used_entry_is_evicted():
    index, _ = insert(CacheIndex(), "a", "A", T0, 2)
    index, _ = insert(index, "b", "B", T0 + timedelta(seconds=1), 2)
    index = touch(index, "a", T0 + timedelta(seconds=2))  # b is now the least recently used
    index, evicted = insert(index, "c", "C", T0 + timedelta(seconds=3), 2)
    assert evicted == ["b"]
    assert lookup(index, "a", T0, 30) and lookup(index, "c", T0, 30) and not lookup(index, "b", T0, 30)
