"""vLLM 0.33's own frontend in front of a stock engine core, timed the way ``bench_link.py`` times
mmfront's ``AsyncEngineClient`` on the same kind of engine.

``AsyncLLM`` with zero local engines (``data_parallel_size_local=0``, what ``vllm serve
--data-parallel-size-local 0`` builds): it binds the handshake socket at
``--data-parallel-address``/``--data-parallel-rpc-port`` and waits for a headless engine there.
Per request, the path of vLLM's chat server: ``renderer.render_chat_async`` (chat parsing, media
loading, template, tokens, the processor with its P0 cache) then ``AsyncLLM.generate``, read to
the end, its outputs streamed as deltas of token ids (``detokenize=False``: mmfront's client
returns token ids too, so neither side detokenizes). Every answer must be the stub executor's
tokens (token k = 1000 + 10 * images + k), or the run fails.

Runs inside the vLLM peer venv, one process per engine. Arguments: the model folder and the
handshake address ``tcp://HOST:PORT``. It builds its ``VllmConfig`` (imports and config are not
timed), prints ``{"ready": true}``, then reads one JSON line ``{"first": PATH, "rounds": [[PATH,
IN_FLIGHT], ...]}`` (PATH: JSON lines of ``{"request_id", "messages", "max_tokens"}``); the
caller starts the engine as it writes that line. It then creates ``AsyncLLM`` (the handshake),
sends the one request of ``first``, runs each round with at most IN_FLIGHT requests at a time,
prints ``{"connected_at", "first_output_at", "requests_per_s": [...]}`` (``time.time()`` stamps),
shuts down and exits::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 /tmp/vllm-peer-venv/bin/python \
        benchmarks/peer/vllm_link.py /tmp/vllm-peer-venv/models/tiny-gemma3-896 tcp://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any


def load(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(row) for row in f if row.strip()]


def expected_tokens(request: dict[str, Any]) -> list[int]:
    images = sum(1 for message in request["messages"] if isinstance(message["content"], list)
                 for part in message["content"] if part.get("type") == "image_url")
    return [1000 + 10 * images + k for k in range(request["max_tokens"])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("handshake", help="tcp://HOST:PORT, where the stock engine will look for its frontend")
    args = parser.parse_args()

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.renderers.params import ChatParams
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    host, port = args.handshake.removeprefix("tcp://").rsplit(":", 1)
    engine_args = AsyncEngineArgs(
        model=args.model_dir, tokenizer=args.model_dir, max_model_len=4096, limit_mm_per_prompt={"image": 4},
        data_parallel_size=1, data_parallel_size_local=0, data_parallel_address=host,
        data_parallel_rpc_port=int(port), disable_log_stats=True)
    vllm_config = engine_args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    chat_params = ChatParams()

    async def answer(llm: AsyncLLM, request: dict[str, Any]) -> float:
        """The request's tokens checked; when its first output came."""
        _, (prompt,) = await llm.renderer.render_chat_async([request["messages"]], chat_params)
        params = SamplingParams(max_tokens=request["max_tokens"], temperature=0.0, detokenize=False,
                                output_kind=RequestOutputKind.DELTA)
        tokens: list[int] = []
        first_at = 0.0
        async for output in llm.generate(prompt, params, request["request_id"]):
            first_at = first_at or time.time()
            tokens.extend(output.outputs[0].token_ids)
        if tokens != expected_tokens(request):
            raise RuntimeError(f"{request['request_id']} answered {tokens}, expected {expected_tokens(request)}")
        return first_at

    async def run(llm: AsyncLLM, requests: list[dict[str, Any]], in_flight: int) -> float:
        gate = asyncio.Semaphore(in_flight)

        async def gated(request: dict[str, Any]) -> None:
            async with gate:
                await answer(llm, request)

        t0 = time.perf_counter()
        await asyncio.gather(*(gated(r) for r in requests))
        return len(requests) / (time.perf_counter() - t0)

    async def serve(command: dict[str, Any]) -> None:
        first = load(command["first"])
        rounds = [(load(path), int(in_flight)) for path, in_flight in command["rounds"]]
        llm = AsyncLLM.from_vllm_config(vllm_config, usage_context=UsageContext.OPENAI_API_SERVER,
                                        disable_log_stats=True)
        connected_at = time.time()
        try:
            [first_output_at] = [await answer(llm, request) for request in first]
            rates = [await run(llm, requests, in_flight) for requests, in_flight in rounds]
            # said before the shutdown: the caller may end this process once its engine is gone
            print(json.dumps({"connected_at": connected_at, "first_output_at": first_output_at,
                              "requests_per_s": rates}), flush=True)
        finally:
            llm.shutdown()

    print(json.dumps({"ready": True}), flush=True)
    command = json.loads(sys.stdin.readline())
    asyncio.run(serve(command))


if __name__ == "__main__":
    main()
