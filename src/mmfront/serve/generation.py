"""The engine streams of one HTTP request (its ``n`` choices, or its beam searches), read in
arrival order: each stream by a task of its own into one list (:meth:`Generation.arrived`), so
outputs that arrive while a chunk is written wait there and the next chunk merges them (vLLM's
output collector). Closing the generation cancels those tasks, and a cancelled stream aborts its
request in the engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from enum import Enum
from typing import Any

from mmfront.serve.iteration_stats import RequestTimings
from mmfront.serve.output import WholeOutput
from mmfront.serve.weight_versions import WeightVersionSpan
from mmfront.wire.structs import EngineCoreOutput


class Unanswered(Enum):
    CHOICE = "a beam search found fewer beams than it was asked for"


QueueItem = EngineCoreOutput | WholeOutput | BaseException | Unanswered | None


class Generation:
    """The engine streams of one HTTP request, each read by its own task into one list
    (``request_ids``: each stream's request), or its beam searches (:meth:`searching`)."""

    def __init__(self, streams: list[AsyncIterator[EngineCoreOutput]], request_ids: list[str]) -> None:
        self.request_ids = request_ids
        self.timings: dict[int, RequestTimings] = {}
        """Each finished choice's timings, where kept (``--enable-per-request-metrics``)."""
        self.weight_versions: dict[int, list[WeightVersionSpan] | None] = {}
        """Each finished choice's weight-version spans (``return_weight_versions``)."""
        self._arrived: list[tuple[int, QueueItem]] = []
        self._waiter: asyncio.Future[None] | None = None
        self.tasks = [asyncio.create_task(self._pump(i, s)) for i, s in enumerate(streams)]

    @classmethod
    def searching(cls, searches: list[Coroutine[Any, Any, list[WholeOutput]]], width: int,
                  request_ids: list[str]) -> Generation:
        """One beam search per prompt, each answering choices ``width * p`` on at once when it ends."""
        gen = cls([], request_ids)
        gen.tasks = [asyncio.create_task(gen._search(p * width, width, search)) for p, search in enumerate(searches)]
        return gen

    async def _search(self, first: int, width: int, search: Coroutine[Any, Any, list[WholeOutput]]) -> None:
        try:
            found = await search
        except Exception as e:
            self._put(first, e)
            return
        for k in range(width):
            self._put(first + k, found[k] if k < len(found) else Unanswered.CHOICE)

    async def _pump(self, index: int, stream: AsyncIterator[EngineCoreOutput]) -> None:
        try:
            async for output in stream:
                self._put(index, output)
        except Exception as e:
            self._put(index, e)
            return
        self._put(index, None)

    def _put(self, index: int, item: QueueItem) -> None:
        self._arrived.append((index, item))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def arrived(self) -> list[tuple[int, QueueItem]]:
        """Every ``(choice, item)`` that arrived since the last call, in arrival order; waits for
        one where none has. A list and one future rather than an ``asyncio.Queue``, whose put and
        get (and the emptiness checks between) ran ~10 Python calls per engine output on the
        event loop; a consumer cancelled while it waits loses nothing (what arrives stays)."""
        while not self._arrived:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch, self._arrived = self._arrived, []
        return batch

    def stop(self, index: int) -> None:
        """Stop reading choice ``index``: its engine request is aborted."""
        self.tasks[index].cancel()

    async def close(self) -> None:
        """Cancel the tasks still reading and wait for them (their streams abort their requests).
        Tasks already over are not waited on: a stream read to its end (every finished response,
        which closes its generation twice) has nothing to wait for, and a gather would cost a
        future and a turn of the event loop."""
        running = [task for task in self.tasks if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


__all__ = ["Generation", "QueueItem", "Unanswered"]
