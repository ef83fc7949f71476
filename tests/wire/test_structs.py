"""Requests, parameters and outputs against vLLM 0.33's own frames (tests/engine/data/vllm_structs.*),
SamplingParams' normalisation and its typed validation errors."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch

from mmfront.errors import DecodeError, ValidationError
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.params import (
    LoRARequest,
    RepetitionDetectionParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from mmfront.wire.structs import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
)

DATA = Path(__file__).parents[1] / "engine" / "data"
_spec = importlib.util.spec_from_file_location("vllm_structs", DATA / "vllm_structs.py")
assert _spec is not None and _spec.loader is not None
STRUCTS = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(STRUCTS)

VLLM: dict[str, list[bytes]] = msgspec.msgpack.decode(STRUCTS.FILE.read_bytes())
MMFRONT = STRUCTS.build(STRUCTS.mmfront_namespace())
TYPES: dict[str, Any] = {
    "request_full": EngineCoreRequest, "request_pooling": EngineCoreRequest, "request_greedy": EngineCoreRequest,
    "sampling_default": SamplingParams, "sampling_full": SamplingParams,
    "outputs_step": EngineCoreOutputs, "outputs_miss": EngineCoreOutputs,
}

VLLM_REQUEST_FIELDS = (
    "request_id", "prompt_token_ids", "mm_features", "sampling_params", "pooling_params", "arrival_time",
    "lora_request", "cache_salt", "data_parallel_rank", "prompt_embeds", "prompt_is_token_ids", "client_index",
    "current_wave", "priority", "trace_headers", "resumable", "external_req_id", "reasoning_ended",
    "reasoning_parser_kwargs", "abort_immediately", "session_id", "kv_hints",
)


def raw(frames: list[Any]) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def test_fixture_set_is_complete() -> None:
    assert set(VLLM) == set(MMFRONT) == set(TYPES)
    assert [len(VLLM[n]) for n in TYPES] == [3, 1, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("name", sorted(TYPES))
def test_mmfront_frames_equal_vllm_frames_byte_for_byte(name: str) -> None:
    assert raw(MsgpackEncoder(size_threshold=256).encode(MMFRONT[name])) == VLLM[name]


@pytest.mark.parametrize("name", sorted(TYPES))
def test_mmfront_decodes_vllm_frames_to_the_same_message(name: str) -> None:
    decoded = MsgpackDecoder(TYPES[name]).decode([bytearray(f) for f in VLLM[name]])
    assert raw(MsgpackEncoder().encode(decoded)) == VLLM[name]


def test_engine_core_request_has_vllms_22_fields_in_order() -> None:
    assert EngineCoreRequest.__struct_fields__ == VLLM_REQUEST_FIELDS
    request = EngineCoreRequest("r", [1], None, None, None, 0.0, None, None, None)  # the 9 required, positionally
    assert msgspec.msgpack.decode(MsgpackEncoder().encode(request)[0])[:9] == ["r", [1], None, None, None, 0.0,
                                                                             None, None, None]
    assert len(msgspec.msgpack.decode(MsgpackEncoder().encode(request)[0])) == 22


def test_full_request_decodes_field_by_field() -> None:
    got = MsgpackDecoder(EngineCoreRequest).decode([bytearray(f) for f in VLLM["request_full"]])
    want = MMFRONT["request_full"]
    assert (got.lora_request, got.kv_hints, got.trace_headers, got.session_id) == (
        want.lora_request, want.kv_hints, want.trace_headers, "s-1")
    assert torch.equal(got.prompt_embeds, want.prompt_embeds)
    params = got.sampling_params
    assert params.output_kind is RequestOutputKind.DELTA
    assert params.structured_outputs == StructuredOutputsParams(json={"type": "object"})
    assert params.logit_bias == {3: 1.5, 9: -2.0}
    assert np.array_equal(params.prompt_logprob_token_ids, [[1, 2], [3, -1]])
    assert (params.stop_token_ids, params._all_stop_token_ids, params.output_text_buffer_length) == (
        [106, 1], {106, 1}, 2)


def test_newer_trailing_fields_are_ignored_by_an_older_decoder() -> None:
    class OldOutput(msgspec.Struct, array_like=True):
        request_id: str
        new_token_ids: list[int]

    frames = MsgpackEncoder().encode(EngineCoreOutput("r", [1], mm_cache_miss_hashes=["h"]))
    assert MsgpackDecoder(OldOutput).decode(frames) == OldOutput("r", [1])


def test_outputs_timestamp_defaults_to_now_and_finish_reason_reads_as_vllms() -> None:
    before = time.monotonic()
    assert before <= EngineCoreOutputs().timestamp <= time.monotonic()
    assert str(FinishReason.ERROR) == "error"
    assert EngineCoreOutput("r", [], finish_reason=FinishReason.LENGTH).finished
    assert not EngineCoreOutput("r", []).finished


def test_sampling_params_normalise_as_vllm() -> None:
    params = SamplingParams(stop="ab", seed=-1, stop_token_ids=[3, 3, 2], bad_words=["x", "x"], prompt_logprobs=1,
                            thinking_token_budget=-1)
    assert (params.stop, params.seed, params.stop_token_ids, params.bad_words) == (["ab"], None, [3, 2], ["x"])
    assert (params.output_text_buffer_length, params._all_stop_token_ids) == (1, {2, 3})
    assert (params.skip_reading_prefix_cache, params.thinking_token_budget) == (True, None)
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=4, min_p=0.2)
    assert (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)
    assert SamplingParams(temperature=0.001).temperature == 0.01
    assert SamplingParams(stop=["abc"], include_stop_str_in_output=True).output_text_buffer_length == 0


@pytest.mark.parametrize(("kwargs", "parameter", "match"), [
    ({"n": 0}, "n", "n must be at least 1"),
    ({"n": 2, "temperature": 0.0}, "n", "n must be 1 when using greedy sampling"),
    ({"presence_penalty": 2.5}, "presence_penalty", r"\[-2, 2\]"),
    ({"frequency_penalty": -3.0}, "frequency_penalty", r"\[-2, 2\]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", "greater than zero"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty", "finite"),
    ({"temperature": 2.5}, "temperature", r"\[0, 2\]"),
    ({"temperature": float("inf")}, "temperature", "finite"),
    ({"temperature": -1.0}, "temperature", "non-negative"),
    ({"top_p": 0.0}, "top_p", r"\(0, 1\]"),
    ({"top_k": -2}, "top_k", "top_k must be 0"),
    ({"min_p": 1.5}, "min_p", r"\[0, 1\]"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "max_tokens=4"),
    ({"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
    ({"stream_interval": 0}, "stream_interval", "at least 1"),
    ({"logprobs": -2}, "logprobs", "non-negative or -1"),
    ({"prompt_logprobs": -5}, "prompt_logprobs", "non-negative or -1"),
    ({"stop": ["a", ""]}, "stop", "empty string"),
    ({"stop": "a", "detokenize": False}, "stop", "detokenize=True"),
    ({"bad_words": [""]}, "bad_words", "empty string"),
    ({"extra_args": {"k": [2**64]}}, "extra_args", r"2\*\*64 - 1"),
    ({"thinking_token_budget": -3}, "thinking_token_budget", "non-negative integer"),
    ({"thinking_token_budget": True}, "thinking_token_budget", "non-negative integer"),
])
def test_bad_sampling_params_name_the_parameter(kwargs: dict[str, Any], parameter: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match) as info:
        SamplingParams(**kwargs)
    assert info.value.parameter == parameter


PEER_VERIFY = """
import json, sys
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams
answers = []
for fields in json.loads(sys.stdin.read()):
    try:
        SamplingParams(**fields)
        answers.append(None)
    except VLLMValidationError as e:
        answers.append({"message": str(e), "words": e.args[0], "parameter": e.parameter})
print(json.dumps(answers))
"""
OUT_OF_RANGE: list[dict[str, Any]] = [
    {"n": 0}, {"n": 2, "temperature": 0.0}, {"presence_penalty": 2.5}, {"frequency_penalty": -3.0},
    {"repetition_penalty": 0.0}, {"repetition_penalty": float("nan")}, {"temperature": -1.0},
    {"temperature": 2.5}, {"temperature": float("inf")}, {"top_p": 0.0}, {"top_k": -2}, {"min_p": 1.5},
    {"max_tokens": 0}, {"min_tokens": 5, "max_tokens": 4}, {"min_tokens": -1}, {"stream_interval": 0},
    {"logprobs": -2}, {"prompt_logprobs": -5}, {"stop": ["a", ""]}, {"stop": "a", "detokenize": False},
    {"bad_words": ["a", ""]}, {"extra_args": {"k": [2**64]}}, {"temperature": -1.0, "presence_penalty": 3.0},
]


def test_a_value_out_of_range_is_refused_in_vllms_words() -> None:
    """Each case refused with vLLM's ``SamplingParams``' message (its first failing check, in its
    order); where vLLM's error names the field and value, mmfront's API message is vLLM's whole
    (``vllm_message``). Where vLLM's names none, mmfront still names the field (docs/serving.md)."""
    python = vllm_peer_python()
    if python is None:
        pytest.skip(SKIP_REASON)
    run = subprocess.run([str(python), "-c", PEER_VERIFY], input=json.dumps(OUT_OF_RANGE), capture_output=True,
                         text=True, timeout=300, check=False, env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    for fields, want in zip(OUT_OF_RANGE, json.loads(run.stdout.strip().splitlines()[-1]), strict=True):
        assert want is not None, fields
        with pytest.raises(ValidationError) as info:
            SamplingParams(**fields)
        assert str(info.value) == want["words"], fields
        if want["parameter"] is not None:
            assert info.value.vllm_message() == want["message"], fields


@pytest.mark.parametrize(("make", "parameter"), [
    (StructuredOutputsParams, None),  # vLLM's VLLMValidationError names no parameter for these two
    (lambda: StructuredOutputsParams(regex="a", grammar="b"), None),
    (lambda: RepetitionDetectionParams(2, 3, 2), "repetition_detection"),
    (lambda: RepetitionDetectionParams(4, 1, 1), "repetition_detection"),
    (lambda: LoRARequest("ad", 0, "/ad"), "lora_request"),
])
def test_bad_nested_params_name_the_parameter(make: Any, parameter: str) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    assert info.value.parameter == parameter


def test_invalid_params_on_the_wire_are_a_decode_error() -> None:
    body = msgspec.msgpack.encode({"temperature": 9.0})
    with pytest.raises(DecodeError, match="temperature must be in"):
        MsgpackDecoder(SamplingParams).decode(body)
