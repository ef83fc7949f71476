"""Two ``mmfront worker`` processes as data-parallel ranks 0 and 1 behind one client, through vLLM's
start-up handshake (``--data-parallel-address`` and ``--engine-index``, as two ``vllm serve
--headless`` ranks meet an API server): 20 concurrent chats spread over both ranks, each answer
the model's own greedy tokens, references only to the rank that holds the item; an abort stops
generation on the rank that runs the request; utility calls reach both ranks; a rank SIGKILLed
mid-request fails that request promptly (its process is watched) while the other rank's finishes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import preloaded
from local_services import greedy_answers
from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.errors import EngineDeadError
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams

pytestmark = pytest.mark.slow

POOL = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(5)]
COMBOS = [tuple(sorted({i % 5, (2 * i + 1) % 5})) for i in range(20)]
MAX_TOKENS = 3
CACHE_GB = 0.02


def chat(images: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": POOL[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in these pictures?"}]}]


@dataclass
class Ranks:
    client: AsyncEngineClient
    procs: list[preloaded.Preloaded]
    pre: InputPreprocessor


@pytest.fixture(scope="module")
def ranks(gemma3_weights_dir: Path) -> Iterator[Ranks]:
    pre = InputPreprocessor(gemma3_weights_dir, MultiModalConfig(mm_processor_cache_gb=CACHE_GB))
    transport = ZmqFrontendTransport("tcp")
    with FrontendHandshake(transport, DataParallelConfig(2, 0, "127.0.0.1", 0)) as handshake:
        port = handshake.address.rsplit(":", 1)[1]
        procs = [preloaded.popen(
            [sys.executable, "-m", "mmfront.cli", "worker", str(gemma3_weights_dir), "--data-parallel-address",
             "127.0.0.1", "--data-parallel-rpc-port", port, "--engine-index", str(rank), "--cache-gb", str(CACHE_GB),
             "--json"], stdout=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True)
            for rank in (0, 1)]
        try:
            infos = handshake.wait(120)
        except BaseException:
            for proc in procs:
                proc.kill()
            transport.close()
            raise
    client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=60, engines=infos)
    for rank, proc in enumerate(procs):
        client.watch_process(rank, proc)
    yield Ranks(client, procs, pre)
    client.close_blocking()
    for proc in procs:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def expected(gemma3_weights_dir: Path) -> dict[tuple[int, ...], list[int]]:
    combos = sorted(set(COMBOS))
    return dict(zip(combos, greedy_answers(gemma3_weights_dir, [chat(c) for c in combos], MAX_TOKENS)))


async def collect(client: AsyncEngineClient, request_id: str, images: tuple[int, ...], max_tokens: int) -> list[int]:
    stream = await client.add_request(request_id, chat(images), SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [t async for output in stream for t in output.new_token_ids]


def test_the_handshake_meets_both_ranks(ranks: Ranks) -> None:
    engines = [rank.info for rank in ranks.client.client.ranks]
    assert [info.engine_index for info in engines if info is not None] == [0, 1]
    assert all(info is not None and not info.local and "heartbeat" in info.extras for info in engines)


def test_twenty_concurrent_chats_spread_over_both_ranks(
    ranks: Ranks, expected: dict[tuple[int, ...], list[int]],
) -> None:
    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(collect(ranks.client, f"c{i}", c, MAX_TOKENS) for i, c in enumerate(COMBOS))))

    assert asyncio.run(asyncio.wait_for(main(), 180)) == [expected[c] for c in COMBOS]
    sent = [rank.sent for rank in ranks.client.client.ranks]
    assert sum(sent) == 20 and min(sent) >= 5, sent
    assert ranks.client.stats.saved_bytes > 0 and ranks.client.stats.resends == 0


def test_utility_calls_reach_both_ranks(ranks: Ranks) -> None:
    async def main() -> tuple[Any, ...]:
        return (await ranks.client.get_supported_tasks(), await ranks.client.call_utility("is_sleeping", engine_index=1))

    tasks, sleeping = asyncio.run(asyncio.wait_for(main(), 60))
    assert tasks == ("generate",) and sleeping is False


def test_an_abort_stops_generation_on_the_rank_that_runs_it(ranks: Ranks) -> None:
    async def main() -> int:
        keep = await ranks.client.add_request("keep", chat((0,)), SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.0))
        long = await ranks.client.add_request("long", chat((1,)), SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0))
        assert ranks.client.rank_of("long") == 1
        got = 0
        async for output in long:
            got += len(output.new_token_ids)
            if got >= 2:
                await ranks.client.abort("long")
        assert len([t async for output in keep for t in output.new_token_ids]) == 40
        return got

    assert asyncio.run(asyncio.wait_for(main(), 120)) >= 2


def test_a_rank_killed_mid_request_fails_it_promptly_and_the_other_rank_finishes(ranks: Ranks) -> None:
    async def main() -> float:
        survivor = await ranks.client.add_request("s", chat((2,)), SamplingParams(max_tokens=30, ignore_eos=True, temperature=0.0))
        doomed = await ranks.client.add_request("d", chat((3,)), SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0))
        assert ranks.client.rank_of("d") == 1
        await anext(doomed)
        ranks.procs[1].kill()
        start = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"^Engine 1's process exited"):
            async for _ in doomed:
                pass
        took = time.monotonic() - start
        assert len([t async for output in survivor for t in output.new_token_ids]) == 30
        return took

    assert asyncio.run(asyncio.wait_for(main(), 120)) < 30
    assert ranks.client.errored
    ranks.procs[0].send_signal(signal.SIGTERM)
    out, _ = ranks.procs[0].communicate(timeout=60)
    stats = json.loads(out.strip().splitlines()[-1])
    # rank 0 served its share of the chats, "keep" and "s"; the aborted request ran on rank 1
    assert stats["requests"] >= 7 and stats["tokens"] < 400
