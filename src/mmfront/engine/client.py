"""P0's side of the link: prepares requests in parallel, commits and sends them in one lane,
and resends them itself when P1 lacks an item.

vLLM 0.33 answers a processor-cache miss by failing the request with a retryable error, and
leaves the retry to whoever called the API. :class:`EngineClient` keeps each request, prepared,
until P1 admits it; when P1 reports missing items it invalidates every item of the request and
commits it again, which now sends all their data, so P1 admits it whatever state it is in. The
caller sees admitted requests and real errors only.

mmfront's extras (mirror stamps, ``Admitted`` replies) are used only with an engine that
announced them in vLLM's start-up handshake (``engine``, an
:class:`~mmfront.engine.handshake.EngineInfo`). With a stock vLLM engine a request is running
once sent, and a miss comes back as vLLM's own: the request's output finished with ``ERROR``
and ``mm_cache_miss_hashes``, which the client answers with a resend, invisibly to the caller.

Concurrency: :meth:`EngineClient.add_request` may be called from any number of threads, and
:meth:`EngineClient.add_request_async` from any number of tasks. Media loading, hashing and HF
processing run on the caller's thread (a worker thread for the async form); the commit to the
P0 cache, the stamp, the encoding and the send run under one lock, the *commit lane*, so the
order in which the mirror changes is the order of the requests on the wire. Replies from P1 are
handled in the same lane.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mmfront.engine.handshake import EngineInfo
from mmfront.engine.transports import BaseTransport
from mmfront.errors import EngineDeadError, MMFrontError, TransportError, ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import InputProcessor, PreparedRequest, PromptInput, RequestOptions
from mmfront.timing import stage
from mmfront.wire import EngineCoreRequest, Frame, MsgpackEncoder, SamplingParams
from mmfront.wire.handshake import EXTRA_ADMITTED, EXTRA_MIRROR, MMFRONT_EXTRAS
from mmfront.wire.messages import (
    ABORT,
    ADMITTED,
    CACHE_MISS,
    ENGINE_HELLO,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    UTILITY,
    Admitted,
    CacheMiss,
    Direction,
    EngineHello,
    MirrorReset,
    UtilityCall,
    decode_message,
    encode_envelope,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, FinishReason, UtilityOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestAdmitted:
    """P1 admitted the request. ``request`` is what the engine got, when P1 echoes it."""

    request_id: str
    request: EngineCoreRequest | None = None


@dataclass(frozen=True)
class RequestFailed:
    """The request cannot be served: committing or sending it again failed, or the engine
    restarted while it was generating. Cache misses never fail a request (see ``_InFlight``)."""

    request_id: str
    error: MMFrontError


@dataclass(frozen=True)
class RequestOutput:
    """One step output of an admitted request (its last has ``finish_reason`` set)."""

    request_id: str
    output: EngineCoreOutput


@dataclass(frozen=True)
class UtilityReply:
    """The engine answered a utility call (:meth:`EngineClient.call_utility`)."""

    output: UtilityOutput


ClientEvent = RequestAdmitted | RequestFailed | RequestOutput | UtilityReply


@dataclass
class _InFlight:
    prepared: PreparedRequest
    complete: bool = False
    """Its latest send carried the data of every item, which P1 admits in any state (in the
    mirror, outside it, with an empty cache): a miss arriving now answers an earlier copy (one
    in transit through a restart or reset, a duplicate) and is ignored."""
    produced: bool = False


@dataclass
class ClientStats:
    """What drift cost: ``resends`` after a cache miss, ``shadow_resets`` of P0's mirror,
    ``mirror_only`` messages for requests rejected after their commit, and ``failures``:
    requests reported to the caller as failed."""

    resends: int = 0
    shadow_resets: int = 0
    mirror_only: int = 0
    failures: int = 0
    engine_restarts: int = 0
    wire_bytes: int = 0
    """Bytes of every request envelope sent (resends included)."""
    saved_bytes: int = 0
    """Bytes of the items sent as references to what P1 holds instead of with their data."""


class EngineClient:
    """Sends requests to P1 over any :class:`~mmfront.engine.transports.BaseTransport` and handles
    P1's replies (feed every arriving envelope to :meth:`handle_reply`).

    Drop-in for the part of vLLM's ``EngineCoreClient`` that adds requests: ``add_request`` takes
    the arguments of ``InputProcessor.process_inputs``. ``engine`` is what the engine said in
    vLLM's start-up handshake; without one (a pipe, a transport connected by hand) the engine is
    taken to be mmfront's, with every extra.
    """

    def __init__(
        self, processor: InputProcessor, transport: BaseTransport, *, stream_outputs: bool = False,
        engines: Sequence[EngineInfo] = (),
    ) -> None:
        engine = engines[0] if engines else None
        self.processor = processor
        self.transport = transport
        self.engine = engine
        """The engine's start-up answer (``max_model_len``, ``num_gpu_blocks``, ``block_size``)."""
        self.extras = MMFRONT_EXTRAS if engine is None else engine.extras
        """The mmfront extras this engine announced; none for a stock vLLM engine."""
        self.stats = ClientStats()
        self.stream_outputs = stream_outputs
        """Keep admitted requests until their last output (the engine's outputs come back over
        the same transport); otherwise a request is done for the client once admitted."""
        self.engine_epoch: int | None = None
        self.max_model_len: int | None = None if engine is None else engine.max_model_len
        """The engine's context length (from its start-up answer): a request whose prompt and
        ``max_tokens`` exceed it is refused before it is sent (``None``: unknown, nothing is
        checked)."""
        self._lane = threading.RLock()
        self._lane_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmfront-commit-lane")
        self._in_flight: dict[str, _InFlight] = {}
        self._running: dict[str, _InFlight] = {}
        self._encoder = MsgpackEncoder()
        self._handlers: dict[bytes, Callable[[Any], list[ClientEvent]]] = {
            ENGINE_OUTPUTS: self._on_outputs, ENGINE_HELLO: self._on_hello, ADMITTED: self._on_admitted,
            MIRROR_RESET: self._on_mirror_reset, CACHE_MISS: self._on_miss}
        """What each P1 -> P0 kind does, run in the commit lane."""

    @property
    def in_flight(self) -> list[str]:
        """Requests sent and not yet admitted, oldest first."""
        with self._lane:
            return list(self._in_flight)

    def add_request(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> None:
        """Prepare (on this thread) and send one request; keyword options are the fields of
        :class:`~mmfront.preprocess.RequestOptions`. Errors in the request itself raise here;
        drift never does. The request's media stay referenced until it is admitted: a resend
        may need to process an item again."""
        self._reserve(request_id)
        try:
            prepared = self.processor.prepare(request_id, prompt, params, options=options, **kwargs)
        except BaseException:
            self._release(request_id)
            raise
        self._send_new(prepared)

    async def add_request_async(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> None:
        """:meth:`add_request` for asyncio: preparation and the commit lane run on worker
        threads, so the event loop never waits for media, the HF processor or the lane."""
        loop = asyncio.get_running_loop()
        self._reserve(request_id)
        try:
            prepared = await loop.run_in_executor(
                self.processor.pipeline.executor,
                lambda: self.processor.prepare(request_id, prompt, params, options=options, **kwargs))
        except BaseException:
            self._release(request_id)
            raise
        await loop.run_in_executor(self._lane_executor, self._send_new, prepared)

    @property
    def running(self) -> list[str]:
        """Requests admitted and not finished (with ``stream_outputs``)."""
        with self._lane:
            return list(self._running)

    def abort_request(self, request_id: str) -> None:
        """Stop tracking ``request_id`` and tell the engine to stop it: later replies for it are
        ignored, and it is not resent."""
        with self._lane:
            sent = self._in_flight.pop(request_id, None) is not None
            sent = self._running.pop(request_id, None) is not None or sent
            if sent:
                self.processor.request_finished(request_id, aborted=True)
                self.transport.send(encode_envelope(ABORT, self._encoder.encode([request_id])))

    def call_utility(self, call: UtilityCall) -> None:
        """Send one utility call; its answer comes back as a :class:`UtilityReply` event."""
        with self._lane:
            self.transport.send(encode_envelope(UTILITY, self._encoder.encode(call)))

    def clear_cache(self) -> None:
        """Clear the P0 caches (the frontend's half of vLLM's ``reset_mm_cache``), in the lane."""
        with self._lane:
            self.processor.preprocessor.reset_mm_cache()

    def handle_reply(self, frames: Sequence[Frame]) -> list[ClientEvent]:
        """Act on one envelope from P1; the events the caller must see (often none)."""
        message = decode_message(frames, Direction.TO_FRONTEND)
        with self._lane:
            return self._handlers[message.kind](message.body)

    def engine_restarted(self) -> list[ClientEvent]:
        """P1 was replaced by an empty one and what was in transit to the old one is lost: clear
        the shadow and send again every request that produced no output yet; one that did fails
        with :class:`~mmfront.errors.EngineDeadError` (resending it would answer it twice).
        Returns the requests that failed."""
        with self._lane:
            self.stats.engine_restarts += 1
            if self.processor.reset_shadow():
                self.stats.shadow_resets += 1
            events: list[ClientEvent] = []
            for request_id, entry in list(self._running.items()):
                del self._running[request_id]
                if entry.produced:
                    self.stats.failures += 1
                    self.processor.request_finished(request_id, aborted=True)
                    events.append(RequestFailed(request_id, EngineDeadError(
                        f"The engine restarted while request {request_id!r} was generating; its output so far is "
                        "incomplete. Send the request again.")))
                else:
                    self._in_flight[request_id] = entry
            for request_id, entry in list(self._in_flight.items()):
                failed = self._resubmit(request_id, entry, complete=False)
                if failed is not None:
                    events.append(failed)
            return events

    def fail_all(self, error: MMFrontError) -> list[ClientEvent]:
        """The engine is gone for good: every request in flight or running fails with ``error``."""
        with self._lane:
            events: list[ClientEvent] = []
            for table in (self._in_flight, self._running):
                for request_id, entry in list(table.items()):
                    del table[request_id]
                    if entry is not None:
                        self.stats.failures += 1
                        self.processor.request_finished(request_id, aborted=True)
                        events.append(RequestFailed(request_id, error))
            return events

    # --- the commit lane ----------------------------------------------------------------------

    def _on_outputs(self, outputs: EngineCoreOutputs) -> list[ClientEvent]:
        events: list[ClientEvent] = []
        failure = outputs.utility_output
        if failure is not None and failure.call_id == -1:
            logger.warning("Engine %d refused a message of this frontend: %s", outputs.engine_index,
                           failure.failure_message)
        elif failure is not None:
            events.append(UtilityReply(failure))
        for output in outputs.outputs:
            entry = self._running.get(output.request_id)
            if entry is None:
                continue  # aborted, or from before an engine restart
            if output.mm_cache_miss_hashes and output.finish_reason == FinishReason.ERROR and not entry.produced:
                events += self._on_stock_miss(output.request_id, entry, output.mm_cache_miss_hashes)
                continue
            entry.produced = True
            if output.finish_reason is not None:
                del self._running[output.request_id]
                self.processor.request_finished(output.request_id)
            events.append(RequestOutput(output.request_id, output))
        return events

    def _on_admitted(self, admitted: Admitted) -> list[ClientEvent]:
        if not self._admit(admitted.request_id):
            return []
        return [RequestAdmitted(admitted.request_id, admitted.request)]

    def _admit(self, request_id: str) -> bool:
        entry = self._in_flight.pop(request_id, None)
        if entry is None:
            return False
        if self.stream_outputs:
            self._running[request_id] = entry
        return True

    def _on_stock_miss(self, request_id: str, entry: _InFlight, mm_hashes: list[str]) -> list[ClientEvent]:
        """A stock engine's miss (vLLM's reply): the request ended there; send it again."""
        if entry.complete:
            return []  # answers a copy sent before the complete resend, which is on its way
        del self._running[request_id]
        self._in_flight[request_id] = entry
        return self._on_miss(CacheMiss(request_id, mm_hashes))

    def _on_mirror_reset(self, reset: MirrorReset) -> list[ClientEvent]:
        self._reset_shadow(reset.epoch)
        return []

    def _on_hello(self, hello: EngineHello) -> list[ClientEvent]:
        known, self.engine_epoch = self.engine_epoch, hello.epoch
        if known is None or known == hello.epoch:
            return []
        logger.warning("Engine %d restarted (epoch %x -> %x): resending what it had not answered.",
                       hello.engine_index, known, hello.epoch)
        return self.engine_restarted()


    def _reserve(self, request_id: str) -> None:
        with self._lane:
            if request_id in self._in_flight:
                raise ValidationError(f"Request {request_id!r} is already in flight; use a new request id.",
                                      parameter="request_id")
            self._in_flight[request_id] = None  # type: ignore[assignment]  # reserved while it is prepared

    def _release(self, request_id: str) -> None:
        with self._lane:
            self._in_flight.pop(request_id, None)

    def _send_new(self, prepared: PreparedRequest) -> None:
        with self._lane:
            if prepared.request_id not in self._in_flight:
                return  # aborted while it was being prepared
            try:
                self._check_length(prepared)
            except ValidationError:
                del self._in_flight[prepared.request_id]
                raise
            entry = _InFlight(prepared)
            self._in_flight[prepared.request_id] = entry
            try:
                self._submit(prepared)
            except BaseException:
                self._in_flight.pop(prepared.request_id, None)
                raise

    def _check_length(self, prepared: PreparedRequest) -> None:
        """vLLM's length checks, before anything is committed or sent."""
        limit = self.max_model_len
        if limit is None:
            return
        prompt = len(prepared.inputs.get("prompt_token_ids") or [])
        if prompt >= limit:
            raise ValidationError(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains {prompt} "
                "input tokens, which leaves no room for output tokens. Please reduce the length of the input prompt.",
                parameter="input_tokens")
        max_tokens = prepared.params.max_tokens
        if max_tokens is not None and prompt + max_tokens > limit:
            raise ValidationError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the input, {max_tokens} in max_tokens). Please reduce "
                "the length of the input prompt or max_tokens.", parameter="max_tokens")

    def _on_miss(self, miss: CacheMiss) -> list[ClientEvent]:
        entry = self._in_flight.get(miss.request_id)
        if entry is None:
            return []
        if miss.stale_epoch is not None:
            self._reset_shadow(miss.stale_epoch)
        if entry.complete:
            logger.debug("Ignoring a cache miss for %r: it answers a copy sent before the complete resend.",
                         miss.request_id)
            return []
        self.stats.resends += 1
        failed = self._resubmit(miss.request_id, entry, complete=True)
        return [] if failed is None else [failed]

    def _resubmit(self, request_id: str, entry: _InFlight | None, *, complete: bool) -> RequestFailed | None:
        """Send ``request_id`` again; ``complete``: with the data of every item, not only what P1
        reported missing, so this send cannot miss even if P1 resets again before it arrives."""
        if entry is None:
            return None  # still being prepared: it is sent after the reset, from the new shadow
        entry.complete = complete
        if complete:
            self.processor.invalidate(list(dict.fromkeys(
                h for hashes in (entry.prepared.inputs.get("mm_hashes") or {}).values() for h in hashes)))
        try:
            self._submit(entry.prepared)
        except MMFrontError as e:
            del self._in_flight[request_id]
            self.stats.failures += 1
            return RequestFailed(request_id, e)
        return None

    def _reset_shadow(self, epoch: int) -> None:
        if self.processor.reset_shadow(epoch):
            self.stats.shadow_resets += 1

    def _submit(self, prepared: PreparedRequest) -> None:
        """Commit, stamp, encode and send one request; the caller holds the lane."""
        try:
            with stage("cache"):
                request = self.processor.commit(prepared)
            with stage("encode"):
                message = self._encoder.encode(request)
        except BaseException:
            self._send_mirror_only(prepared.request_id)
            raise
        request_id = prepared.request_id
        stamp = self.processor.take_stamp(request_id, keep=True)
        envelope = encode_envelope(REQUEST, message, stamp if EXTRA_MIRROR in self.extras else None)
        self.stats.wire_bytes += sum(memoryview(frame).nbytes for frame in envelope)
        cache = self.processor.cache
        if cache is not None:
            for feature in request.mm_features or []:
                if feature.data is None and feature.mm_hash is not None:
                    self.stats.saved_bytes += cache.cached_nbytes(feature.mm_hash) or 0
        try:
            with stage("send"):
                self.transport.send(envelope)
        except TransportError as e:
            if not self.stream_outputs:
                self._send_mirror_only(request_id)
                raise
            # The engine is away (restarting): the request stays in flight and is sent again when
            # an engine greets with a new epoch (which resets the shadow), or fails when none does.
            self.processor.take_stamp(request_id)
            logger.warning("Request %r could not reach the engine (%s); it waits for the engine.", request_id, e)
        except BaseException:
            self._send_mirror_only(request_id)
            raise
        else:
            self.processor.take_stamp(request_id)
            if EXTRA_ADMITTED not in self.extras:
                self._admit(request_id)  # a stock engine sends no Admitted: the request runs once sent

    def _send_mirror_only(self, request_id: str) -> None:
        """The request changed the shadow but will not be sent: P1 must replay the change. When
        even that cannot be sent, the shadow starts a new epoch, which P1 adopts at the next
        request, instead of leaving P1 a hole in the sequence to wait out."""
        taken = self.processor.take_mirror_only(request_id)
        if taken is not None and EXTRA_MIRROR not in self.extras:
            if self.processor.reset_shadow():  # a stock engine has no mirror-only replay
                self.stats.shadow_resets += 1
        elif taken is not None:
            stamp, message = taken
            self.stats.mirror_only += 1
            try:
                self.transport.send(encode_envelope(MIRROR_ONLY, self._encoder.encode(message), stamp))
            except TransportError:
                if self.processor.reset_shadow():
                    self.stats.shadow_resets += 1


__all__ = [
    "ClientEvent", "ClientStats", "EngineClient", "RequestAdmitted", "RequestFailed", "RequestOutput", "UtilityReply"]
