"""The one context-length rule (``mmfront.preprocess.context_length``) on each path that knows a
request's length: the ``InputProcessor`` (``MultiModalConfig.max_model_len``), the engine client
(its ``max_model_len``, before anything is sent) and ``mmfront serve``. Each refuses the same
request with the same message, ``parameter`` and ``value``, and over HTTP the body is the one
``vllm serve`` 0.33 answers (recorded below from vLLM's own API server in front of a stock engine,
``--max-model-len 300``, token-id completions)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_harness import run_app

from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.client import EngineClient
from mmfront.engine.transports import PipeTransport
from mmfront.errors import ValidationError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.preprocess.context_length import get_max_tokens
from mmfront.serve.app import create_app
from mmfront.serve.settings import ServeSettings
from mmfront.wire import SamplingParams

LIMIT = 300
TOKEN = 5
"""Any id of the tiny vocabulary (vLLM was asked with 1000, of its peer model's; the answers do not depend on it)."""

VLLM_ANSWERS = {
    "prompt over the context": (
        LIMIT + 5, 2,
        {"message": "This model's maximum context length is 300 tokens. However, your prompt contains 305 input "
                    "tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
                    "the input prompt. (parameter=input_tokens, value=305)",
         "type": "BadRequestError", "param": "input_tokens", "code": 400}),
    "prompt as long as the context": (
        LIMIT, 2,
        {"message": "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
         "type": "BadRequestError", "param": "max_tokens", "code": 400}),
    "max_tokens over the context": (
        3, LIMIT + 1,
        {"message": "max_tokens=301 cannot be greater than max_model_len=300. Please request fewer output tokens. "
                    "(parameter=max_tokens, value=301)",
         "type": "BadRequestError", "param": "max_tokens", "code": 400}),
}
"""case -> (prompt tokens, max_tokens, vLLM's error body)."""


@dataclass
class Paths:
    processor: InputProcessor
    """Its preprocessor has ``max_model_len=LIMIT``."""
    client: EngineClient
    """``max_model_len=LIMIT``; no engine behind its pipe (nothing that is refused is sent)."""
    url: str
    """``mmfront serve``'s app over a client with ``max_model_len=LIMIT``."""


@pytest.fixture(scope="module")
def paths(gemma3_dir: Path) -> Iterator[Paths]:
    limited = InputPreprocessor(gemma3_dir, MultiModalConfig(max_model_len=LIMIT, mm_processor_cache_gb=0))
    free = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0))
    client_end, client_engine_end = multiprocessing.Pipe()
    client = EngineClient(InputProcessor(free), PipeTransport(client_end))
    client.max_model_len = LIMIT
    app_end, app_engine_end = multiprocessing.Pipe()  # the engine ends stay open: no engine, but none gone
    served = AsyncEngineClient(InputProcessor(free), PipeTransport(app_end))
    served.max_model_len = LIMIT
    try:
        with run_app(create_app(served, ServeSettings(gemma3_dir, served_model_name=("tiny",)))) as url:
            yield Paths(InputProcessor(limited), client, url)
    finally:
        served.close_blocking()
        client_engine_end.close()
        app_engine_end.close()
        limited.close()
        free.close()


def _refusal(call: Any) -> ValidationError:
    with pytest.raises(ValidationError) as raised:
        call()
    return raised.value


@pytest.mark.parametrize("case", list(VLLM_ANSWERS))
def test_each_path_refuses_alike_and_as_vllm_serve_does(paths: Paths, case: str) -> None:
    prompt_len, max_tokens, vllm_body = VLLM_ANSWERS[case]
    prompt = [TOKEN] * prompt_len
    params = SamplingParams(max_tokens=max_tokens)
    by_processor = _refusal(lambda: paths.processor.process_inputs("p", prompt, params))
    by_client = _refusal(lambda: paths.client.add_request(f"c-{prompt_len}-{max_tokens}", prompt, params))
    by_rule = _refusal(lambda: get_max_tokens(LIMIT, max_tokens, prompt_len))
    said = {(str(e), e.parameter, e.value) for e in (by_processor, by_client, by_rule)}
    assert len(said) == 1, said
    ((message, parameter, value),) = said
    answer = httpx.post(paths.url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens},
                        timeout=60)
    assert answer.status_code == 400
    assert answer.json() == {"error": vllm_body}
    assert vllm_body["message"] == f"{message} (parameter={parameter}, value={value})"
    assert paths.client.in_flight == [] and paths.client.stats.wire_bytes == 0


def test_a_budget_is_what_the_prompt_leaves_or_less() -> None:
    assert get_max_tokens(LIMIT, None, LIMIT - 7) == 7
    assert get_max_tokens(LIMIT, 5, LIMIT - 7) == 5
    assert get_max_tokens(LIMIT, LIMIT, LIMIT - 7) == 7  # vLLM's server cuts it to the room, it does not refuse
    assert get_max_tokens(None, 10**9, 10**9) == 10**9  # an unknown context checks nothing


def test_the_chat_field_that_asked_is_named() -> None:
    refused = _refusal(lambda: get_max_tokens(LIMIT, LIMIT + 1, 3, max_tokens_param="max_completion_tokens"))
    assert (str(refused), refused.parameter, refused.value) == (
        "max_completion_tokens=301 cannot be greater than max_model_len=300. Please request fewer output tokens.",
        "max_completion_tokens", LIMIT + 1)
