"""Requests to ``SamplingParams`` with vLLM's defaults, and the checks vLLM's API server makes of
them; ``n`` choices get seeds of their own."""

from __future__ import annotations

import pytest
from chat_requests import chat

from mmfront.errors import ValidationError
from mmfront.serve import request_decoding, sampling
from mmfront.serve.protocol import CompletionRequest
from mmfront.wire import RequestOutputKind, SamplingParams


def test_unset_fields_take_vllms_defaults() -> None:
    params = sampling.sampling_params(chat(), max_tokens=20)
    assert (params.n, params.temperature, params.top_p, params.top_k, params.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (params.max_tokens, params.skip_special_tokens, params.logprobs) == (20, True, None)
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    streamed = sampling.sampling_params(chat(stream=True, logprobs=True, top_logprobs=3, stop="x"), max_tokens=4)
    assert (streamed.output_kind, streamed.logprobs, streamed.stop) == (RequestOutputKind.DELTA, 3, ["x"])


def test_logprob_fields_become_vllms_sampling_params() -> None:
    params = sampling.sampling_params(chat(logprobs=True, top_logprobs=3, logprob_token_ids=[7, 9]), max_tokens=4)
    assert (params.logprobs, params.logprob_token_ids, params.prompt_logprobs) == (None, [7, 9], None)
    params = sampling.sampling_params(chat(echo=True, top_logprobs=0), max_tokens=4)
    assert (params.logprobs, params.prompt_logprobs, params.skip_reading_prefix_cache) == (None, 0, True)
    request = request_decoding.decode_request(b'{"prompt": "a", "echo": true, "max_tokens": 0, "logprobs": 2}',
                                              CompletionRequest)
    params = sampling.sampling_params(request, max_tokens=0)
    assert (params.max_tokens, params.logprobs, params.prompt_logprobs) == (1, 2, 2)


def test_logprob_token_ids_are_checked_as_vllm_checks_them() -> None:
    sampling.check_logprobs(SamplingParams(logprob_token_ids=[0, 999]), 20, 1000)
    with pytest.raises(ValidationError, match=r"^token_id\(s\) \[1000, -1\] in logprob_token_ids contain out-of-vocab"):
        sampling.check_logprobs(SamplingParams(logprob_token_ids=[1, 1000, -1]), 20, 1000)
    with pytest.raises(ValidationError, match="Requested logprob_token_ids of length 129, which is greater than max "
                                              "allowed: 128") as e:
        sampling.check_logprobs(SamplingParams(logprob_token_ids=list(range(129))), 20, 1000)
    assert (e.value.parameter, e.value.value) == ("logprob_token_ids", 129)


def test_children_get_n_1_and_their_own_seed() -> None:
    params = sampling.sampling_params(chat(n=3, seed=7, temperature=0.8), max_tokens=4)
    children = [sampling.child_params(params, i) for i in range(3)]
    assert [(c.n, c.seed) for c in children] == [(1, 7), (1, 8), (1, 9)]
    unseeded = sampling.sampling_params(chat(n=2, temperature=0.8), max_tokens=4)
    assert sampling.child_params(unseeded, 1).seed is None


def test_more_logprobs_than_max_logprobs_are_refused_as_vllm_refuses_them() -> None:
    sampling.check_logprobs(SamplingParams(logprobs=20), 20, 1000)
    sampling.check_logprobs(SamplingParams(logprobs=-1), -1, 1000)
    with pytest.raises(ValidationError, match=r"^Requested sample logprobs of 30, which is greater than max allowed: 20") as e:
        sampling.check_logprobs(SamplingParams(logprobs=30), 20, 1000)
    assert (e.value.parameter, e.value.value) == ("logprobs", 30)
    with pytest.raises(ValidationError, match="prompt logprobs of 1000, which is greater than max allowed: 5"):
        sampling.check_logprobs(SamplingParams(prompt_logprobs=-1), 5, 1000)
