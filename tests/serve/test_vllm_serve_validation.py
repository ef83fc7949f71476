"""vLLM's own OpenAI-server cases for structured outputs and request validation, sent to ``vllm
serve`` and ``mmfront serve`` side by side (each in front of a stock vLLM 0.33 engine core with
the stub executor, the harness of test_vllm_serve_parity.py): the same status, error ``type`` and
``param``, and the same message or body where both are deterministic.

Ported from vLLM's tests/entrypoints/openai: chat_completion/test_chat.py (structured outputs:
choice, json, regex, a dict given as regex, ``response_format`` json_object / json_schema / text,
long seeds), completion/test_completion.py (structured outputs on completions),
chat_completion/test_chat_logit_bias_validation.py, test_chat_stop_token_ids_validation.py,
test_chat.py's stream options, chat_completion/test_vision.py's image_url given as a bare string,
and the checks vLLM's request models and ``SamplingParams.verify`` make (cache_salt, priority,
allowed_token_ids, structural tags, thinking_token_budget without a reasoning parser,
media_io_kwargs). The stub executor ignores a grammar's token mask, so a constraint its text
(``cur 3In`` for a text prompt) does not fit ends in the engine's "grammar rejected tokens"
error, a 500 in both: the grammar reached the engine and was applied there.

Messages compared only by status, type and param (``KIND``): request-shape errors (pydantic's
words in vLLM, msgspec's in mmfront) and the engine's 500. Beam search's refusals:
test_vllm_serve_beam_search.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_vllm_serve_parity import (
    BODY,
    KIND,
    SAME_ERROR,
    SERVED,
    Pair,
    assert_alike,
    both,
    completion,
    error,
    explain,
    pair,  # noqa: F401  the module's servers
    read_stream,
)

pytestmark = pytest.mark.vllm_side_by_side

pytest.importorskip("xgrammar", reason="xgrammar is not installed (a dependency of mmfront: pip install -e .)")

VOCAB = 262208
"""The peer model's vocabulary (its config's ``vocab_size``; its tokenizer holds 262145)."""
TEXT = [{"role": "user", "content": "Hi there"}]
"""A text prompt: the stub generates 1000, 1001, ... = 'cur', ' 3', 'In', ..."""

SAMPLE_JSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "skills": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 3},
                   "work_history": {"type": "array", "items": {"type": "object", "properties": {
                       "company": {"type": "string"}, "duration": {"type": "number"},
                       "position": {"type": "string"}}, "required": ["company", "position"]}}},
    "required": ["name", "age", "skills", "work_history"],
}
"""vLLM's ``sample_json_schema`` fixture."""
SAMPLE_REGEX = r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)"
SAMPLE_CHOICES = ["Python", "Java", "JavaScript", "C++", "C#", "PHP", "TypeScript", "Ruby", "Swift", "Kotlin"]


def text_chat(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": TEXT, "max_tokens": 3, **fields}


CHAT, COMPLETION = "/v1/chat/completions", "/v1/completions"

CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    # structured outputs the stub's text fits: answered as without them
    "so_regex_fits": (CHAT, text_chat(structured_outputs={"regex": r"[\s\S]*"}), BODY),
    "so_choice_fits": (CHAT, text_chat(structured_outputs={"choice": ["cur 3In", "no"]}), BODY),
    "so_grammar_fits": (CHAT, text_chat(structured_outputs={"grammar": 'root ::= "cur 3In" | "no"'}), BODY),
    "so_completion_regex_fits": (COMPLETION, completion(max_tokens=3, structured_outputs={"regex": r"[\s\S]*"}), BODY),
    "response_format_text": (CHAT, text_chat(response_format={"type": "text"}), BODY),
    # vLLM's test_chat.py constraints, which the stub's text does not fit: the engine fails the request
    "so_choice_chat": (CHAT, text_chat(structured_outputs={"choice": SAMPLE_CHOICES}), KIND),
    "so_json_chat": (CHAT, text_chat(structured_outputs={"json": SAMPLE_JSON_SCHEMA}), KIND),
    "so_regex_chat": (CHAT, text_chat(structured_outputs={"regex": SAMPLE_REGEX}), KIND),
    "response_format_json_object": (CHAT, text_chat(response_format={"type": "json_object"}), KIND),
    "response_format_json_schema": (CHAT, text_chat(response_format={"type": "json_schema", "json_schema": {
        "name": "foo_test", "schema": {"type": "object", "properties": {"result": {"type": "integer"}}}}}), KIND),
    "so_completion_choice": (COMPLETION, completion(max_tokens=3, structured_outputs={"choice": SAMPLE_CHOICES}),
                             KIND),
    # invalid constraints: 400 before anything runs
    "so_type_error": (CHAT, text_chat(structured_outputs={"regex": {1: "Python", 2: "C++"}}), KIND),
    "so_bad_regex": (CHAT, text_chat(structured_outputs={"regex": "[a-"}), SAME_ERROR),
    "so_bad_json_schema": (CHAT, text_chat(structured_outputs={"json": {"type": "foo"}}), SAME_ERROR),
    "so_json_not_json": (CHAT, text_chat(structured_outputs={"json": "{not json"}), SAME_ERROR),
    "so_bad_grammar": (COMPLETION, completion(structured_outputs={"grammar": "root ::= x y"}), SAME_ERROR),
    "so_regex_nul": (CHAT, text_chat(structured_outputs={"regex": "a\x00"}), SAME_ERROR),
    "so_choice_empty": (CHAT, text_chat(structured_outputs={"choice": []}), SAME_ERROR),
    "so_json_object_false": (CHAT, text_chat(structured_outputs={"json_object": False}), SAME_ERROR),
    "so_none": (CHAT, text_chat(structured_outputs={}), SAME_ERROR),
    "so_regex_and_choice": (CHAT, text_chat(structured_outputs={"regex": "a", "choice": ["a"]}), SAME_ERROR),
    "so_regex_and_choice_completion": (COMPLETION, completion(structured_outputs={"regex": "a", "choice": ["a"]}),
                                       SAME_ERROR),
    "so_regex_and_grammar": (CHAT, text_chat(structured_outputs={"regex": "a", "grammar": 'root ::= "a"'}),
                             SAME_ERROR),
    "so_bad_structural_tag": (CHAT, text_chat(structured_outputs={"structural_tag": "{}"}), SAME_ERROR),
    "response_format_schema_missing": (CHAT, text_chat(response_format={"type": "json_schema"}), SAME_ERROR),
    "response_format_bad_structural_tag": (CHAT, text_chat(response_format={"type": "structural_tag", "format": 5}),
                                           SAME_ERROR),
    "response_format_unknown_type": (CHAT, text_chat(response_format={"type": "xml"}), KIND),
    "response_format_and_structured_outputs": (CHAT, text_chat(response_format={"type": "json_object"},
                                                               structured_outputs={"regex": "a"}), SAME_ERROR),
    # test_chat_logit_bias_validation.py
    "logit_bias_valid": (CHAT, text_chat(logit_bias={str(VOCAB - 1): 1.0}), BODY),
    "logit_bias_out_of_vocab": (CHAT, text_chat(logit_bias={str(VOCAB + 1): 1.0}), SAME_ERROR),
    "logit_bias_non_integer_key": (CHAT, text_chat(logit_bias={"not_a_token_id": 50}), SAME_ERROR),
    "logit_bias_non_numeric_value": (CHAT, text_chat(logit_bias={"1": "not_a_number"}), KIND),
    "logit_bias_multiple_non_integer_keys": (CHAT, text_chat(logit_bias={"bad1": 50.0, "bad2": 20.0}), SAME_ERROR),
    "logit_bias_completion_out_of_vocab": (COMPLETION, completion(logit_bias={"-1": 2}), SAME_ERROR),
    # test_chat_stop_token_ids_validation.py
    "stop_token_ids_valid": (CHAT, text_chat(stop_token_ids=[VOCAB - 1]), BODY),
    "stop_token_ids_out_of_vocab": (CHAT, text_chat(stop_token_ids=[VOCAB + 1]), SAME_ERROR),
    "stop_token_ids_negative": (CHAT, text_chat(stop_token_ids=[-1]), SAME_ERROR),
    # test_chat.py's test_long_seed, and the other 64-bit fields
    "seed_below_int64": (CHAT, text_chat(seed=-(2**63) - 1), KIND),
    "seed_above_int64": (CHAT, text_chat(seed=2**63), KIND),
    "seed_2_64": (CHAT, text_chat(seed=2**64), KIND),
    "seed_int64_max": (CHAT, text_chat(seed=2**63 - 1), BODY),
    "priority": (CHAT, text_chat(priority=1), BODY),
    "priority_above_int64": (CHAT, text_chat(priority=2**63), KIND),
    # issue 36: the integer and list bounds hostile requests probe (tests/hardening/test_http_parameters.py)
    "seed_2_64_minus_1_with_n_2": (CHAT, text_chat(seed=2**64 - 1, n=2, temperature=1.0), KIND),
    "priority_below_int64": (CHAT, text_chat(priority=-(2**63) - 1), KIND),
    "stop_past_vllm_max_stop_strings": (CHAT, text_chat(stop=[f"s{i}" for i in range(100_000)]), KIND),
    "stop_token_ids_past_64_bits": (CHAT, text_chat(stop_token_ids=[2**70]), SAME_ERROR),
    "allowed_token_ids_past_64_bits": (CHAT, text_chat(allowed_token_ids=[2**70]), SAME_ERROR),
    "logit_bias_past_64_bits": (CHAT, text_chat(logit_bias={str(2**70): 1.0}), SAME_ERROR),
    "routed_experts_prompt_start_past_the_prompt": (CHAT, text_chat(routed_experts_prompt_start=10**6), SAME_ERROR),
    "completion_prompts_past_vllm_max": (COMPLETION, completion(max_tokens=1, prompt=["Hi"] * 1025), KIND),
    "vllm_xargs_past_64_bits": (CHAT, text_chat(vllm_xargs={"a": 2**70}), KIND),
    # cache_salt, allowed_token_ids, bad_words and the engine's extras
    "cache_salt_empty": (CHAT, text_chat(cache_salt=""), SAME_ERROR),
    "cache_salt_slash": (CHAT, text_chat(cache_salt="a/b"), SAME_ERROR),
    "allowed_token_ids": (CHAT, text_chat(allowed_token_ids=[1000, 1001, 1002]), BODY),
    "allowed_token_ids_empty": (CHAT, text_chat(allowed_token_ids=[]), SAME_ERROR),
    "allowed_token_ids_out_of_vocab": (CHAT, text_chat(allowed_token_ids=[VOCAB]), SAME_ERROR),
    "bad_words": (CHAT, text_chat(bad_words=["cur", "hello world"]), BODY),
    "repetition_detection": (CHAT, text_chat(repetition_detection={"max_pattern_size": 4, "min_pattern_size": 1,
                                                                   "min_count": 3}), BODY),
    "vllm_xargs": (CHAT, text_chat(vllm_xargs={"a": 1, "b": ["x", 2]}), BODY),
    "routed_experts_prompt_start": (CHAT, text_chat(routed_experts_prompt_start=2), BODY),
    "watermarking": (CHAT, text_chat(watermarking=True), BODY),
    "length_penalty_without_beam_search": (CHAT, text_chat(length_penalty=2.0), BODY),
    "thinking_token_budget_without_reasoning_parser": (CHAT, text_chat(thinking_token_budget=5), SAME_ERROR),
    "thinking_token_budget_unlimited": (CHAT, text_chat(thinking_token_budget=-1), BODY),
    "media_io_kwargs": (CHAT, text_chat(media_io_kwargs={"image": {"x": 1}}), SAME_ERROR),
    # SamplingParams' bounds where vLLM's error names the field: the same message
    "temperature_negative": (CHAT, text_chat(temperature=-1), SAME_ERROR),
    "temperature_above_2": (CHAT, text_chat(temperature=2.5), SAME_ERROR),
    "completion_temperature_negative": (COMPLETION, completion(temperature=-0.5), SAME_ERROR),
    "top_p_zero": (CHAT, text_chat(top_p=0), SAME_ERROR),
    # stream_options: {} without stream is no error (vLLM checks a non-empty one)
    "stream_options_empty_without_stream": (CHAT, text_chat(stream_options={}), BODY),
    # test_vision.py: an image_url that is a bare string
    "image_url_bare_string": (CHAT, {"model": SERVED, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": "data:image/png;base64,AAAA"}, {"type": "text", "text": "?"}]}]}, KIND),
    # found by sending both servers the same odd bodies (session 16): vLLM's models are lax
    # (pydantic), take a null completion max_tokens as 16, prompt lists of one kind, an empty id
    "numbers_as_strings": (COMPLETION, completion(n="2", seed="7", temperature="0.5", logit_bias={"1000": "5"}),
                           BODY),
    "integral_float_max_tokens": (COMPLETION, completion(max_tokens=3.0), BODY),
    "fractional_max_tokens": (COMPLETION, completion(max_tokens=3.5), KIND),
    "bool_as_string": (COMPLETION, completion(max_tokens=3, ignore_eos="true"), BODY),
    "completion_max_tokens_null": (COMPLETION, completion(max_tokens=None), BODY),
    "chat_max_completion_tokens_zero": (CHAT, text_chat(max_completion_tokens=0), SAME_ERROR),
    "prompt_list_with_an_empty_string": (COMPLETION, completion(prompt=["Hello", ""], max_tokens=2), BODY),
    "prompt_list_with_an_empty_token_list": (COMPLETION, completion(prompt=[[2, 1000], []], max_tokens=2),
                                             SAME_ERROR),
    "completion_request_id_empty": (COMPLETION, completion(max_tokens=2, request_id=""), BODY),
    "chat_request_id_empty": (CHAT, text_chat(request_id=""), BODY),
    "chat_model_empty": (CHAT, {**text_chat(), "model": ""}, BODY),
    "completion_model_empty": (COMPLETION, {**completion(max_tokens=2), "model": ""}, BODY),
}


@pytest.mark.parametrize("case", CASES)
def test_vllms_case_gets_vllms_answer(pair: Pair, case: str) -> None:  # noqa: F811
    path, body, compare = CASES[case]
    vllm, mmfront = both(pair, "POST", path, body)
    assert_alike(pair, vllm, mmfront, compare)


@pytest.mark.parametrize("options", [{}, {"include_usage": False}, {"include_usage": True}])
def test_stream_options_say_the_same(pair: Pair, options: dict[str, Any]) -> None:  # noqa: F811
    body = text_chat(stream=True, stream_options=options)
    vllm, mmfront = both(pair, "POST", CHAT, body)
    want, got = read_stream(vllm), read_stream(mmfront)
    assert (got.text, got.finish, got.usage) == (want.text, want.finish, want.usage), explain(pair, vllm, mmfront)
    assert bool(want.usage) is (options.get("include_usage") is True)


# --- issue 36: nesting, n, echoed input (tests/hardening/test_http_parameters.py) -----------------


@pytest.mark.parametrize("where", ["body", "content", "chat_template_kwargs"])
def test_a_nesting_bomb_is_a_400_in_both(pair: Pair, where: str) -> None:  # noqa: F811
    """vLLM answers FastAPI's ``{"detail": "There was an error parsing the body"}``; mmfront its
    error JSON naming the body (docs/serving.md, "Differences")."""
    bomb = "[" * 5000 + "]" * 5000
    placed = {"body": "@", "content": {"model": SERVED, "messages": [{"role": "user", "content": "@"}]},
              "chat_template_kwargs": text_chat(chat_template_kwargs={"a": "@"})}[where]
    raw = json.dumps(placed).replace('"@"', bomb)
    vllm, mmfront = both(pair, "POST", CHAT, raw=raw.encode())
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    assert vllm.json() == {"detail": "There was an error parsing the body"}, explain(pair, vllm, mmfront)
    assert (error(mmfront)["type"], error(mmfront)["param"]) == ("Bad Request", "body"), explain(pair, vllm, mmfront)


def test_n_past_vllms_cap_is_a_400_in_both_and_mmfront_names_it(pair: Pair) -> None:  # noqa: F811
    vllm, mmfront = both(pair, "POST", CHAT, text_chat(n=10**9, temperature=1.0))
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], want["param"], got["param"]) == (want["type"], None, "n"), explain(pair, vllm, mmfront)
    assert got["message"] == want["message"] + " (parameter=n, value=1000000000)", explain(pair, vllm, mmfront)


def test_an_unknown_model_is_a_404_in_both_and_mmfront_quotes_a_bounded_part(pair: Pair) -> None:  # noqa: F811
    vllm, mmfront = both(pair, "POST", CHAT, text_chat(model="m" * (1 << 20)))
    assert vllm.status == mmfront.status == 404, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["param"]) == (want["type"], want["param"]), explain(pair, vllm, mmfront)
    assert len(vllm.text) > 1 << 20 and len(mmfront.text) < 2048, explain(pair, vllm, mmfront)


def test_a_huge_request_id_is_echoed_by_vllm_and_refused_by_mmfront(pair: Pair) -> None:  # noqa: F811
    vllm, mmfront = both(pair, "POST", CHAT, text_chat(request_id="r" * (1 << 20)))
    assert vllm.status == 200 and len(vllm.text) > 1 << 20, explain(pair, vllm, mmfront)
    assert mmfront.status == 400 and error(mmfront)["param"] == "request_id", explain(pair, vllm, mmfront)


def test_a_prompt_list_of_two_kinds_is_a_body_error_in_both(pair: Pair) -> None:  # noqa: F811
    """vLLM's model names the first element its union refuses; mmfront names the field."""
    vllm, mmfront = both(pair, "POST", COMPLETION, completion(prompt=["a", [1, 2]], max_tokens=2))
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert want["type"] == got["type"] == "Bad Request", explain(pair, vllm, mmfront)
    assert (want["param"], got["param"]) == ("body.prompt.0", "body.prompt"), explain(pair, vllm, mmfront)
