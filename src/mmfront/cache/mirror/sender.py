"""P0's half of the mirror: the shadow of P1's LRU that stamps every request it commits."""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass

from mmfront.cache.base import ProcessorCacheInput, ProcessorCacheOutput, SenderMirror
from mmfront.cache.lru import LruKeyReplicatedSenderCache, no_data_error
from mmfront.cache.mirror.oplog import INSERT, OpLog, initial_digest
from mmfront.wire.messages import MirrorOnly, MirrorStamp

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Issued:
    stamp: MirrorStamp
    log: OpLog


class MirroredSenderCache(LruKeyReplicatedSenderCache, SenderMirror):
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
        self._log = OpLog()
        self._invalidated: list[str] = []

    @property
    def mirror(self) -> SenderMirror:
        return self

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
        if updates is not None:
            self._log.hit(mm_hash)
            return None, updates
        if mm_item is None:
            raise no_data_error(mm_hash)
        nbytes = mm_item[0].nbytes
        evicted: list[str] = []
        if self._cache.put_if_fits(mm_hash, mm_item[1], nbytes, evicted):
            self._log.insert(mm_hash, nbytes, evicted)
        else:
            self._oversize(nbytes, self._cache.capacity)
            self._log.oversize(mm_hash)
        return mm_item

    def release_sender_touches(self) -> None:
        """Close the request's operation log into its stamp."""
        request_id, self._request_id = self._request_id, None
        log = self._log
        if not log:
            return
        invalidated = tuple(self._invalidated)
        self._seq += 1
        self._digest = log.digest(self._digest, invalidated)
        self._issued[request_id] = _Issued(MirrorStamp(self._epoch, self._seq, self._digest, invalidated), log)
        self._log, self._invalidated = OpLog(), []
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
        issued = self._issued.get(request_id) if keep else self._issued.pop(request_id, None)
        return None if issued is None else issued.stamp

    def take_mirror_only(self, request_id: str | None) -> tuple[MirrorStamp, MirrorOnly] | None:
        """The keys the request inserted are invalidated, since P1 will never receive their data."""
        issued = self._issued.pop(request_id, None)
        if issued is None:
            return None
        ops = issued.log.mirror_ops()
        for op in ops:
            if op.kind == INSERT:
                self.invalidate(op.mm_hash)
        return issued.stamp, MirrorOnly(ops)

    def invalidate(self, mm_hash: str) -> None:
        self._cache.pop(mm_hash)
        self._invalidated.append(mm_hash)

    def clear_cache(self) -> None:
        """Clear the shadow and start a new epoch; P1 clears its cache when the epoch reaches it."""
        super().clear_cache()
        self._new_epoch()


__all__ = ["MirroredSenderCache"]
