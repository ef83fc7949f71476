"""Request bodies to typed requests and ``SamplingParams`` with vLLM's defaults and checks; the
field a malformed body gets wrong is named ``body.<field>``; ``n`` choices get seeds of their
own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mmfront.errors import ValidationError
from mmfront.serve import protocol
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.wire import RequestOutputKind, SamplingParams

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    request: ChatCompletionRequest = protocol.decode_request(json.dumps({"messages": MESSAGES, **fields}).encode(),
                                                             ChatCompletionRequest)
    return request


def test_unset_fields_take_vllms_defaults() -> None:
    params = protocol.sampling_params(chat(), max_tokens=20)
    assert (params.n, params.temperature, params.top_p, params.top_k, params.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (params.max_tokens, params.skip_special_tokens, params.logprobs) == (20, True, None)
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    streamed = protocol.sampling_params(chat(stream=True, logprobs=True, top_logprobs=3, stop="x"), max_tokens=4)
    assert (streamed.output_kind, streamed.logprobs, streamed.stop) == (RequestOutputKind.DELTA, 3, ["x"])


def test_unknown_fields_are_ignored_as_vllm_ignores_them() -> None:
    assert chat(foo_bar=1, max_tokens=3).max_tokens == 3


@pytest.mark.parametrize(("body", "param"), [
    (b'{"model": "m"}', "body.messages"),
    (b'{"messages": "hi"}', "body.messages"),
    (b'{"messages": [], "max_tokens": "many"}', "body.max_tokens"),
    (b'{"messages": [1]}', "body.messages.0"),
    (b"{not json", "body"),
    (b"[]", "body"),
])
def test_malformed_bodies_name_the_field(body: bytes, param: str) -> None:
    with pytest.raises(ValidationError) as info:
        protocol.decode_request(body, ChatCompletionRequest)
    assert info.value.parameter == param


@pytest.mark.parametrize(("fields", "param"), [
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -2}, "top_logprobs"),
])
def test_vllms_body_checks(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as info:
        chat(**fields)
    assert info.value.parameter == param


def test_usage_is_off_unless_include_usage_is_true_as_in_vllm() -> None:
    assert not protocol.include_usage(chat(stream=True, stream_options={}))
    assert not protocol.include_usage(chat(stream=True))
    assert not protocol.include_usage(chat(stream=True, stream_options={"include_usage": False}))
    assert protocol.include_usage(chat(stream=True, stream_options={"include_usage": True}))
    assert protocol.continuous_usage(chat(stream=True, stream_options={"include_usage": True,
                                                                       "continuous_usage_stats": True}))


def test_empty_stream_options_without_stream_are_accepted_as_vllm_accepts_them() -> None:
    assert chat(stream_options={}).stream_options is not None
    with pytest.raises(ValidationError) as info:
        chat(stream_options={"include_usage": False})
    assert info.value.parameter == "stream_options"


@pytest.mark.parametrize(("prompt", "want"), [
    ("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]]),
])
def test_completion_prompts(prompt: Any, want: list[Any]) -> None:
    request = protocol.decode_request(json.dumps({"prompt": prompt}).encode(), CompletionRequest)
    assert protocol.prompts(request) == want and request.max_tokens == 16


@pytest.mark.parametrize("body", [{}, {"prompt": ""}, {"prompt": ["a", 3]}, {"prompt": "a", "suffix": "b"},
                                  {"prompt": "a", "logprobs": -2}, {"prompt": "a", "prompt_logprobs": -2},
                                  {"prompt": "a", "prompt_logprobs": 1, "stream": True},
                                  {"prompt": "a", "logprob_token_ids": [1]},
                                  {"prompt": "a", "echo": True, "max_tokens": 0, "logprobs": 1,
                                   "logprob_token_ids": [1]}])
def test_completion_bodies_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        protocol.decode_request(json.dumps(body).encode(), CompletionRequest)


def test_logprob_fields_become_vllms_sampling_params() -> None:
    params = protocol.sampling_params(chat(logprobs=True, top_logprobs=3, logprob_token_ids=[7, 9]), max_tokens=4)
    assert (params.logprobs, params.logprob_token_ids, params.prompt_logprobs) == (None, [7, 9], None)
    params = protocol.sampling_params(chat(echo=True, top_logprobs=0), max_tokens=4)
    assert (params.logprobs, params.prompt_logprobs, params.skip_reading_prefix_cache) == (None, 0, True)
    request = protocol.decode_request(b'{"prompt": "a", "echo": true, "max_tokens": 0, "logprobs": 2}',
                                      CompletionRequest)
    params = protocol.sampling_params(request, max_tokens=0)
    assert (params.max_tokens, params.logprobs, params.prompt_logprobs) == (1, 2, 2)
    with pytest.raises(ValidationError, match="when using `logprob_token_ids`, `logprobs` must be set to true"):
        protocol.decode_request(b'{"messages": [], "logprob_token_ids": [1]}', ChatCompletionRequest)
    with pytest.raises(ValidationError, match="`prompt_logprobs` are not available when `stream=True`"):
        protocol.decode_request(b'{"messages": [], "prompt_logprobs": 1, "stream": true}', ChatCompletionRequest)
    protocol.decode_request(b'{"messages": [], "prompt_logprobs": 0, "stream": true}', ChatCompletionRequest)


def test_logprob_token_ids_are_checked_as_vllm_checks_them() -> None:
    protocol.check_logprobs(SamplingParams(logprob_token_ids=[0, 999]), 20, 1000)
    with pytest.raises(ValidationError, match=r"^token_id\(s\) \[1000, -1\] in logprob_token_ids contain out-of-vocab"):
        protocol.check_logprobs(SamplingParams(logprob_token_ids=[1, 1000, -1]), 20, 1000)
    with pytest.raises(ValidationError, match="Requested logprob_token_ids of length 129, which is greater than max "
                                              "allowed: 128") as e:
        protocol.check_logprobs(SamplingParams(logprob_token_ids=list(range(129))), 20, 1000)
    assert (e.value.parameter, e.value.value) == ("logprob_token_ids", 129)


def test_children_get_n_1_and_their_own_seed() -> None:
    params = protocol.sampling_params(chat(n=3, seed=7, temperature=0.8), max_tokens=4)
    children = [protocol.child_params(params, i) for i in range(3)]
    assert [(c.n, c.seed) for c in children] == [(1, 7), (1, 8), (1, 9)]
    unseeded = protocol.sampling_params(chat(n=2, temperature=0.8), max_tokens=4)
    assert protocol.child_params(unseeded, 1).seed is None


def test_more_logprobs_than_max_logprobs_are_refused_as_vllm_refuses_them() -> None:
    protocol.check_logprobs(SamplingParams(logprobs=20), 20, 1000)
    protocol.check_logprobs(SamplingParams(logprobs=-1), -1, 1000)
    with pytest.raises(ValidationError, match=r"^Requested sample logprobs of 30, which is greater than max allowed: 20") as e:
        protocol.check_logprobs(SamplingParams(logprobs=30), 20, 1000)
    assert (e.value.parameter, e.value.value) == ("logprobs", 30)
    with pytest.raises(ValidationError, match="prompt logprobs of 1000, which is greater than max allowed: 5"):
        protocol.check_logprobs(SamplingParams(prompt_logprobs=-1), 5, 1000)
