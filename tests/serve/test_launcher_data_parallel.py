"""``mmfront serve --data-parallel-size 2``: the launcher starts two ``mmfront worker`` processes,
ranks 0 and 1, meets both through one handshake, and the client spreads chats over them with one
processor-cache mirror per rank; a killed rank fails only what it owed, and is reported by rank.
One start of two workers for the module."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.engine.handshake import DataParallelConfig
from mmfront.errors import EngineDeadError
from mmfront.serve.launcher import Frontend, start_frontend
from mmfront.serve.settings import ServePlan, ServeSettings
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams

pytestmark = pytest.mark.slow

LONG_TOKENS = 400
"""A request's tokens in the killed-rank test (the module ran in 8 s with it, 2026-12-07)."""
IMAGES = [image_data_url(make_image(40 + 4 * i, 32, seed=20 + i)) for i in range(3)]


def chat(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGES[i % 3]}},
                                         {"type": "text", "text": f"Picture {i % 3}?"}]}]


@pytest.fixture(scope="module")
def exits() -> list[tuple[int, int]]:
    return []


@pytest.fixture(scope="module")
def frontend(gemma3_weights_dir: Path, exits: list[tuple[int, int]]) -> Iterator[Frontend]:
    plan = ServePlan(ServeSettings(gemma3_weights_dir),
                     MultiModalConfig(mm_processor_cache_gb=0.02, mm_processing_lanes=0),
                     DataParallelConfig(2, 2), engine_ready_timeout_s=240)
    started = start_frontend(plan, env={**os.environ, "OMP_NUM_THREADS": "1"},
                             on_engine_exit=lambda rank, status: exits.append((rank, status)))
    try:
        yield started
    finally:
        started.close()


async def answer(frontend: Frontend, request_id: str, i: int, max_tokens: int = 2) -> list[int]:
    stream = await frontend.client.add_request(request_id, chat(i), SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [t async for output in stream for t in output.new_token_ids]


def test_both_local_ranks_are_started_and_met(frontend: Frontend) -> None:
    assert [info.engine_index for info in frontend.infos] == [0, 1]
    assert all(info.local for info in frontend.infos)
    assert frontend.engines is not None and len(frontend.engines.processes) == 2
    assert [rank.index for rank in frontend.client.client.ranks] == [0, 1]


def test_chats_spread_over_both_ranks_each_with_its_mirror(frontend: Frontend) -> None:
    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(answer(frontend, f"c{i}", i) for i in range(12))))

    answers = asyncio.run(asyncio.wait_for(main(), 180))
    assert all(len(a) == 2 for a in answers)
    assert [answers[i] for i in range(3)] == [answers[i + 3] for i in range(3)]  # same picture, same answer
    sent = [rank.sent for rank in frontend.client.client.ranks]
    assert sum(sent) == 12 and min(sent) > 0, sent
    assert frontend.client.stats.resends == 0


def test_a_killed_rank_fails_what_it_owed_and_is_reported(frontend: Frontend, exits: list[tuple[int, int]]) -> None:
    """Two long requests, one per rank (each goes to the rank with fewer outstanding); rank 1's
    process is killed: exactly one request fails, the other runs to its end on rank 0. Long
    enough that the first is still running when the second is added: 40 tokens ended first on a
    loaded 2-core machine (``[1, 0]`` outstanding)."""
    assert frontend.engines is not None
    victim = frontend.engines.processes[1]
    params = SamplingParams(max_tokens=LONG_TOKENS, ignore_eos=True, temperature=0.0)

    async def drain(stream: Any) -> int | BaseException:
        try:
            return sum([len(output.new_token_ids) async for output in stream])
        except EngineDeadError as e:
            return e

    async def main() -> list[int | BaseException]:
        streams = [await frontend.client.add_request(f"long-{i}", chat(i), params) for i in range(2)]
        assert [rank.outstanding for rank in frontend.client.client.ranks] == [1, 1]
        os.kill(victim.pid, signal.SIGKILL)
        return list(await asyncio.gather(*(drain(s) for s in streams)))

    results = asyncio.run(asyncio.wait_for(main(), 120))
    assert sorted(isinstance(r, EngineDeadError) for r in results) == [False, True]
    assert LONG_TOKENS in results and frontend.client.errored
    assert victim.wait(10) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while not exits:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert exits == [(1, -signal.SIGKILL)]
