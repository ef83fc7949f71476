"""A byte-budgeted LRU map: the primitive under every mirrored processor cache.

Sizes are passed in by the caller (an item's ``nbytes``, known since the item was built), so an
insert never walks the value. vLLM 0.33 computes the size by walking the item on every insert on
both P0 and P1, which is about 85% of its insert time.

Order lives in a :class:`collections.OrderedDict` (C-level ``move_to_end`` and
``popitem(last=False)``, both O(1)); sizes live in a second dict that is only touched on insert
and removal, so a hit is a single ``move_to_end``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from mmfront.cache.base import CacheInfo, HitCounter
from mmfront.errors import CacheError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """Least-recently-used map whose entries together weigh at most ``capacity`` bytes.

    ``key in cache`` and :meth:`peek` neither reorder nor count; :meth:`get` moves the key to
    the most-recently-used end and counts one lookup (and one hit when found), so statistics
    measure exactly the lookups that decided something.
    """

    __slots__ = ("_capacity", "_counter", "_currsize", "_data", "_sizes")

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise CacheError(f"LRUCache capacity must be a byte count >= 0, got {capacity!r}")
        self._capacity = capacity
        self._currsize = 0
        self._data: OrderedDict[K, V] = OrderedDict()
        self._sizes: dict[K, int] = {}
        self._counter = HitCounter()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def currsize(self) -> int:
        """Bytes held by the current entries."""
        return self._currsize

    @property
    def order(self) -> list[K]:
        """Keys from least to most recently used."""
        return list(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def size_of(self, key: K) -> int | None:
        return self._sizes.get(key)

    def peek(self, key: K) -> V | None:
        """The value of ``key`` without reordering or counting."""
        return self._data.get(key)

    def get(self, key: K) -> V | None:
        """The value of ``key`` (moved to most recently used), or ``None``; counted in the stats."""
        counter = self._counter
        counter.total += 1
        value = self._data.get(key)
        if value is not None:
            counter.hits += 1
            self._data.move_to_end(key)
        return value

    def touch(self, key: K) -> None:
        """Move ``key`` to most recently used if present, so inserts evict other keys first."""
        if key in self._data:
            self._data.move_to_end(key)

    def put_if_fits(self, key: K, value: V, size: int, evicted: list[K] | None = None) -> bool:
        """Insert (or replace) ``key`` as most recently used, evicting LRU entries to make room.

        Returns ``False`` and changes nothing when ``size`` exceeds the whole capacity. ``value``
        must not be ``None`` (``None`` is what :meth:`get` returns for a miss). The evicted keys
        are appended to ``evicted`` when one is given: the mirrored caches fold them into their
        drift digest, and the check costs nothing unless something is evicted.
        """
        if size > self._capacity:
            return False
        data = self._data
        if key in data:
            del data[key]
            self._currsize -= self._sizes.pop(key)
        currsize = self._currsize + size
        if currsize > self._capacity:
            sizes = self._sizes
            while currsize > self._capacity:
                old, _ = data.popitem(last=False)
                currsize -= sizes.pop(old)
                if evicted is not None:
                    evicted.append(old)
        data[key] = value
        self._sizes[key] = size
        self._currsize = currsize
        return True

    def pop(self, key: K) -> V | None:
        """Remove ``key``; its value, or ``None`` if it was absent."""
        value = self._data.pop(key, None)
        if value is not None:
            self._currsize -= self._sizes.pop(key)
        return value

    def clear(self) -> None:
        """Drop every entry and reset the statistics."""
        self._data.clear()
        self._sizes.clear()
        self._currsize = 0
        self._counter.reset()

    def stat(self, *, delta: bool = False) -> CacheInfo:
        """Cumulative ``CacheInfo``, or its change since the previous ``delta=True`` call."""
        return self._counter.stat(delta=delta)
