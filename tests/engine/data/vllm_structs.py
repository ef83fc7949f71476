"""Requests, parameters and outputs encoded by vLLM 0.33's own ``MsgpackEncoder`` into
``vllm_structs.msgpack`` here.

``build(ns)`` builds the same objects from either vLLM's classes or mmfront's (``ns`` maps the
class names to either), so tests compare mmfront's frames with vLLM's byte for byte and decode
vLLM's frames with mmfront. Every one of ``EngineCoreRequest``'s 22 fields and every
``SamplingParams`` field is away from its default somewhere.

Regenerate in the vLLM peer venv (see vllm_frames.py)::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 <peer python> tests/engine/data/vllm_structs.py

The file is a msgpack map ``{name: [frame, ...]}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).parent
FILE = HERE / "vllm_structs.msgpack"


def full_sampling(ns: Any) -> Any:
    return ns.SamplingParams(
        n=1, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.1, temperature=0.7,
        watermarking=True, top_p=0.9, top_k=20, min_p=0.05, seed=7, stop=["\n\n", "END"],
        stop_token_ids=[106, 106, 1], ignore_eos=True, max_tokens=64, min_tokens=2, logprobs=5,
        prompt_logprobs=2, prompt_logprob_token_ids=np.array([[1, 2], [3, -1]]), prompt_logprob_start=1,
        logprob_token_ids=[5, 6], flat_logprobs=True, detokenize=True, skip_special_tokens=False,
        spaces_between_special_tokens=False, include_stop_str_in_output=False, output_kind=ns.RequestOutputKind.DELTA,
        stream_interval=4, skip_clone=True, _eos_token_id=1, _watermarking_skipped=True,
        structured_outputs=ns.StructuredOutputsParams(json={"type": "object"}), logit_bias={3: 1.5, 9: -2.0},
        allowed_token_ids=[1, 2, 3], extra_args={"k": [1, "v"]}, bad_words=["bad", "worse"],
        _bad_words_token_ids=[[11]], skip_reading_prefix_cache=False, thinking_token_budget=128,
        repetition_detection=ns.RepetitionDetectionParams(4, 1, 3), routed_experts_prompt_start=2,
        trace_decode_token_ids=[7, 8],
    )


def build(ns: Any) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    item = ns.MultiModalKwargsItem({
        "pixel_values": ns.MultiModalFieldElem(torch.randn(2, 3, 8, 8, generator=gen), ns.MultiModalBatchedField())})
    features = [
        ns.MultiModalFeatureSpec(item, "image", "lora-1:abc",
                                 ns.PlaceholderRange(3, 4, torch.tensor([0, 1, 1, 0]).bool()), "abc"),
        ns.MultiModalFeatureSpec(None, "image", "def", ns.PlaceholderRange(10, 2), "def"),
    ]
    full = ns.EngineCoreRequest(
        "req-full", list(range(20)), features, full_sampling(ns), None, 1.5,
        ns.LoRARequest("ad", 3, "/loras/ad", base_model_name="base", load_inplace=True, is_3d_lora_weight=True),
        "salt", 1, prompt_embeds=torch.randn(16, 32, generator=gen), prompt_is_token_ids=[True] * 20,
        client_index=2, current_wave=3, priority=-1, trace_headers={"traceparent": "00-ab"}, resumable=True,
        external_req_id="ext-1", reasoning_ended=False, reasoning_parser_kwargs={"effort": "high"},
        abort_immediately=True, session_id="s-1",
        kv_hints=ns.KvHintsEnvelope("1", "m-1", [ns.KvHintAction("a1", "pin", "1", {"blocks": [1, 2]})]),
    )
    pooling = ns.PoolingParams(use_activation=True, dimensions=64, task="embed",
                               late_interaction_params=ns.LateInteractionParams("cache_query", "q", 2),
                               late_chunking_params=ns.LateChunkingParams(16))
    greedy = ns.SamplingParams(temperature=0.0, top_p=0.5, top_k=3, stop="x", seed=-1, max_tokens=5)
    step = ns.EngineCoreOutputs(engine_index=1, timestamp=12.5, finished_requests={"a"}, outputs=[
        ns.EngineCoreOutput("a", [5, 6], finish_reason=ns.FinishReason.STOP, stop_reason="END",
                            events=[ns.EngineCoreEvent(ns.EngineCoreEventType.SCHEDULED, 3.25)], num_nans_in_logits=1),
        ns.EngineCoreOutput("b", [9], stop_reason=106),
    ])
    miss = ns.EngineCoreOutputs(engine_index=0, timestamp=2.0, finished_requests={"m"}, outputs=[
        ns.EngineCoreOutput("m", [], finish_reason=ns.FinishReason.ERROR, mm_cache_miss_hashes=["h1", "h2"])])
    return {
        "request_full": full,
        "request_pooling": ns.EngineCoreRequest("req-pool", [1, 2, 3], None, None, pooling, 0.0, None, None, None),
        "request_greedy": ns.EngineCoreRequest("req-greedy", [1], None, greedy, None, 0.0, None, None, None),
        "sampling_default": ns.SamplingParams(),
        "sampling_full": full_sampling(ns),
        "outputs_step": step,
        "outputs_miss": miss,
    }


def mmfront_namespace() -> SimpleNamespace:
    from mmfront import inputs
    from mmfront.wire import params, structs

    return SimpleNamespace(**{**vars(inputs), **vars(params), **vars(structs)})


def _vllm_namespace() -> SimpleNamespace:
    from vllm.lora.request import LoRARequest
    from vllm.multimodal import inputs
    from vllm.pooling_params import LateChunkingParams, LateInteractionParams, PoolingParams
    from vllm.sampling_params import (
        RepetitionDetectionParams,
        RequestOutputKind,
        SamplingParams,
        StructuredOutputsParams,
    )
    from vllm.v1 import engine
    from vllm.v1.kv_hints.protocol import KvHintAction, KvHintsEnvelope

    return SimpleNamespace(
        **{name: getattr(inputs, name) for name in (
            "MultiModalKwargsItem", "MultiModalFieldElem", "MultiModalBatchedField", "MultiModalFeatureSpec",
            "PlaceholderRange")},
        **{name: getattr(engine, name) for name in (
            "EngineCoreRequest", "EngineCoreOutputs", "EngineCoreOutput", "EngineCoreEvent", "EngineCoreEventType",
            "FinishReason")},
        LoRARequest=LoRARequest, PoolingParams=PoolingParams, LateChunkingParams=LateChunkingParams,
        LateInteractionParams=LateInteractionParams, SamplingParams=SamplingParams,
        StructuredOutputsParams=StructuredOutputsParams, RepetitionDetectionParams=RepetitionDetectionParams,
        RequestOutputKind=RequestOutputKind, KvHintAction=KvHintAction, KvHintsEnvelope=KvHintsEnvelope,
    )


def _main() -> None:
    import msgspec
    from vllm.v1.serial_utils import MsgpackEncoder

    encoder = MsgpackEncoder(size_threshold=256)
    out = {name: [bytes(memoryview(f).cast("B")) for f in encoder.encode(obj)]
           for name, obj in build(_vllm_namespace()).items()}
    FILE.write_bytes(msgspec.msgpack.encode(out))
    print({name: [len(f) for f in frames] for name, frames in out.items()}, file=sys.stderr)


if __name__ == "__main__":
    _main()
