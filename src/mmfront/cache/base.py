"""The processor-cache interfaces that P0 (frontend) and P1 (engine) implement.

P0 caches hold an item's processed kwargs (or only its size, when P1 keeps the data) together
with its resolved prompt updates, so a hit needs neither the media nor the HF processor. P1
caches hold the kwargs the engine feeds to the model.

Mirror rule (LRU mode): ``is_cached``/``is_cached_item``/``peek_prompt_updates`` are read-only;
``get_and_update_item`` is called exactly once per item of a request, in placeholder-offset
order, after every item of the request has been touched. P1 walks the same order, so both LRUs
evolve identically.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem

PromptUpdates = Sequence[Any]
"""An item's resolved prompt updates (``mmfront.processing.updates.ResolvedPromptUpdate``): the
cache stores them for the processor and never looks inside, so it need not import the layer above."""
ProcessorCacheInput = tuple[MultiModalKwargsItem, PromptUpdates]
ProcessorCacheOutput = tuple[MultiModalKwargsItem | None, PromptUpdates]

I = TypeVar("I")
O = TypeVar("O")


@dataclass(frozen=True)
class CacheInfo:
    """Hit statistics: ``total`` lookups, of which ``hits`` found the key."""

    hits: int = 0
    total: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.total if self.total else 0.0

    def __sub__(self, other: CacheInfo) -> CacheInfo:
        return CacheInfo(hits=self.hits - other.hits, total=self.total - other.total)


class HitCounter:
    """Lookups and hits, cumulative and as deltas since the previous ``delta=True`` read."""

    __slots__ = ("_last", "hits", "total")

    def __init__(self) -> None:
        self.hits = 0
        self.total = 0
        self._last = CacheInfo()

    def reset(self) -> None:
        self.hits = 0
        self.total = 0
        self._last = CacheInfo()

    def stat(self, *, delta: bool = False) -> CacheInfo:
        info = CacheInfo(hits=self.hits, total=self.total)
        if not delta:
            return info
        change = info - self._last
        self._last = info
        return change


class BaseMultiModalCache(ABC, Generic[I, O]):
    """A cache keyed by ``mm_hash`` whose update both reads and writes."""

    @abstractmethod
    def get_and_update_item(self, mm_item: I, mm_hash: str) -> O:
        """Return the cached value for ``mm_hash`` (a hit) or store ``mm_item`` (a miss)."""

    def get_and_update(self, mm_items: Sequence[I], mm_hashes: Sequence[str]) -> list[O]:
        if len(mm_items) != len(mm_hashes):
            raise ValidationError(f"Got {len(mm_items)} items for {len(mm_hashes)} hashes: pass one mm_hash per item",
                                  parameter="mm_hashes")
        return [self.get_and_update_item(item, h) for item, h in zip(mm_items, mm_hashes)]

    @abstractmethod
    def clear_cache(self) -> None:
        """Drop every entry and reset the statistics."""


class BaseMultiModalProcessorCache(BaseMultiModalCache[ProcessorCacheInput | None, ProcessorCacheOutput]):
    """P0's side: input is ``(item, prompt_updates)`` on a miss or ``None`` for a cached item."""

    commit_at_send: ClassVar[bool] = False
    """Whether P1 depends on this cache's state (the mirrored LRU, shared memory): then a
    request's items are committed only when the request is handed to the transport, never while
    it is prepared, so a request that is never sent leaves no trace."""

    @abstractmethod
    def is_cached_item(self, mm_hash: str) -> bool:
        """Read-only: neither reorders the LRU nor counts in the statistics."""

    def is_cached(self, mm_hashes: Sequence[str]) -> list[bool]:
        return [self.is_cached_item(h) for h in mm_hashes]

    @abstractmethod
    def peek_prompt_updates(self, mm_hash: str) -> PromptUpdates | None:
        """Read-only: the cached prompt updates of ``mm_hash``, or ``None`` if it is not cached.

        Lets P0 place a request's placeholders before it commits the cache updates, so it can
        commit them in placeholder-offset order, the order P1 walks."""

    def cached_nbytes(self, mm_hash: str) -> int | None:
        """The size of the item P1 holds under ``mm_hash`` (what a reference saves on the wire),
        where the cache knows it."""
        return None

    def touch_sender_cache_item(self, mm_hash: str) -> None:
        """Protect ``mm_hash`` from eviction by the inserts of the current request."""

    def release_sender_touches(self) -> None:
        """End the protection granted by :meth:`touch_sender_cache_item`."""

    def invalidate(self, mm_hash: str) -> None:
        """Forget ``mm_hash`` because P1 reported it missing; the next use resends its data."""

    def begin_request(self, request_id: str) -> None:
        """Attribute what the following updates issue (shm handles, mirror operations) to
        ``request_id``, until :meth:`release_sender_touches`."""

    def on_request_finished(self, request_id: str) -> None:
        """The request has left the engine: what was held for it (shm chunks) may be reused."""

    def on_request_aborted(self, request_id: str) -> None:
        """The request was aborted: what was held for it is reclaimed after a grace period."""

    @abstractmethod
    def make_stats(self, *, delta: bool = False) -> CacheInfo:
        """Cumulative statistics, or the change since the previous ``delta=True`` call."""

    def close(self) -> None:
        """Release resources held by the cache (shared memory)."""


class BaseMultiModalReceiverCache(
    BaseMultiModalCache[MultiModalKwargsItem | None, MultiModalKwargsItem]
):
    """P1's side: fills in the data P0 left out because P1 already holds it."""

    @abstractmethod
    def touch_receiver_cache_item(self, mm_hash: str, mm_item: MultiModalKwargsItem | None = None) -> None:
        """Mark ``mm_hash`` as used by the current request (moves it to MRU if present)."""

    @abstractmethod
    def get_and_update_features(self, mm_features: Sequence[MultiModalFeatureSpec]) -> list[MultiModalFeatureSpec]:
        """Touch every feature, then fill or store each one, in the given (offset) order.

        Raises :class:`~mmfront.errors.MultiModalCacheMissError` listing *every* missing hash,
        after the features that did carry data have been stored."""
