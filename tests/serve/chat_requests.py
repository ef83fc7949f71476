"""Chat requests decoded from their JSON bodies as the server decodes them (vLLM's checks
included), for the tests of a request's stages: its fields, its checks, its sampling parameters."""

from __future__ import annotations

import json
from typing import Any

from mmfront.serve import request_decoding
from mmfront.serve.protocol import ChatCompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    """A one-message chat request with ``fields``."""
    request: ChatCompletionRequest = request_decoding.decode_request(
        json.dumps({"messages": MESSAGES, **fields}).encode(), ChatCompletionRequest)
    return request
