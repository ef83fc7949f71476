"""mmfront's client in front of a STOCK vLLM 0.33 engine core, through vLLM's start-up handshake.

The engine is ``../shared/peer/stock_engine.py`` (``vllm serve --headless`` with a stub
executor: generated token k of a request is 1000 + 10 * n + k, n = images that reached the
executor with their data, so the tokens prove every image arrived resolved). P0 binds the
handshake socket as vLLM's API server does with ``--data-parallel-size-local 0``, and uses none
of mmfront's extras: the engine announced none.

Skipped where the peer venv or its model folder is absent (:mod:`mmfront.testing.peer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.handshake import DataParallelConfig, FrontendHandshake
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.errors import EngineDeadError
from mmfront.network import get_open_port
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import (
    MMFRONT_EXTRAS,
    EngineCoreReadyResponse,
    EngineHandshakeMetadata,
    HandshakeAddresses,
    HandshakeStatus,
)

PEER = vllm_peer_python()
MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
PEER_DIR = Path(__file__).resolve().parents[3] / "shared" / "peer"
pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

POOL = [image_data_url(make_image(40 + 8 * i, 32 + 4 * i, seed=i)) for i in range(5)]
STARTUP_S = 300


def chat(images: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": POOL[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in these pictures?"}]}]


def expected(images: tuple[int, ...], max_tokens: int) -> list[int]:
    return [1000 + 10 * len(images) + k for k in range(max_tokens)]


@dataclass
class Stock:
    client: AsyncEngineClient
    proc: subprocess.Popen[bytes]
    trace: Path
    pre: InputPreprocessor


def start_stock(tmp_path: Path, ranks: int = 1, **env: str) -> Stock:
    """Bind P0 and its handshake socket, start the stock engine headless (``ranks`` data-parallel
    ranks, as ``vllm serve --headless --data-parallel-size N --data-parallel-size-local N``), run
    the handshake."""
    assert PEER is not None and MODEL is not None
    pre = InputPreprocessor(MODEL, MultiModalConfig())
    port = get_open_port()
    transport = ZmqFrontendTransport("tcp")
    trace = tmp_path / "trace.jsonl"
    handshake = FrontendHandshake(transport, DataParallelConfig(ranks, 0, "127.0.0.1", port))
    proc = subprocess.Popen(
        [str(PEER), str(PEER_DIR / "stock_engine.py"), "--dp-size", str(ranks), "--dp-local", str(ranks), str(MODEL),
         handshake.address, "--", "--distributed-executor-backend", "stub_trace.TraceStubExecutor"],
        cwd=PEER_DIR, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "engine.log", "wb"),  # noqa: SIM115
        env={**os.environ, "STUB_TRACE_LOG": str(trace), **env}, start_new_session=True)
    try:
        infos = handshake.wait(STARTUP_S)
    except BaseException:
        kill(proc)
        transport.close()
        raise
    finally:
        handshake.close()
    return Stock(AsyncEngineClient(InputProcessor(pre), transport, engines=infos), proc, trace, pre)


def kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@pytest.fixture(scope="module")
def stock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stock]:
    running = start_stock(tmp_path_factory.mktemp("stock"), STUB_TRACE_STEP_DELAY_S="0.02")
    yield running
    running.client.close_blocking()
    kill(running.proc)
    if running.pre.cache is not None:
        running.pre.cache.close()


def trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def collect(client: AsyncEngineClient, request_id: str, images: tuple[int, ...], max_tokens: int) -> list[int]:
    stream = await client.add_request(request_id, chat(images), SamplingParams(max_tokens=max_tokens))
    return [t async for output in stream for t in output.new_token_ids]


def test_handshake_gives_the_client_the_engines_limits(stock: Stock) -> None:
    engine = stock.client.client.engine
    assert engine is not None
    assert (engine.max_model_len, engine.block_size) == (4096, 16)
    assert engine.num_gpu_blocks > 0
    assert engine.extras == frozenset() and not engine.local


def test_twenty_concurrent_chats_with_repeated_images(stock: Stock) -> None:
    combos = [tuple(sorted({i % 5, (3 * i + 1) % 5})) for i in range(20)]

    async def main() -> list[list[int]]:
        return list(await asyncio.gather(*(collect(stock.client, f"chat-{i}", c, 4) for i, c in enumerate(combos))))

    before = stock.client.stats.saved_bytes
    assert asyncio.run(asyncio.wait_for(main(), 120)) == [expected(c, 4) for c in combos]
    assert stock.client.stats.saved_bytes > before  # some images went as references, resolved by vLLM's P1 cache
    assert stock.client.stats.failures == 0


def test_an_abort_stops_generation(stock: Stock) -> None:
    async def main() -> None:
        stream = await stock.client.add_request("long", chat((0,)), SamplingParams(max_tokens=1000))
        got = 0
        async for output in stream:
            got += len(output.new_token_ids)
            if got >= 3:
                await stock.client.abort("long")

    asyncio.run(asyncio.wait_for(main(), 60))
    deadline = time.monotonic() + 20
    while not [e for e in trace(stock.trace) if e["ev"] == "finished" and e["req_id"].startswith("long")]:
        assert time.monotonic() < deadline, "the engine never finished the aborted request"
        time.sleep(0.2)
    [finished] = [e for e in trace(stock.trace) if e["ev"] == "finished" and e["req_id"].startswith("long")]
    assert finished["generated"] < 1000


def test_utility_calls_answer_on_the_stock_engine(stock: Stock) -> None:
    """vLLM's own engine answers mmfront's utility calls; after ``reset_mm_cache`` both caches are
    empty, so images seen before travel with their data again (no reference, no miss, no resend)."""
    async def main() -> tuple[tuple[str, ...], list[int], bool]:
        await collect(stock.client, "before-reset", (0, 1), 2)
        tasks = await stock.client.get_supported_tasks()
        await stock.client.reset_mm_cache()
        saved, resends = stock.client.stats.saved_bytes, stock.client.stats.resends
        again = await collect(stock.client, "after-reset", (0, 1), 3)
        assert (stock.client.stats.saved_bytes, stock.client.stats.resends) == (saved, resends)
        return tasks, again, await stock.client.is_sleeping()

    tasks, again, sleeping = asyncio.run(asyncio.wait_for(main(), 120))
    assert "generate" in tasks
    assert again == expected((0, 1), 3)
    assert sleeping is False


def test_sigkill_mid_request_fails_it_within_30_s(tmp_path: Path) -> None:
    running = start_stock(tmp_path, STUB_TRACE_STEP_DELAY_S="0.2")
    try:
        async def main() -> float:
            stream = await running.client.add_request("doomed", chat((1,)), SamplingParams(max_tokens=1000))
            await anext(stream)
            os.killpg(running.proc.pid, signal.SIGKILL)
            start = time.monotonic()
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    pass
            return time.monotonic() - start

        assert asyncio.run(asyncio.wait_for(main(), 60)) < 30
    finally:
        running.client.close_blocking()
        kill(running.proc)


def test_two_data_parallel_ranks_share_the_chats_and_each_resolves_its_references(tmp_path: Path) -> None:
    """Two stock ranks (vLLM's non-MoE data parallelism: independent engines, no DPCoordinator named
    in the handshake, so none is waited for): the chats spread over both, each rank's P1 cache
    resolves the references its own P0 mirror sent (no miss, no resend), utility calls reach both."""
    running = start_stock(tmp_path, ranks=2, STUB_TRACE_STEP_DELAY_S="0.02")
    try:
        assert [info.engine_index for info in running.client.client.engines] == [0, 1]
        combos = [tuple(sorted({i % 5, (3 * i + 1) % 5})) for i in range(20)]

        async def main() -> tuple[list[list[int]], Any]:
            answers = await asyncio.gather(*(collect(running.client, f"dp-{i}", c, 4) for i, c in enumerate(combos)))
            tasks = await running.client.get_supported_tasks()
            await running.client.reset_mm_cache()
            return list(answers), tasks

        answers, tasks = asyncio.run(asyncio.wait_for(main(), 180))
        assert answers == [expected(c, 4) for c in combos]
        sent = [rank.sent for rank in running.client.client.ranks]
        assert sum(sent) == 20 and min(sent) >= 5, sent
        stats = running.client.stats
        assert stats.saved_bytes > 0 and stats.resends == 0 and stats.failures == 0
        assert "generate" in tasks
    finally:
        running.client.close_blocking()
        kill(running.proc)


def test_a_thirty_second_first_step_completes(tmp_path: Path) -> None:
    running = start_stock(tmp_path, STUB_EXECUTOR_FIRST_STEP_DELAY_S="30")
    try:
        answer = asyncio.run(asyncio.wait_for(collect(running.client, "patient", (2, 3), 3), 120))
        assert answer == expected((2, 3), 3)
    finally:
        running.client.close_blocking()
        kill(running.proc)


VLLM_DECODE = """
import json, sys, msgspec
from vllm.v1.engine import EngineCoreReadyResponse
from vllm.v1.engine.utils import EngineHandshakeMetadata
hello, ready, metadata = (bytes.fromhex(h) for h in sys.argv[1:4])
said = msgspec.msgpack.decode(hello)
got = msgspec.msgpack.decode(ready, type=EngineCoreReadyResponse)
meta = msgspec.msgpack.decode(metadata, type=EngineHandshakeMetadata)
print(json.dumps([said["status"], said["local"], said["headless"], got.max_model_len, got.num_gpu_blocks,
                  got.block_size, meta.addresses.inputs, meta.addresses.outputs, meta.parallel_config]))
"""


def test_vllm_reads_the_handshake_messages_of_mmfront_engines_and_frontends() -> None:
    """What vLLM's frontend reads from an mmfront engine (its HELLO, with the extra key, and its
    ready response), and what vLLM's engine reads from mmfront's frontend, decode with vLLM's
    own types."""
    assert PEER is not None
    encode = msgspec.msgpack.encode
    hello = encode(HandshakeStatus("HELLO", False, True, mmfront_extras=sorted(MMFRONT_EXTRAS)))
    ready = encode(EngineCoreReadyResponse(max_model_len=8192, num_gpu_blocks=8192, block_size=1))
    metadata = encode(EngineHandshakeMetadata(HandshakeAddresses(["tcp://127.0.0.1:1"], ["tcp://127.0.0.1:2"])))
    done = subprocess.run([str(PEER), "-c", VLLM_DECODE, hello.hex(), ready.hex(), metadata.hex()],
                          capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "HELLO", False, True, 8192, 8192, 1, ["tcp://127.0.0.1:1"], ["tcp://127.0.0.1:2"], {}]
