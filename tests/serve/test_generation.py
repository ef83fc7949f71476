"""Issue 34's hit path: a :class:`Generation` hands its streams' outputs over in arrival order, in
one batch of whatever arrived while its consumer was away, loses nothing when its consumer is
cancelled mid-wait, and its ``close`` aborts (cancels) only what is still reading."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from mmfront.serve.generation import Generation


async def outputs(items: list[Any], gate: asyncio.Event | None = None,
                  closed: list[str] | None = None) -> AsyncIterator[Any]:
    """An engine stream: ``items``, then (with ``gate``) it waits for the gate; records its close."""
    try:
        for item in items:
            yield item
        if gate is not None:
            await gate.wait()
    finally:
        if closed is not None:
            closed.append("closed")


def test_outputs_arrive_in_order_batched_by_what_arrived_meanwhile() -> None:
    async def run() -> list[list[tuple[int, Any]]]:
        gen = Generation([outputs(["a1", "a2"]), outputs(["b1"])], ["a", "b"])
        await asyncio.sleep(0.01)  # both streams read to their end while nobody consumed
        first = await gen.arrived()
        await gen.close()
        return [first]

    # each stream is read by its own task, whole here (its outputs need no wait), the first first
    assert asyncio.run(run()) == [[(0, "a1"), (0, "a2"), (0, None), (1, "b1"), (1, None)]]


def test_a_consumer_waits_for_the_next_output_and_a_cancelled_wait_loses_nothing() -> None:
    async def run() -> tuple[bool, list[tuple[int, Any]], list[str]]:
        gate = asyncio.Event()
        closed: list[str] = []
        gen = Generation([outputs([], gate, closed)], ["a"])
        waiting = asyncio.ensure_future(gen.arrived())
        await asyncio.sleep(0.01)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        gate.set()  # the stream ends while nobody waits
        await asyncio.sleep(0.01)
        later = await gen.arrived()
        await gen.close()
        return waiting.cancelled(), later, closed

    cancelled, later, closed = asyncio.run(run())
    assert cancelled
    assert later == [(0, None)]
    assert closed == ["closed"]


def test_closing_cancels_what_still_reads_and_a_finished_generation_closes_at_once() -> None:
    async def run() -> tuple[list[str], bool, bool]:
        closed: list[str] = []
        reading = Generation([outputs(["x"], asyncio.Event(), closed)], ["a"])
        await asyncio.sleep(0.01)
        await reading.close()
        finished = Generation([outputs(["y"])], ["b"])
        await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(finished.close())
        await asyncio.sleep(0)  # one turn: a close with nothing to wait for is over in it
        return closed, reading.tasks[0].cancelled(), closing.done()

    closed, cancelled, done_in_one_turn = asyncio.run(run())
    assert closed == ["closed"]
    assert cancelled
    assert done_in_one_turn
