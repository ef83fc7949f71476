"""The processor-cache interfaces that P0 (frontend) and P1 (engine) implement.

P0 caches hold an item's processed kwargs (or only its size, when P1 keeps the data) together
with its resolved prompt updates, so a hit needs neither the media nor the HF processor. P1
caches hold the kwargs the engine feeds to the model.

Mirror rule (LRU mode): ``is_cached``/``is_cached_item``/``peek_prompt_updates`` are read-only;
``get_and_update_item`` is called exactly once per item of a request, in placeholder-offset
order, after every item of the request has been touched. P1 walks the same order, so both LRUs
evolve identically.

Every cache answers the mirror protocol (:mod:`mmfront.cache.mirror`) through its ``mirror``:
:class:`SenderMirror` on P0, :class:`ReceiverMirror` on P1. A cache P1 does not mirror answers
through the null halves here, so the frontend and the engine receiver drive every cache alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from mmfront.errors import MultiModalCacheMissError, ValidationError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem
from mmfront.wire.messages import MirrorOnly, MirrorReset, MirrorStamp

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


@dataclass(slots=True)
class MirrorDelivery:
    """A request P1 is done with: ``missing`` is empty when every feature's data is filled in
    (admit it), and otherwise lists the hashes P0 must resend. ``stale_epoch`` is set when P1
    served the request outside the mirror because its epoch was retired."""

    payload: Any
    features: list[MultiModalFeatureSpec]
    missing: list[str]
    stale_epoch: int | None = None


MirrorEvent = MirrorDelivery | MirrorReset
"""What P1's mirror hands the engine receiver: a request to answer, or a reset to announce."""


class SenderMirror(ABC):
    """P0's half of the mirror, as the frontend drives it after each commit."""

    @property
    @abstractmethod
    def epoch(self) -> int | None:
        """The epoch of P0's shadow; ``None`` for a cache P1 does not mirror."""

    @abstractmethod
    def take_stamp(self, request_id: str | None, *, keep: bool = False) -> MirrorStamp | None:
        """The stamp of ``request_id``'s commit, to send with it; ``None`` if it changed nothing.
        ``keep`` leaves it issued until the send succeeds, so a request the transport fails to
        carry can still hand P1 its :meth:`take_mirror_only`."""

    @abstractmethod
    def take_mirror_only(self, request_id: str | None) -> tuple[MirrorStamp, MirrorOnly] | None:
        """For a request committed but never to be sent: its stamp and operations, for P1 to
        replay; ``None`` if it changed nothing P1 mirrors."""


class NullSenderMirror(SenderMirror):
    """The mirror of a cache P1 does not mirror: nothing to stamp, nothing to replay."""

    @property
    def epoch(self) -> int | None:
        return None

    def take_stamp(self, request_id: str | None, *, keep: bool = False) -> MirrorStamp | None:
        return None

    def take_mirror_only(self, request_id: str | None) -> tuple[MirrorStamp, MirrorOnly] | None:
        return None


NULL_SENDER_MIRROR = NullSenderMirror()


class ReceiverMirror(ABC):
    """P1's half of the mirror, as the engine receiver drives it: each method takes what arrived
    and returns what is ready, in order."""

    @abstractmethod
    def receive(
        self, stamp: MirrorStamp | None, features: Sequence[MultiModalFeatureSpec], payload: Any,
    ) -> list[MirrorEvent]:
        """Take one request with the stamp it carries (``None``: it changed nothing on P0)."""

    @abstractmethod
    def receive_mirror_only(self, stamp: MirrorStamp, message: MirrorOnly) -> list[MirrorEvent]:
        """Take the mirror operations of a request P0 committed but never sent."""

    @abstractmethod
    def poll(self) -> list[MirrorEvent]:
        """What became due without an arrival (call it when idle)."""


class NullReceiverMirror(ReceiverMirror):
    """P1 without a mirror: each request is served at once from what ``cache`` holds (fill or
    resolve), stamps are ignored, and a request that lacks data is answered with its misses.
    Without a cache, every feature must carry its data."""

    def __init__(self, cache: BaseMultiModalReceiverCache | None) -> None:
        self._cache = cache

    def receive(
        self, stamp: MirrorStamp | None, features: Sequence[MultiModalFeatureSpec], payload: Any,
    ) -> list[MirrorEvent]:
        feats = list(features)
        return [MirrorDelivery(payload, feats, self._fill(feats))]

    def receive_mirror_only(self, stamp: MirrorStamp, message: MirrorOnly) -> list[MirrorEvent]:
        return []

    def poll(self) -> list[MirrorEvent]:
        return []

    def _fill(self, features: list[MultiModalFeatureSpec]) -> list[str]:
        if not features:
            return []
        if self._cache is None:
            return [f.cache_key for f in features if f.data is None]
        try:
            self._cache.get_and_update_features(features)
        except MultiModalCacheMissError as e:
            return e.mm_hashes
        return []


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

    @property
    def mirror(self) -> SenderMirror:
        """This cache's half of the P0/P1 mirror (the null one unless P1 mirrors it)."""
        return NULL_SENDER_MIRROR


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

    @property
    def mirror(self) -> ReceiverMirror:
        """How P1 takes requests into this cache (the null mirror unless P0 mirrors it)."""
        return NullReceiverMirror(self)
