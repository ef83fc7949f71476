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

Data-parallel ranks (``engines``, one :class:`~mmfront.engine.handshake.EngineInfo` per rank):
each request goes to the rank with the fewest requests outstanding from this client (chosen
before it is prepared, so it is prepared and committed against that rank's P0 cache: one mirror
per rank, as each rank keeps its own P1 cache); its aborts, resends and replies stay with that
rank. mmfront names no ``DPCoordinator`` in the handshake, so vLLM's non-MoE ranks start without
waiting for one and publish no queue statistics: the balance is counted here.

Concurrency: :meth:`EngineClient.add_request` may be called from any number of threads, and
:meth:`EngineClient.add_request_async` from any number of tasks. Media loading, hashing and HF
processing run on the caller's thread (a worker thread for the async form); the commit to the
P0 cache, the stamp, the encoding and the send run under one lock, the *commit lane*, so the
order in which the mirror changes is the order of the requests on the wire (a prompt already
processed is checked in the lane job that sends it: see :meth:`EngineClient.add_request_async`).
Replies from P1 are handled in the same lane. Thread-safe: every public method; the ``_on_*``,
``_submit`` and ``_send*`` methods run in the lane only.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from mmfront.engine.client_events import (
    ClientEvent,
    EngineStep,
    RequestAdmitted,
    RequestFailed,
    RequestOutput,
    UtilityReply,
)
from mmfront.engine.client_state import ClientStats, EngineRank, InFlight
from mmfront.engine.handshake import EngineInfo
from mmfront.engine.reference_limits import check_reference_params
from mmfront.engine.transports import BaseTransport
from mmfront.errors import ConfigError, EngineDeadError, MMFrontError, TransportError, ValidationError
from mmfront.inputs import MultiModalInputs, is_processed
from mmfront.preprocess import InputProcessor, PreparedRequest, PromptInput, RequestOptions
from mmfront.preprocess.context_length import check_context_length
from mmfront.timing import stage
from mmfront.wire import Frame, MsgpackEncoder, SamplingParams
from mmfront.wire.handshake import EXTRA_ADMITTED, EXTRA_MIRROR, EXTRA_REFERENCE_LIMITS, MMFRONT_EXTRAS
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
from mmfront.wire.structs import EngineCoreOutputs, FinishReason

logger = logging.getLogger(__name__)


class EngineClient:
    """Sends requests to P1 over any :class:`~mmfront.engine.transports.BaseTransport` and handles
    P1's replies (feed every arriving envelope to :meth:`handle_reply`).

    Drop-in for the part of vLLM's ``EngineCoreClient`` that adds requests: ``add_request`` takes
    the arguments of ``InputProcessor.process_inputs``. ``engines`` is what the engines said in
    vLLM's start-up handshake, one per data-parallel rank (several need a transport that routes,
    ``send_to``); without it (a pipe, a transport connected by hand) there is one engine, taken to
    be mmfront's, with every extra.
    """

    def __init__(
        self, processor: InputProcessor, transport: BaseTransport, *, stream_outputs: bool = False,
        engines: Sequence[EngineInfo] = (), step_events: bool = False,
    ) -> None:
        self.processor = processor
        """Rank 0's processor; the other ranks' share its model and processing."""
        self.transport = transport
        infos: list[EngineInfo | None] = [*engines] or [None]
        if len(infos) > 1 and not transport.routes_to_engines:
            raise ConfigError(f"{len(infos)} engine ranks need a transport that routes to each "
                              f"(ZmqFrontendTransport); {type(transport).__name__} reaches one engine.")
        if [info.engine_index for info in engines] != list(range(len(engines))):
            raise ConfigError(f"engines must list ranks 0..{len(engines) - 1} in order (FrontendHandshake.wait's "
                              f"answer), got ranks {[info.engine_index for info in engines]}.")
        self.ranks = [
            EngineRank(i, processor if i == 0 else processor.for_another_engine(), info,
                       MMFRONT_EXTRAS if info is None else info.extras)
            for i, info in enumerate(infos)]
        self.engines = list(engines)
        """Every rank's start-up answer, by rank (empty without a handshake)."""
        self.engine = infos[0]
        """Rank 0's start-up answer (``max_model_len``, ``num_gpu_blocks``, ``block_size``)."""
        self.stats = ClientStats()
        self.stream_outputs = stream_outputs
        """Keep admitted requests until their last output (the engine's outputs come back over
        the same transport); otherwise a request is done for the client once admitted."""
        self.step_events = step_events
        """Report each message of outputs as an :class:`EngineStep` too (for statistics)."""
        known = [info.max_model_len for info in engines]
        self.max_model_len: int | None = min(known) if known else None
        """The engines' context length (the smallest start-up answer, as vLLM takes it): a request
        that cannot fit it is refused before it is sent, by the one context-length rule
        (:func:`~mmfront.preprocess.context_length.check_context_length`; ``None``: unknown,
        nothing is checked)."""
        self._lane = threading.RLock()
        self._lane_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmfront-commit-lane")
        self._in_flight: dict[str, InFlight] = {}
        self._running: dict[str, InFlight] = {}
        self._rank_of: dict[str, EngineRank] = {}
        """Every request this client tracks (being prepared, in flight, running) and its rank."""
        self._encoder = MsgpackEncoder()
        self._handlers: dict[bytes, Callable[[Any], list[ClientEvent]]] = {
            ENGINE_OUTPUTS: self._on_outputs, ENGINE_HELLO: self._on_hello, ADMITTED: self._on_admitted,
            MIRROR_RESET: self._on_mirror_reset, CACHE_MISS: self._on_miss}
        """What each P1 -> P0 kind does, run in the commit lane."""

    @property
    def extras(self) -> frozenset[str]:
        """The extras every rank announced."""
        return frozenset.intersection(*(rank.extras for rank in self.ranks))

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
        rank = self._reserve(request_id)
        try:
            prepared = rank.processor.prepare(request_id, prompt, params, options=options, **kwargs)
        except BaseException:
            self._release(request_id)
            raise
        self._send_new(prepared)

    async def add_request_async(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> None:
        """:meth:`add_request` for asyncio: preparation and the commit lane run on worker
        threads, so the event loop never waits for media, the HF processor or the lane.

        A prompt already processed (``MultiModalInputs``, as ``mmfront serve`` passes them after
        its own preparation job) needs no processor: its checks and the copy of its parameters
        (tens of microseconds, plus a pass over its token ids, as its encoding makes in the same
        job) run in the lane job that sends it, one thread hand-off instead of two. Any other
        prompt is prepared on the preparation pool first."""
        loop = asyncio.get_running_loop()
        rank = self._reserve(request_id)
        prepare = partial(rank.processor.prepare, request_id, prompt, params, options=options, **kwargs)
        if is_processed(prompt):
            send = partial(self._prepare_and_send, request_id, prepare)
        else:
            try:
                prepared = await loop.run_in_executor(self.processor.pipeline.executor, prepare)
            except BaseException:
                self._release(request_id)
                raise
            send = partial(self._send_new, prepared)
        try:
            await loop.run_in_executor(self._lane_executor, send)
        except asyncio.CancelledError:
            # The send may still run (it had started): queued behind it in the lane, this abort
            # either finds the request sent and stops it, or finds it unsent and frees its id.
            self._lane_executor.submit(self.abort_request, request_id)
            raise

    @property
    def running(self) -> list[str]:
        """Requests admitted and not finished (with ``stream_outputs``)."""
        with self._lane:
            return list(self._running)

    def abort_request(self, request_id: str) -> None:
        """Stop tracking ``request_id`` and tell its engine to stop it: later replies for it are
        ignored, and it is not resent."""
        with self._lane:
            sent = self._in_flight.pop(request_id, None) is not None
            sent = self._running.pop(request_id, None) is not None or sent
            rank = self._untrack(request_id)
            if sent and rank is not None:
                rank.processor.request_finished(request_id, aborted=True)
                self._send(rank, encode_envelope(ABORT, self._encoder.encode([request_id])))

    def call_utility(self, call: UtilityCall, engine_index: int = 0) -> None:
        """Send one utility call to rank ``engine_index``; its answer comes back as a
        :class:`UtilityReply` event."""
        with self._lane:
            self._send(self.ranks[engine_index], encode_envelope(UTILITY, self._encoder.encode(call)))

    def clear_cache(self) -> None:
        """Clear every rank's P0 caches (the frontend's half of vLLM's ``reset_mm_cache``), in the lane."""
        with self._lane:
            for rank in self.ranks:
                rank.processor.clear_cache()

    def rank_of(self, request_id: str) -> int | None:
        """The rank ``request_id`` went to, while it is tracked."""
        with self._lane:
            rank = self._rank_of.get(request_id)
            return None if rank is None else rank.index

    def has_work(self, engine_index: int) -> bool:
        """Whether rank ``engine_index`` owes this client an answer (a request in flight or running)."""
        with self._lane:
            return any(entry is not None and entry.rank.index == engine_index
                       for table in (self._in_flight, self._running) for entry in table.values())

    def handle_reply(self, frames: Sequence[Frame]) -> list[ClientEvent]:
        """Act on one envelope from P1; the events the caller must see (often none)."""
        message = decode_message(frames, Direction.TO_FRONTEND)
        with self._lane:
            return self._handlers[message.kind](message.body)

    def engine_restarted(self, engine_index: int = 0) -> list[ClientEvent]:
        """Rank ``engine_index`` was replaced by an empty engine and what was in transit to the old
        one is lost: clear its shadow and send again every request of it that produced no output
        yet; one that did fails with :class:`~mmfront.errors.EngineDeadError` (resending it would
        answer it twice). Returns the requests that failed."""
        with self._lane:
            rank = self.ranks[engine_index]
            self.stats.engine_restarts += 1
            if rank.processor.reset_shadow():
                self.stats.shadow_resets += 1
            events: list[ClientEvent] = []
            for request_id, entry in list(self._running.items()):
                if entry.rank is not rank:
                    continue
                del self._running[request_id]
                if entry.produced:
                    events.append(self._fail(request_id, entry, EngineDeadError(
                        f"The engine restarted while request {request_id!r} was generating; its output so far is "
                        "incomplete. Send the request again.")))
                else:
                    self._in_flight[request_id] = entry
            for request_id, entry in list(self._in_flight.items()):
                if entry is not None and entry.rank is rank:
                    failed = self._resubmit(request_id, entry, complete=False)
                    if failed is not None:
                        events.append(failed)
            return events

    def fail_all(self, error: MMFrontError, engine_index: int | None = None) -> list[ClientEvent]:
        """The engine is gone for good: every request in flight or running on it (``None``: on
        any rank) fails with ``error``."""
        with self._lane:
            events: list[ClientEvent] = []
            for table in (self._in_flight, self._running):
                for request_id, entry in list(table.items()):
                    if entry is not None and (engine_index is None or entry.rank.index == engine_index):
                        del table[request_id]
                        events.append(self._fail(request_id, entry, error))
            return events

    # --- the commit lane ----------------------------------------------------------------------

    def _on_outputs(self, outputs: EngineCoreOutputs) -> list[ClientEvent]:
        if 0 <= outputs.engine_index < len(self.ranks):
            self.ranks[outputs.engine_index].last_heard = time.monotonic()
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
                refused = self._in_flight.get(output.request_id)
                if refused is not None and output.finish_reason == FinishReason.ERROR and output.error is not None:
                    del self._in_flight[output.request_id]  # the engine refused it before admitting it
                    events.append(self._fail(output.request_id, refused, ValidationError(
                        f"The engine refused request {output.request_id!r}: {output.error.message}",
                        parameter="request_id")))
                continue  # aborted, or from before an engine restart
            if output.mm_cache_miss_hashes and output.finish_reason == FinishReason.ERROR and not entry.produced:
                events += self._on_stock_miss(output.request_id, entry, output.mm_cache_miss_hashes)
                continue
            entry.produced = True
            if output.finish_reason is not None:
                del self._running[output.request_id]
                self._untrack(output.request_id)
                entry.rank.processor.request_finished(output.request_id)
            events.append(RequestOutput(output.request_id, output))
        if self.step_events and (outputs.outputs or outputs.scheduler_stats is not None):
            ours = [event.output for event in events if isinstance(event, RequestOutput)]
            events.insert(0, EngineStep(outputs.engine_index, outputs.timestamp, outputs.scheduler_stats, ours,
                                        outputs.weight_version))
        return events

    def _on_admitted(self, admitted: Admitted) -> list[ClientEvent]:
        self._heard_about(admitted.request_id)
        if not self._admit(admitted.request_id):
            return []
        return [RequestAdmitted(admitted.request_id, admitted.request)]

    def _admit(self, request_id: str) -> bool:
        entry = self._in_flight.get(request_id)
        if entry is None:
            return False  # not ours, or still being prepared: a reply to an earlier request of that id
        del self._in_flight[request_id]
        if self.stream_outputs:
            self._running[request_id] = entry
        else:
            self._untrack(request_id)
        return True

    def _on_stock_miss(self, request_id: str, entry: InFlight, mm_hashes: list[str]) -> list[ClientEvent]:
        """A stock engine's miss (vLLM's reply): the request ended there; send it again."""
        if entry.complete:
            return []  # answers a copy sent before the complete resend, which is on its way
        del self._running[request_id]
        self._in_flight[request_id] = entry
        return self._on_miss(CacheMiss(request_id, mm_hashes))

    def _on_mirror_reset(self, reset: MirrorReset) -> list[ClientEvent]:
        for rank in self.ranks:  # epochs are random per shadow: at most one rank is still in it
            if self._reset_shadow(rank, reset.epoch):
                rank.last_heard = time.monotonic()
        return []

    def _on_hello(self, hello: EngineHello) -> list[ClientEvent]:
        if hello.engine_index >= len(self.ranks):
            logger.warning("Dropped a greeting from engine %d: this client has ranks 0..%d.",
                           hello.engine_index, len(self.ranks) - 1)
            return []
        rank = self.ranks[hello.engine_index]
        rank.last_heard = time.monotonic()
        known, rank.epoch = rank.epoch, hello.epoch
        if known is None or known == hello.epoch:
            return []
        logger.warning("Engine %d restarted (epoch %x -> %x): resending what it had not answered.",
                       hello.engine_index, known, hello.epoch)
        return self.engine_restarted(hello.engine_index)

    def _reserve(self, request_id: str) -> EngineRank:
        """Track ``request_id`` from now on and choose its rank: the one with the fewest requests
        outstanding (ties: the lowest index)."""
        with self._lane:
            if request_id in self._rank_of:
                raise ValidationError(f"Request {request_id!r} is already in flight; use a new request id.",
                                      parameter="request_id")
            rank = min(self.ranks, key=lambda r: r.outstanding)
            self._in_flight[request_id] = None  # type: ignore[assignment]  # reserved while it is prepared
            self._rank_of[request_id] = rank
            rank.outstanding += 1
            return rank

    def _release(self, request_id: str) -> None:
        with self._lane:
            self._in_flight.pop(request_id, None)
            self._untrack(request_id)

    def _untrack(self, request_id: str) -> EngineRank | None:
        rank = self._rank_of.pop(request_id, None)
        if rank is not None:
            rank.outstanding -= 1
        return rank

    def _heard_about(self, request_id: str) -> None:
        rank = self._rank_of.get(request_id)
        if rank is not None:
            rank.last_heard = time.monotonic()

    def _fail(self, request_id: str, entry: InFlight, error: MMFrontError) -> RequestFailed:
        """``request_id`` (already out of the tables) fails with ``error``."""
        self.stats.failures += 1
        self._untrack(request_id)
        entry.rank.processor.request_finished(request_id, aborted=True)
        return RequestFailed(request_id, error)

    def _send(self, rank: EngineRank, envelope: Sequence[Frame]) -> None:
        if len(self.ranks) == 1:
            self.transport.send(envelope)
        else:
            self.transport.send_to(rank.index, envelope)

    def _prepare_and_send(self, request_id: str, prepare: Callable[[], PreparedRequest]) -> None:
        """Prepare (cheaply: a processed prompt) and send ``request_id`` in one lane job; a
        failure frees its id."""
        with self._lane:
            if request_id not in self._rank_of:
                return  # aborted while it waited for the lane
            try:
                prepared = prepare()
            except BaseException:
                self._release(request_id)
                raise
            self._send_new(prepared)

    def _send_new(self, prepared: PreparedRequest) -> None:
        with self._lane:
            rank = self._rank_of.get(prepared.request_id)
            if rank is None:
                return  # aborted while it was being prepared
            try:
                check_context_length(self.max_model_len, prepared.params.max_tokens,
                                     len(prepared.inputs.get("prompt_token_ids") or []))
                if EXTRA_REFERENCE_LIMITS in rank.extras:
                    check_reference_params(prepared.params)
            except ValidationError:
                self._release(prepared.request_id)
                raise
            entry = InFlight(prepared, rank)
            self._in_flight[prepared.request_id] = entry
            try:
                self._submit(entry)
            except BaseException:
                self._release(prepared.request_id)
                raise
            rank.sent += 1

    def _on_miss(self, miss: CacheMiss) -> list[ClientEvent]:
        entry = self._in_flight.get(miss.request_id)
        if entry is None:
            return []
        entry.rank.last_heard = time.monotonic()
        if miss.stale_epoch is not None:
            self._reset_shadow(entry.rank, miss.stale_epoch)
        if entry.complete:
            logger.debug("Ignoring a cache miss for %r: it answers a copy sent before the complete resend.",
                         miss.request_id)
            return []
        self.stats.resends += 1
        failed = self._resubmit(miss.request_id, entry, complete=True)
        return [] if failed is None else [failed]

    def _resubmit(self, request_id: str, entry: InFlight | None, *, complete: bool) -> RequestFailed | None:
        """Send ``request_id`` again; ``complete``: with the data of every item, not only what P1
        reported missing, so this send cannot miss even if P1 resets again before it arrives."""
        if entry is None:
            return None  # still being prepared: it is sent after the reset, from the new shadow
        entry.complete = complete
        if complete:
            entry.rank.processor.invalidate(list(dict.fromkeys(
                h for hashes in (entry.prepared.inputs.get("mm_hashes") or {}).values() for h in hashes)))
        try:
            self._submit(entry)
        except MMFrontError as e:
            del self._in_flight[request_id]
            return self._fail(request_id, entry, e)
        return None

    def _reset_shadow(self, rank: EngineRank, epoch: int | None = None) -> bool:
        if rank.processor.reset_shadow(epoch):
            self.stats.shadow_resets += 1
            return True
        return False

    def _submit(self, entry: InFlight) -> None:
        """Commit, stamp, encode and send one request to its rank; the caller holds the lane."""
        prepared, rank, processor = entry.prepared, entry.rank, entry.rank.processor
        try:
            with stage("cache"):
                request = processor.commit(prepared)
            request.client_index = self.transport.client_index
            with stage("encode"):
                message = self._encoder.encode(request)
        except BaseException:
            self._send_mirror_only(rank, prepared.request_id)
            raise
        request_id = prepared.request_id
        stamp = processor.take_stamp(request_id, keep=True)
        envelope = encode_envelope(REQUEST, message, stamp if EXTRA_MIRROR in rank.extras else None)
        self.stats.wire_bytes += sum(memoryview(frame).nbytes for frame in envelope)
        cache = processor.cache
        if cache is not None:
            for feature in request.mm_features or []:
                if feature.data is None and feature.mm_hash is not None:
                    self.stats.saved_bytes += cache.cached_nbytes(feature.mm_hash) or 0
        try:
            with stage("send"):
                self._send(rank, envelope)
        except TransportError as e:
            if not self.stream_outputs:
                self._send_mirror_only(rank, request_id)
                raise
            # The engine is away (restarting): the request stays in flight and is sent again when
            # an engine greets with a new epoch (which resets the shadow), or fails when none does.
            processor.take_stamp(request_id)
            logger.warning("Request %r could not reach engine %d (%s); it waits for the engine.",
                           request_id, rank.index, e)
        except BaseException:
            self._send_mirror_only(rank, request_id)
            raise
        else:
            processor.take_stamp(request_id)
            if EXTRA_ADMITTED not in rank.extras:
                self._admit(request_id)  # a stock engine sends no Admitted: the request runs once sent

    def _send_mirror_only(self, rank: EngineRank, request_id: str) -> None:
        """The request changed the shadow but will not be sent: P1 must replay the change. When
        even that cannot be sent, the shadow starts a new epoch, which P1 adopts at the next
        request, instead of leaving P1 a hole in the sequence to wait out."""
        taken = rank.processor.take_mirror_only(request_id)
        if taken is not None and EXTRA_MIRROR not in rank.extras:
            self._reset_shadow(rank)  # a stock engine has no mirror-only replay
        elif taken is not None:
            stamp, message = taken
            self.stats.mirror_only += 1
            try:
                self._send(rank, encode_envelope(MIRROR_ONLY, self._encoder.encode(message), stamp))
            except TransportError:
                self._reset_shadow(rank)


__all__ = [
    "ClientEvent", "ClientStats", "EngineClient", "EngineRank", "EngineStep", "RequestAdmitted", "RequestFailed", "RequestOutput",
    "UtilityReply"]
