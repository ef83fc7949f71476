"""What a request's fields mean to the server: a completion's prompts in their four shapes, and
a stream's usage chunks as vLLM's ``stream_options`` rules set them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chat_requests import chat

from mmfront.serve import protocol, request_decoding
from mmfront.serve.protocol import CompletionRequest


def test_usage_is_off_unless_include_usage_is_true_as_in_vllm() -> None:
    assert not protocol.include_usage(chat(stream=True, stream_options={}))
    assert not protocol.include_usage(chat(stream=True))
    assert not protocol.include_usage(chat(stream=True, stream_options={"include_usage": False}))
    assert protocol.include_usage(chat(stream=True, stream_options={"include_usage": True}))
    assert protocol.continuous_usage(chat(stream=True, stream_options={"include_usage": True,
                                                                       "continuous_usage_stats": True}))


@pytest.mark.parametrize(("prompt", "want"), [
    ("hi", ["hi"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]]),
])
def test_completion_prompts(prompt: Any, want: list[Any]) -> None:
    request = request_decoding.decode_request(json.dumps({"prompt": prompt}).encode(), CompletionRequest)
    assert protocol.prompts(request) == want and request.max_tokens == 16
