"""The reference engine (``mmfront worker``) says what it is: over HTTP, ``mmfront serve`` in
front of it answers 400 with vLLM's error body, the field in ``param``, for every request that asks
for more than greedy decoding of one sequence (``mmfront.engine.reference_limits``), and answers
what it can honour (temperature 0, ``top_k`` 1, a seed, ``top_p`` at temperature 0)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from serve_harness import MODEL_NAME, Served, serve

from mmfront.engine.reference_limits import REFERENCE_ENGINE_LIMITS, USE_VLLM, check_reference_request
from mmfront.errors import ValidationError
from mmfront.wire import SamplingParams
from mmfront.wire.handshake import EXTRA_REFERENCE_LIMITS
from mmfront.wire.params import LoRARequest, PoolingParams, RepetitionDetectionParams, StructuredOutputsParams
from mmfront.wire.structs import EngineCoreRequest

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 3}
GREEDY = {**CHAT, "temperature": 0}

REFUSED_OVER_HTTP: dict[str, tuple[dict[str, Any], str]] = {
    "default temperature": (CHAT, "temperature"),
    "temperature": ({**CHAT, "temperature": 0.7}, "temperature"),
    "n with sampling": ({**CHAT, "n": 2, "temperature": 0.7}, "temperature"),
    "presence_penalty": ({**GREEDY, "presence_penalty": 0.5}, "presence_penalty"),
    "frequency_penalty": ({**GREEDY, "frequency_penalty": 0.5}, "frequency_penalty"),
    "repetition_penalty": ({**GREEDY, "repetition_penalty": 1.2}, "repetition_penalty"),
    "logprobs": ({**GREEDY, "logprobs": True, "top_logprobs": 2}, "logprobs"),
    "logprob_token_ids": ({**GREEDY, "logprobs": True, "logprob_token_ids": [1, 2]}, "logprob_token_ids"),
    "prompt_logprobs": ({**GREEDY, "prompt_logprobs": 1}, "prompt_logprobs"),
    "structured_outputs": ({**GREEDY, "structured_outputs": {"regex": "[a-z]+"}}, "structured_outputs"),
    "response_format": ({**GREEDY, "response_format": {"type": "json_object"}}, "structured_outputs"),
    "logit_bias": ({**GREEDY, "logit_bias": {"5": 1.0}}, "logit_bias"),
    "allowed_token_ids": ({**GREEDY, "allowed_token_ids": [1, 2, 3]}, "allowed_token_ids"),
    "bad_words": ({**GREEDY, "bad_words": ["hello"]}, "bad_words"),
    "repetition_detection": ({**GREEDY, "repetition_detection": {"max_pattern_size": 4, "min_pattern_size": 1,
                                                                 "min_count": 3}}, "repetition_detection"),
}
"""Each field a chat request can send that the reference engine cannot honour, and the ``param``
of its refusal. ``n`` travels as ``n`` children of ``n`` 1 (vLLM's ``ParentRequest``), so it is
refused for the sampling it needs (at temperature 0 the API server refuses it, as vLLM's does)."""


@pytest.fixture(scope="module")
def served(gemma3_weights_dir: Path) -> Iterator[Served]:
    with serve(gemma3_weights_dir) as running:
        yield running


def post(served: Served, body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(served.v1 + path.removeprefix("/v1"), json=body, timeout=120)


@pytest.mark.parametrize("case", list(REFUSED_OVER_HTTP))
def test_a_field_the_reference_engine_cannot_honour_is_refused_400(served: Served, case: str) -> None:
    if case in ("structured_outputs", "response_format"):
        pytest.importorskip("xgrammar", reason="xgrammar is not installed (a dependency of mmfront: pip install -e .)")
    body, param = REFUSED_OVER_HTTP[case]
    answer = post(served, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", param, 400)
    assert error["message"].startswith("mmfront's reference engine (mmfront worker) ")
    assert USE_VLLM in error["message"] and f"(parameter={param}" in error["message"]


def test_n_above_one_at_temperature_0_is_refused_by_the_api_server_as_vllms(served: Served) -> None:
    error = post(served, {**GREEDY, "n": 2}).json()["error"]
    assert (error["param"], error["message"]) == (
        "n", "n must be 1 when using greedy sampling, got 2. (parameter=n, value=2)")


def test_a_completion_at_the_default_temperature_is_refused(served: Served) -> None:
    answer = post(served, {"model": MODEL_NAME, "prompt": "Once upon", "max_tokens": 2}, "/v1/completions")
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "temperature"


def test_what_it_honours_is_answered_greedily(served: Served) -> None:
    greedy = post(served, GREEDY)
    assert greedy.status_code == 200, greedy.text
    want = greedy.json()["choices"][0]["message"]["content"]
    assert greedy.json()["usage"]["completion_tokens"] == 3
    for extra in ({"temperature": 0.8, "top_k": 1}, {"seed": 7}, {"top_p": 0.5, "top_k": 5, "min_p": 0.2},
                  {"n": 1, "stop_token_ids": [], "ignore_eos": True, "min_tokens": 1}):
        answer = post(served, {**GREEDY, **extra})
        assert answer.status_code == 200, (extra, answer.text)
        assert answer.json()["choices"][0]["message"]["content"] == want, extra


def test_a_stream_is_refused_before_it_starts(served: Served) -> None:
    answer = post(served, {**CHAT, "stream": True})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "temperature"


def test_the_engine_refuses_what_the_client_would_send(served: Served) -> None:
    """Without the handshake's word (another frontend, or an older one), the engine refuses by
    itself: the same answer, from the engine's error output."""
    ranks = served.client.client.ranks
    announced = ranks[0].extras
    ranks[0].extras = announced - {EXTRA_REFERENCE_LIMITS}
    try:
        refused = post(served, {**GREEDY, "logit_bias": {"5": 1.0}})
        streamed = post(served, {**GREEDY, "logit_bias": {"5": 1.0}, "stream": True})
    finally:
        ranks[0].extras = announced
    assert refused.status_code == 400, refused.text
    assert (refused.json()["error"]["param"], refused.json()["error"]["type"]) == ("logit_bias", "BadRequestError")
    assert streamed.status_code == 200 and '"param":"logit_bias"' in streamed.text
    assert streamed.text.rstrip().endswith("data: [DONE]")


def test_the_worker_announces_its_limits(served: Served) -> None:
    assert EXTRA_REFERENCE_LIMITS in served.client.client.ranks[0].extras


def test_the_engine_stays_up_after_refusals(served: Served) -> None:
    assert post(served, CHAT).status_code == 400
    assert post(served, GREEDY).status_code == 200
    assert httpx.get(served.url + "/health", timeout=30).status_code == 200


# --- the rule itself, for the fields no chat request sets -------------------------------------------


def request(params: SamplingParams | None = None, **fields: Any) -> EngineCoreRequest:
    return EngineCoreRequest("r", [1, 2], None, params or SamplingParams(temperature=0), None, 0.0,
                             fields.pop("lora_request", None), None, None, **fields)


ASKING: dict[str, dict[str, Any]] = {
    "n": {"n": 2, "temperature": 0.5}, "temperature": {"temperature": 0.5},
    "presence_penalty": {"presence_penalty": -1.0}, "frequency_penalty": {"frequency_penalty": 1.0},
    "repetition_penalty": {"repetition_penalty": 0.9}, "logprobs": {"logprobs": 0},
    "logprob_token_ids": {"logprob_token_ids": [3]}, "prompt_logprobs": {"prompt_logprobs": -1},
    "prompt_logprob_token_ids": {"prompt_logprob_token_ids": np.array([3])},
    "structured_outputs": {"structured_outputs": StructuredOutputsParams(regex="a+")},
    "logit_bias": {"logit_bias": {3: -1.0}}, "allowed_token_ids": {"allowed_token_ids": []},
    "bad_words": {"bad_words": ["x"]}, "thinking_token_budget": {"thinking_token_budget": 4},
    "repetition_detection": {"repetition_detection": RepetitionDetectionParams(max_pattern_size=2, min_count=2)},
    "trace_decode_token_ids": {"trace_decode_token_ids": [1, 2]},
}
"""A value that asks for each limit (at temperature 0 unless it says otherwise)."""


def test_every_limit_has_a_case() -> None:
    assert [limit.parameter for limit in REFERENCE_ENGINE_LIMITS] == list(ASKING)


@pytest.mark.parametrize("parameter", list(ASKING))
def test_each_limit_is_refused_naming_its_field(parameter: str) -> None:
    with pytest.raises(ValidationError) as refused:
        check_reference_request(request(SamplingParams(**{"temperature": 0.0, **ASKING[parameter]})))
    assert refused.value.parameter == parameter and USE_VLLM in str(refused.value)


@pytest.mark.parametrize(("fields", "parameter"), [
    ({"lora_request": LoRARequest("adapter", 1, "/adapters/a")}, "lora_request"),
    ({"prompt_embeds": torch.zeros(2, 8)}, "prompt_embeds"),
])
def test_requests_beyond_the_base_model_and_token_prompts_are_refused(fields: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ValidationError) as refused:
        check_reference_request(request(**fields))
    assert refused.value.parameter == parameter


def test_pooling_is_refused() -> None:
    pooled = EngineCoreRequest("r", [1, 2], None, None, PoolingParams(), 0.0, None, None, None)
    with pytest.raises(ValidationError) as refused:
        check_reference_request(pooled)
    assert refused.value.parameter == "pooling_params"


def test_greedy_requests_pass() -> None:
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=1.5, top_k=1),
                   SamplingParams(temperature=0, seed=3, top_p=0.1, top_k=4, min_p=0.5, watermarking=True,
                                  extra_args={"k": 1}, min_tokens=2, stop_token_ids=[5], ignore_eos=True)):
        check_reference_request(request(params))


def test_the_docs_list_every_field_it_refuses() -> None:
    text = (Path(__file__).parents[2] / "docs" / "engine.md").read_text()
    section = text.split("### What the reference engine refuses", 1)[1].split("\n## ", 1)[0]
    for parameter in [*(limit.parameter for limit in REFERENCE_ENGINE_LIMITS), "lora_request", "pooling_params",
                      "prompt_embeds"]:
        assert f"`{parameter}`" in section, parameter
