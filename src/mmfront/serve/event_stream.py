"""Server-sent events as vLLM's OpenAI server writes them: one ``data:`` event per chunk, the
closing ``[DONE]``, and a keep-alive comment while a stream is quiet (``--sse-keep-alive-interval``).

The response is written by the request's own task. Starlette's ``StreamingResponse`` writes it
from a task of its own in an anyio task group while the request's task reads the connection for
a disconnect, per response; here one :class:`DisconnectWatch` per request reads the connection
from the moment the body is read to the stream's last chunk, and cancels the request's task if
the client leaves. The bytes on the wire are the same: the same head, one HTTP chunk per event."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mmfront.serve.responses import ENCODER

SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEP_ALIVE_COMMENT = b": keep-alive\n\n"


def sse_event(chunk: msgspec.Struct) -> bytes:
    return b"data: " + ENCODER.encode(chunk) + b"\n\n"


class DisconnectWatch:
    """Reads a request's ASGI messages after its body until the client leaves (the next message
    an ASGI server delivers then is ``http.disconnect``; uvicorn delivers it too once the
    response is complete, so the watch is disarmed before the last message is sent). While
    armed, the client leaving cancels the task that armed it; :meth:`took_cancel` tells that
    task's ``except CancelledError`` whether the cancel was the watch's."""

    def __init__(self, receive: Receive) -> None:
        self.left = False
        self._target: asyncio.Task[object] | None = None
        self._cancelled: asyncio.Task[object] | None = None
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left = True
        if self._target is not None:
            self._target.cancel()
            self._cancelled, self._target = self._target, None

    def arm(self) -> None:
        """The client leaving from now on cancels the current task."""
        self._target = asyncio.current_task()

    def disarm(self) -> None:
        self._target = None

    def took_cancel(self) -> bool:
        """Whether the current task's cancellation was the watch's alone: it is taken back
        (``uncancel``) and the task may go on; a cancel from elsewhere stays."""
        task = asyncio.current_task()
        if task is None or self._cancelled is not task:
            return False
        self._cancelled = None
        if sys.version_info >= (3, 11):  # a task counts its cancels from 3.11 on
            task.uncancel()
            return task.cancelling() == 0
        return True

    def close(self) -> None:
        self._target = None
        self._task.cancel()


class EventStreamResponse(Response):
    """The SSE response of a stream of chunks: the head ``StreamingResponse`` sends
    (``text/event-stream; charset=utf-8``, no length), one body message per chunk, then the
    empty last one. ``on_close`` runs afterwards, also for a client gone before the first chunk,
    when the chunk generator never starts (so its own cleanup never runs). ``watch``: the
    request's :class:`DisconnectWatch`, which the response then owns (a new one otherwise)."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]],
                 headers: dict[str, str] | None, keep_alive_s: float) -> None:
        self.body_iterator = chunks if keep_alive_s <= 0 else with_sse_keep_alive(chunks, keep_alive_s)
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.watch: DisconnectWatch | None = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = self.watch or DisconnectWatch(receive)
        watch.arm()
        try:
            if not watch.left:
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                async for chunk in self.body_iterator:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                watch.disarm()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watch.took_cancel():
                raise
        finally:
            watch.close()
            await self.on_close()


def event_stream_response(chunks: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]],
                          headers: dict[str, str] | None, keep_alive_s: float) -> EventStreamResponse:
    """The SSE response of ``chunks`` (:class:`EventStreamResponse`)."""
    return EventStreamResponse(chunks, on_close, headers, keep_alive_s)


async def with_sse_keep_alive(chunks: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    """vLLM's ``with_sse_keep_alive``: ``chunks``, with an SSE comment whenever none came for
    ``interval`` seconds. One pending ``anext`` is waited on, never cancelled mid-chunk."""
    pending = asyncio.ensure_future(anext(chunks))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield SSE_KEEP_ALIVE_COMMENT
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            yield chunk
            pending = asyncio.ensure_future(anext(chunks))
    finally:
        pending.cancel()
        with contextlib.suppress(BaseException):
            await pending
        with contextlib.suppress(BaseException):
            await chunks.aclose()  # type: ignore[attr-defined]


__all__ = ["SSE_DONE", "SSE_KEEP_ALIVE_COMMENT", "DisconnectWatch", "EventStreamResponse", "event_stream_response",
           "sse_event", "with_sse_keep_alive"]
