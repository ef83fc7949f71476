"""Several frontends, one engine: three frontend processes, each with its own InputPreprocessor,
P0 cache and sockets, served by one ``mmfront worker`` running the tiny Gemma 3 with weights.

Each frontend sends 12 chat requests over the async client, drawing from one pool of images
that all frontends share and repeat. Every answer must equal what the same model gives
in-process (ModelRunner on the request processed without a cache), each frontend's P0 cache
must have hits (the cache stays on with several API servers, one receiver cache per frontend
in the worker), and no frontend may see a cache-miss resend, a shadow reset or a failure.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import preloaded
from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.cache.mirror import MirroredReceiverCache
from mmfront.cli import main
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.runner import ModelRunner
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.engine.worker import receiver_caches, run_worker
from mmfront.errors import ConfigError
from mmfront.metrics import snapshot
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams

FRONTENDS = 3
REQUESTS = 12
MAX_TOKENS = 3
CACHE_GB = 0.02
POOL = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(6)]
COMBOS = [(0,), (1, 2), (0, 3), (4,), (2,), (5, 1), (3, 4), (0, 1, 2)]
CTX = preloaded.CONTEXT  # the frontends run threads: forked from the preloaded interpreter, never from here


def messages(combo: tuple[int, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": POOL[i]}} for i in combo]
    return [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [*parts, {"type": "text", "text": "What is in these pictures?"}]}]


def plan(frontend: int) -> dict[str, tuple[int, ...]]:
    """Request id -> its images; ids are distinct across frontends, as the engine requires."""
    return {f"fe{frontend}-{n}": COMBOS[(3 * n + frontend) % len(COMBOS)] for n in range(REQUESTS)}


def params() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


async def _serve_requests(client: AsyncEngineClient, todo: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    gate = asyncio.Semaphore(8)
    answers: dict[str, Any] = {}

    async def one(request_id: str, combo: tuple[int, ...]) -> None:
        async with gate:
            tokens: list[int] = []
            try:
                stream = await client.add_request(request_id, messages(combo), params())
                async for output in stream:
                    tokens += output.new_token_ids
                    if output.error is not None:
                        raise RuntimeError(f"{output.error.code}: {output.error.message}")
                answers[request_id] = tokens
            except Exception as e:  # reported to the test, which names the request
                answers[request_id] = f"{type(e).__name__}: {e}"

    await asyncio.gather(*(one(rid, combo) for rid, combo in todo.items()))
    return answers


def frontend_main(conn: Connection, model_dir: str, index: int, cache: str) -> None:
    """One API server: bind, report the addresses, wait for the engine, send, report the answers."""
    config = MultiModalConfig(mm_processor_cache_gb=CACHE_GB, mm_processor_cache_type=cache)
    pre = InputPreprocessor(model_dir, config)
    transport = ZmqFrontendTransport("ipc", client_index=index)
    conn.send((transport.addresses.input, transport.addresses.output, getattr(pre.cache, "shm_name", None)))
    client = None
    try:
        transport.wait_for_engines([0], 120)
        client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=120)
        answers = asyncio.run(_serve_requests(client, plan(index)))
        conn.send({"answers": answers, "metrics": snapshot(pre, client)})
    finally:
        if client is not None:
            client.close_blocking()
        transport.close()
        if pre.cache is not None:
            pre.cache.close()


@functools.cache
def expected_tokens(model_dir: Path) -> dict[tuple[int, ...], list[int]]:
    """Each combination's greedy tokens, in-process: no cache, no wire, no worker (computed once
    for both caches' cases: the answers do not depend on the cache)."""
    processor = InputProcessor(InputPreprocessor(model_dir, MultiModalConfig(mm_processor_cache_gb=0)))
    runner = ModelRunner(model_dir)
    for n, combo in enumerate(COMBOS):
        runner.add(processor.process_inputs(str(n), messages(combo), params()))
    tokens: dict[str, list[int]] = {str(n): [] for n in range(len(COMBOS))}
    while runner.has_unfinished_requests:
        for output in runner.step():
            tokens[output.request_id] += output.new_token_ids
    return {combo: tokens[str(n)] for n, combo in enumerate(COMBOS)}


def _stop(proc: preloaded.Preloaded) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["lru", "shm"])
def test_three_frontend_processes_one_worker_cache_stays_on(gemma3_weights_dir: Path, cache: str) -> None:
    pipes = [CTX.Pipe() for _ in range(FRONTENDS)]
    procs = [CTX.Process(target=frontend_main, args=(child, str(gemma3_weights_dir), i, cache), daemon=True)
             for i, (_, child) in enumerate(pipes)]
    worker: preloaded.Preloaded | None = None
    try:
        for proc in procs:
            proc.start()
        addresses = []
        for parent, _ in pipes:
            assert parent.poll(120), "a frontend did not start"
            addresses.append(parent.recv())
        args = [sys.executable, "-m", "mmfront.cli", "worker", str(gemma3_weights_dir), "--cache", cache,
                "--cache-gb", str(CACHE_GB), "--json"]
        for input_address, output_address, shm_name in addresses:
            args += ["--input", input_address, "--output", output_address]
            if cache == "shm":
                args += ["--shm-name", shm_name]
        worker = preloaded.popen(args, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        reports = []
        for parent, _ in pipes:
            assert parent.poll(240), "a frontend did not finish"
            reports.append(parent.recv())
        worker_stats = json.loads(_stop(worker).strip().splitlines()[-1])
    finally:
        if worker is not None:
            _stop(worker)
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()

    expected = expected_tokens(gemma3_weights_dir)
    assert all(len(tokens) == MAX_TOKENS for tokens in expected.values())
    for index, report in enumerate(reports):
        todo = plan(index)
        assert set(report["answers"]) == set(todo)
        for request_id, combo in todo.items():
            assert report["answers"][request_id] == expected[combo], request_id
        metrics = report["metrics"]
        assert metrics["mm_cache_requests"] == REQUESTS, index
        assert metrics["mm_cache_queries"] == sum(len(combo) for combo in todo.values()), index
        distinct = {image for combo in todo.values() for image in combo}
        assert metrics["mm_cache_hits"] == metrics["mm_cache_queries"] - len(distinct) > 0, index  # all but firsts
        assert {k: metrics[k] for k in ("resends", "shadow_resets", "mirror_only", "failures", "engine_restarts")} \
            == dict.fromkeys(("resends", "shadow_resets", "mirror_only", "failures", "engine_restarts"), 0), index
        if cache == "lru":
            assert metrics["saved_bytes"] > 0, index
    assert worker_stats["requests"] == FRONTENDS * REQUESTS
    assert worker_stats["tokens"] == FRONTENDS * REQUESTS * MAX_TOKENS


def test_the_worker_keeps_one_receiver_cache_per_frontend() -> None:
    caches = receiver_caches(MultiModalConfig(mm_processor_cache_gb=0.01), 3, None)
    assert [type(c) for c in caches] == [MirroredReceiverCache] * 3
    assert len({id(c) for c in caches}) == 3
    assert receiver_caches(MultiModalConfig(mm_processor_cache_gb=0), 2, None) == [None, None]
    shm = MultiModalConfig(mm_processor_cache_gb=0.01, mm_processor_cache_type="shm")
    with pytest.raises(ConfigError, match="one segment name per frontend: 2 frontends, 1 names"):
        receiver_caches(shm, 2, ["mmfront-segment-0"])
    with pytest.raises(ConfigError, match="at least one frontend"):
        run_worker("unused", [])


@pytest.mark.parametrize(("argv", "message"), [
    (["--input", "ipc://a", "--output", "ipc://b", "--input", "ipc://c"],
     "2 --input and 1 --output addresses; give one --input and one --output per frontend"),
    (["--input", "ipc://a", "--output", "ipc://b", "--input", "ipc://c", "--output", "ipc://d", "--cache", "shm",
      "--shm-name", "seg-0"], "--cache shm needs one --shm-name per frontend (2), got 1"),
])
def test_worker_command_refuses_unpaired_addresses(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["worker", "unused-model", *argv])
    assert message in str(exc.value.code)
