"""``mmfront serve``'s launcher with one local engine, as ``vllm serve MODEL`` runs: it starts
``mmfront worker`` itself, meets it through vLLM's handshake, serves chats through the client, its
apps cap ``max_model_len`` at ``--max-model-len`` without changing the shared client; an engine killed under a request fails that request at
once and marks the client dead; closing leaves no process behind. One worker start for the module."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmfront import MultiModalConfig
from mmfront.errors import EngineDeadError
from mmfront.serve.launcher import Frontend, start_frontend
from mmfront.serve.settings import ServePlan, ServeSettings
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import EXTRA_HEARTBEAT, EXTRA_MIRROR

pytestmark = pytest.mark.slow

LIMIT = 600
IMAGE = image_data_url(make_image(40, 32, seed=7))


def chat(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                         {"type": "text", "text": text}]}]


class Exits:
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self.event = threading.Event()

    def __call__(self, rank: int, status: int) -> None:
        self.seen.append((rank, status))
        self.event.set()


@pytest.fixture(scope="module")
def exits() -> Exits:
    return Exits()


@pytest.fixture(scope="module")
def frontend(gemma3_weights_dir: Path, exits: Exits) -> Iterator[Frontend]:
    plan = ServePlan(ServeSettings(gemma3_weights_dir),
                     MultiModalConfig(mm_processor_cache_gb=0.02, mm_processing_lanes=0, max_model_len=LIMIT),
                     engine_ready_timeout_s=180)
    started = start_frontend(plan, env={**os.environ, "OMP_NUM_THREADS": "1"}, on_engine_exit=exits)
    try:
        yield started
    finally:
        started.close()


async def answer(frontend: Frontend, request_id: str, max_tokens: int = 3) -> list[int]:
    stream = await frontend.client.add_request(request_id, chat("What is this?"), SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [t async for output in stream for t in output.new_token_ids]


def test_the_local_engine_is_met_through_the_handshake(frontend: Frontend) -> None:
    [info] = frontend.infos
    assert info.engine_index == 0 and info.local
    assert {EXTRA_MIRROR, EXTRA_HEARTBEAT} <= info.extras
    assert frontend.engines is not None and len(frontend.engines.processes) == 1


def test_max_model_len_is_the_smaller_of_the_flag_and_the_engines(frontend: Frontend, gemma3_weights_dir: Path) -> None:
    from mmfront.serve.app import create_app

    engines = frontend.infos[0].max_model_len
    assert frontend.client.max_model_len == engines > LIMIT
    apps = [create_app(frontend.client, ServeSettings(gemma3_weights_dir, served_model_name=(name,)))
            for name in ("one", "two")]

    async def card(app: Any) -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
            return (await http.get("/v1/models")).json()["data"][0]

    cards = [asyncio.run(card(app)) for app in apps]
    assert [(c["id"], c["max_model_len"]) for c in cards] == [("one", LIMIT), ("two", LIMIT)]
    assert frontend.client.max_model_len == engines  # the apps leave the shared client as it is


def test_chats_are_answered_with_the_cache_mirrored(frontend: Frontend) -> None:
    first = asyncio.run(asyncio.wait_for(answer(frontend, "a"), 120))
    again = asyncio.run(asyncio.wait_for(answer(frontend, "b"), 120))
    assert len(first) == 3 and again == first
    assert frontend.client.stats.saved_bytes > 0 and frontend.client.stats.resends == 0


def test_a_killed_engine_fails_its_request_at_once_and_is_reported(frontend: Frontend, exits: Exits) -> None:
    assert frontend.engines is not None
    [process] = frontend.engines.processes

    async def main() -> None:
        stream = await frontend.client.add_request("long", chat("Talk."), SamplingParams(max_tokens=200,
                                                                                        ignore_eos=True, temperature=0.0))
        async for _ in stream:
            os.kill(process.pid, signal.SIGKILL)

    with pytest.raises(EngineDeadError):
        asyncio.run(asyncio.wait_for(main(), 20))  # well inside engine_timeout_s (30 s): the link broke
    assert frontend.client.errored
    assert exits.event.wait(10) and exits.seen == [(0, -signal.SIGKILL)]


def test_closing_stops_every_engine(frontend: Frontend) -> None:
    frontend.close()
    assert frontend.engines is not None
    assert all(p.poll() is not None for p in frontend.engines.processes)
