"""The real link end to end: the async client over vLLM's ZMQ sockets to an engine process built
only on ``EngineCoreReceiver`` (tests/engine/echo_engine.py), which checksums every tensor it gets."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from echo_engine import request_checksum

import preloaded
from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient, BlockingEngineClient
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.errors import EngineDeadError, ValidationError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput

ECHO = Path(__file__).with_name("echo_engine.py")
SIDE_FROM = 2048
POOL = [image_data_url(make_image(20 + 3 * i, 16 + 2 * (i % 5), seed=i)) for i in range(24)]


def messages(images: tuple[int, ...], n: int) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": POOL[i]}} for i in images]
    return [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Hello."},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": [*parts, {"type": "text", "text": f"Request {n}: what is here?"}]}]


def plans(count: int, seed: int) -> dict[str, tuple[int, ...]]:
    rng = random.Random(seed)
    return {f"req-{n}": tuple(rng.randrange(len(POOL)) for _ in range(rng.randint(1, 3))) for n in range(count)}


class Expected:
    """The checksum of each request as computed in-process, without any cache."""

    def __init__(self, model_dir: Path) -> None:
        self.processor = InputProcessor(InputPreprocessor(model_dir, MultiModalConfig(mm_processor_cache_gb=0)))
        self._memo: dict[tuple[int, ...], int] = {}

    def __call__(self, images: tuple[int, ...]) -> int:
        if images not in self._memo:
            self._memo[images] = request_checksum(self.processor.process_inputs("x", messages(images, 0)))
        return self._memo[images]


def start_engine(transport: ZmqFrontendTransport, cache: str, *, shm_name: str | None = None,
                 capacity: int = 1 << 30, steps: int = 1) -> preloaded.Preloaded:
    args = [sys.executable, str(ECHO), transport.addresses.input, transport.addresses.output, "--cache", cache,
            "--capacity-bytes", str(capacity), "--steps", str(steps)]
    if shm_name:
        args += ["--shm-name", shm_name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ECHO.parent), os.environ.get("PYTHONPATH", "")]),
           "ECHO_SIDE_SECRET": transport.addresses.side_secret.hex()}  # the side channel's key, not in argv
    proc = preloaded.popen(args, env=env)
    transport.wait_for_engines([0], 60)
    return proc


def stop(proc: preloaded.Preloaded) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def shm_segments() -> set[str]:
    root = Path("/dev/shm")
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


@pytest.fixture
def link_factory() -> Iterator[Any]:
    made: list[tuple[AsyncEngineClient | None, ZmqFrontendTransport, list[preloaded.Preloaded], Any]] = []

    def make(model_dir: Path, scheme: str, cache: str, **engine: Any) -> tuple[AsyncEngineClient, Any]:
        config = MultiModalConfig(mm_processor_cache_gb=0.02, mm_processor_cache_type=cache)
        pre = InputPreprocessor(model_dir, config)
        # the tiny model's tensors are far below 1 MiB: a low threshold sends them over the side channel
        transport = ZmqFrontendTransport(scheme, side_channel_min_bytes=SIDE_FROM)  # type: ignore[arg-type]
        shm_name = getattr(pre.cache, "shm_name", None)
        procs = [start_engine(transport, cache, shm_name=shm_name, capacity=config.mm_processor_cache_bytes,
                              **engine)]
        client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=60)
        made.append((client, transport, procs, pre))
        return client, (transport, procs, cache, shm_name, config)

    yield make
    for client, _, procs, pre in made:
        for proc in procs:
            stop(proc)
        if client is not None:
            client.close_blocking()
        if pre.cache is not None:
            pre.cache.close()


async def run_requests(client: AsyncEngineClient, todo: dict[str, tuple[int, ...]], concurrency: int = 16,
                       ) -> dict[str, list[EngineCoreOutput] | BaseException]:
    gate = asyncio.Semaphore(concurrency)
    results: dict[str, list[EngineCoreOutput] | BaseException] = {}

    async def one(request_id: str, images: tuple[int, ...]) -> None:
        async with gate:
            try:
                stream = await client.add_request(request_id, messages(images, int(request_id.split("-")[1])),
                                                  SamplingParams(max_tokens=1))
                results[request_id] = [output async for output in stream]
            except EngineDeadError as e:
                results[request_id] = e

    await asyncio.gather(*(one(rid, images) for rid, images in todo.items()))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["ipc", "tcp"])
@pytest.mark.parametrize("cache", ["lru", "shm"])
def test_a_thousand_chat_requests_each_answered_once_with_the_right_tensors(
    gemma3_dir: Path, link_factory: Any, scheme: str, cache: str,
) -> None:
    client, (transport, _, _, shm_name, _) = link_factory(gemma3_dir, scheme, cache)
    expected = Expected(gemma3_dir)
    todo = plans(1000, seed=len(scheme) + len(cache))
    results = asyncio.run(run_requests(client, todo))
    assert set(results) == set(todo)
    for request_id, images in todo.items():
        outputs = results[request_id]
        assert isinstance(outputs, list), f"{request_id}: {outputs!r}"
        assert len(outputs) == 1 and outputs[0].finish_reason is not None, request_id
        assert outputs[0].new_token_ids == [expected(images)], request_id
    assert client.stats.failures == 0 and client.stats.engine_restarts == 0
    if cache == "lru":
        assert client.client.processor.preprocessor.stats.hits > 0
        assert (transport.side_channel_messages > 0) == (scheme == "ipc")
    ipc_dir = transport.addresses.input[len("ipc://"):] if scheme == "ipc" else None
    client.close_blocking()
    if ipc_dir:
        assert not Path(ipc_dir).exists() and not Path(ipc_dir).parent.exists()
    if shm_name:
        client.client.processor.preprocessor.cache.close()  # type: ignore[union-attr]
        assert shm_name.lstrip("/") not in shm_segments()  # this test's segment; others may run beside it


@pytest.mark.slow
def test_engine_killed_and_restarted_mid_run_loses_nothing(gemma3_dir: Path, link_factory: Any) -> None:
    client, (transport, procs, cache, _, config) = link_factory(gemma3_dir, "ipc", "lru")
    expected = Expected(gemma3_dir)
    todo = plans(300, seed=7)

    async def main() -> dict[str, list[EngineCoreOutput] | BaseException]:
        task = asyncio.ensure_future(run_requests(client, todo, concurrency=8))
        while client.client.processor.preprocessor.stats.requests < 100:
            await asyncio.sleep(0.01)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        await asyncio.sleep(0.3)
        procs.append(await asyncio.get_running_loop().run_in_executor(
            None, lambda: start_engine(transport, cache, capacity=config.mm_processor_cache_bytes)))
        return await task

    results = asyncio.run(main())
    assert set(results) == set(todo)
    for request_id, images in todo.items():
        outputs = results[request_id]
        assert isinstance(outputs, list), f"{request_id}: {outputs!r}"  # one output each: nothing half-done
        assert [o.new_token_ids for o in outputs] == [[expected(images)]], request_id
    assert client.stats.engine_restarts == 1
    assert transport.side_channel_messages > 0


def test_streaming_abort_and_the_blocking_facade(gemma3_dir: Path, link_factory: Any) -> None:
    client, (_, procs, _, _, config) = link_factory(gemma3_dir, "ipc", "lru", steps=2)
    expected = Expected(gemma3_dir)

    async def main() -> list[EngineCoreOutput]:
        stream = await client.add_request("req-1", messages((0, 1), 1))
        return [output async for output in stream]

    outputs = asyncio.run(main())
    assert [o.new_token_ids for o in outputs] == [[expected((0, 1))], [len(
        expected.processor.process_inputs("x", messages((0, 1), 1)).prompt_token_ids or [])]]
    assert outputs[0].finish_reason is None and outputs[1].finish_reason is not None
    client.close_blocking()
    stop(procs.pop())
    blocking_transport = ZmqFrontendTransport("ipc")
    procs.append(start_engine(blocking_transport, "lru", capacity=config.mm_processor_cache_bytes, steps=2))
    pre = InputPreprocessor(gemma3_dir, config)
    with BlockingEngineClient(InputProcessor(pre), blocking_transport) as blocking:
        got = list(blocking.add_request("req-2", messages((2,), 2)))
        assert [o.new_token_ids[0] for o in got][:1] == [expected((2,))] and len(got) == 2
        assert blocking.client.client.running == []


def test_an_engine_that_never_answers_fails_requests_with_a_typed_error(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0.02))
    transport = ZmqFrontendTransport("ipc")
    client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=0.5)

    async def main() -> BaseException | None:
        stream = await client.add_request("req-0", messages((0,), 0))  # nobody is there
        try:
            async for _ in stream:
                pass
        except EngineDeadError as e:
            return e
        return None

    started = time.monotonic()
    error = asyncio.run(main())
    client.close_blocking()
    assert isinstance(error, EngineDeadError) and error.retryable
    assert time.monotonic() - started < 30


def test_a_request_id_already_running_is_the_requests_fault(gemma3_dir: Path) -> None:
    """As ``EngineClient`` refuses it: a 400 naming ``request_id``, not a server error."""
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0.02))
    client = AsyncEngineClient(InputProcessor(pre), ZmqFrontendTransport("ipc"), engine_timeout_s=30)

    async def main() -> None:
        first = await client.add_request("req-0", messages((0,), 0))  # nobody is there: it stays running
        try:
            with pytest.raises(ValidationError, match="'req-0' is already running") as info:
                await client.add_request("req-0", messages((1,), 0))
            assert info.value.parameter == "request_id"
        finally:
            await first.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    client.close_blocking()
