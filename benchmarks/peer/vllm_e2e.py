"""vLLM 0.33's own path from an OpenAI chat request to the frames it sends the engine, measured
the way ``bench_e2e.py`` measures mmfront's: the path ``AsyncLLM`` and the chat server take.

Per request: ``HfRenderer.render_chat_async`` (chat parsing, media loading through vLLM's
``MediaConnector``, the chat template, tokenization, then the multimodal processor with its P0
LRU sender cache on the renderer's single multimodal worker), ``InputProcessor.process_inputs``
(the ``EngineCoreRequest`` and its checks), ``assign_request_id``, and ``MsgpackEncoder.encode``
(what the core client sends). Concurrency is AsyncLLM's: requests are coroutines on one event
loop, at most ``in_flight`` at a time (an ``asyncio.Semaphore``), and the renderer hands the
blocking parts to its own executors.

Runs inside the vLLM peer venv (``../shared/peer/vllm_peer_setup.sh``), never in mmfront's, and
stays up so that ``bench_e2e.py`` can alternate rounds with mmfront's. It prints one JSON line when
it is ready, then, for each JSON line ``{"workload": PATH, "in_flight": K}`` read from stdin (PATH:
JSON lines of ``{"request_id", "messages", "max_tokens"}``), clears its P0 cache, runs the
workload and prints ``{"requests_per_s", "wire_bytes", "hit_ratio"}``, until stdin closes::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 /tmp/vllm-peer-venv/bin/python \
        benchmarks/peer/vllm_e2e.py /tmp/vllm-peer-venv/models/tiny-gemma3-896
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    args = parser.parse_args()

    from vllm import SamplingParams
    from vllm.config import ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config
    from vllm.renderers.params import ChatParams
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.serial_utils import MsgpackEncoder

    started = time.perf_counter()
    model_config = ModelConfig(model=args.model_dir, tokenizer=args.model_dir, max_model_len=8192)
    vllm_config = VllmConfig(model_config=model_config)
    renderer = renderer_from_config(vllm_config)
    input_processor = InputProcessor(vllm_config, renderer)
    encoder = MsgpackEncoder()
    chat_params = ChatParams()
    assert renderer.mm_processor_cache is not None, "the P0 processor cache must be on (vLLM's default)"

    async def one(request: dict[str, Any]) -> int:
        _, (prompt,) = await renderer.render_chat_async([request["messages"]], chat_params)
        engine_request = input_processor.process_inputs(
            request["request_id"], prompt, SamplingParams(max_tokens=request["max_tokens"], temperature=0.0),
            supported_tasks=("generate",))
        input_processor.assign_request_id(engine_request)
        return sum(memoryview(frame).nbytes for frame in encoder.encode(engine_request))

    async def run(requests: list[dict[str, Any]], in_flight: int) -> dict[str, Any]:
        renderer.clear_mm_cache()
        renderer.stat_mm_cache()  # takes (and so resets) the counts of earlier rounds
        gate = asyncio.Semaphore(in_flight)

        async def gated(request: dict[str, Any]) -> int:
            async with gate:
                return await one(request)

        t0 = time.perf_counter()
        sizes = await asyncio.gather(*(gated(r) for r in requests))
        wall = time.perf_counter() - t0
        stats = renderer.stat_mm_cache()
        return {"requests_per_s": len(requests) / wall, "wire_bytes": sum(sizes),
                "hit_ratio": stats.hits / stats.queries if stats is not None and stats.queries else None}

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        print(json.dumps({"ready": True, "setup_s": time.perf_counter() - started}), flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            with open(command["workload"], encoding="utf-8") as f:
                requests = [json.loads(row) for row in f if row.strip()]
            print(json.dumps(await run(requests, int(command["in_flight"]))), flush=True)

    asyncio.run(serve())


if __name__ == "__main__":
    main()
