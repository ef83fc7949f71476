"""P0's side of the envelope: sends requests, and resends them itself when P1 lacks an item.

vLLM 0.33 answers a processor-cache miss by failing the request with a retryable error, and
leaves the retry to whoever called the API. :class:`EngineClient` keeps each request's
arguments until P1 admits it; when P1 reports missing items it invalidates them and runs the
request through preprocessing again, which now sends their data. The caller sees admitted
requests and real errors only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmfront.cache.mirror import MirroredSenderCache
from mmfront.engine.transport import BaseTransport
from mmfront.errors import DecodeError, MMFrontError, MultiModalCacheMissError, ValidationError
from mmfront.preprocess import InputProcessor, PromptInput
from mmfront.processing.processor import MultiModalUUIDs
from mmfront.wire import EngineCoreRequest, Frame, LoRARequest, MsgpackDecoder, MsgpackEncoder, SamplingParams
from mmfront.wire.messages import (
    ADMITTED,
    CACHE_MISS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    Admitted,
    CacheMiss,
    MirrorReset,
    decode_envelope,
    encode_envelope,
)


@dataclass(frozen=True)
class RequestAdmitted:
    """P1 admitted the request. ``request`` is what the engine got, when P1 echoes it."""

    request_id: str
    request: EngineCoreRequest | None = None


@dataclass(frozen=True)
class RequestFailed:
    """The request cannot be served: it missed P1's cache again after its resend, or preparing
    the resend failed."""

    request_id: str
    error: MMFrontError


ClientEvent = RequestAdmitted | RequestFailed


@dataclass
class _InFlight:
    prompt: Any
    params: SamplingParams | None
    kwargs: dict[str, Any]
    resent: bool = False


@dataclass
class ClientStats:
    """What drift cost: ``resends`` after a cache miss, ``shadow_resets`` of P0's mirror,
    ``mirror_only`` messages for requests rejected after their commit, and ``failures``:
    requests reported to the caller as failed."""

    resends: int = 0
    shadow_resets: int = 0
    mirror_only: int = 0
    failures: int = 0


class EngineClient:
    """Sends requests to P1 over any :class:`~mmfront.engine.transport.BaseTransport` and handles
    P1's replies (feed every arriving envelope to :meth:`handle_reply`).

    Drop-in for the part of vLLM's ``EngineCoreClient`` that adds requests: ``add_request`` takes
    the arguments of ``InputProcessor.process_inputs``.
    """

    def __init__(self, processor: InputProcessor, transport: BaseTransport) -> None:
        self.processor = processor
        self.transport = transport
        self.stats = ClientStats()
        self._in_flight: dict[str, _InFlight] = {}
        self._encoder = MsgpackEncoder()
        self._admitted = MsgpackDecoder(Admitted)
        self._miss = MsgpackDecoder(CacheMiss)
        self._reset = MsgpackDecoder(MirrorReset)

    @property
    def in_flight(self) -> list[str]:
        """Requests sent and not yet admitted, oldest first."""
        return list(self._in_flight)

    @property
    def _mirror(self) -> MirroredSenderCache | None:
        cache = self.processor.preprocessor.cache
        return cache if isinstance(cache, MirroredSenderCache) else None

    def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        mm_data: Mapping[str, Any] | None = None,
        mm_uuids: MultiModalUUIDs | None = None,
        hf_processor_mm_kwargs: Mapping[str, Any] | None = None,
        media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> None:
        """Preprocess and send one request (the arguments of ``InputProcessor.process_inputs``).
        Errors in the request itself raise here; drift never does. The media must stay readable
        until the request is admitted: a resend processes them again."""
        if request_id in self._in_flight:
            raise ValidationError(f"Request {request_id!r} is already in flight; use a new request id.",
                                  parameter="request_id")
        entry = _InFlight(prompt, params, {
            "mm_data": mm_data, "mm_uuids": mm_uuids, "hf_processor_mm_kwargs": hf_processor_mm_kwargs,
            "media_io_kwargs": media_io_kwargs,
            "arrival_time": arrival_time if arrival_time is not None else time.time(),
            "lora_request": lora_request, "cache_salt": cache_salt, "priority": priority,
            "data_parallel_rank": data_parallel_rank,
        })
        self._submit(request_id, entry)
        self._in_flight[request_id] = entry

    def abort_request(self, request_id: str) -> None:
        """Stop tracking ``request_id``: later replies for it are ignored, and it is not resent."""
        self._in_flight.pop(request_id, None)

    def handle_reply(self, frames: Sequence[Frame]) -> list[ClientEvent]:
        """Act on one envelope from P1; the events the caller must see (often none)."""
        envelope = decode_envelope(frames)
        if envelope.kind == ADMITTED:
            admitted = self._admitted.decode(envelope.message)
            if self._in_flight.pop(admitted.request_id, None) is None:
                return []
            return [RequestAdmitted(admitted.request_id, admitted.request)]
        if envelope.kind == MIRROR_RESET:
            self._reset_shadow(self._reset.decode(envelope.message).epoch)
            return []
        if envelope.kind == CACHE_MISS:
            return self._on_miss(self._miss.decode(envelope.message))
        raise DecodeError(f"P0 does not accept {envelope.kind!r} messages; they are requests for P1.")

    def engine_restarted(self) -> list[ClientEvent]:
        """P1 was replaced by an empty one and what was in transit to the old one is lost: clear
        the shadow and send every request that was not admitted again. Returns the requests
        whose resend could not be prepared."""
        mirror = self._mirror
        if mirror is not None:
            self._clear_shadow(mirror)
        events: list[ClientEvent] = []
        for request_id, entry in list(self._in_flight.items()):
            failed = self._resubmit(request_id, entry)
            if failed is not None:
                events.append(failed)
        return events

    def _on_miss(self, miss: CacheMiss) -> list[ClientEvent]:
        entry = self._in_flight.get(miss.request_id)
        if entry is None:
            return []
        if entry.resent:
            del self._in_flight[miss.request_id]
            self.stats.failures += 1
            return [RequestFailed(miss.request_id, MultiModalCacheMissError(
                miss.mm_hashes,
                f"P1 still lacked {len(miss.mm_hashes)} item(s) after the request was resent with their data: "
                f"{miss.mm_hashes}. The engine is dropping cached items faster than requests arrive (restarts or "
                "cache resets in a loop); retry the request.",
            ))]
        entry.resent = True
        self.stats.resends += 1
        if miss.stale_epoch is not None:
            self._reset_shadow(miss.stale_epoch)
        cache = self.processor.preprocessor.cache
        if cache is not None:
            for mm_hash in miss.mm_hashes:
                cache.invalidate(mm_hash)
        failed = self._resubmit(miss.request_id, entry)
        return [] if failed is None else [failed]

    def _resubmit(self, request_id: str, entry: _InFlight) -> RequestFailed | None:
        try:
            self._submit(request_id, entry)
        except MMFrontError as e:
            del self._in_flight[request_id]
            self.stats.failures += 1
            return RequestFailed(request_id, e)
        return None

    def _reset_shadow(self, epoch: int) -> None:
        mirror = self._mirror
        if mirror is not None and mirror.epoch == epoch:
            self._clear_shadow(mirror)

    def _clear_shadow(self, mirror: MirroredSenderCache) -> None:
        mirror.clear_cache()
        self.processor.preprocessor.stats.reset = True
        self.stats.shadow_resets += 1

    def _submit(self, request_id: str, entry: _InFlight) -> None:
        mirror = self._mirror
        try:
            request = self.processor.process_inputs(request_id, entry.prompt, entry.params, **entry.kwargs)
            message = self._encoder.encode(request)
        except BaseException:
            if mirror is not None:
                self._send_mirror_only(mirror, request_id)
            raise
        stamp = mirror.take_stamp(request_id) if mirror is not None else None
        self.transport.send(encode_envelope(REQUEST, message, stamp))

    def _send_mirror_only(self, mirror: MirroredSenderCache, request_id: str) -> None:
        """The request changed the shadow but will not be sent: P1 must replay the change."""
        taken = mirror.take_mirror_only(request_id)
        if taken is not None:
            stamp, message = taken
            self.stats.mirror_only += 1
            self.transport.send(encode_envelope(MIRROR_ONLY, self._encoder.encode(message), stamp))


__all__ = ["ClientEvent", "ClientStats", "EngineClient", "RequestAdmitted", "RequestFailed"]
