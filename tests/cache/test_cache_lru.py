from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.cache._lrumap import LRUCache
from mmfront.cache.base import CacheInfo
from mmfront.errors import CacheError


def _filled(capacity: int = 10, **sizes: int) -> LRUCache[str, str]:
    cache: LRUCache[str, str] = LRUCache(capacity)
    for key, size in sizes.items():
        assert cache.put_if_fits(key, f"v{key}", size)
    return cache


def test_contains_and_peek_neither_reorder_nor_count():
    cache = _filled(A=1, B=1, C=1)
    assert "A" in cache
    assert "Z" not in cache
    assert cache.peek("A") == "vA"
    assert cache.peek("Z") is None
    assert cache.order == ["A", "B", "C"]
    assert cache.stat() == CacheInfo(hits=0, total=0)


def test_get_moves_to_mru_and_counts():
    cache = _filled(A=1, B=1, C=1)
    assert cache.get("A") == "vA"
    assert cache.get("Z") is None
    assert cache.order == ["B", "C", "A"]
    assert cache.stat() == CacheInfo(hits=1, total=2)


def test_touch_moves_present_keys_only():
    cache = _filled(A=1, B=1, C=1)
    cache.touch("A")
    cache.touch("Z")
    assert cache.order == ["B", "C", "A"]
    assert "Z" not in cache
    assert cache.stat() == CacheInfo(hits=0, total=0)


def test_put_if_fits_evicts_least_recently_used_until_it_fits():
    cache = _filled(10, A=3, B=3, C=3)
    cache.get("A")
    assert cache.put_if_fits("D", "vD", 5)
    assert cache.order == ["A", "D"]
    assert cache.currsize == 8
    assert len(cache) == 2


def test_put_if_fits_refuses_oversize_without_changing_anything():
    cache = _filled(10, A=3, B=3)
    assert not cache.put_if_fits("X", "vX", 11)
    assert not cache.put_if_fits("A", "new", 11)
    assert cache.order == ["A", "B"]
    assert cache.peek("A") == "vA"
    assert cache.currsize == 6


def test_put_if_fits_exact_capacity_and_zero_size():
    cache = _filled(10, A=3)
    assert cache.put_if_fits("B", "vB", 10)
    assert cache.order == ["B"]
    assert cache.put_if_fits("C", "vC", 0)
    assert cache.order == ["B", "C"]
    assert cache.currsize == 10


def test_put_replaces_existing_key_with_new_size_at_mru():
    cache = _filled(10, A=3, B=3)
    assert cache.put_if_fits("A", "new", 5)
    assert cache.order == ["B", "A"]
    assert cache.peek("A") == "new"
    assert cache.size_of("A") == 5
    assert cache.currsize == 8


def test_pop():
    cache = _filled(10, A=3, B=4)
    assert cache.pop("A") == "vA"
    assert cache.pop("A") is None
    assert cache.currsize == 4
    assert cache.order == ["B"]


def test_clear_resets_entries_and_stats():
    cache = _filled(10, A=3)
    cache.get("A")
    cache.stat(delta=True)
    cache.clear()
    assert len(cache) == 0
    assert cache.currsize == 0
    assert cache.stat() == CacheInfo(0, 0)
    cache.get("A")
    assert cache.stat(delta=True) == CacheInfo(hits=0, total=1)


def test_stat_delta_reports_change_since_previous_delta_call():
    cache = _filled(10, A=1)
    cache.get("A")
    cache.get("B")
    assert cache.stat(delta=True) == CacheInfo(hits=1, total=2)
    assert cache.stat(delta=True) == CacheInfo(hits=0, total=0)
    cache.get("A")
    assert cache.stat() == CacheInfo(hits=2, total=3)
    assert cache.stat(delta=True) == CacheInfo(hits=1, total=1)
    assert cache.stat(delta=True).hit_ratio == 0.0


@pytest.mark.parametrize("capacity", [-1, 1.5, True, "10"])
def test_invalid_capacity(capacity):
    with pytest.raises(CacheError, match="capacity"):
        LRUCache(capacity)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "touch", "pop", "contains"]),
        st.sampled_from("ABCDEFG"),
        st.integers(min_value=0, max_value=12),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_matches_a_reference_lru(ops):
    """Same answers and order as a list-based model of a byte-budgeted LRU."""
    capacity = 10
    cache: LRUCache[str, int] = LRUCache(capacity)
    order: list[str] = []
    values: dict[str, int] = {}
    sizes: dict[str, int] = {}
    hits = total = 0
    for op, key, n in ops:
        if op == "put":
            fits = n <= capacity
            if fits:
                if key in order:
                    order.remove(key)
                while sum(sizes[k] for k in order) + n > capacity:
                    order.pop(0)
                order.append(key)
                values[key], sizes[key] = n, n
            assert cache.put_if_fits(key, n, n) is fits
        elif op == "get":
            total += 1
            expected = values[key] if key in order else None
            if key in order:
                hits += 1
                order.remove(key)
                order.append(key)
            assert cache.get(key) == expected
        elif op == "touch":
            if key in order:
                order.remove(key)
                order.append(key)
            cache.touch(key)
        elif op == "pop":
            expected = values[key] if key in order else None
            if key in order:
                order.remove(key)
            assert cache.pop(key) == expected
        else:
            assert (key in cache) is (key in order)
        assert cache.order == order
        assert cache.currsize == sum(sizes[k] for k in order)
    assert cache.stat() == CacheInfo(hits=hits, total=total)
