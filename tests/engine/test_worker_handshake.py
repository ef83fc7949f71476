"""``mmfront worker`` meets P0 through vLLM's start-up handshake, the same one a stock engine runs
(tests/engine/test_stock_engine.py): P0 learns its limits and the extras it announces, then
serves chat requests with repeated images, each answer equal to the model in-process; through
the command (``mmfront worker --data-parallel-address``) an abort stops generation and a killed
worker fails its request in flight."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import preloaded
from local_services import greedy_answers
from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake
from mmfront.engine.runner import ModelRunner
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.engine.worker import run_worker
from mmfront.errors import EngineDeadError
from mmfront.network import get_open_port
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import EXTRA_ADMITTED, EXTRA_HEARTBEAT, EXTRA_MIRROR

POOL = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(3)]
COMBOS = [(0,), (1, 2), (0, 1), (2,), (0,), (1, 2)]


def chat(combo: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": POOL[i]}} for i in combo]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in these pictures?"}]}]


@pytest.mark.slow
@pytest.mark.parametrize("local", [True, False])
def test_worker_through_the_handshake_serves_chats_with_repeated_images(gemma3_weights_dir: Path, local: bool) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=0.02)
    pre = InputPreprocessor(gemma3_weights_dir, config)
    transport = ZmqFrontendTransport("ipc" if local else "tcp")
    stop = threading.Event()
    with FrontendHandshake(transport, DataParallelConfig(1, 1 if local else 0, "127.0.0.1", 0)) as handshake:
        worker = threading.Thread(target=run_worker, args=(gemma3_weights_dir, [], config), daemon=True,
                                  kwargs={"handshake": [handshake.address], "local": local, "stop": stop})
        worker.start()
        [info] = handshake.wait(120)
    client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=120, engines=[info])
    try:
        runner = ModelRunner(gemma3_weights_dir)
        assert info.max_model_len == runner.max_model_len
        assert {EXTRA_MIRROR, EXTRA_ADMITTED, EXTRA_HEARTBEAT} <= info.extras

        async def one(n: int, combo: tuple[int, ...]) -> list[int]:
            stream = await client.add_request(f"w{n}", chat(combo), SamplingParams(max_tokens=3, temperature=0.0))
            return [t async for output in stream for t in output.new_token_ids]

        async def main() -> list[list[int]]:
            return list(await asyncio.gather(*(one(n, c) for n, c in enumerate(COMBOS))))

        answers = asyncio.run(asyncio.wait_for(main(), 120))
        assert answers == greedy_answers(gemma3_weights_dir, [chat(c) for c in COMBOS], 3)
        assert client.stats.saved_bytes > 0 and client.stats.resends == 0
    finally:
        stop.set()
        worker.join(30)
        client.close_blocking()
        if pre.cache is not None:
            pre.cache.close()


def _start_worker(model_dir: Path, port: int) -> preloaded.Preloaded:
    return preloaded.popen(
        [sys.executable, "-m", "mmfront.cli", "worker", str(model_dir), "--data-parallel-address", "127.0.0.1",
         "--data-parallel-rpc-port", str(port), "--cache-gb", "0.02", "--json"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _meet(model_dir: Path) -> tuple[AsyncEngineClient, preloaded.Preloaded, InputPreprocessor]:
    pre = InputPreprocessor(model_dir, MultiModalConfig(mm_processor_cache_gb=0.02))
    transport = ZmqFrontendTransport("tcp")
    port = get_open_port()
    with FrontendHandshake(transport, DataParallelConfig(1, 0, "127.0.0.1", port)) as handshake:
        worker = _start_worker(model_dir, port)
        [info] = handshake.wait(120)
    return AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=5, engines=[info]), worker, pre


@pytest.mark.slow
def test_worker_command_through_the_handshake_abort_stops_generation(gemma3_weights_dir: Path) -> None:
    client, worker, pre = _meet(gemma3_weights_dir)
    try:
        async def main() -> int:
            stream = await client.add_request("long", chat((0,)), SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0))
            got = 0
            async for output in stream:
                got += len(output.new_token_ids)
                if got >= 2:
                    await client.abort("long")
            return got

        assert asyncio.run(asyncio.wait_for(main(), 60)) >= 2
        # the engine still serves, and generated for the aborted request only until the abort
        assert len(asyncio.run(asyncio.wait_for(_answer(client, "after", (1,)), 60))) == 3
    finally:
        client.close_blocking()
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
        if pre.cache is not None:
            pre.cache.close()
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["requests"] == 2 and stats["tokens"] < 400


@pytest.mark.slow
def test_worker_killed_mid_request_fails_it_within_30_s(gemma3_weights_dir: Path) -> None:
    client, worker, pre = _meet(gemma3_weights_dir)
    try:
        async def main() -> float:
            stream = await client.add_request("doomed", chat((2,)), SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0))
            await anext(stream)
            worker.kill()
            start = time.monotonic()
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    pass
            return time.monotonic() - start

        assert asyncio.run(asyncio.wait_for(main(), 60)) < 30
    finally:
        client.close_blocking()
        worker.kill()
        worker.wait(30)
        if pre.cache is not None:
            pre.cache.close()


async def _answer(client: AsyncEngineClient, request_id: str, combo: tuple[int, ...]) -> list[int]:
    stream = await client.add_request(request_id, chat(combo), SamplingParams(max_tokens=3, temperature=0.0))
    return [t async for output in stream for t in output.new_token_ids]
