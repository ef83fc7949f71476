"""P1's side: what an engine core embeds to take requests from mmfront's P0s.

:class:`EngineCoreReceiver` is the engine loop's interface: ``poll`` for ready requests over any
number of frontends' transports, ``send`` for step outputs, ``take_aborted``. Under it,
:class:`EngineReceiver` turns one frontend's envelopes into requests ready for the scheduler
(every feature's data filled in) and the replies P0 needs: ``Admitted``, ``CacheMiss`` (resend
with data), ``MirrorReset`` (clear your shadow). Drift never raises: it becomes a reply, and the
request comes back with its data. :func:`serve_pipe` runs one over a pipe, for tests and for a
P1 in a child process.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from mmfront.cache.base import BaseMultiModalReceiverCache, MirrorEvent, NullReceiverMirror
from mmfront.cache.factory import engine_receiver_cache_from_config
from mmfront.config import DEFAULT_LIMIT_PER_PROMPT, MODALITIES, MultiModalConfig
from mmfront.engine.transports import BaseTransport, PipeTransport
from mmfront.errors import ConfigError, DecodeError, ResourceError, TransportError, UnknownUtilityError
from mmfront.wire import EngineCoreRequest, Frame, MsgpackEncoder
from mmfront.wire.allocator import unmap_large_buffers
from mmfront.wire.messages import (
    ABORT,
    ADMITTED,
    CACHE_MISS,
    ENGINE_HELLO,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    MIRROR_RESET,
    REQUEST,
    RESET_CACHE,
    UTILITY,
    Admitted,
    CacheMiss,
    Direction,
    EngineHello,
    Message,
    MirrorReset,
    UtilityCall,
    decode_message,
    encode_envelope,
    utility_result,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, FinishReason, RequestError, UtilityOutput

logger = logging.getLogger(__name__)

Reply = list[Frame]
DEFAULT_MAX_MM_FEATURES = len(MODALITIES) * DEFAULT_LIMIT_PER_PROMPT
"""Most multimodal features one request may carry to an engine whose limit is not given: every
modality at vLLM's default ``limit_mm_per_prompt``. :func:`mm_feature_limit` gives a config's."""
DEFAULT_ROUND_BUDGET = 64
"""Messages the engine loop reads from one frontend before it turns to the next: a frontend that
floods the engine delays the others by at most this many messages per round."""
UtilityMethods = Mapping[str, Callable[..., Any]]
"""An engine's utility methods by vLLM name (``EngineCore.sleep`` is ``"sleep"``)."""


class EngineReceiver:
    """Admits requests into the engine, filling their features from P1's processor cache.

    ``cache`` is what :func:`~mmfront.cache.engine_receiver_cache_from_config` gives: a
    :class:`~mmfront.cache.mirror.MirroredReceiverCache` in ``lru`` mode (stamps are checked,
    requests applied in P0's order), ``None`` otherwise (requests must carry all their data).
    Any other receiver cache works too, through its null mirror: each request is served at once
    from what it holds, without drift detection. ``echo`` puts each admitted request in its
    ``Admitted`` reply.
    """

    def __init__(
        self, cache: BaseMultiModalReceiverCache | None, *, echo: bool = False,
        max_mm_features: int = DEFAULT_MAX_MM_FEATURES,
    ) -> None:
        if max_mm_features < 1:
            raise ConfigError(f"max_mm_features must be at least 1 (multimodal items per request), got {max_mm_features}.")
        self.cache = cache
        self.mirror = NullReceiverMirror(None) if cache is None else cache.mirror
        self.echo = echo
        self.max_mm_features = max_mm_features
        self._encoder = MsgpackEncoder()

    def handle(self, frames: Sequence[Frame]) -> tuple[list[EngineCoreRequest], list[Reply]]:
        """One arrived envelope -> the requests now ready for the engine, and the replies to P0.

        A request may become ready later (it waits for an earlier one that is still in transit),
        and one arrival may release several."""
        return self.handle_message(self.decode(frames))

    def decode(self, frames: Sequence[Frame]) -> Message:
        """One envelope from P0, read as untrusted: a request with more than ``max_mm_features``
        features is refused before they are decoded (:class:`~mmfront.errors.DecodeError`)."""
        return decode_message(frames, Direction.TO_ENGINE, max_mm_features=self.max_mm_features)

    def handle_message(self, envelope: Message) -> tuple[list[EngineCoreRequest], list[Reply]]:
        """:meth:`handle` for an envelope already decoded."""
        events: list[MirrorEvent]
        if envelope.kind == REQUEST:
            request: EngineCoreRequest = envelope.body
            events = self.mirror.receive(envelope.stamp, request.mm_features or [], request)
        elif envelope.kind == MIRROR_ONLY:
            assert envelope.stamp is not None  # decode_message refuses a MIRROR_ONLY without one
            if len(envelope.body.ops) > self.max_mm_features:
                raise DecodeError(f"A mirror-only message carries {len(envelope.body.ops)} operations; a request "
                                  f"has at most {self.max_mm_features} items here.")
            events = self.mirror.receive_mirror_only(envelope.stamp, envelope.body)
        elif envelope.kind == RESET_CACHE:
            events = self.reset_cache()
        else:
            events = []  # nothing else is held here: aborts are the engine loop's (EngineCoreReceiver)
        return self._answer(events)

    def poll(self) -> tuple[list[EngineCoreRequest], list[Reply]]:
        """What became due without an arrival; call it from the engine loop when idle."""
        return self._answer(self.mirror.poll())

    def reset_cache(self) -> list[MirrorEvent]:
        """Clear the processor cache (reset_mm_cache, sleep); the events tell P0 to follow."""
        if self.cache is None:
            return []
        self.cache.clear_cache()
        return self.mirror.poll()

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


@dataclass
class _Frontend:
    transport: BaseTransport
    receiver: EngineReceiver
    index: int
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    """Serialises sends on ``transport``: the engine loop's and the heartbeat thread's."""
    broken: BaseException | None = None
    """Why a send or a receive failed: the frontend is gone, the engine loop drops it."""
    dropped: bool = False
    messages_dropped: int = 0
    """Messages not sent because this frontend's queue was full (under ``send_lock``)."""


def _beat(ref: weakref.ref[EngineCoreReceiver], stop: threading.Event, period: float) -> None:
    """The heartbeat thread: it holds the receiver weakly, so a receiver nobody closed still goes."""
    while not stop.wait(period):
        receiver = ref()
        if receiver is None:
            return
        receiver.send_heartbeats()
        del receiver


class EngineCoreReceiver:
    """What an existing engine embeds to take requests from mmfront frontends (P0s).

    One instance serves one engine and any number of frontends, each over its own transport
    and with its own receiver cache (one mirror per frontend, so the processor cache stays on
    with many API servers). The engine loop calls :meth:`poll` for requests whose features are
    filled in and :meth:`send` for its step outputs; :meth:`take_aborted` lists what P0 aborted.

    Reach each frontend through vLLM's start-up handshake
    (:func:`~mmfront.engine.handshake.engine_handshake`), which announces the extras this
    receiver speaks (mirror stamps, ``Admitted``, heartbeats) so P0 relies on them.

    Utility calls (vLLM's UTILITY requests) run ``utilities[method_name]`` and are answered with
    a ``UtilityOutput`` as vLLM's engine answers them: the result, or ``failure_message``
    ``"Call to NAME method failed: ..."``. ``reset_mm_cache`` is the receiver's own: it clears the
    caller's receiver cache and tells its P0 (``MirrorReset``) before it runs the engine's.

    A malformed message costs only its sender: it is answered with a ``DecodeError`` failure
    and service goes on. A frontend whose link breaks (a send raises
    :class:`~mmfront.errors.TransportError`, a receive ``EOFError``: its P0 went away) is dropped:
    its transport is closed, its requests come back from :meth:`take_aborted`, and the other
    frontends are served on.

    Nothing is sent waiting for room (``BaseTransport.try_send``), so a frontend that stops
    reading never holds the engine loop or the heartbeat thread. When its queue is full, what
    changes no request (refusals of malformed messages, heartbeats, idle statistics) is dropped
    and counted (:attr:`messages_dropped`, logged sparingly); what does (outputs, admissions,
    cache misses, utility answers) cannot be dropped without stranding its requests, so that
    frontend is dropped as one whose link broke.

    Heartbeats (``EngineHello`` every ``heartbeat_s``) come from a daemon thread the receiver
    owns, so P0 hears from the engine while a long step runs (``engine_timeout_s``); it stops on
    :meth:`close` (or when the receiver is garbage-collected) and a failed heartbeat only marks
    its frontend as gone. Thread-safety: call the methods from the engine loop's thread
    (:meth:`send_heartbeats` from any). The heartbeat thread shares only the transports' sending
    side with the loop, through one lock per frontend, so a transport sees one sender at a time
    (and one receiver: the loop).
    """

    def __init__(
        self, transport: BaseTransport, cache: BaseMultiModalReceiverCache | None = None, *, engine_index: int = 0,
        heartbeat_s: float = 1.0, poll_slice_s: float = 0.005, utilities: UtilityMethods | None = None,
        round_budget: int = DEFAULT_ROUND_BUDGET, max_mm_features: int = DEFAULT_MAX_MM_FEATURES,
    ) -> None:
        if not heartbeat_s > 0:
            raise ConfigError(f"heartbeat_s must be positive (seconds between heartbeats), got {heartbeat_s}.")
        if round_budget < 1:
            raise ConfigError(f"round_budget must be at least 1 (messages per frontend per round), got {round_budget}.")
        unmap_large_buffers()  # a frontend's large messages must not stay resident once freed
        self.round_budget = round_budget
        self.max_mm_features = max_mm_features
        self.engine_index = engine_index
        self.utilities: UtilityMethods = utilities or {}
        self.epoch = secrets.randbits(63)
        self.heartbeat_s = heartbeat_s
        self.poll_slice_s = poll_slice_s
        self.decode_errors = 0
        self.requests_refused = 0
        """Requests refused by id (one already running); logged as malformed messages are, sparingly."""
        self._frontends: list[_Frontend] = []
        self._routes: dict[str, _Frontend] = {}
        self._aborted: list[str] = []
        self._ready: list[EngineCoreRequest] = []
        self._held: list[tuple[_Frontend, EngineCoreRequest]] = []
        """Requests whose id the engine has yet to take the abort of (an earlier request of that id):
        admitted once it has (:meth:`take_aborted`), so the abort never reaches the new one."""
        """Admitted outside an arrival (a cache reset released them); the next poll returns them."""
        self._encoder = MsgpackEncoder()
        self._hello = encode_envelope(ENGINE_HELLO, self._encoder.encode(EngineHello(engine_index, self.epoch)))
        self.add_frontend(transport, cache)
        self._stop_heartbeats = threading.Event()
        self._heartbeats = threading.Thread(
            target=_beat, args=(weakref.ref(self), self._stop_heartbeats, heartbeat_s),
            name=f"mmfront-heartbeat-{engine_index}", daemon=True)
        self._heartbeats.start()

    def add_frontend(self, transport: BaseTransport, cache: BaseMultiModalReceiverCache | None = None) -> int:
        """Serve one more frontend; its index is the ``client_index`` its requests get."""
        frontend = _Frontend(transport, EngineReceiver(cache, max_mm_features=self.max_mm_features),
                             len(self._frontends))
        self._frontends.append(frontend)
        self._send_to(frontend, self._hello, droppable=True)
        return frontend.index

    @property
    def messages_dropped(self) -> int:
        """Messages dropped so far because their frontend's queue was full (refusals, heartbeats,
        idle statistics: nothing a request waits for)."""
        return sum(f.messages_dropped for f in self._frontends)

    @property
    def frontends_served(self) -> int:
        """Frontends served now (those whose link broke are not)."""
        return sum(not f.dropped for f in self._frontends)

    @property
    def caches(self) -> list[BaseMultiModalReceiverCache | None]:
        return [f.receiver.cache for f in self._frontends]

    def poll(self, timeout: float | None = 0.0) -> list[EngineCoreRequest]:
        """Requests ready for the engine (every feature's data filled in), waiting up to
        ``timeout`` seconds for the first (``None``: until one arrives). One round reads at most
        ``round_budget`` messages from each frontend in turn, and returns what became ready."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready, more = self._poll_once()
            left = None if deadline is None else deadline - time.monotonic()
            if ready or (left is not None and left <= 0):
                return ready
            if more:
                continue  # a frontend has more queued than one round takes: no sleep
            ready = self._wait(self.poll_slice_s if left is None else min(left, self.poll_slice_s))
            if ready:
                return ready

    def send(self, outputs: Sequence[EngineCoreOutput], scheduler_stats: Mapping[str, Any] | None = None) -> None:
        """Send step outputs to the frontends their requests came from; a finished request is
        forgotten (its id may be reused). ``scheduler_stats``: vLLM's ``SchedulerStats`` of the
        step (as a map), sent with each frontend's outputs, as an engine that keeps statistics does."""
        by_frontend: dict[int, list[EngineCoreOutput]] = {}
        for output in outputs:
            frontend = self._routes.get(output.request_id)
            if frontend is None:
                continue  # aborted meanwhile: P0 no longer listens for it
            by_frontend.setdefault(frontend.index, []).append(output)
            if output.finish_reason is not None:
                del self._routes[output.request_id]
        now = time.time()
        for index, group in by_frontend.items():
            message = EngineCoreOutputs(engine_index=self.engine_index, outputs=group, timestamp=now,
                                        scheduler_stats=scheduler_stats)
            self._send_to(self._frontends[index], encode_envelope(ENGINE_OUTPUTS, self._encoder.encode(message)))
        self._drop_broken()

    def reset_mm_caches(self) -> None:
        """Clear every frontend's receiver cache and tell each P0 (``sleep`` does this)."""
        for frontend in self._frontends:
            if not frontend.dropped:
                self._reset_mm_cache(frontend)

    def take_aborted(self) -> list[str]:
        """Requests P0 aborted (or whose frontend went away) since the last call: stop generating
        for them."""
        aborted, self._aborted = self._aborted, []
        held, self._held = self._held, []
        for frontend, request in held:
            if not frontend.dropped:
                self._ready += self._admit(frontend, [request])
        return aborted

    def send_scheduler_stats(self, scheduler_stats: Mapping[str, Any]) -> None:
        """vLLM's request-count message (outputs with only ``SchedulerStats``) to every frontend:
        how an idle engine tells its API servers that its counts changed (requests aborted)."""
        message = EngineCoreOutputs(engine_index=self.engine_index, scheduler_stats=scheduler_stats,
                                    timestamp=time.time())
        frames = encode_envelope(ENGINE_OUTPUTS, self._encoder.encode(message))
        for frontend in self._frontends:
            if not frontend.dropped:
                self._send_to(frontend, frames, droppable=True)
        self._drop_broken()

    def send_heartbeats(self) -> None:
        """Greet every frontend (``EngineHello``): the heartbeat thread calls it every
        ``heartbeat_s``; safe from any thread."""
        for frontend in list(self._frontends):
            self._send_to(frontend, self._hello, droppable=True)

    def close(self) -> None:
        self._stop_heartbeats.set()
        if self._heartbeats is not threading.current_thread():
            self._heartbeats.join()
        for frontend in self._frontends:
            with frontend.send_lock:
                frontend.transport.close()

    def __enter__(self) -> EngineCoreReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals --------------------------------------------------------------------------------

    def _poll_once(self) -> tuple[list[EngineCoreRequest], bool]:
        """One round: each frontend in turn, at most ``round_budget`` messages each, never waiting
        on one (a message held for its side-channel datagram waits in its own transport). The
        requests now ready, and whether a frontend had more than its budget."""
        self._drop_broken()
        ready, self._ready = self._ready, []
        more = False
        for frontend in self._frontends:
            if frontend.dropped:
                continue
            _, replies = frontend.receiver.poll()
            self._reply(frontend, replies)
            budget = self.round_budget
            while frontend.broken is None:
                if budget == 0:
                    more = True
                    break
                budget -= 1
                try:
                    frames = frontend.transport.recv(0.0)
                    if frames is None:
                        break
                    ready += self._handle(frontend, frames)
                except (DecodeError, ResourceError) as e:  # that message alone is lost
                    self._refuse(frontend, e)
                except (EOFError, TransportError) as e:
                    self._mark_broken(frontend, e)
        self._drop_broken()
        return ready, more

    def _handle(self, frontend: _Frontend, frames: Sequence[Frame]) -> list[EngineCoreRequest]:
        message = frontend.receiver.decode(frames)
        if message.kind == ABORT:
            for request_id in message.body:
                if self._routes.get(request_id) is frontend:
                    del self._routes[request_id]
                    self._aborted.append(request_id)
            self._held = [(f, r) for f, r in self._held if f is not frontend or r.request_id not in message.body]
            return []
        if message.kind == UTILITY:
            self._call(frontend, message.body)
            ready, self._ready = self._ready, []
            return ready
        requests, replies = frontend.receiver.handle_message(message)
        self._reply(frontend, replies)
        return self._admit(frontend, requests)

    def _admit(self, frontend: _Frontend, requests: list[EngineCoreRequest]) -> list[EngineCoreRequest]:
        ready = []
        pending = set(self._aborted)
        for request in requests:
            request_id = request.request_id
            if request_id in self._routes or any(r.request_id == request_id for _, r in self._held):
                self._refuse_request(frontend, request_id, f"Request id {request_id!r} is already running on engine "
                                     f"{self.engine_index}; frontends must use distinct request ids.")
            elif request_id in pending:
                self._held.append((frontend, request))
            else:
                request.client_index = frontend.index
                self._routes[request_id] = frontend
                ready.append(request)
        return ready

    def _refuse_request(self, frontend: _Frontend, request_id: str, message: str) -> None:
        """End ``request_id`` for its sender alone, before the engine saw it (vLLM's error output)."""
        self.requests_refused += 1
        if _worth_logging(self.requests_refused):
            logger.warning("Engine %d: refused request %r of frontend %d (%d refused so far): %s", self.engine_index,
                           request_id, frontend.index, self.requests_refused, message)
        output = EngineCoreOutput(request_id, [], finish_reason=FinishReason.ERROR,
                                  error=RequestError("ValidationError", message))
        outputs = EngineCoreOutputs(engine_index=self.engine_index, outputs=[output], finished_requests={request_id},
                                    timestamp=time.time())
        self._send_to(frontend, encode_envelope(ENGINE_OUTPUTS, self._encoder.encode(outputs)))

    def _reset_mm_cache(self, frontend: _Frontend) -> None:
        requests, replies = frontend.receiver.handle_message(Message(RESET_CACHE, None, None))
        self._reply(frontend, replies)
        self._ready += self._admit(frontend, requests)

    def _call(self, frontend: _Frontend, call: UtilityCall) -> None:
        """Run one utility call and answer it to its caller, as vLLM's engine does."""
        output = UtilityOutput(call.call_id)
        name = call.method_name
        try:
            if name == "reset_mm_cache":
                self._reset_mm_cache(frontend)
            method = self.utilities.get(name)
            if method is None and name != "reset_mm_cache":
                raise UnknownUtilityError(f"engine {self.engine_index} has no method {name!r}", call_id=call.call_id)
            output.result = utility_result(None if method is None else method(*call.args))
        except Exception as e:  # vLLM answers every failure of the method to its caller; the engine goes on
            logger.warning("Engine %d: utility call %s failed: %s", self.engine_index, name, e)
            output.failure_message = f"Call to {name} method failed: {e}"
        self._send_utility_output(frontend, output)

    def _send_utility_output(self, frontend: _Frontend, output: UtilityOutput, *, droppable: bool = False) -> None:
        message = EngineCoreOutputs(engine_index=self.engine_index, utility_output=output, timestamp=time.time())
        self._send_to(frontend, encode_envelope(ENGINE_OUTPUTS, self._encoder.encode(message)), droppable=droppable)

    def _reply(self, frontend: _Frontend, replies: list[Reply]) -> None:
        for reply in replies:
            self._send_to(frontend, reply)

    def _send_to(self, frontend: _Frontend, frames: Sequence[Frame], *, droppable: bool = False) -> None:
        """Send on ``frontend``'s transport from any thread, never waiting for room; a frontend
        whose link broke gets nothing more (the engine loop drops it). On a full queue a
        ``droppable`` message is dropped and counted; any other breaks the link."""
        with frontend.send_lock:
            if frontend.broken is not None:
                return
            try:
                if frontend.transport.try_send(frames):
                    return
            except TransportError as e:
                self._mark_broken(frontend, e)
                return
            if not droppable:
                self._mark_broken(frontend, TransportError(
                    f"frontend {frontend.index} does not read what the engine sends (its queue is full)"))
                return
            frontend.messages_dropped += 1
            dropped = frontend.messages_dropped
        if _worth_logging(dropped):
            logger.warning("Engine %d: frontend %d does not read what the engine sends; dropped a refusal or "
                           "heartbeat (%d dropped for it so far).", self.engine_index, frontend.index, dropped)

    @staticmethod
    def _mark_broken(frontend: _Frontend, error: BaseException) -> None:
        if frontend.broken is None:
            frontend.broken = error

    def _drop_broken(self) -> None:
        """Forget each frontend whose link broke: close its transport and abort its requests (the
        engine loop's thread only, as it owns the routes)."""
        for frontend in self._frontends:
            if frontend.broken is None or frontend.dropped:
                continue
            frontend.dropped = True
            with frontend.send_lock:
                frontend.transport.close()
            orphans = [request_id for request_id, f in self._routes.items() if f is frontend]
            for request_id in orphans:
                del self._routes[request_id]
            self._aborted += orphans
            logger.warning("Engine %d: the link to frontend %d broke (%s); dropped it and its %d requests, "
                           "serving %d other frontends.", self.engine_index, frontend.index,
                           str(frontend.broken) or type(frontend.broken).__name__, len(orphans),
                           self.frontends_served)

    def _refuse(self, frontend: _Frontend, error: DecodeError | ResourceError) -> None:
        """Tell the sender what was wrong with its message; the others never notice."""
        self.decode_errors += 1
        if _worth_logging(self.decode_errors):
            logger.warning("Engine %d: refused a message from frontend %d (%d refused so far): %s",
                           self.engine_index, frontend.index, self.decode_errors, error)
        call_id = error.call_id if isinstance(error, UnknownUtilityError) else -1
        kind = "DecodeError" if isinstance(error, DecodeError) else type(error).__name__
        self._send_utility_output(frontend, UtilityOutput(call_id, failure_message=f"{kind}: {error}"), droppable=True)

    def _wait(self, seconds: float) -> list[EngineCoreRequest]:
        """Sleep until a message arrives (one frontend: in its ``recv``) or ``seconds`` pass."""
        live = [f for f in self._frontends if not f.dropped]
        if len(live) != 1:
            time.sleep(seconds)
            return []
        frontend = live[0]
        try:
            frames = frontend.transport.recv(seconds)
            return [] if frames is None else self._handle(frontend, frames)
        except (DecodeError, ResourceError) as e:
            self._refuse(frontend, e)
        except (EOFError, TransportError) as e:
            self._mark_broken(frontend, e)
            self._drop_broken()
        return []


def _worth_logging(count: int) -> bool:
    """Log the first ten refusals, then every thousandth: a hostile peer must not flood the log."""
    return count <= 10 or count % 1000 == 0


def mm_feature_limit(config: MultiModalConfig) -> int:
    """Most multimodal features a request may carry to an engine with ``config``: the sum of its
    ``limit_mm_per_prompt`` over the modalities (what P0 lets through with the same config)."""
    return max(1, sum(config.get_limit_per_prompt(modality) for modality in MODALITIES))


def serve_pipe(
    conn: Connection, config: MultiModalConfig, *, echo: bool = False, poll_interval_s: float = 0.05,
) -> None:
    """Run a P1 receiver over one end of a pipe until P0 closes the other end.

    The cache comes from ``config`` as in a real engine; ready requests are dropped (there is no
    model behind this loop), so run it with ``echo=True`` to see what the engine would get."""
    transport = PipeTransport(conn)
    receiver = EngineReceiver(engine_receiver_cache_from_config(config), echo=echo,
                              max_mm_features=mm_feature_limit(config))
    try:
        while True:
            try:
                frames = transport.recv(poll_interval_s)
                _, replies = receiver.poll() if frames is None else receiver.handle(frames)
            except DecodeError as e:  # a malformed message costs only itself
                logger.warning("serve_pipe: refused a message: %s", e)
                continue
            for reply in replies:
                transport.send(reply)
    except (EOFError, TransportError):
        return  # P0 closed its end
    finally:
        transport.close()


__all__ = [
    "DEFAULT_MAX_MM_FEATURES", "DEFAULT_ROUND_BUDGET", "EngineCoreReceiver", "EngineReceiver", "Reply", "mm_feature_limit",
    "serve_pipe",
]
