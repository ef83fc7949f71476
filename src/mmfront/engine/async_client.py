"""The P0 client for serving code: ``await client.add_request(...)`` returns the request's
outputs as an async iterator; :class:`BlockingEngineClient` is the same for threads.

One reader thread takes everything the engine sends (admissions, cache-miss replies, outputs,
heartbeats) and hands each output to its request's stream on the stream's event loop; what the
P0/P1 mirror needs is done by :class:`~mmfront.engine.client.EngineClient` in its commit lane.
An engine that restarts is noticed by its new epoch (every engine greets with one and repeats it
as a heartbeat): what it had not answered is resent, what it was generating fails with
:class:`~mmfront.errors.EngineDeadError`; an engine silent for ``engine_timeout_s`` while requests
wait fails them all. A stock vLLM engine sends no heartbeat (it is silent while a step runs):
it is declared dead only by ``ENGINE_CORE_DEAD`` or a dropped connection, never by silence.
A request is answered exactly once either way.

Backpressure: sends run in the commit lane; a transport with a send high-water mark blocks
there, so a slow engine slows ``add_request`` and never loses a request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from mmfront.engine.client import EngineClient, RequestFailed, RequestOutput
from mmfront.engine.handshake import EngineInfo
from mmfront.engine.transports import BaseTransport
from mmfront.errors import DecodeError, EngineDeadError, MMFrontError, TransportError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import InputProcessor, PromptInput, RequestOptions
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import EXTRA_HEARTBEAT
from mmfront.wire.structs import EngineCoreOutput

logger = logging.getLogger(__name__)

_END = object()


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)


class AsyncEngineClient:
    """vLLM's ``AsyncLLM``-side view of the engine link, for one engine.

    Thread-safety: any number of tasks, on any number of event loops, may add and abort
    requests; the reader thread is the only one that receives. :meth:`close` (or ``async with``)
    stops the reader and closes the transport.
    """

    def __init__(
        self, processor: InputProcessor, transport: BaseTransport, *, engine_timeout_s: float = 30.0,
        poll_interval_s: float = 0.05, engine: EngineInfo | None = None,
    ) -> None:
        self.client = EngineClient(processor, transport, stream_outputs=True, engine=engine)
        self.transport = transport
        self.engine_timeout_s = engine_timeout_s
        self._poll_interval_s = poll_interval_s
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._last_heard = time.monotonic()
        self._reader = threading.Thread(target=self._read, name="mmfront-engine-reader", daemon=True)
        self._reader.start()

    @property
    def stats(self) -> Any:
        return self.client.stats

    async def add_request(
        self, request_id: str, prompt: PromptInput | MultiModalInputs, params: SamplingParams | None = None, *,
        options: RequestOptions | None = None, **kwargs: Any,
    ) -> AsyncIterator[EngineCoreOutput]:
        """Prepare and send one request; its outputs, in order, as they come. Errors in the
        request raise here; an engine failure raises from the iterator."""
        if self._closed.is_set():
            raise TransportError("The client is closed; create a new one.")
        stream = _Stream(asyncio.get_running_loop())
        with self._lock:
            if request_id in self._streams:
                raise MMFrontError(f"Request {request_id!r} is already running; use a new request id.")
            self._streams[request_id] = stream
        try:
            await self.client.add_request_async(request_id, prompt, params, options=options, **kwargs)
        except BaseException:
            with self._lock:
                self._streams.pop(request_id, None)
            raise
        return self._iterate(request_id, stream)

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id``: the engine is told, and its stream ends (even when telling the
        engine fails with :class:`~mmfront.errors.TransportError`: an engine that is away)."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.client.abort_request, request_id)
        finally:
            self._end(request_id, _END)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close_blocking)

    def close_blocking(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._reader.join(5)
        for request_id in list(self._streams):
            self._end(request_id, TransportError("The client was closed before the request finished."))
        self.transport.close()

    async def __aenter__(self) -> AsyncEngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _iterate(self, request_id: str, stream: _Stream) -> AsyncIterator[EngineCoreOutput]:
        try:
            while True:
                item = await stream.queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            with self._lock:
                self._streams.pop(request_id, None)

    # --- the reader thread ------------------------------------------------------------------------

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                frames = self.transport.recv(self._poll_interval_s)
            except DecodeError as e:
                logger.warning("Dropped a malformed message from the engine: %s", e)
                continue
            except (EOFError, TransportError) as e:
                self._dispatch(self.client.fail_all(EngineDeadError(f"The engine link broke ({e}).")))
                return
            if frames is None:
                if (EXTRA_HEARTBEAT in self.client.extras and self._waiting()
                        and time.monotonic() - self._last_heard > self.engine_timeout_s):
                    self._dispatch(self.client.fail_all(EngineDeadError(
                        f"The engine sent nothing for {self.engine_timeout_s:.0f} s (no heartbeat): it is gone. "
                        "Restart it, then send the requests again.")))
                    self._last_heard = time.monotonic()
                continue
            self._last_heard = time.monotonic()
            try:
                self._dispatch(self.client.handle_reply(frames))
            except DecodeError as e:
                logger.warning("Dropped a malformed message from the engine: %s", e)

    def _waiting(self) -> bool:
        return bool(self.client.in_flight or self.client.running)

    def _dispatch(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, RequestOutput):
                self._put(event.request_id, event.output)
            elif isinstance(event, RequestFailed):
                self._end(event.request_id, event.error)

    def _put(self, request_id: str, item: Any) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is not None:
            try:
                stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody listens any more
                with self._lock:
                    self._streams.pop(request_id, None)

    def _end(self, request_id: str, item: Any) -> None:
        self._put(request_id, item)


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

    def _iterate(self, stream: AsyncIterator[EngineCoreOutput]) -> Iterator[EngineCoreOutput]:
        while True:
            future: concurrent.futures.Future[EngineCoreOutput] = asyncio.run_coroutine_threadsafe(
                anext(stream), self._loop)  # type: ignore[arg-type]
            try:
                yield future.result()
            except StopAsyncIteration:
                return

    def abort(self, request_id: str) -> None:
        self._call(self.client.abort(request_id))

    def close(self) -> None:
        self.client.close_blocking()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> BlockingEngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AsyncEngineClient", "BlockingEngineClient"]
