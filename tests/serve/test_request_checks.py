"""vLLM's checks of a decoded request, each refusal naming the field vLLM names: stream options
without a stream, the logprob fields' combinations, completion bodies vLLM refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chat_requests import chat

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.serve import request_decoding
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize(("fields", "param"), [
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -2}, "top_logprobs"),
])
def test_vllms_body_checks(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as info:
        chat(**fields)
    assert info.value.parameter == param


def test_empty_stream_options_without_stream_are_accepted_as_vllm_accepts_them() -> None:
    assert chat(stream_options={}).stream_options is not None
    with pytest.raises(ValidationError) as info:
        chat(stream_options={"include_usage": False})
    assert info.value.parameter == "stream_options"


@pytest.mark.parametrize("body", [{}, {"prompt": ""}, {"prompt": ["a", 3]}, {"prompt": "a", "suffix": "b"},
                                  {"prompt": "a", "logprobs": -2}, {"prompt": "a", "prompt_logprobs": -2},
                                  {"prompt": "a", "prompt_logprobs": 1, "stream": True},
                                  {"prompt": "a", "logprob_token_ids": [1]},
                                  {"prompt": "a", "echo": True, "max_tokens": 0, "logprobs": 1,
                                   "logprob_token_ids": [1]}])
def test_completion_bodies_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        request_decoding.decode_request(json.dumps(body).encode(), CompletionRequest)


def test_chat_logprob_fields_are_checked_as_vllm_checks_them() -> None:
    with pytest.raises(ValidationError, match="when using `logprob_token_ids`, `logprobs` must be set to true"):
        request_decoding.decode_request(b'{"messages": [], "logprob_token_ids": [1]}', ChatCompletionRequest)
    with pytest.raises(ValidationError, match="`prompt_logprobs` are not available when `stream=True`"):
        request_decoding.decode_request(b'{"messages": [], "prompt_logprobs": 1, "stream": true}', ChatCompletionRequest)
    request_decoding.decode_request(b'{"messages": [], "prompt_logprobs": 0, "stream": true}', ChatCompletionRequest)


@pytest.mark.parametrize(("role", "content"), [("user", None), ("system", None), ("developer", None), ("tool", None),
                                               ("wizard", None), ("user", 5), ("assistant", {"type": "text"})])
def test_content_vllms_model_refuses(role: str, content: Any) -> None:
    messages = [{"role": role, "content": content}, {"role": "user", "content": "Hi"}]
    with pytest.raises(RequestBodyError) as info:
        request_decoding.decode_request(json.dumps({"model": "m", "messages": messages}).encode(), ChatCompletionRequest)
    assert info.value.parameter == "body.messages.0.content"
    assert info.value.error_type == "Bad Request"


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}],  # an assistant's may be null
    [{"role": "function", "name": "f", "content": None}],
    [{"role": "user"}],  # left out: vLLM renders it as no content, whatever the role
    [{"role": "wizard"}],
])
def test_null_or_missing_content_that_vllm_takes(messages: list[dict[str, Any]]) -> None:
    body = json.dumps({"model": "m", "messages": messages}).encode()
    assert request_decoding.decode_request(body, ChatCompletionRequest).messages == messages

