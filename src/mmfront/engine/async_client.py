"""The P0 client for serving code: ``await client.add_request(...)`` returns the request's
outputs as an async iterator; :class:`BlockingEngineClient` is the same for threads.

One reader thread takes everything the engine sends (admissions, cache-miss replies, outputs,
heartbeats) and hands each output to its request's stream on the stream's event loop; what the
P0/P1 mirror needs is done by :class:`~mmfront.engine.client.EngineClient` in its commit lane.
An engine that restarts is noticed by its new epoch (every engine greets with one and repeats it
as a heartbeat): what it had not answered is resent, what it was generating fails with
:class:`~mmfront.errors.EngineDeadError`; an engine silent for ``engine_timeout_s`` while requests
wait fails them all and marks the client :attr:`~AsyncEngineClient.errored` until the engine is
heard again. A stock vLLM engine sends no heartbeat (it is silent while a step runs): it is
declared dead only by ``ENGINE_CORE_DEAD`` or a dropped connection, never by silence. A request
is answered exactly once either way.

The caller's view is vLLM's ``AsyncLLM``: a stream whose consumer goes away (its task is
cancelled, the iterator is closed or garbage-collected before the last output) aborts the request
in the engine; a request that cannot fit the engine's ``max_model_len`` (the one context-length
rule, :func:`~mmfront.preprocess.context_length.get_max_tokens`) is refused with
:class:`~mmfront.errors.ValidationError` before anything is sent; engine methods
are called by name with :meth:`~AsyncEngineClient.call_utility` (vLLM's ``call_utility_async``)
and its named wrappers (``sleep``, ``wake_up``, ``reset_mm_cache``, ...).

Backpressure: sends run in the commit lane; a transport with a send high-water mark blocks
there, so a slow engine slows ``add_request`` and never loses a request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import secrets
import select
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mmfront.engine.client import EngineClient, EngineStep, RequestFailed, RequestOutput, UtilityReply
from mmfront.engine.handshake import EngineInfo
from mmfront.engine.transports import BaseTransport
from mmfront.errors import DecodeError, EngineDeadError, TransportError, UtilityCallError, ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import InputProcessor, PromptInput, RequestOptions
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import EXTRA_HEARTBEAT, EXTRA_MIRROR
from mmfront.wire.messages import UtilityCall, utility_value
from mmfront.wire.structs import EngineCoreOutput, UtilityOutput

logger = logging.getLogger(__name__)

_END = object()


@dataclass
class _Stream:
    """One request as its caller sees it: ``request_id`` is the caller's, ``engine_id`` the one
    the engine gets (see :meth:`AsyncEngineClient.add_request`)."""

    loop: asyncio.AbstractEventLoop
    request_id: str
    engine_id: str
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    abandoned: bool = False
    """Its consumer went away (the reader thread has yet to abort it): its id is free."""
    dropped: weakref.finalize | None = None
    """Aborts the request if its iterator is dropped before it ran to its end or was closed;
    detached when it did, so a stream that ended costs the reader no wake-up when it is collected."""


class _Bell:
    """Rings the reader thread awake from any thread: an ``eventfd`` in the transport's wake set.
    Ringing takes no lock (a garbage collection may ring, see ``AsyncEngineClient._forget``), so
    the descriptor is closed only with the bell itself, when no thread can ring it any more."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)

    def ring(self) -> None:
        os.eventfd_write(self.fd, 1)

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)


def exit_fd(process: EngineProcess) -> int | None:
    """A descriptor that becomes readable when ``process`` exits (Linux's ``pidfd``), or ``None``
    where there is none (another system, a process object without ``pid``): poll that one."""
    pid = getattr(process, "pid", None)
    if not isinstance(pid, int) or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def engine_request_id(request_id: str) -> str:
    """The id the engine gets for the caller's ``request_id``: vLLM's ``"{id}-{8 random
    characters}"``, new for every request, so that replies to an earlier request of the same id
    (aborted, abandoned) can never reach the new one."""
    return f"{request_id}-{secrets.token_hex(4)}"


@dataclass
class _Call:
    method: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    engine_index: int


class EngineProcess(Protocol):
    """A local engine process the client watches (``subprocess.Popen`` is one): ``poll`` returns
    its exit code once it has exited."""

    def poll(self) -> int | None: ...


StepObserver = Callable[[EngineStep, list[str]], None]
"""Called with each :class:`~mmfront.engine.client_events.EngineStep` and its outputs' request ids."""

FIRST_CALL_ID = 1 << 32
"""The client numbers its utility calls from here; the transport numbers mmfront's own utility
messages (``RESET_CACHE``, ``MIRROR_ONLY``) from 0, so an answer to one never resolves a call."""


class AsyncEngineClient:
    """vLLM's ``AsyncLLM``-side view of the engine link: one engine, or one per data-parallel rank
    (``engines``, from :meth:`~mmfront.engine.handshake.FrontendHandshake.wait`).

    An engine that dies fails the requests it had; the client is then :attr:`errored` (as vLLM's,
    new requests are refused) until that engine is heard again. Thread-safety: any number of
    tasks, on any number of event loops, may add and abort requests; the reader thread is the only
    one that receives. :meth:`close` (or ``async with``) stops the reader and closes the transport.
    """

    def __init__(
        self, processor: InputProcessor, transport: BaseTransport, *, engine_timeout_s: float = 30.0,
        poll_interval_s: float = 0.05, engines: Sequence[EngineInfo] = (),
    ) -> None:
        self.client = EngineClient(processor, transport, stream_outputs=True, engines=engines, step_events=True)
        self.transport = transport
        self.engine_timeout_s = engine_timeout_s
        self._poll_interval_s = poll_interval_s
        self._streams: dict[str, _Stream] = {}
        """Requests by the id the engine knows them by."""
        self._named: dict[str, _Stream] = {}
        """The same requests by the caller's id, while their stream is open."""
        self._calls: dict[int, _Call] = {}
        self._call_ids = itertools.count(FIRST_CALL_ID)
        self._abandoned: queue.SimpleQueue[_Stream] = queue.SimpleQueue()
        """Requests whose stream's consumer went away; the reader thread aborts them."""
        self._rejoined: queue.SimpleQueue[int] = queue.SimpleQueue()
        """Ranks restarted and met again through the handshake; the reader thread revives them."""
        self._dead: dict[int, EngineDeadError] = {}
        """The ranks known dead, and why; a rank is alive again once heard after its death."""
        self._died_at: dict[int, float] = {}
        self._processes: dict[int, EngineProcess] = {}
        self._exit_fds: dict[int, tuple[EngineProcess, int | None]] = {}
        """The reader's ``pidfd`` of each watched process still running, in the transport's wake
        set; ``None`` once it turned readable while ``poll`` had no exit status yet (another
        thread is reaping the process: ``Popen.poll`` says nothing while ``Popen.wait`` holds
        its lock), so the process is polled until it does."""
        self._bell = _Bell() if hasattr(os, "eventfd") else None
        self._checked = 0.0
        self._step_observers: list[StepObserver] = []
        self._health_observers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="mmfront-engine-reader", daemon=True)
        self._reader.start()

    @property
    def stats(self) -> Any:
        return self.client.stats

    @property
    def max_model_len(self) -> int | None:
        """The engine's context length, which requests are checked against (``None``: unchecked)."""
        return self.client.max_model_len

    @max_model_len.setter
    def max_model_len(self, value: int | None) -> None:
        self.client.max_model_len = value

    @property
    def errored(self) -> bool:
        """An engine is dead (vLLM's ``AsyncLLM.errored``): its link broke, its process exited, or
        it went silent while requests waited. Cleared when the restarted engine is heard again."""
        return bool(self._dead)

    @property
    def dead_error(self) -> EngineDeadError:
        """Why an engine is considered dead (vLLM's ``dead_error``)."""
        dead = dict(self._dead)
        return next(iter(dead.values())) if dead else EngineDeadError("The engine is dead.")

    async def check_health(self) -> None:
        """Raise :class:`~mmfront.errors.EngineDeadError` when :attr:`errored` (vLLM's ``check_health``)."""
        if self._dead:
            raise self.dead_error

    def watch_process(self, engine_index: int, process: EngineProcess) -> None:
        """Rank ``engine_index`` runs in ``process`` on this host: its exit is its death (vLLM's
        frontend watches its local engine processes the same way), noticed at once through its
        ``pidfd`` (:func:`exit_fd`) where the transport can wake the reader, else within a poll interval."""
        with self._lock:
            self._processes[engine_index] = process
        self._ring()

    def _ring(self) -> None:
        if self._bell is not None:
            self._bell.ring()

    def engine_rejoined(self, engine_index: int) -> None:
        """Rank ``engine_index`` was restarted and met this server again through the handshake
        (:class:`~mmfront.engine.handshake.RejoinListener`): it is alive, with an empty cache. A
        stock vLLM engine says nothing more until it is sent a request, so this is how it is heard;
        the dead ranks that died of the same news (a dropped connection names no rank) revive with it."""
        self._rejoined.put(engine_index)
        self._ring()

    def add_step_observer(self, observer: StepObserver) -> None:
        """Call ``observer(step, request_ids)`` on the reader thread for every message of outputs,
        before its outputs reach their streams (vLLM's output handler records its statistics
        first too); ``request_ids[i]`` is the caller's id of ``step.outputs[i]``."""
        with self._lock:
            self._step_observers.append(observer)

    def add_health_observer(self, observer: Callable[[], None]) -> None:
        """Call ``observer()`` on the reader thread whenever :attr:`errored` may have changed (a
        rank died or was heard again): how a watchdog waits for a death without polling."""
        with self._lock:
            self._health_observers.append(observer)

    def _health_changed(self) -> None:
        with self._lock:
            observers = list(self._health_observers)
        for observer in observers:
            observer()

    async def add_request(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> AsyncGenerator[EngineCoreOutput, None]:
        """Prepare and send one request; its outputs, in order, as they come (each output's
        ``request_id`` is ``request_id``). Errors in the request raise here; an engine failure
        raises from the iterator. Closing the iterator (or dropping it, or cancelling the task
        that reads it) before its last output aborts the request in the engine.

        The engine knows the request by :func:`engine_request_id` (as vLLM's ``AsyncLLM`` makes
        its ids unique), so ``request_id`` may be used again as soon as its stream is over."""
        if self._closed.is_set():
            raise TransportError("The client is closed; create a new one.")
        if self._dead:
            raise self.dead_error
        stream = _Stream(asyncio.get_running_loop(), request_id, engine_request_id(request_id))
        with self._lock:
            named = self._named.get(request_id)
            if named is not None and not named.abandoned:
                raise ValidationError(f"Request {request_id!r} is already running; use a new request id.",
                                      parameter="request_id")
            self._named[request_id] = stream
            self._streams[stream.engine_id] = stream
        try:
            await self.client.add_request_async(stream.engine_id, prompt, params, options=options, **kwargs)
        except BaseException:
            self._unlink(stream)
            raise
        iterator = self._iterate(stream)
        # an iterator dropped without being closed, even one never iterated, aborts its request too
        stream.dropped = weakref.finalize(iterator, self._forget, stream, abort=True)
        stream.dropped.atexit = False
        return iterator

    def rank_of(self, request_id: str) -> int | None:
        """The data-parallel rank running ``request_id`` (``None`` once it is over)."""
        with self._lock:
            stream = self._named.get(request_id)
        return None if stream is None else self.client.rank_of(stream.engine_id)

    async def call_utility(self, method: str, *args: Any, engine_index: int | None = None) -> Any:
        """Run the engine's method ``method`` with ``args`` and return its result (vLLM's
        ``call_utility_async``). With several ranks it runs on every one (``engine_index``: on
        that one only) and rank 0's result is returned, as vLLM's data-parallel client does. A
        failure in an engine raises :class:`~mmfront.errors.UtilityCallError` with the engine's
        message; a dead engine, :class:`~mmfront.errors.EngineDeadError` (at once when it is known
        dead)."""
        if self._closed.is_set():
            raise TransportError("The client is closed; create a new one.")
        if self._dead:
            raise self.dead_error
        ranks = range(len(self.client.ranks)) if engine_index is None else [engine_index]
        results = await asyncio.gather(*(self._call_one(method, args, i) for i in ranks))
        return results[0]

    async def _call_one(self, method: str, args: tuple[Any, ...], engine_index: int) -> Any:
        loop = asyncio.get_running_loop()
        call = UtilityCall(next(self._call_ids), method, args)
        pending = _Call(method, loop, loop.create_future(), engine_index)
        with self._lock:
            self._calls[call.call_id] = pending
        try:
            try:
                await loop.run_in_executor(None, self.client.call_utility, call, engine_index)
            except EngineDeadError:
                raise
            except TransportError as e:
                raise EngineDeadError(f"Engine {engine_index} cannot be reached ({e}).") from e
            return await pending.future
        finally:
            with self._lock:
                self._calls.pop(call.call_id, None)

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return tuple(await self.call_utility("get_supported_tasks"))

    async def is_sleeping(self) -> bool:
        return bool(await self.call_utility("is_sleeping"))

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Put the engine to sleep (vLLM's ``sleep``); from level 1 the P0 caches are cleared too,
        as the engine clears its own."""
        if level >= 1:
            await asyncio.get_running_loop().run_in_executor(None, self.client.clear_cache)
        await self.call_utility("sleep", level, mode)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Wake the engine (``tags``: only those parts); True when it is fully awake."""
        return bool(await self.call_utility("wake_up", tags))

    async def reset_mm_cache(self) -> None:
        """Clear the multimodal caches on both sides (vLLM's ``reset_mm_cache``)."""
        await asyncio.get_running_loop().run_in_executor(None, self.client.clear_cache)
        await self.call_utility("reset_mm_cache")

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return bool(await self.call_utility("reset_prefix_cache", reset_running_requests, reset_connector))

    async def reset_encoder_cache(self) -> None:
        await self.call_utility("reset_encoder_cache")

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id``: the engine is told, and its stream ends (even when telling the
        engine fails with :class:`~mmfront.errors.TransportError`: an engine that is away)."""
        with self._lock:
            stream = self._named.get(request_id)
        if stream is None:
            return
        self._unlink(stream)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.client.abort_request, stream.engine_id)
        finally:
            self._deliver(stream, _END)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close_blocking)

    def close_blocking(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._ring()
        self._reader.join(5)
        for stream in list(self._streams.values()):
            self._deliver(stream, TransportError("The client was closed before the request finished."))
        self._fail_calls(TransportError("The client was closed before the engine answered."))
        self.transport.close()

    async def __aenter__(self) -> AsyncEngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _iterate(self, stream: _Stream) -> AsyncGenerator[EngineCoreOutput, None]:
        done = False
        try:
            while True:
                item = await stream.queue.get()
                done = item is _END or isinstance(item, BaseException) or item.finish_reason is not None
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if done:
                    return
        finally:
            if not done:  # the caller's id is free at once; the reader aborts the request in the engine
                with self._lock:
                    if self._named.get(stream.request_id) is stream:
                        del self._named[stream.request_id]
            if stream.dropped is not None:
                stream.dropped.detach()
            self._forget(stream, abort=not done)

    def _forget(self, stream: _Stream, *, abort: bool) -> None:
        """``stream`` is over for its consumer. ``abort``: it went away before the end; the reader
        thread aborts the request in the engine, unless it ended meanwhile. Takes no lock, so a
        garbage collection may call it anywhere (``weakref.finalize``)."""
        if abort:
            stream.abandoned = True  # a dropped stream's id is free at once, as a closed one's
            self._abandoned.put(stream)
            self._ring()
        else:
            self._unlink(stream)

    def _unlink(self, stream: _Stream) -> bool:
        """Stop routing to ``stream``; whether it was still routed (its request not yet over)."""
        with self._lock:
            if self._named.get(stream.request_id) is stream:
                del self._named[stream.request_id]
            return self._streams.pop(stream.engine_id, None) is not None

    # --- the reader thread ------------------------------------------------------------------------

    def _read(self) -> None:
        """The reader's loop. Where the transport can wake it (:meth:`BaseTransport.wake_on`), an
        idle reader sleeps until a message, the bell (an abandoned stream, a rejoined rank, a
        process to watch, the close) or a watched process's exit; it polls every
        ``poll_interval_s`` only while that cannot be enough: a rank is dead (it revives when
        heard), a rank sends heartbeats (its silence is timed), or a process has no ``pidfd``.
        An idle server then takes no CPU (it woke 20 times a second, 3.5 ms of CPU a second)."""
        bell = self._bell
        wakes = bell is not None and self.transport.wake_on(bell.fd)
        try:
            while not self._closed.is_set():
                self._abort_abandoned()
                self._revive_rejoined()
                try:
                    frames = self.transport.recv(self._recv_timeout(wakes))
                except DecodeError as e:
                    logger.warning("Dropped a malformed message from the engine: %s", e)
                    continue
                except EngineDeadError as e:  # a stock engine's ENGINE_CORE_DEAD, or the socket monitor
                    self._engine_died(e)
                    continue
                except (EOFError, TransportError) as e:
                    self._engine_died(EngineDeadError(f"The engine link broke ({e})."))
                    return
                if frames is not None:
                    try:
                        self._dispatch(self.client.handle_reply(frames))
                    except DecodeError as e:
                        logger.warning("Dropped a malformed message from the engine: %s", e)
                if frames is None and bell is not None:
                    bell.clear()  # what rang it is handled next, from the top of the loop
                if frames is None or time.monotonic() - self._checked >= self._poll_interval_s:
                    self._check_ranks()
                    if wakes:
                        self._watch_exits()
        finally:
            for index in list(self._exit_fds):
                self._forget_exit_fd(index)

    def _recv_timeout(self, wakes: bool) -> float | None:
        if (wakes and not self._died_at and len(self._exit_fds) == len(self._processes)
                and all(fd is not None for _, fd in self._exit_fds.values())
                and not any(EXTRA_HEARTBEAT in rank.extras for rank in self.client.ranks)):
            return None
        return self._poll_interval_s

    def _watch_exits(self) -> None:
        """One ``pidfd`` in the transport's wake set per watched process still running; the fd
        of a process that exited (its death is reported by :meth:`_check_ranks`, which ran first)
        or was replaced leaves the set, as it would stay readable."""
        with self._lock:
            processes = dict(self._processes)
        for index, (process, fd) in list(self._exit_fds.items()):
            if processes.get(index) is not process or process.poll() is not None:
                self._forget_exit_fd(index)
            elif fd is not None and select.select([fd], [], [], 0)[0]:
                self._forget_exit_fd(index, keep=True)
        for index, process in processes.items():
            if index in self._exit_fds or process.poll() is not None:
                continue
            exits = exit_fd(process)
            if exits is None:
                continue
            if not self.transport.wake_on(exits):
                os.close(exits)
                continue
            self._exit_fds[index] = (process, exits)

    def _forget_exit_fd(self, index: int, *, keep: bool = False) -> None:
        """Close rank ``index``'s ``pidfd``; ``keep``: its process stays in :attr:`_exit_fds`
        without one (it exited; polled until its status comes)."""
        process, fd = self._exit_fds.pop(index)
        if fd is not None:
            self.transport.stop_waking_on(fd)
            os.close(fd)
        if keep:
            self._exit_fds[index] = (process, None)

    def _check_ranks(self) -> None:
        """Revive ranks heard since they died; declare dead the ranks whose process exited or that
        announced heartbeats and went silent for ``engine_timeout_s`` while owing an answer."""
        now = self._checked = time.monotonic()
        for rank in self.client.ranks:
            died = self._died_at.get(rank.index)
            if died is not None:
                if rank.last_heard > died:
                    self._dead.pop(rank.index, None)
                    del self._died_at[rank.index]
                    self._health_changed()
                continue
            process = self._processes.get(rank.index)
            code = None if process is None else process.poll()
            if code is not None:
                self._engine_died(EngineDeadError(
                    f"Engine {rank.index}'s process exited (code {code}); its log says why. Restart it, then "
                    "send the requests again."), rank.index)
            elif (EXTRA_HEARTBEAT in rank.extras and now - rank.last_heard > self.engine_timeout_s
                    and self._waiting(rank.index)):
                self._engine_died(EngineDeadError(
                    f"Engine {rank.index} sent nothing for {self.engine_timeout_s:.0f} s (no heartbeat): it is gone. "
                    "Restart it, then send the requests again."), rank.index)

    def _waiting(self, engine_index: int) -> bool:
        with self._lock:
            calls = any(call.engine_index == engine_index for call in self._calls.values())
        return calls or self.client.has_work(engine_index)

    def _engine_died(self, error: EngineDeadError, engine_index: int | None = None) -> None:
        """Rank ``engine_index`` (``None``: every rank, when the link cannot say which) is dead:
        fail what it owes."""
        now = time.monotonic()
        for rank in self.client.ranks:
            if engine_index is None or rank.index == engine_index:
                self._dead[rank.index] = error
                self._died_at[rank.index] = now
        self._dispatch(self.client.fail_all(error, engine_index))
        self._fail_calls(error, engine_index)
        self._health_changed()

    def _revive_rejoined(self) -> None:
        while not self._rejoined.empty():
            index = self._rejoined.get_nowait()
            if not 0 <= index < len(self.client.ranks):
                continue
            if EXTRA_MIRROR not in self.client.ranks[index].extras:  # an mmfront engine's greeting resets its own
                self._dispatch(self.client.engine_restarted(index))
            error = self._dead.get(index)
            for rank in [r for r, why in self._dead.items() if r == index or why is error]:
                del self._dead[rank]
                self._died_at.pop(rank, None)
            self._health_changed()

    def _abort_abandoned(self) -> None:
        while not self._abandoned.empty():
            stream = self._abandoned.get_nowait()
            if not self._unlink(stream):
                continue  # it ended first (answered, failed or aborted)
            try:
                self.client.abort_request(stream.engine_id)
            except TransportError as e:
                logger.warning("Could not abort %r, whose consumer went away: %s", stream.request_id, e)

    def _dispatch(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, RequestOutput):
                self._put(event.request_id, event.output)
            elif isinstance(event, RequestFailed):
                self._put(event.request_id, event.error)
            elif isinstance(event, UtilityReply):
                self._answer(event.output)
            elif isinstance(event, EngineStep):
                self._observe(event)

    def _observe(self, step: EngineStep) -> None:
        with self._lock:
            observers = list(self._step_observers)
            if not observers:
                return
            streams = [self._streams.get(output.request_id) for output in step.outputs]
        ours = EngineStep(step.engine_index, step.timestamp, step.scheduler_stats,
                          [output for output, stream in zip(step.outputs, streams) if stream is not None],
                          step.weight_version)
        ids = [stream.request_id for stream in streams if stream is not None]
        for observer in observers:
            try:
                observer(ours, ids)
            except Exception:  # statistics never stop the outputs
                logger.exception("A step observer failed")

    def _answer(self, output: UtilityOutput) -> None:
        with self._lock:
            call = self._calls.pop(output.call_id, None)
        if call is None:
            return  # not ours (an answer to mmfront's own utility message), or its caller gave up
        result: Any = None
        error: BaseException | None = None
        if output.failure_message is not None:
            error = UtilityCallError(output.failure_message, method=call.method)
        else:
            try:
                result = utility_value(output.result)
            except DecodeError as e:
                error = e
        self._settle(call, result, error)

    def _fail_calls(self, error: BaseException, engine_index: int | None = None) -> None:
        with self._lock:
            failed = {call_id: call for call_id, call in self._calls.items()
                      if engine_index is None or call.engine_index == engine_index}
            for call_id in failed:
                del self._calls[call_id]
        for call in failed.values():
            self._settle(call, None, error)

    @staticmethod
    def _settle(call: _Call, result: Any, error: BaseException | None) -> None:
        def settle() -> None:
            if call.future.done():
                return  # its caller was cancelled
            if error is not None:
                call.future.set_exception(error)
            else:
                call.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits any more
            call.loop.call_soon_threadsafe(settle)

    def _put(self, engine_id: str, item: Any) -> None:
        with self._lock:
            stream = self._streams.get(engine_id)
        if stream is not None:
            if isinstance(item, EngineCoreOutput):
                item.request_id = stream.request_id
            self._deliver(stream, item)

    def _deliver(self, stream: _Stream, item: Any) -> None:
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody listens any more, so it is aborted
            self._forget(stream, abort=True)


class BlockingEngineClient:
    """:class:`AsyncEngineClient` for threaded code: ``add_request`` returns a plain iterator.

    It runs its own event loop on a background thread; any number of threads may call it."""

    def __init__(self, processor: InputProcessor, transport: BaseTransport, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mmfront-client-loop", daemon=True)
        self._thread.start()
        self.client = self._call(self._make(processor, transport, kwargs))

    async def _make(self, processor: InputProcessor, transport: BaseTransport, kwargs: dict[str, Any]) -> AsyncEngineClient:
        return AsyncEngineClient(processor, transport, **kwargs)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def add_request(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None,
        **kwargs: Any,
    ) -> Iterator[EngineCoreOutput]:
        stream = self._call(self.client.add_request(request_id, prompt, params, **kwargs))
        return self._iterate(stream)

    def _iterate(self, stream: AsyncGenerator[EngineCoreOutput, None]) -> Iterator[EngineCoreOutput]:
        try:
            while True:
                future: concurrent.futures.Future[EngineCoreOutput] = asyncio.run_coroutine_threadsafe(
                    anext(stream), self._loop)
                try:
                    output = future.result()
                except StopAsyncIteration:
                    return
                yield output
        finally:  # closing this iterator closes the stream: the request is aborted if it still runs
            if self._loop.is_running():
                asyncio.run_coroutine_threadsafe(stream.aclose(), self._loop).result()

    def abort(self, request_id: str) -> None:
        self._call(self.client.abort(request_id))

    def call_utility(self, method: str, *args: Any) -> Any:
        """:meth:`AsyncEngineClient.call_utility`, blocking."""
        return self._call(self.client.call_utility(method, *args))

    def get_supported_tasks(self) -> tuple[str, ...]:
        result: tuple[str, ...] = self._call(self.client.get_supported_tasks())
        return result

    def is_sleeping(self) -> bool:
        return bool(self._call(self.client.is_sleeping()))

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self._call(self.client.sleep(level, mode))

    def wake_up(self, tags: list[str] | None = None) -> bool:
        return bool(self._call(self.client.wake_up(tags)))

    def reset_mm_cache(self) -> None:
        self._call(self.client.reset_mm_cache())

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return bool(self._call(self.client.reset_prefix_cache(reset_running_requests, reset_connector)))

    def reset_encoder_cache(self) -> None:
        self._call(self.client.reset_encoder_cache())

    @property
    def errored(self) -> bool:
        return self.client.errored

    def check_health(self) -> None:
        self._call(self.client.check_health())

    def close(self) -> None:
        self.client.close_blocking()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> BlockingEngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FIRST_CALL_ID", "AsyncEngineClient", "BlockingEngineClient", "StepObserver", "engine_request_id", "exit_fd"]
