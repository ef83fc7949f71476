"""P1's half of the mirror: the LRU that applies stamped requests in P0's order and resets on drift."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mmfront.cache.base import MirrorDelivery, MirrorEvent, ReceiverMirror
from mmfront.cache.lru import LruKeyReplicatedReceiverCache
from mmfront.cache.mirror.oplog import HIT, OVERSIZE, OpLog, initial_digest
from mmfront.errors import CacheError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem
from mmfront.wire.messages import MirrorOnly, MirrorOp, MirrorReset, MirrorStamp

logger = logging.getLogger(__name__)

DEFAULT_GAP_TIMEOUT_S = 5.0
"""How long P1 waits for a missing ``seq`` before it gives up on the epoch and resets."""

DEFAULT_MAX_PENDING = 1024
"""How many early arrivals P1 buffers in all, over every epoch, before it gives up on the epoch
waiting longest and resets: a flood of requests of unknown epochs costs bounded memory."""

_PLACEHOLDER = MultiModalKwargsItem()
"""What P1 stores for an item inserted by a mirror-only message: it weighs what P0 charged, and
a request that needs its data gets a miss."""


@dataclass(slots=True)
class _Entry:
    stamp: MirrorStamp
    features: list[MultiModalFeatureSpec] | None
    ops: list[MirrorOp] | None
    payload: Any


class MirroredReceiverCache(LruKeyReplicatedReceiverCache, ReceiverMirror):
    """P1's LRU that applies stamped requests in P0's order and resets on any drift.

    :meth:`receive` and :meth:`receive_mirror_only` take what arrived and return what is ready,
    in order: a :class:`MirrorReset` to send to P0, and a :class:`MirrorDelivery` per request
    that can be answered (admitted, or missing items). Call :meth:`poll` when nothing arrives, so
    a gap that never fills still resets after ``gap_timeout_s``.

    Driven per item instead (``get_and_update_item``, ``get_and_update_features``), it is the
    unstamped LRU mirror of :class:`LruKeyReplicatedReceiverCache`, which a P0 that sends no
    stamps pairs with. Per-item use of a cache that also follows stamps changes its LRU outside
    P0's log: that is drift like any other, caught by the next digest that depends on it, and
    answered with a reset.
    """

    def __init__(
        self, capacity_bytes: int, *, gap_timeout_s: float = DEFAULT_GAP_TIMEOUT_S,
        max_pending: int = DEFAULT_MAX_PENDING, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(capacity_bytes)
        if gap_timeout_s <= 0 or max_pending < 1:
            raise CacheError(f"gap_timeout_s must be > 0 and max_pending >= 1, got {gap_timeout_s!r}, {max_pending!r}")
        self._gap_timeout_s = gap_timeout_s
        self._max_pending = max_pending
        self._clock = clock
        self._epoch: int | None = None
        self._next_seq = 1
        self._digest = b""
        self._fresh = True
        """Neither followed an epoch nor announced a reset yet: just started, with no idea of the
        past of the epoch P0 is in."""
        self._pending: dict[int, dict[int, _Entry]] = {}
        self._pending_count = 0
        self._waiting_since: dict[int, float] = {}
        """Per epoch with buffered requests, when its current gap opened; oldest gap first."""
        self._retired: OrderedDict[int, None] = OrderedDict()
        self._outbox: list[MirrorEvent] = []
        self.resets = 0
        """How many times P1 found drift (or was cleared) and reset."""

    @property
    def mirror(self) -> ReceiverMirror:
        return self

    @property
    def epoch(self) -> int | None:
        """The epoch P1 currently mirrors (``None`` before the first, and after a reset)."""
        return self._epoch

    @property
    def pending(self) -> int:
        """Requests buffered until their predecessors arrive."""
        return self._pending_count

    # --- entry points ---------------------------------------------------------------------

    def receive(
        self, stamp: MirrorStamp | None, features: Sequence[MultiModalFeatureSpec], payload: Any,
    ) -> list[MirrorEvent]:
        """Take one request. Without a stamp (it changed nothing on P0: text only, embeddings)
        it is served at once from what the cache holds, and changes nothing here either."""
        events = self._take_outbox()
        if stamp is None:
            feats = list(features)
            events.append(MirrorDelivery(payload, feats, self._fill_held(feats)))
        else:
            self._accept(_Entry(stamp, list(features), None, payload), events)
        return events

    def receive_mirror_only(self, stamp: MirrorStamp, message: MirrorOnly) -> list[MirrorEvent]:
        """Take the mirror operations of a request P0 committed but never sent."""
        events = self._take_outbox()
        self._accept(_Entry(stamp, None, list(message.ops), None), events)
        return events

    def poll(self) -> list[MirrorEvent]:
        """Resets and deliveries due without a new arrival (gap timeouts, :meth:`clear_cache`)."""
        return self._take_outbox()

    def clear_cache(self) -> None:
        """Clear the cache (sleep, reset_mm_cache). The epoch is retired and the reset announced
        with the next :meth:`poll` or :meth:`receive`, so P0 clears its shadow too."""
        super().clear_cache()
        if self._epoch is not None:
            self._retire(self._epoch, self._outbox, announce=True)

    def get_and_update_item(self, mm_item: MultiModalKwargsItem | None, mm_hash: str) -> MultiModalKwargsItem:
        self._drop_placeholder(mm_hash)
        return super().get_and_update_item(mm_item, mm_hash)

    def get_and_update_features(self, mm_features: Sequence[MultiModalFeatureSpec]) -> list[MultiModalFeatureSpec]:
        for feature in mm_features:
            self._drop_placeholder(feature.cache_key)
        return super().get_and_update_features(mm_features)

    # --- sequencing -----------------------------------------------------------------------

    def _take_outbox(self) -> list[MirrorEvent]:
        events, self._outbox = self._outbox, []
        if self._waiting_since:
            now = self._clock()
            for epoch, since in list(self._waiting_since.items()):
                if now - since < self._gap_timeout_s:
                    break  # the others' gaps opened later
                logger.warning("Multi-modal cache mirror: a request of epoch %x never arrived within %.1f s; "
                               "resetting the cache.", epoch, self._gap_timeout_s)
                self._retire(epoch, events, announce=True)
        return events

    def _accept(self, entry: _Entry, events: list[MirrorEvent]) -> None:
        epoch, seq = entry.stamp.epoch, entry.stamp.seq
        if epoch in self._retired:
            self._serve_outside(entry, epoch, events)
        elif epoch == self._epoch:
            if seq < self._next_seq:
                self._serve_outside(entry, None, events)  # a duplicate: its operations are applied
            elif seq > self._next_seq:
                self._buffer(entry, events)
            else:
                self._apply(entry, events)
        elif seq == 1:
            self._adopt(epoch, events)
            self._apply(entry, events)
        elif self._fresh:
            # A P1 that just started, seeing an epoch in mid-stream: it never saw the beginning. It
            # resets once; P0 answers with a new epoch, whose first requests may arrive after later
            # ones (a reordering link) and are then waited for like any other new epoch's.
            logger.warning("Multi-modal cache mirror: first request is #%d of epoch %x; resetting.", seq, epoch)
            self._retire(epoch, events, announce=True)
            self._serve_outside(entry, epoch, events)
        else:
            self._buffer(entry, events)  # a new epoch whose first requests are still in transit

    def _buffer(self, entry: _Entry, events: list[MirrorEvent]) -> None:
        epoch, seq = entry.stamp.epoch, entry.stamp.seq
        waiting = self._pending.setdefault(epoch, {})
        if seq in waiting:
            self._serve_outside(entry, None, events)
            return
        waiting[seq] = entry
        self._pending_count += 1
        self._waiting_since.setdefault(epoch, self._clock())
        while self._pending_count > self._max_pending:
            oldest = next(iter(self._waiting_since))
            logger.warning("Multi-modal cache mirror: %d requests wait for earlier ones; resetting epoch %x, "
                           "which waits longest.", self._pending_count, oldest)
            self._retire(oldest, events, announce=True)

    def _adopt(self, epoch: int, events: list[MirrorEvent]) -> None:
        """P0 started ``epoch`` with an empty shadow: follow it from an empty cache."""
        if self._epoch is not None:
            self._retire(self._epoch, events, announce=False)  # P0 left it already
        self._cache.clear()
        self._epoch = epoch
        self._next_seq = 1
        self._digest = initial_digest(epoch, self._cache.capacity)
        self._fresh = False

    def _retire(self, epoch: int, events: list[MirrorEvent], *, announce: bool) -> None:
        """Stop mirroring ``epoch``: its buffered and later requests are served outside it."""
        self._retired[epoch] = None
        if len(self._retired) > 64:
            self._retired.popitem(last=False)
        if epoch == self._epoch:
            self._epoch = None
            self._cache.clear()
        if announce:
            self.resets += 1
            self._fresh = False
            events.append(MirrorReset(epoch))
        waiting = self._pending.pop(epoch, {})
        self._pending_count -= len(waiting)
        self._waiting_since.pop(epoch, None)
        for seq in sorted(waiting):
            self._serve_outside(waiting[seq], epoch, events)

    def _apply(self, entry: _Entry, events: list[MirrorEvent]) -> None:
        """Apply the next request of the live epoch, then whatever it unblocked."""
        while True:
            epoch = entry.stamp.epoch
            log = OpLog()
            for key in entry.stamp.invalidated:
                self._cache.pop(key)
            if entry.features is not None:
                missing = self._walk_features(entry.features, log)
            else:
                missing = self._walk_ops(entry.ops or [], log)
            digest = None if missing is None else log.digest(self._digest, entry.stamp.invalidated)
            if missing is None or digest != entry.stamp.digest:
                logger.warning("Multi-modal cache mirror: P1 diverged from P0 at request #%d of epoch %x; resetting. "
                               "(If this repeats at #1, P0 and P1 use different mm_processor_cache_gb.)",
                               entry.stamp.seq, epoch)
                self._retire(epoch, events, announce=True)
                self._serve_outside(entry, epoch, events)
                return
            self._digest = digest
            self._next_seq += 1
            if entry.features is not None:
                events.append(MirrorDelivery(entry.payload, entry.features, missing))
            waiting = self._pending.get(epoch)
            if not waiting or self._next_seq not in waiting:
                if waiting:  # progress: the next gap's clock starts now, so it queues as the newest
                    del self._waiting_since[epoch]
                    self._waiting_since[epoch] = self._clock()
                return
            entry = waiting.pop(self._next_seq)
            self._pending_count -= 1
            if not waiting:
                del self._pending[epoch]
                self._waiting_since.pop(epoch, None)

    def _walk_features(self, features: list[MultiModalFeatureSpec], log: OpLog) -> list[str] | None:
        """P1's half of the mirror for one request; ``None`` on an operation P0 cannot have done."""
        cache = self._cache
        keys = [f.cache_key for f in features]
        for key in keys:
            cache.touch(key)
        missing: list[str] = []
        capacity = cache.capacity
        for feature, key in zip(features, keys):
            data = feature.data
            if data is None:
                held = cache.get(key)
                if held is None:
                    return None  # P0 believes P1 holds it
                log.hit(key)
                if held is _PLACEHOLDER:
                    missing.append(key)
                else:
                    feature.data = held
            elif data.nbytes > capacity:
                log.oversize(key)
            elif not self._insert(key, data, data.nbytes, log):
                return None
        return missing

    def _walk_ops(self, mirror_ops: list[MirrorOp], log: OpLog) -> list[str] | None:
        cache = self._cache
        for op in mirror_ops:
            cache.touch(op.mm_hash)
        for op in mirror_ops:
            key = op.mm_hash
            if op.kind == HIT:
                if cache.get(key) is None:
                    return None
                log.hit(key)
            elif op.kind == OVERSIZE:
                log.oversize(key)
            elif op.nbytes > cache.capacity or not self._insert(key, _PLACEHOLDER, op.nbytes, log):
                return None
        return []

    def _insert(self, key: str, item: MultiModalKwargsItem, nbytes: int, log: OpLog) -> bool:
        cache = self._cache
        if key in cache:
            return False  # P0 sends data only for what it evicted: P1 kept something P0 did not
        evicted: list[str] = []
        cache.put_if_fits(key, item, nbytes, evicted)
        log.insert(key, nbytes, evicted)
        return True

    def _serve_outside(self, entry: _Entry, stale_epoch: int | None, events: list[MirrorEvent]) -> None:
        """Answer a request outside the mirror (a mirror-only message has nothing to answer)."""
        if entry.features is not None:
            events.append(MirrorDelivery(entry.payload, entry.features, self._fill_held(entry.features), stale_epoch))

    def _fill_held(self, features: list[MultiModalFeatureSpec]) -> list[str]:
        """Fill what the cache or the request itself holds without changing the cache; the hashes
        it cannot fill. An item that occurs twice in a request travels with data once (P0's second
        lookup is a hit), so a resend that carries all its items is admitted even here."""
        carried = {f.cache_key: f.data for f in features if f.data is not None}
        missing: list[str] = []
        for feature in features:
            if feature.data is None:
                key = feature.cache_key
                held = carried.get(key)
                if held is None:
                    held = self._cache.peek(key)
                if held is None or held is _PLACEHOLDER:
                    missing.append(key)
                else:
                    feature.data = held
        return missing

    def _drop_placeholder(self, key: str) -> None:
        """A data-less placeholder is no item for the per-item path: that path gets a miss."""
        if self._cache.peek(key) is _PLACEHOLDER:
            self._cache.pop(key)


__all__ = ["DEFAULT_GAP_TIMEOUT_S", "DEFAULT_MAX_PENDING", "MirroredReceiverCache"]
