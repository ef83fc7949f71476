"""vLLM's start-up handshake on both sides, and the extras it negotiates.

P0 (``FrontendHandshake``) meets an engine built on ``engine_handshake`` (what ``mmfront worker``
runs) over ipc (a local engine) and tcp (a headless one); a wrong or missing peer is a typed
error naming the rank. An engine that announces no extras behaves as a stock vLLM engine core:
outputs are its only reply, a miss is vLLM's finished-with-``ERROR`` output (resent invisibly),
silence during a long step is not death, ``ENGINE_CORE_DEAD`` and a dropped connection are.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from stock_like import StockLikeEngine, engine_in_thread, start_stock_like

from local_services import caller_id
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake
from mmfront.engine.transports.zmq import ZmqEngineTransport, ZmqFrontendTransport, engine_identity
from mmfront.errors import ConfigError, EngineDeadError, HandshakeError, ValidationError
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.handshake import (
    ENGINE_CORE_DEAD,
    EXTRA_ADMITTED,
    EXTRA_HEARTBEAT,
    EXTRA_MIRROR,
    EXTRA_SIDE_CHANNEL,
    HandshakeStatus,
)
from mmfront.wire.messages import ABORT, Direction, decode_message, encode_envelope

IMAGES = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(3)]


@pytest.mark.parametrize("local", [True, False])
def test_handshake_with_an_mmfront_engine_announces_its_extras(local: bool) -> None:
    parallel = DataParallelConfig(1, 1 if local else 0, "127.0.0.1", 0)
    with ZmqFrontendTransport("ipc" if local else "tcp") as p0, FrontendHandshake(p0, parallel) as handshake:
        assert handshake.address.startswith("ipc://" if local else "tcp://127.0.0.1:")
        thread, box = engine_in_thread(handshake.address, local=local)
        [info] = handshake.wait(30)
        thread.join(10)
        engine: ZmqEngineTransport = box["transport"]
        try:
            assert (info.engine_index, info.local) == (0, local)
            assert (info.max_model_len, info.num_gpu_blocks, info.block_size) == (4096, 1234, 16)
            assert info.ready.data_parallel_rank == 0
            expected = {EXTRA_MIRROR, EXTRA_ADMITTED, EXTRA_HEARTBEAT} | ({EXTRA_SIDE_CHANNEL} if local else set())
            assert info.extras == expected
            # the data sockets work: P0 sends, the engine receives
            p0.send(encode_envelope(ABORT, MsgpackEncoder().encode(["r"])))
            frames = engine.recv(10)
            assert frames is not None and decode_message(frames, Direction.TO_ENGINE).body == ["r"]
        finally:
            engine.close()


def test_a_peer_with_an_unexpected_rank_is_a_typed_error() -> None:
    with ZmqFrontendTransport() as p0, FrontendHandshake(p0) as handshake:
        ctx = zmq.Context()
        try:
            dealer = ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, engine_identity(5))
            dealer.connect(handshake.address)
            dealer.send(msgspec.msgpack.encode(HandshakeStatus("HELLO", True, False)))
            with pytest.raises(HandshakeError, match=r"expected engine ranks 0\.\.0"):
                handshake.wait(10)
        finally:
            ctx.destroy(linger=0)


def test_a_local_engine_where_a_headless_one_is_expected_is_refused() -> None:
    parallel = DataParallelConfig(1, 0, "127.0.0.1", 0)
    with ZmqFrontendTransport("tcp") as p0, FrontendHandshake(p0, parallel) as handshake:
        engine_in_thread(handshake.address, local=True, timeout=1)
        with pytest.raises(HandshakeError, match=r"rank 0 says local=True.*headless"):
            handshake.wait(10)


def test_a_rank_that_never_comes_is_named_after_a_bounded_wait() -> None:
    with ZmqFrontendTransport() as p0, FrontendHandshake(p0) as handshake:
        start = time.monotonic()
        with pytest.raises(HandshakeError, match=r"rank\(s\) \[0\] never said HELLO within 0.3 s"):
            handshake.wait(0.3)
        assert time.monotonic() - start < 5


def test_data_parallel_config_checks_vllm_names() -> None:
    with pytest.raises(ConfigError, match="data_parallel_size_local"):
        DataParallelConfig(1, 2)


# --- an engine that announces nothing: what a stock vLLM engine core does ------------------------


@pytest.fixture
def stock_like(gemma3_dir: Path) -> Iterator[tuple[AsyncEngineClient, StockLikeEngine, ZmqFrontendTransport]]:
    running = start_stock_like(gemma3_dir, 1, local=False, engine_timeout_s=0.3)
    yield running.client, running.engines[0], running.client.transport  # type: ignore[misc]
    running.engines[0].close()
    running.client.close_blocking()
    if running.pre.cache is not None:
        running.pre.cache.close()


def chat(images: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": IMAGES[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}]


async def answer(client: AsyncEngineClient, request_id: str, images: tuple[int, ...]) -> list[int]:
    stream = await client.add_request(request_id, chat(images), SamplingParams(max_tokens=2))
    return [t async for output in stream for t in output.new_token_ids]


def test_with_a_stock_like_engine_outputs_are_the_only_reply(stock_like: Any) -> None:
    client, engine, _ = stock_like
    assert client.client.extras == frozenset()
    assert client.client.engine.max_model_len == 4096

    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(answer(client, f"r{i}", (i % 3, (i + 1) % 3)) for i in range(6))))

    assert asyncio.run(main()) == [[1020, 1021]] * 6
    assert any(f.data is None for r in engine.seen for f in r.mm_features or [])  # some went as references
    assert client.stats.resends == 0


def test_the_engines_max_model_len_refuses_an_overlong_request_before_it_is_sent(stock_like: Any) -> None:
    client, _, _ = stock_like
    assert client.max_model_len == 4096

    async def main() -> None:
        await client.add_request("too-long", chat((0,)), SamplingParams(max_tokens=4097))

    with pytest.raises(ValidationError) as raised:
        asyncio.run(main())
    assert raised.value.parameter == "max_tokens"
    assert str(raised.value) == "max_tokens=4097 cannot be greater than max_model_len=4096. Please request fewer output tokens."
    assert client.client.stats.wire_bytes == 0  # nothing was sent


def test_a_stock_miss_is_resent_with_the_data_invisibly(stock_like: Any) -> None:
    client, engine, _ = stock_like
    assert asyncio.run(answer(client, "a", (0, 1))) == [1020, 1021]
    engine.held.clear()  # the engine lost its cache: the next references miss
    assert asyncio.run(answer(client, "b", (0, 1))) == [1020, 1021]
    assert client.stats.resends == 1
    assert [caller_id(r.request_id) for r in engine.seen] == ["a", "b", "b"]
    assert all(f.data is not None for f in engine.seen[-1].mm_features or [])


def test_silence_during_a_long_step_is_not_death(stock_like: Any) -> None:
    client, engine, _ = stock_like
    engine.stall_s = 1.5  # five times engine_timeout_s, which applies to heartbeat engines only
    assert asyncio.run(answer(client, "slow", (2,))) == [1010, 1011]


def test_engine_core_dead_fails_the_request_in_flight(stock_like: Any) -> None:
    client, engine, p0 = stock_like
    engine.stall_s = 3.0

    async def main() -> BaseException:
        stream = await client.add_request("doomed", chat((0,)), SamplingParams(max_tokens=2))
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(p0.addresses.output)
        push.send(ENGINE_CORE_DEAD)
        try:
            with pytest.raises(EngineDeadError, match="ENGINE_CORE_DEAD") as caught:
                async for _ in stream:
                    pass
        finally:
            ctx.destroy(linger=1000)
        return caught.value

    assert isinstance(asyncio.run(asyncio.wait_for(main(), 10)), EngineDeadError)


def test_a_dropped_connection_fails_the_request_in_flight(stock_like: Any) -> None:
    client, engine, _ = stock_like
    engine.stall_s = 30.0

    async def main() -> None:
        stream = await client.add_request("orphan", chat((1,)), SamplingParams(max_tokens=2))
        await asyncio.sleep(0.5)
        engine.transport.close()  # as a SIGKILLed process: its connections drop
        with pytest.raises(EngineDeadError, match="socket monitor"):
            async for _ in stream:
                pass

    asyncio.run(asyncio.wait_for(main(), 10))
