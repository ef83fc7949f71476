"""`mmfront worker` serves random-weight Qwen2.5-VL and LLaVA-OneVision folders (served by the
transformers backend, with their own model modules): each chat's greedy tokens equal
``model.generate`` on the HF processor's outputs for the same conversation, a repeated chat's
images come from the caches, and the prefill logits of the reference engine match within float
tolerance (Qwen2.5-VL's only with its M-RoPE positions)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from dataclasses import replace

import pytest
import torch
from runner_cases import Family, Item, conversation, image_item
from test_frontends import _stop

from local_services import start_worker_command
from mmfront import InputPreprocessor, InputProcessor
from mmfront.engine import runner as runner_module
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.runner import ModelRunner
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.models.catalog import model_specs
from mmfront.testing.models import build_model_folder
from mmfront.wire import SamplingParams

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None,
    reason="these processors take a video processor, which transformers builds only with torchvision "
           "(`make test` installs it; docs/models.md, 'torchvision')")

MAX_TOKENS = 6

#: chats of one user turn each: two images of different sizes, one image, then the first again
CHATS: dict[str, list[list[Item]]] = {
    "two": [[image_item(64, 48, 0), image_item(40, 72, 1)]],
    "one": [[image_item(100, 30, 2)]],
    "again": [[image_item(64, 48, 0), image_item(40, 72, 1)]],
}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "llava_onevision"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    kind = request.param
    # the reference engine runs these float32 checkpoints in float32: the frontend sends float32 pixels
    # (vLLM's --dtype float32), not the bfloat16 of --dtype auto, so the logits compare at float tolerance
    folder = build_model_folder(kind, tmp_path_factory.mktemp(kind), with_weights=True)
    return Family(kind, folder, "images")


async def _chat(client: AsyncEngineClient, request_id: str, turns: list[list[Item]]) -> list[int]:
    tokens: list[int] = []
    stream = await client.add_request(request_id, conversation(turns), SamplingParams(max_tokens=MAX_TOKENS,
                                                                                      temperature=0.0))
    async for output in stream:
        assert output.error is None, output.error
        tokens += output.new_token_ids
    return tokens


@pytest.mark.slow
def test_worker_tokens_equal_transformers_generate(family: Family) -> None:
    config = replace(family.config, mm_processor_cache_gb=0.02)
    pre = InputPreprocessor(family.folder, config)
    transport = ZmqFrontendTransport("ipc")
    worker = start_worker_command(family.folder, transport.addresses.input, transport.addresses.output,
                                  config.mm_processor_cache_gb)
    client = None
    try:
        transport.wait_for_engines([0], 120)
        client = AsyncEngineClient(InputProcessor(pre), transport, engine_timeout_s=120)

        async def serve() -> dict[str, list[int]]:
            return {rid: await _chat(client, rid, turns) for rid, turns in CHATS.items()}  # type: ignore[arg-type]

        answers = asyncio.run(serve())
    finally:
        if client is not None:
            client.close_blocking()
        out = _stop(worker)
        transport.close()
    assert answers == {rid: family.reference(turns, MAX_TOKENS)[1] for rid, turns in CHATS.items()}
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["requests"] == len(CHATS)
    assert stats["encoder_hits"] >= 2  # the repeated chat's two images were encoded once
    assert pre.stats.hits >= 2  # and went to the worker as references to its cache


def test_prefill_logits_equal_transformers(family: Family, monkeypatch: pytest.MonkeyPatch) -> None:
    turns = CHATS["two"]
    request = family.request("r", turns)
    prompt, _, logits = family.reference(turns)
    assert request.prompt_token_ids == prompt
    assert torch.allclose(ModelRunner(family.folder).prefill_logits(request), logits, rtol=1e-4, atol=1e-4)
    reference = model_specs()[family.kind].reference
    if reference is not None and reference.positions is not None:
        # without its M-RoPE positions the runner numbers the prompt 0..n-1 and the logits move:
        # the equality proves the positions, not just the embeddings
        monkeypatch.setattr(runner_module, "reference_model", lambda model_type: replace(reference, positions=None))
        plain = ModelRunner(family.folder).prefill_logits(request)
        assert not torch.allclose(plain, logits, rtol=1e-4, atol=1e-4)
