"""Data-parallel ranks behind one client: the handshake meets every rank, each request goes to
the rank with the fewest outstanding and stays there (its aborts, resends and replies), every
rank keeps its own P0 mirror (so references never reach a rank that lacks the item), utility
calls reach every rank or the one named, and a rank that dies fails only what it owed.

The ranks here speak vLLM's protocol only (tests/engine/stock_like.py, as a stock engine core
does); tests/engine/test_stock_engine.py runs two real stock vLLM ranks and
tests/engine/test_worker_handshake.py two ``mmfront worker`` ranks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stock_like import Ranks, engine_in_thread, start_stock_like

from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.client import EngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake
from mmfront.engine.transports import PipeTransport
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.errors import ConfigError, EngineDeadError, HandshakeError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams

IMAGES = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(5)]


@pytest.fixture(params=[False, True], ids=["headless", "local"])
def ranks(gemma3_dir: Path, request: pytest.FixtureRequest) -> Iterator[Ranks]:
    running = start_stock_like(gemma3_dir, 2, local=request.param)
    yield running
    for engine in running.engines:
        engine.close()
    running.client.close_blocking()


def chat(images: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": IMAGES[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}]


async def answer(client: AsyncEngineClient, request_id: str, images: tuple[int, ...]) -> list[int]:
    stream = await client.add_request(request_id, chat(images), SamplingParams(max_tokens=2))
    return [t async for output in stream for t in output.new_token_ids]


def test_the_handshake_meets_every_rank_and_the_client_gets_one_mirror_per_rank(ranks: Ranks) -> None:
    assert [info.engine_index for info in ranks.infos] == [0, 1]
    assert all(info.extras == frozenset() for info in ranks.infos)
    client = ranks.client.client
    assert [rank.index for rank in client.ranks] == [0, 1]
    zero, one = (rank.processor.cache for rank in client.ranks)
    assert zero is ranks.pre.cache and one is not None and one is not zero
    assert zero.mirror.epoch != one.mirror.epoch


def test_twenty_concurrent_chats_with_repeated_images_spread_over_both_ranks_and_never_miss(ranks: Ranks) -> None:
    combos = [(i % 5,) if i % 3 else (i % 5, (i + 2) % 5) for i in range(20)]

    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(answer(ranks.client, f"r{i}", c) for i, c in enumerate(combos))))

    assert asyncio.run(asyncio.wait_for(main(), 60)) == [[1000 + 10 * len(c), 1001 + 10 * len(c)] for c in combos]
    sent = [rank.sent for rank in ranks.client.client.ranks]
    assert sum(sent) == 20 and min(sent) >= 5, sent
    assert [len(engine.seen) for engine in ranks.engines] == sent
    # references went out, and only to the rank that had been sent the data: no miss anywhere
    assert any(f.data is None for engine in ranks.engines for r in engine.seen for f in r.mm_features or [])
    assert ranks.client.stats.resends == 0 and ranks.client.stats.saved_bytes > 0
    assert all(rank.outstanding == 0 for rank in ranks.client.client.ranks)


def test_requests_go_to_the_rank_with_the_fewest_outstanding(ranks: Ranks) -> None:
    for engine in ranks.engines:
        engine.stall_s = 1.0
    ranks.engines[0].stall_s = 3.0  # rank 0 keeps its requests longest

    async def main() -> list[int | None]:
        streams = [await ranks.client.add_request(f"b{i}", chat((i % 5,)), SamplingParams(max_tokens=2))
                   for i in range(4)]
        placed = [ranks.client.client.rank_of(f"b{i}") for i in range(4)]
        assert [rank.outstanding for rank in ranks.client.client.ranks] == [2, 2]
        await asyncio.gather(*(anext(s) for s in streams[1::2]))  # rank 1 answers first
        late = await ranks.client.add_request("late", chat((0,)), SamplingParams(max_tokens=2))
        placed.append(ranks.client.client.rank_of("late"))
        for stream in [*streams, late]:
            async for _ in stream:
                pass
        return placed

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1, 0, 1, 1]


def test_an_abort_goes_to_the_rank_that_runs_the_request(ranks: Ranks) -> None:
    for engine in ranks.engines:
        engine.stall_s = 2.0

    async def main() -> None:
        first = await ranks.client.add_request("on-0", chat((0,)), SamplingParams(max_tokens=2))
        second = await ranks.client.add_request("on-1", chat((1,)), SamplingParams(max_tokens=2))
        assert ranks.client.client.rank_of("on-1") == 1
        await ranks.client.abort("on-1")
        assert [t async for output in first for t in output.new_token_ids] == [1010, 1011]
        assert [output async for output in second] == []

    asyncio.run(asyncio.wait_for(main(), 30))
    deadline = time.monotonic() + 10
    while not ranks.engines[1].aborted and time.monotonic() < deadline:  # rank 1 reads it after its stall
        time.sleep(0.05)
    assert ranks.engines[1].aborted == ["on-1"] and ranks.engines[0].aborted == []


def test_utility_calls_reach_every_rank_or_the_one_named(ranks: Ranks) -> None:
    async def main() -> tuple[Any, Any]:
        return (await ranks.client.call_utility("get_supported_tasks"),
                await ranks.client.call_utility("is_sleeping", engine_index=1))

    every, one = asyncio.run(asyncio.wait_for(main(), 30))
    assert every == [0, "get_supported_tasks"]  # rank 0's answer, as vLLM's data-parallel client returns
    assert one == [1, "is_sleeping"]
    assert ranks.engines[0].calls == ["get_supported_tasks"]
    assert ranks.engines[1].calls == ["get_supported_tasks", "is_sleeping"]


def test_reset_mm_cache_clears_every_ranks_mirror(ranks: Ranks) -> None:
    assert asyncio.run(answer(ranks.client, "a", (0,))) == [1010, 1011]
    assert asyncio.run(answer(ranks.client, "b", (0,))) == [1010, 1011]  # rank 0 again: nothing outstanding
    epochs = [rank.processor.cache.mirror.epoch for rank in ranks.client.client.ranks]  # type: ignore[union-attr]
    asyncio.run(asyncio.wait_for(ranks.client.reset_mm_cache(), 30))
    assert all(engine.calls == ["reset_mm_cache"] for engine in ranks.engines)
    assert [rank.processor.cache.mirror.epoch for rank in ranks.client.client.ranks] != epochs  # type: ignore[union-attr]
    for engine in ranks.engines:
        engine.held.clear()  # what the engines' own reset_mm_cache does
    assert asyncio.run(answer(ranks.client, "c", (0,))) == [1010, 1011]
    assert ranks.client.stats.resends == 0  # the data went again: the P0 side forgot too


def test_a_rank_whose_process_exits_fails_only_what_it_owed(ranks: Ranks) -> None:
    class Process:
        code: int | None = None

        def poll(self) -> int | None:
            return self.code

    process = Process()
    ranks.client.watch_process(1, process)
    ranks.engines[1].stall_s = 30.0
    ranks.engines[0].stall_s = 1.0

    async def main() -> None:
        survivor = await ranks.client.add_request("on-0", chat((0,)), SamplingParams(max_tokens=2))
        doomed = await ranks.client.add_request("on-1", chat((1,)), SamplingParams(max_tokens=2))
        assert ranks.client.client.rank_of("on-1") == 1
        process.code = -9
        with pytest.raises(EngineDeadError, match=r"^Engine 1's process exited \(code -9\)"):
            async for _ in doomed:
                pass
        assert ranks.client.errored
        with pytest.raises(EngineDeadError):  # as vLLM's client: no new requests while an engine is dead
            await ranks.client.add_request("new", chat((0,)), SamplingParams(max_tokens=2))
        assert [t async for output in survivor for t in output.new_token_ids] == [1010, 1011]

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_rank_that_never_comes_is_named(gemma3_dir: Path) -> None:
    p0 = ZmqFrontendTransport("tcp")
    with FrontendHandshake(p0, DataParallelConfig(2, 0, "127.0.0.1", 0)) as handshake:
        thread, box = engine_in_thread(handshake.address, 0, extras=())
        with pytest.raises(HandshakeError, match=r"Engine rank\(s\) \[1\] never said HELLO within 1"):
            handshake.wait(1)
    thread.join(30)
    box["transport"].close()
    p0.close()


def test_several_ranks_need_a_transport_that_routes(gemma3_dir: Path) -> None:
    import multiprocessing

    a, b = multiprocessing.Pipe()
    ranks = start_stock_like(gemma3_dir, 2, local=True)
    try:
        with pytest.raises(ConfigError, match="need a transport that routes"):
            EngineClient(InputProcessor(ranks.pre), PipeTransport(a), engines=ranks.infos)
        with pytest.raises(ConfigError, match=r"ranks 0..1 in order"):
            EngineClient(InputProcessor(ranks.pre), ranks.client.transport, engines=ranks.infos[::-1])
    finally:
        a.close()
        b.close()
        for engine in ranks.engines:
            engine.close()
        ranks.client.close_blocking()


def test_the_shm_cache_serves_one_rank_only(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0.02, mm_processor_cache_type="shm"))
    try:
        with pytest.raises(ConfigError, match="use mm_processor_cache_type='lru'"):
            InputProcessor(pre).for_another_engine()
    finally:
        if pre.cache is not None:
            pre.cache.close()
