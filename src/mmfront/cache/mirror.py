"""Drift detection for the mirrored LRU cache: P0 stamps each request, P1 checks the stamps.

The mirror only holds while P0 and P1 apply the same cache operations in the same order. Order
can break in transit (a reordering transport), state can break on one side only (P1 restarted or
cleared), and a request P0 committed can fail to reach P1 (aborted after its commit). vLLM 0.33
notices none of that until an item is missing, then fails the request with a retryable error.

Here every request that changed P0's shadow carries a :class:`MirrorStamp`: the shadow's
``epoch`` (a random id, renewed whenever P0's shadow is cleared), the request's ``seq`` within
the epoch, and ``digest``, a hash chain over every mirror operation so far: per item its hash and
what happened (hit, insert, oversize), the keys each insert evicted, and the keys P0 invalidated
since the previous request. P1 (:class:`MirroredReceiverCache`) applies stamped requests strictly
in ``seq`` order, buffering early arrivals, recomputes the digest from its own operations and
compares. On any disagreement it resets: clears its cache, retires the epoch, and announces
:class:`MirrorReset` so P0 clears its shadow and starts a new epoch; the requests of a retired
epoch are still served, filling what it can and reporting the rest as missing, so P0 resends
them with their data. See docs/caching.md, "Drift".
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from mmfront.cache.base import ProcessorCacheInput, ProcessorCacheOutput
from mmfront.cache.lru import LruKeyReplicatedReceiverCache, LruKeyReplicatedSenderCache, _no_data_error
from mmfront.errors import CacheError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem
from mmfront.wire.messages import (
    DIGEST_SIZE,
    EVICT,
    HIT,
    INSERT,
    OVERSIZE,
    MirrorOnly,
    MirrorOp,
    MirrorReset,
    MirrorStamp,
)

logger = logging.getLogger(__name__)

DEFAULT_GAP_TIMEOUT_S = 5.0
"""How long P1 waits for a missing ``seq`` before it gives up on the epoch and resets."""

DEFAULT_MAX_PENDING = 1024
"""How many early arrivals P1 buffers in all, over every epoch, before it gives up on the epoch
waiting longest and resets: a flood of requests of unknown epochs costs bounded memory."""

_encode = msgspec.msgpack.Encoder().encode


def initial_digest(epoch: int, capacity_bytes: int) -> bytes:
    """The chain's start. The capacity is part of it because two LRUs of different capacities
    cannot mirror each other: a misconfigured pair disagrees at its very first request."""
    seed = epoch.to_bytes(8, "little") + capacity_bytes.to_bytes(8, "little")
    return hashlib.blake2b(seed, digest_size=DIGEST_SIZE).digest()


def chain_digest(previous: bytes, invalidated: Sequence[str], ops: Sequence[str]) -> bytes:
    """The next link of an epoch's digest chain: ``ops`` alternates kinds and keys."""
    return hashlib.blake2b(previous + _encode((invalidated, ops)), digest_size=DIGEST_SIZE).digest()


# --- P0 -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Issued:
    stamp: MirrorStamp
    ops: list[str]
    sizes: list[int]


class MirroredSenderCache(LruKeyReplicatedSenderCache):
    """P0's shadow of P1's LRU that stamps every request it commits.

    Between :meth:`begin_request` and :meth:`release_sender_touches` it logs each item's
    operation (two list appends on a hit); the release closes the log into the next stamp, which
    the frontend collects with :meth:`take_stamp` and sends with the request. A request that was
    committed but will not be sent must deliver :meth:`take_mirror_only` instead, or P1 sees a
    hole in the sequence and resets after its gap timeout.
    """

    max_untaken: int = 4096
    """Stamps kept for requests nobody collected (direct ``InputPreprocessor`` users without a
    client); the oldest are dropped beyond this."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self._request_id: str | None = None
        self._issued: OrderedDict[str | None, _Issued] = OrderedDict()
        self._warned_untaken = False
        self._new_epoch()

    def _new_epoch(self) -> None:
        self._epoch = secrets.randbits(64)
        self._seq = 0
        self._digest = initial_digest(self._epoch, self._cache.capacity)
        self._ops: list[str] = []
        self._sizes: list[int] = []
        self._invalidated: list[str] = []

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def seq(self) -> int:
        """The ``seq`` of the last stamp issued in this epoch (0 before the first)."""
        return self._seq

    def begin_request(self, request_id: str) -> None:
        self._request_id = request_id

    def get_and_update_item(self, mm_item: ProcessorCacheInput | None, mm_hash: str) -> ProcessorCacheOutput:
        updates = self._cache.get(mm_hash)
        ops = self._ops
        if updates is not None:
            ops.append(HIT)
            ops.append(mm_hash)
            return None, updates
        if mm_item is None:
            raise _no_data_error(mm_hash)
        nbytes = mm_item[0].nbytes
        evicted: list[str] = []
        if self._cache.put_if_fits(mm_hash, mm_item[1], nbytes, evicted):
            ops.append(INSERT)
            ops.append(mm_hash)
            self._sizes.append(nbytes)
            for key in evicted:
                ops.append(EVICT)
                ops.append(key)
        else:
            self._oversize(nbytes, self._cache.capacity)
            ops.append(OVERSIZE)
            ops.append(mm_hash)
        return mm_item

    def release_sender_touches(self) -> None:
        """Close the request's operation log into its stamp."""
        request_id, self._request_id = self._request_id, None
        ops = self._ops
        if not ops:
            return
        invalidated = tuple(self._invalidated)
        self._seq += 1
        self._digest = chain_digest(self._digest, invalidated, ops)
        self._issued[request_id] = _Issued(MirrorStamp(self._epoch, self._seq, self._digest, invalidated),
                                           ops, self._sizes)
        self._ops, self._sizes, self._invalidated = [], [], []
        if len(self._issued) > self.max_untaken:
            self._issued.popitem(last=False)
            if not self._warned_untaken:
                self._warned_untaken = True
                logger.warning(
                    "More than %d mirror stamps were never collected: send requests through "
                    "mmfront.engine.client.EngineClient (or call take_stamp per request), otherwise P1 "
                    "sees holes in the sequence and resets its cache.", self.max_untaken,
                )

    def take_stamp(self, request_id: str | None, *, keep: bool = False) -> MirrorStamp | None:
        """The stamp of ``request_id``'s commit, to send with it; ``None`` if it changed nothing.
        ``keep`` leaves it issued until the send succeeds, so a request the transport fails to
        carry can still hand P1 its :meth:`take_mirror_only`."""
        issued = self._issued.get(request_id) if keep else self._issued.pop(request_id, None)
        return None if issued is None else issued.stamp

    def take_mirror_only(self, request_id: str | None) -> tuple[MirrorStamp, MirrorOnly] | None:
        """For a request committed but never to be sent: its stamp and operations, for P1 to
        replay. The keys it inserted are invalidated, since P1 will never receive their data."""
        issued = self._issued.pop(request_id, None)
        if issued is None:
            return None
        ops: list[MirrorOp] = []
        sizes = iter(issued.sizes)
        log = issued.ops
        for i in range(0, len(log), 2):
            kind, key = log[i], log[i + 1]
            if kind == INSERT:
                ops.append(MirrorOp(INSERT, key, next(sizes)))
                self.invalidate(key)
            elif kind != EVICT:
                ops.append(MirrorOp(kind, key))  # type: ignore[arg-type]
        return issued.stamp, MirrorOnly(ops)

    def invalidate(self, mm_hash: str) -> None:
        self._cache.pop(mm_hash)
        self._invalidated.append(mm_hash)

    def clear_cache(self) -> None:
        """Clear the shadow and start a new epoch; P1 clears its cache when the epoch reaches it."""
        super().clear_cache()
        self._new_epoch()


# --- P1 -----------------------------------------------------------------------------------------


_PLACEHOLDER = MultiModalKwargsItem()
"""What P1 stores for an item inserted by a mirror-only message: it weighs what P0 charged, and
a request that needs its data gets a miss."""


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


@dataclass(slots=True)
class _Entry:
    stamp: MirrorStamp
    features: list[MultiModalFeatureSpec] | None
    ops: list[MirrorOp] | None
    payload: Any


def _key(feature: MultiModalFeatureSpec) -> str:
    return feature.mm_hash or feature.identifier


class MirroredReceiverCache(LruKeyReplicatedReceiverCache):
    """P1's LRU that applies stamped requests in P0's order and resets on any drift.

    :meth:`receive` and :meth:`receive_mirror_only` take what arrived and return what is ready,
    in order: a :class:`MirrorReset` to send to P0, and a :class:`MirrorDelivery` per request
    that can be answered (admitted, or missing items). Call :meth:`poll` when nothing arrives, so
    a gap that never fills still resets after ``gap_timeout_s``.

    The inherited per-item methods (``get_and_update_item``, ``get_and_update_features``) keep
    the unmirrored semantics of :class:`LruKeyReplicatedReceiverCache`; do not mix them with
    :meth:`receive` on one cache.
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
            self._drop_placeholder(_key(feature))
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
            ops: list[str] = []
            for key in entry.stamp.invalidated:
                self._cache.pop(key)
            if entry.features is not None:
                missing = self._walk_features(entry.features, ops)
            else:
                missing = self._walk_ops(entry.ops or [], ops)
            digest = None if missing is None else chain_digest(self._digest, entry.stamp.invalidated, ops)
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

    def _walk_features(self, features: list[MultiModalFeatureSpec], ops: list[str]) -> list[str] | None:
        """P1's half of the mirror for one request; ``None`` on an operation P0 cannot have done."""
        cache = self._cache
        keys = [f.mm_hash or f.identifier for f in features]
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
                ops.append(HIT)
                ops.append(key)
                if held is _PLACEHOLDER:
                    missing.append(key)
                else:
                    feature.data = held
            elif data.nbytes > capacity:
                ops.append(OVERSIZE)
                ops.append(key)
            elif not self._insert(key, data, data.nbytes, ops):
                return None
        return missing

    def _walk_ops(self, mirror_ops: list[MirrorOp], ops: list[str]) -> list[str] | None:
        cache = self._cache
        for op in mirror_ops:
            cache.touch(op.mm_hash)
        for op in mirror_ops:
            key = op.mm_hash
            if op.kind == HIT:
                if cache.get(key) is None:
                    return None
                ops.append(HIT)
                ops.append(key)
            elif op.kind == OVERSIZE:
                ops.append(OVERSIZE)
                ops.append(key)
            elif op.nbytes > cache.capacity or not self._insert(key, _PLACEHOLDER, op.nbytes, ops):
                return None
        return []

    def _insert(self, key: str, item: MultiModalKwargsItem, nbytes: int, ops: list[str]) -> bool:
        cache = self._cache
        if key in cache:
            return False  # P0 sends data only for what it evicted: P1 kept something P0 did not
        evicted: list[str] = []
        cache.put_if_fits(key, item, nbytes, evicted)
        ops.append(INSERT)
        ops.append(key)
        for old in evicted:
            ops.append(EVICT)
            ops.append(old)
        return True

    def _serve_outside(self, entry: _Entry, stale_epoch: int | None, events: list[MirrorEvent]) -> None:
        """Answer a request outside the mirror (a mirror-only message has nothing to answer)."""
        if entry.features is not None:
            events.append(MirrorDelivery(entry.payload, entry.features, self._fill_held(entry.features), stale_epoch))

    def _fill_held(self, features: list[MultiModalFeatureSpec]) -> list[str]:
        """Fill what the cache or the request itself holds without changing the cache; the hashes
        it cannot fill. An item that occurs twice in a request travels with data once (P0's second
        lookup is a hit), so a resend that carries all its items is admitted even here."""
        carried = {_key(f): f.data for f in features if f.data is not None}
        missing: list[str] = []
        for feature in features:
            if feature.data is None:
                key = _key(feature)
                held = carried.get(key)
                if held is None:
                    held = self._cache.peek(key)
                if held is None or held is _PLACEHOLDER:
                    missing.append(key)
                else:
                    feature.data = held
        return missing

    def _drop_placeholder(self, key: str) -> None:
        if self._cache.peek(key) is _PLACEHOLDER:
            self._cache.pop(key)


__all__ = [
    "DEFAULT_GAP_TIMEOUT_S",
    "DEFAULT_MAX_PENDING",
    "MirrorDelivery",
    "MirrorEvent",
    "MirroredReceiverCache",
    "MirroredSenderCache",
    "chain_digest",
    "initial_digest",
]
