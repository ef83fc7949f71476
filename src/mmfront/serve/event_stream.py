"""Server-sent events as vLLM's OpenAI server writes them: one ``data:`` event per chunk, the
closing ``[DONE]``, and a keep-alive comment while a stream is quiet (``--sse-keep-alive-interval``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from mmfront.serve.responses import ENCODER

SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEP_ALIVE_COMMENT = b": keep-alive\n\n"


def sse_event(chunk: msgspec.Struct) -> bytes:
    return b"data: " + ENCODER.encode(chunk) + b"\n\n"


def event_stream_response(chunks: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]],
                          headers: dict[str, str] | None, keep_alive_s: float) -> StreamingResponse:
    """The SSE response; ``on_close`` runs afterwards, which also covers a client gone before the
    first chunk, when the chunk generator never starts (so its own cleanup never runs)."""
    body = chunks if keep_alive_s <= 0 else with_sse_keep_alive(chunks, keep_alive_s)
    return StreamingResponse(body, media_type="text/event-stream", headers=headers,
                             background=BackgroundTask(on_close))


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


__all__ = ["SSE_DONE", "SSE_KEEP_ALIVE_COMMENT", "event_stream_response", "sse_event", "with_sse_keep_alive"]
