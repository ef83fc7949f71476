"""The in-process processor caches: P0's processor-only and mirrored sender caches, P1's receiver.

Mirror invariant (LRU mode): P0's :class:`LruKeyReplicatedSenderCache` keeps only each item's
size and prompt updates, P1's :class:`LruKeyReplicatedReceiverCache` keeps the item. Both use the
same capacity and the same size (``MultiModalKwargsItem.nbytes``), both touch every item of a
request before updating, and both update once per item in the same order, so both LRUs evict
the same keys at the same moments and P0 knows, without asking, which items P1 still holds.

Every method on the hit path is a handful of dict operations: no logging, no formatting, no
allocation beyond the returned tuple.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Generic, TypeVar

from mmfront.cache._lrumap import LRUCache
from mmfront.cache.base import (
    BaseMultiModalProcessorCache,
    BaseMultiModalReceiverCache,
    CacheInfo,
    ProcessorCacheInput,
    ProcessorCacheOutput,
    PromptUpdates,
)
from mmfront.config import GiB_bytes
from mmfront.errors import CacheError, MultiModalCacheMissError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem

V = TypeVar("V")

logger = logging.getLogger(__name__)


class OversizeWarning:
    """Logs once per cache that an item larger than the whole cache is served uncached.

    P0 and P1 skip such an item alike (its size is deterministic), so the mirror holds; the
    warning tells the operator that every request with it pays full processing and transfer.
    """

    __slots__ = ("_flag", "_warned")

    def __init__(self, flag: str) -> None:
        self._flag = flag
        self._warned = False

    def __call__(self, nbytes: int, capacity: int) -> None:
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "Skipping multi-modal processor cache insert for an item of %.3f GiB because it exceeds "
            "%s=%.3f GiB; such items are processed and sent on every request. Raise %s to cache them.",
            nbytes / GiB_bytes, self._flag, capacity / GiB_bytes, self._flag,
        )


def no_data_error(mm_hash: str) -> CacheError:
    return CacheError(
        f"Processor cache has no entry for mm_hash {mm_hash!r} and no item was given. Pass "
        "(item, prompt_updates) for every item is_cached() reported missing; if it reported this "
        "one cached, the request's own inserts evicted it because its items together exceed "
        "mm_processor_cache_gb (raise it, or process the item again)."
    )


class _LruProcessorCache(BaseMultiModalProcessorCache, Generic[V]):
    """A P0 cache over one byte-budgeted LRU keyed by ``mm_hash``; subclasses say what an entry
    holds (``get_and_update_item`` stays in each subclass: it is the hot path)."""

    def __init__(self, capacity_bytes: int) -> None:
        self._cache: LRUCache[str, V] = LRUCache(capacity_bytes)
        self._oversize = OversizeWarning("mm_processor_cache_gb")

    def is_cached_item(self, mm_hash: str) -> bool:
        return mm_hash in self._cache

    def cached_nbytes(self, mm_hash: str) -> int | None:
        return self._cache.size_of(mm_hash)

    def touch_sender_cache_item(self, mm_hash: str) -> None:
        self._cache.touch(mm_hash)

    def invalidate(self, mm_hash: str) -> None:
        self._cache.pop(mm_hash)

    def clear_cache(self) -> None:
        self._cache.clear()

    def make_stats(self, *, delta: bool = False) -> CacheInfo:
        return self._cache.stat(delta=delta)


class MultiModalProcessorOnlyCache(_LruProcessorCache[ProcessorCacheInput]):
    """P0 cache of full items and prompt updates, for when P1 keeps no mirror.

    Used when IPC caching is impossible (several API processes, or internal DP load balancing)
    and for warm-up and tokenize-only requests, which must never disturb the sender/receiver
    mirror.
    """

    def peek_prompt_updates(self, mm_hash: str) -> PromptUpdates | None:
        entry = self._cache.peek(mm_hash)
        return None if entry is None else entry[1]

    def get_and_update_item(self, mm_item: ProcessorCacheInput | None, mm_hash: str) -> ProcessorCacheOutput:
        cached = self._cache.get(mm_hash)
        if cached is not None:
            return cached
        if mm_item is None:
            raise no_data_error(mm_hash)
        nbytes = mm_item[0].nbytes
        if not self._cache.put_if_fits(mm_hash, mm_item, nbytes):
            self._oversize(nbytes, self._cache.capacity)
        return mm_item


class LruKeyReplicatedSenderCache(_LruProcessorCache[PromptUpdates]):
    """P0's shadow of P1's LRU: sizes and prompt updates only; a hit sends ``data=None``.

    The stored value is the prompt-update sequence itself and the LRU weighs it by the item's
    ``nbytes``, so the shadow charges exactly what P1 charges for the real item.
    """

    commit_at_send = True

    def peek_prompt_updates(self, mm_hash: str) -> PromptUpdates | None:
        return self._cache.peek(mm_hash)

    def get_and_update_item(self, mm_item: ProcessorCacheInput | None, mm_hash: str) -> ProcessorCacheOutput:
        updates = self._cache.get(mm_hash)
        if updates is not None:
            return None, updates
        if mm_item is None:
            raise no_data_error(mm_hash)
        nbytes = mm_item[0].nbytes
        if not self._cache.put_if_fits(mm_hash, mm_item[1], nbytes):
            self._oversize(nbytes, self._cache.capacity)
        return mm_item


class LruKeyReplicatedReceiverCache(BaseMultiModalReceiverCache):
    """P1's LRU of items, kept in lockstep with P0's :class:`LruKeyReplicatedSenderCache`.

    A feature that arrives with data always replaces what is stored under its hash (the sender
    only sends data when it believes P1 lacks the item, so a stored copy is stale); a feature
    without data is filled from the cache, and every hash that cannot be filled is reported in
    one :class:`~mmfront.errors.MultiModalCacheMissError`.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self._cache: LRUCache[str, MultiModalKwargsItem] = LRUCache(capacity_bytes)
        self._oversize = OversizeWarning("mm_processor_cache_gb")

    def is_cached_item(self, mm_hash: str) -> bool:
        """Read-only membership test (for diagnostics and tests; P1's flow never needs it)."""
        return mm_hash in self._cache

    def touch_receiver_cache_item(self, mm_hash: str, mm_item: MultiModalKwargsItem | None = None) -> None:
        self._cache.touch(mm_hash)

    def get_and_update_item(self, mm_item: MultiModalKwargsItem | None, mm_hash: str) -> MultiModalKwargsItem:
        if mm_item is None:
            cached = self._cache.get(mm_hash)
            if cached is None:
                raise MultiModalCacheMissError([mm_hash])
            return cached
        if not self._cache.put_if_fits(mm_hash, mm_item, mm_item.nbytes):
            self._cache.pop(mm_hash)
            self._oversize(mm_item.nbytes, self._cache.capacity)
        return mm_item

    def get_and_update_features(self, mm_features: Sequence[MultiModalFeatureSpec]) -> list[MultiModalFeatureSpec]:
        keys = [f.cache_key for f in mm_features]
        for key in keys:
            self._cache.touch(key)
        missing: list[str] = []
        for feature, key in zip(mm_features, keys):
            if feature.data is None:
                cached = self._cache.get(key)
                if cached is None:
                    missing.append(key)
                    continue
                feature.data = cached
            else:
                self.get_and_update_item(feature.data, key)
        if missing:
            raise MultiModalCacheMissError(missing)
        return list(mm_features)

    def clear_cache(self) -> None:
        self._cache.clear()

    def make_stats(self, *, delta: bool = False) -> CacheInfo:
        return self._cache.stat(delta=delta)
