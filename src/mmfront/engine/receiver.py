"""P1's side of the envelope: what an engine core embeds to take requests from mmfront's P0.

:class:`EngineReceiver` turns the envelopes that arrive into requests ready for the scheduler
(every feature's data filled in) and the replies P0 needs: ``Admitted``, ``CacheMiss`` (resend
with data), ``MirrorReset`` (clear your shadow). It never raises for drift: drift becomes a reply,
and the request comes back with its data. :func:`serve_pipe` runs one over a pipe, for tests and
for a P1 in a child process.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from multiprocessing.connection import Connection

from mmfront.cache.base import BaseMultiModalReceiverCache
from mmfront.cache.factory import engine_receiver_cache_from_config
from mmfront.cache.mirror import MirrorDelivery, MirroredReceiverCache, MirrorEvent
from mmfront.config import MultiModalConfig
from mmfront.engine.transport import PipeTransport
from mmfront.errors import DecodeError, MultiModalCacheMissError, TransportError
from mmfront.inputs import MultiModalFeatureSpec
from mmfront.wire import EngineCoreRequest, Frame, MsgpackDecoder, MsgpackEncoder
from mmfront.wire.messages import (
    ADMITTED,
    CACHE_MISS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    RESET_CACHE,
    Admitted,
    CacheMiss,
    MirrorOnly,
    MirrorReset,
    decode_envelope,
    encode_envelope,
)

logger = logging.getLogger(__name__)

Reply = list[Frame]


class EngineReceiver:
    """Admits requests into the engine, filling their features from P1's processor cache.

    ``cache`` is what :func:`~mmfront.cache.engine_receiver_cache_from_config` gives: a
    :class:`~mmfront.cache.mirror.MirroredReceiverCache` in ``lru`` mode (stamps are checked,
    requests applied in P0's order), ``None`` otherwise (requests must carry all their data).
    A plain :class:`~mmfront.cache.LruKeyReplicatedReceiverCache` works too, without drift
    detection. ``echo`` puts each admitted request in its ``Admitted`` reply.
    """

    def __init__(self, cache: BaseMultiModalReceiverCache | None, *, echo: bool = False) -> None:
        self.cache = cache
        self.echo = echo
        self._encoder = MsgpackEncoder()
        self._requests = MsgpackDecoder(EngineCoreRequest)
        self._mirror_only = MsgpackDecoder(MirrorOnly)

    def handle(self, frames: Sequence[Frame]) -> tuple[list[EngineCoreRequest], list[Reply]]:
        """One arrived envelope -> the requests now ready for the engine, and the replies to P0.

        A request may become ready later (it waits for an earlier one that is still in transit),
        and one arrival may release several."""
        envelope = decode_envelope(frames)
        cache = self.cache
        events: list[MirrorEvent]
        if envelope.kind == REQUEST:
            request = self._requests.decode(envelope.message)
            features = request.mm_features or []
            if isinstance(cache, MirroredReceiverCache):
                events = cache.receive(envelope.stamp, features, request)
            else:
                events = [MirrorDelivery(request, features, self._fill_plain(features))]
        elif envelope.kind == MIRROR_ONLY:
            message = self._mirror_only.decode(envelope.message)
            if envelope.stamp is None:
                raise DecodeError("A mirror-only message must carry the stamp of the request it stands for.")
            events = cache.receive_mirror_only(envelope.stamp, message) if isinstance(
                cache, MirroredReceiverCache) else []
        elif envelope.kind == RESET_CACHE:
            events = self.reset_cache()
        else:
            raise DecodeError(f"P1 does not accept {envelope.kind!r} messages; they are replies for P0.")
        return self._answer(events)

    def poll(self) -> tuple[list[EngineCoreRequest], list[Reply]]:
        """What became due without an arrival; call it from the engine loop when idle."""
        if isinstance(self.cache, MirroredReceiverCache):
            return self._answer(self.cache.poll())
        return [], []

    def reset_cache(self) -> list[MirrorEvent]:
        """Clear the processor cache (reset_mm_cache, sleep); the events tell P0 to follow."""
        if self.cache is None:
            return []
        self.cache.clear_cache()
        return self.cache.poll() if isinstance(self.cache, MirroredReceiverCache) else []

    def _fill_plain(self, features: list[MultiModalFeatureSpec]) -> list[str]:
        if not any(f.data is None for f in features):
            return []
        if self.cache is None:
            return [f.mm_hash or f.identifier for f in features if f.data is None]
        try:
            self.cache.get_and_update_features(features)
        except MultiModalCacheMissError as e:
            return e.mm_hashes
        return []

    def _answer(self, events: list[MirrorEvent]) -> tuple[list[EngineCoreRequest], list[Reply]]:
        ready: list[EngineCoreRequest] = []
        replies: list[Reply] = []
        encode = self._encoder.encode
        for event in events:
            if isinstance(event, MirrorReset):
                replies.append(encode_envelope(MIRROR_RESET, encode(event)))
                continue
            request: EngineCoreRequest = event.payload
            if event.missing:
                miss = CacheMiss(request.request_id, event.missing, event.stale_epoch)
                replies.append(encode_envelope(CACHE_MISS, encode(miss)))
            else:
                ready.append(request)
                admitted = Admitted(request.request_id, request if self.echo else None)
                replies.append(encode_envelope(ADMITTED, encode(admitted)))
        return ready, replies


def serve_pipe(
    conn: Connection, config: MultiModalConfig, *, echo: bool = False, poll_interval_s: float = 0.05,
) -> None:
    """Run a P1 receiver over one end of a pipe until P0 closes the other end.

    The cache comes from ``config`` as in a real engine; ready requests are dropped (there is no
    model behind this loop), so run it with ``echo=True`` to see what the engine would get."""
    transport = PipeTransport(conn)
    receiver = EngineReceiver(engine_receiver_cache_from_config(config), echo=echo)
    try:
        while True:
            frames = transport.recv(poll_interval_s)
            _, replies = receiver.poll() if frames is None else receiver.handle(frames)
            for reply in replies:
                transport.send(reply)
    except (EOFError, TransportError):
        return  # P0 closed its end
    finally:
        transport.close()


__all__ = ["EngineReceiver", "Reply", "serve_pipe"]
