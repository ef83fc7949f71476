"""The P0/P1 mirror protocol: drift detection for the mirrored LRU cache, in one package.

The mirror only holds while P0 and P1 apply the same cache operations in the same order. Order
can break in transit (a reordering transport), state can break on one side only (P1 restarted or
cleared), and a request P0 committed can fail to reach P1 (aborted after its commit). vLLM 0.33
notices none of that until an item is missing, then fails the request with a retryable error.

Here every request that changed P0's shadow carries a :class:`~mmfront.wire.messages.MirrorStamp`:
the shadow's ``epoch`` (a random id, renewed whenever P0's shadow is cleared), the request's
``seq`` within the epoch, and ``digest``, a hash chain over every mirror operation so far
(:mod:`.oplog`). P1 (:class:`MirroredReceiverCache`) applies stamped requests strictly in ``seq``
order, buffering early arrivals, recomputes the digest from its own operations and compares. On
any disagreement it resets: clears its cache, retires the epoch, and announces
:class:`~mmfront.wire.messages.MirrorReset` so P0 (:class:`MirroredSenderCache`) clears its shadow
and starts a new epoch; the requests of a retired epoch are still served, filling what it can and
reporting the rest as missing, so P0 resends them with their data. See docs/caching.md, "Drift".

* :mod:`.oplog`: the operations each side logs per request (their kinds are
  :class:`~mmfront.wire.messages.MirrorOpKind`) and the digest chain over them;
* :mod:`.sender`: P0's half, :class:`MirroredSenderCache`;
* :mod:`.receiver`: P1's half, :class:`MirroredReceiverCache`.

The frontend and the engine receiver drive every cache through the interfaces of
:mod:`mmfront.cache.base` (``SenderMirror``, ``ReceiverMirror``); a cache P1 does not mirror
answers them through their null halves there.
"""

from __future__ import annotations

from mmfront.cache.base import MirrorDelivery, MirrorEvent
from mmfront.cache.mirror.oplog import OpLog, chain_digest, initial_digest
from mmfront.cache.mirror.receiver import DEFAULT_GAP_TIMEOUT_S, DEFAULT_MAX_PENDING, MirroredReceiverCache
from mmfront.cache.mirror.sender import MirroredSenderCache

__all__ = [
    "DEFAULT_GAP_TIMEOUT_S",
    "DEFAULT_MAX_PENDING",
    "MirrorDelivery",
    "MirrorEvent",
    "MirroredReceiverCache",
    "MirroredSenderCache",
    "OpLog",
    "chain_digest",
    "initial_digest",
]
