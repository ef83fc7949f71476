"""Several API servers in front of the same engines (vLLM's ``api_server_count``): the handshake
names every server's sockets, each engine connects to all of them and writes its ready response
to each, each server reads its own (``wait_for_ready_responses``) and keeps its own P0 mirror,
which the engine mirrors with one receiver cache per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

from local_services import greedy_answers
from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import (
    DataParallelConfig,
    FrontendHandshake,
    engine_handshake,
    engine_handshake_all,
    wait_for_ready_responses,
)
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.engine.worker import run_worker
from mmfront.errors import HandshakeError
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import EXTRA_HEARTBEAT, EngineCoreReadyResponse

POOL = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(3)]
READY = EngineCoreReadyResponse(max_model_len=4096, num_gpu_blocks=64, block_size=16)


def chat(images: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": POOL[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in these pictures?"}]}]


@pytest.mark.slow
def test_two_api_servers_share_one_mmfront_worker_each_with_its_own_mirror(gemma3_weights_dir: Path) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=0.02)
    first, second = ZmqFrontendTransport(), ZmqFrontendTransport()
    stop = threading.Event()
    with FrontendHandshake(first, DataParallelConfig(), other_frontends=[second.addresses]) as handshake:
        worker = threading.Thread(target=run_worker, args=(gemma3_weights_dir, [], config), daemon=True,
                                  kwargs={"handshake": [handshake.address], "local": True, "stop": stop})
        worker.start()
        infos = handshake.wait(120)
    seconds = wait_for_ready_responses(second, infos, timeout=30)
    assert [info.ready for info in seconds] == [info.ready for info in infos]
    assert EXTRA_HEARTBEAT in seconds[0].extras
    pres = [InputPreprocessor(gemma3_weights_dir, config) for _ in range(2)]
    clients = [AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=120, engines=engines)
               for pre, transport, engines in zip(pres, (first, second), (infos, seconds))]
    combos = [(0,), (1, 2), (0, 1), (2,), (0,), (1, 2)]
    try:
        async def one(client: AsyncEngineClient, request_id: str, combo: tuple[int, ...]) -> list[int]:
            stream = await client.add_request(request_id, chat(combo), SamplingParams(max_tokens=3, temperature=0.0))
            return [t async for output in stream for t in output.new_token_ids]

        async def main() -> list[list[int]]:
            return list(await asyncio.gather(*(one(clients[n % 2], f"{n % 2}-{n}", combo)
                                               for n, combo in enumerate(combos * 2))))

        answers = asyncio.run(asyncio.wait_for(main(), 180))
        want = greedy_answers(gemma3_weights_dir, [chat(c) for c in combos], 3)
        assert answers == want * 2
        for client in clients:  # each server sent references that its own mirror in the engine resolved
            assert client.stats.saved_bytes > 0 and client.stats.resends == 0
    finally:
        stop.set()
        worker.join(30)
        for client in clients:
            client.close_blocking()


def test_an_engine_that_expects_one_api_server_is_told_there_are_two() -> None:
    first, second = ZmqFrontendTransport(), ZmqFrontendTransport()
    box: dict[str, Any] = {}
    with FrontendHandshake(first, DataParallelConfig(), other_frontends=[second.addresses]) as handshake:
        def engine() -> None:
            try:
                engine_handshake(handshake.address, 0, READY, local=True)
            except HandshakeError as e:
                box["error"] = e

        thread = threading.Thread(target=engine, daemon=True)
        thread.start()
        with contextlib.suppress(HandshakeError):  # the engine closes its sockets as it refuses: its ready may be lost
            handshake.wait(2)
        thread.join(30)
    assert "has 2 API servers; connect to each (engine_handshake_all)" in str(box["error"])
    first.close()
    second.close()


def test_a_server_that_the_engines_never_reach_is_a_typed_error() -> None:
    first, second, stray = ZmqFrontendTransport(), ZmqFrontendTransport(), ZmqFrontendTransport()
    box: dict[str, Any] = {}
    with FrontendHandshake(first, DataParallelConfig(), other_frontends=[second.addresses]) as handshake:
        thread = threading.Thread(target=lambda: box.update(t=engine_handshake_all(handshake.address, 0, READY,
                                                                                     local=True)), daemon=True)
        thread.start()
        infos = handshake.wait(30)
        thread.join(30)
    assert len(box["t"]) == 2
    with pytest.raises(HandshakeError, match=r"Engine rank\(s\) \[0\] never connected to .* within 0.5 s"):
        wait_for_ready_responses(stray, infos, timeout=0.5)
    for transport in (*box["t"], first, second, stray):
        transport.close()
