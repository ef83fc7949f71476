"""``mmfront worker`` behind mmfront's client, through vLLM's start-up handshake: what
tests/engine/test_stock_engine.py proves against a stock vLLM engine core, proved here against
mmfront's own engine, with no vLLM install (the abort and SIGKILL tests are in
test_worker_handshake.py).

The tiny Gemma 3 with random weights answers; every answer must equal the greedy tokens of the
same model run in-process (:class:`ModelRunner`, no cache, no wire). One worker process serves
the chat and utility tests; the tests of a long step and of a frontend that goes away build the
engine in-process from the worker's own parts (``engine_handshake`` or pipes,
:class:`EngineCoreReceiver`, the worker's ``serve`` loop).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
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
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake, engine_handshake
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.runner import ModelRunner
from mmfront.engine.transports import PipeTransport
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.engine.worker import WorkerStats, ready_response, receiver_caches, serve
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput

POOL = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(5)]
COMBOS = [tuple(sorted({i % 5, (3 * i + 1) % 5})) for i in range(20)]
MAX_TOKENS = 4
CACHE_GB = 0.02
LONG_TESTS = os.environ.get("MMFRONT_LONG_TESTS") == "1"


def chat(images: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": POOL[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in these pictures?"}]}]


async def collect(client: AsyncEngineClient, request_id: str, images: tuple[int, ...], max_tokens: int) -> list[int]:
    stream = await client.add_request(request_id, chat(images), SamplingParams(max_tokens=max_tokens, temperature=0.0))
    return [t async for output in stream for t in output.new_token_ids]


@pytest.fixture(scope="module")
def expected(gemma3_weights_dir: Path) -> dict[tuple[int, ...], list[int]]:
    """Each combination's first ``MAX_TOKENS`` greedy tokens, in-process (fewer: a prefix)."""
    combos = sorted({*COMBOS, (2, 3)})
    want = dict(zip(combos, greedy_answers(gemma3_weights_dir, [chat(c) for c in combos], MAX_TOKENS)))
    assert len({tuple(t) for t in want.values()}) > 1  # the answers depend on the images
    return want


def new_preprocessor(model_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(model_dir, MultiModalConfig(mm_processor_cache_gb=CACHE_GB))


def close(client: AsyncEngineClient, pre: InputPreprocessor) -> None:
    client.close_blocking()
    if pre.cache is not None:
        pre.cache.close()


# --- the worker command, through the handshake --------------------------------------------------


@dataclass
class Worker:
    client: AsyncEngineClient
    proc: preloaded.Preloaded
    pre: InputPreprocessor


@pytest.fixture(scope="module")
def worker(gemma3_weights_dir: Path) -> Iterator[Worker]:
    """``mmfront worker --data-parallel-address``, as ``vllm serve --headless`` meets an API server."""
    pre = new_preprocessor(gemma3_weights_dir)
    transport = ZmqFrontendTransport("tcp")
    with FrontendHandshake(transport, DataParallelConfig(1, 0, "127.0.0.1", 0)) as handshake:
        port = handshake.address.rsplit(":", 1)[1]
        proc = preloaded.popen(
            [sys.executable, "-m", "mmfront.cli", "worker", str(gemma3_weights_dir), "--data-parallel-address",
             "127.0.0.1", "--data-parallel-rpc-port", port, "--cache-gb", str(CACHE_GB)],
            env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True)
        try:
            [info] = handshake.wait(120)
        except BaseException:
            proc.kill()
            transport.close()
            raise
    running = Worker(AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=30, engines=[info]), proc, pre)
    yield running
    close(running.client, pre)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_twenty_concurrent_chats_with_repeated_images(worker: Worker, expected: dict[tuple[int, ...], list[int]]) -> None:
    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(collect(worker.client, f"chat-{i}", c, MAX_TOKENS)
                                           for i, c in enumerate(COMBOS))))

    before = worker.client.stats.saved_bytes
    assert asyncio.run(asyncio.wait_for(main(), 120)) == [expected[c] for c in COMBOS]
    assert worker.client.stats.saved_bytes > before  # repeated images went as references to P1's cache
    assert worker.client.stats.resends == 0  # and P1 resolved every one of them
    assert worker.client.stats.failures == 0


@pytest.mark.slow
def test_utility_calls_answer_through_the_handshake(worker: Worker, expected: dict[tuple[int, ...], list[int]]) -> None:
    """As on the stock engine: after ``reset_mm_cache`` both caches are empty, so images seen
    before travel with their data again (no reference, no miss, no resend)."""
    stats = worker.client.stats

    async def main() -> tuple[tuple[str, ...], list[int], bool]:
        assert await collect(worker.client, "before-reset", (0, 1), 2) == expected[(0, 1)][:2]
        tasks = await worker.client.get_supported_tasks()
        await worker.client.reset_mm_cache()
        saved, resends = stats.saved_bytes, stats.resends
        again = await collect(worker.client, "after-reset", (0, 1), 3)
        assert (stats.saved_bytes, stats.resends) == (saved, resends)
        return tasks, again, await worker.client.is_sleeping()

    tasks, again, sleeping = asyncio.run(asyncio.wait_for(main(), 120))
    assert tasks == ("generate",)
    assert again == expected[(0, 1)][:3]
    assert sleeping is False


# --- a long step: heartbeats keep coming ----------------------------------------------------------


class FirstStepSleeps(ModelRunner):
    """The worker's runner with a first step as long as a big prefill."""

    def __init__(self, model_dir: Path, first_step_s: float) -> None:
        super().__init__(model_dir)
        self.first_step_s = first_step_s
        self.steps = 0

    def step(self) -> list[EngineCoreOutput]:
        if self.steps == 0:
            time.sleep(self.first_step_s)
        self.steps += 1
        return super().step()


def engine_main(address: str, runner: ModelRunner, stop: threading.Event) -> None:
    """``mmfront worker`` in a thread: vLLM's handshake, the receiver, the worker's loop."""
    transport = engine_handshake(address, 0, ready_response(runner))
    cache = receiver_caches(MultiModalConfig(mm_processor_cache_gb=CACHE_GB), 1, None)[0]
    with EngineCoreReceiver(transport, cache) as receiver:
        serve(receiver, runner, stop, WorkerStats())


@pytest.mark.slow
@pytest.mark.parametrize(("first_step_s", "engine_timeout_s"), [
    (6.0, 2.0),
    pytest.param(30.0, 30.0, marks=pytest.mark.skipif(
        not LONG_TESTS, reason="the issue's literal 30 s first step costs 30 s of make test; the 6 s step against a "
                               "2 s engine_timeout_s proves the same (set MMFRONT_LONG_TESTS=1 to run it)")),
])
def test_a_first_step_longer_than_engine_timeout_completes(
    gemma3_weights_dir: Path, expected: dict[tuple[int, ...], list[int]], first_step_s: float,
    engine_timeout_s: float,
) -> None:
    """The engine announced heartbeats, so P0 declares it dead after ``engine_timeout_s`` of
    silence; its heartbeats come from the receiver's own thread, so a step three times as long
    (or the issue's 30 s against the default timeout) is not silence."""
    pre = new_preprocessor(gemma3_weights_dir)
    transport = ZmqFrontendTransport("tcp")
    stop = threading.Event()
    runner = FirstStepSleeps(gemma3_weights_dir, first_step_s)
    with FrontendHandshake(transport, DataParallelConfig(1, 0, "127.0.0.1", 0)) as handshake:
        engine = threading.Thread(target=engine_main, args=(handshake.address, runner, stop), daemon=True)
        engine.start()
        [info] = handshake.wait(60)
    client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=engine_timeout_s, engines=[info])
    try:
        started = time.monotonic()
        answer = asyncio.run(asyncio.wait_for(collect(client, "patient", (2, 3), 3), first_step_s + 60))
        assert time.monotonic() - started >= first_step_s
        assert answer == expected[(2, 3)][:3]
        assert runner.steps >= 3 and not client.errored
    finally:
        stop.set()
        engine.join(30)
        close(client, pre)


# --- one frontend goes away, the others are served on ---------------------------------------------


@pytest.mark.slow
def test_a_frontend_that_goes_away_costs_only_itself(
    gemma3_weights_dir: Path, expected: dict[tuple[int, ...], list[int]],
) -> None:
    """Two frontends over pipes, one engine. B's frontend vanishes while its long request
    generates (its end of the link closes, no abort sent): the engine drops B, stops generating
    for B's request, and answers A's requests, sent before and after, with the right tokens."""
    (a_p0, a_p1), (b_p0, b_p1) = multiprocessing.Pipe(), multiprocessing.Pipe()
    caches = receiver_caches(MultiModalConfig(mm_processor_cache_gb=CACHE_GB), 2, None)
    receiver = EngineCoreReceiver(PipeTransport(a_p1), caches[0])
    receiver.add_frontend(PipeTransport(b_p1), caches[1])
    runner, stop, stats = ModelRunner(gemma3_weights_dir), threading.Event(), WorkerStats()
    engine = threading.Thread(target=serve, args=(receiver, runner, stop, stats), daemon=True)
    engine.start()
    pre_a, pre_b = new_preprocessor(gemma3_weights_dir), new_preprocessor(gemma3_weights_dir)
    client_a = AsyncEngineClient(InputProcessor(pre_a), PipeTransport(a_p0), engine_timeout_s=60)
    client_b = AsyncEngineClient(InputProcessor(pre_b), PipeTransport(b_p0), engine_timeout_s=60)
    try:
        async def main() -> tuple[list[list[int]], list[list[int]]]:
            long = await client_b.add_request("b-long", chat((0,)), SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0))
            await anext(long)
            during = asyncio.gather(*(collect(client_a, f"a-{i}", c, 3) for i, c in enumerate(COMBOS[:4])))
            await asyncio.get_running_loop().run_in_executor(None, client_b.close_blocking)
            after = await asyncio.gather(*(collect(client_a, f"a-after-{i}", c, 3)
                                           for i, c in enumerate(COMBOS[4:8])))
            return list(await during), list(after)

        during, after = asyncio.run(asyncio.wait_for(main(), 120))
        assert during == [expected[c][:3] for c in COMBOS[:4]]
        assert after == [expected[c][:3] for c in COMBOS[4:8]]
        deadline = time.monotonic() + 10
        while runner.has_unfinished_requests:
            assert time.monotonic() < deadline, "the engine still generates for the frontend that went away"
            time.sleep(0.05)
        assert receiver.frontends_served == 1
    finally:
        stop.set()
        engine.join(30)
        receiver.close()
        close(client_a, pre_a)
        close(client_b, pre_b)
    assert not engine.is_alive()
    assert stats.requests == 9 and stats.tokens < 400 + 8 * 3
