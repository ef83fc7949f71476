"""`mmfront worker` as a separate process: 50 chat requests with repeated images over ipc://,
every answer equal to the same model run in-process, and the worker's encoder cache hits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_frontends import COMBOS, _serve_requests, _stop, expected_tokens

from local_services import start_worker_command
from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.preprocess import InputPreprocessor, InputProcessor

REQUESTS = 50


@pytest.mark.slow
def test_fifty_requests_through_a_worker_process_equal_the_in_process_model(gemma3_weights_dir: Path) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=0.02)
    pre = InputPreprocessor(gemma3_weights_dir, config)
    transport = ZmqFrontendTransport("ipc")
    worker = start_worker_command(gemma3_weights_dir, transport.addresses.input, transport.addresses.output,
                                  config.mm_processor_cache_gb)
    client = None
    try:
        transport.wait_for_engines([0], 120)
        client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=120)
        todo = {f"req-{n}": COMBOS[n % len(COMBOS)] for n in range(REQUESTS)}
        answers = asyncio.run(_serve_requests(client, todo))
    finally:
        if client is not None:
            client.close_blocking()
        out = _stop(worker)
        transport.close()
    want = expected_tokens(gemma3_weights_dir)
    assert {rid: answers[rid] for rid in todo} == {rid: want[combo] for rid, combo in todo.items()}
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["requests"] == REQUESTS
    assert stats["encoder_lookups"] > stats["encoder_hits"] > 0  # repeated images are encoded once
    assert pre.stats.hits > 0  # and sent as references to P1's cache
