"""Structured outputs checked and resolved as vLLM 0.33's API server does it, before the engine.

Without a peer: the request fields (``response_format``, ``structured_outputs``) become the one
``StructuredOutputsParams`` vLLM makes of them, and what xgrammar or llguidance refuses is a 400
in vLLM's words. With the vLLM peer venv: the same constraints go through vLLM's own
``SamplingParams._validate_structured_outputs`` (backend ``auto``, the peer model's fast
tokenizer) and through mmfront's :func:`~mmfront.serve.structured.resolve_backend`; each answer
is the same error message, or the same msgpack bytes on the wire (the backend written in, a
``choice`` rewritten as xgrammar's EBNF grammar).
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.serve import request_decoding, sampling, structured
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.params import StructuredOutputsParams

pytest.importorskip("xgrammar", reason="xgrammar is not installed (a dependency of mmfront: pip install -e .)")
pytest.importorskip("llguidance", reason="llguidance is not installed (a dependency of mmfront: pip install -e .)")

MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


CASES: dict[str, dict[str, Any]] = {
    "regex": {"regex": r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.?\b){4}"},
    "regex_unclosed": {"regex": "[a-"},
    "regex_nul": {"regex": "a\x00b"},
    "regex_empty": {"regex": ""},
    "choice": {"choice": ["Python", "Java", "JavaScript", "C++", "C#", "PHP", "TypeScript", "Ruby", "Swift", "Kotlin"]},
    "choice_escaped": {"choice": ['say "hi"', "a\\b", "line\nbreak", "tab\tbell\x07"]},
    "choice_empty": {"choice": []},
    "json": {"json": SCHEMA},
    "json_string": {"json": json.dumps(SCHEMA)},
    "json_not_json": {"json": "{not json"},
    "json_blank": {"json": "   "},
    "json_unknown_type": {"json": {"type": "foo"}},
    "json_multiple_of": {"json": {"type": "integer", "multipleOf": 3}},
    "json_too_deep": {"json": deep(70)},
    "json_deep_enough": {"json": deep(20)},
    "json_no_whitespace": {"json": SCHEMA, "disable_any_whitespace": True},
    "grammar_ebnf": {"grammar": 'root ::= "yes" | "no"'},
    "grammar_undefined_rule": {"grammar": "root ::= x y"},
    "grammar_lark": {"grammar": 'start: "a" | "b"'},
    "grammar_blank": {"grammar": "  \n "},
    "json_object": {"json_object": True},
    "json_object_false": {"json_object": False},
    "structural_tag": {"structural_tag": json.dumps({
        "type": "structural_tag", "format": {"type": "const_string", "value": "hello"}})},
    "structural_tag_legacy": {"structural_tag": json.dumps({
        "type": "structural_tag", "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f"]})},
    "structural_tag_blank": {"structural_tag": " "},
    "none": {},
    "two_kinds": {"regex": "a", "grammar": 'root ::= "a"'},
}


def mmfront_answer(fields: dict[str, Any]) -> dict[str, Any]:
    try:
        params = StructuredOutputsParams(**fields)
        structured.resolve_backend(params, "auto", fast_tokenizer=True)
    except ValidationError as e:
        return {"error": str(e)}
    return {"wire": MsgpackEncoder().encode(params)[0].hex()}


PEER_SCRIPT = r"""
import json, sys
from types import SimpleNamespace
from transformers import AutoTokenizer
from vllm.config import StructuredOutputsConfig
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.serial_utils import MsgpackEncoder
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
answers = {}
for name, fields in json.loads(sys.stdin.read()).items():
    try:
        params = SamplingParams(structured_outputs=StructuredOutputsParams(**fields))
        params._validate_structured_outputs(SimpleNamespace(is_diffusion=False), StructuredOutputsConfig(), tokenizer)
    except VLLMValidationError as e:
        answers[name] = {"error": str(e)}
        continue
    answers[name] = {"wire": bytes(MsgpackEncoder().encode(params.structured_outputs)[0]).hex()}
print(json.dumps(answers))
"""

_XGRAMMAR_TIME = re.compile(r"\[\d\d:\d\d:\d\d\] ")
"""xgrammar stamps its error messages with the time of day."""


@pytest.fixture(scope="module")
def vllm_answers() -> dict[str, Any]:
    python = vllm_peer_python()
    model = None if python is None else vllm_peer_model_dir(python)
    if python is None or model is None:
        pytest.skip(SKIP_REASON)
    run = subprocess.run([str(python), "-c", PEER_SCRIPT, str(model)], input=json.dumps(CASES), capture_output=True, check=False,
                         text=True, timeout=300, env={"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
                                                      "PATH": "/usr/bin:/bin"})
    if "No module named 'lmformatenforcer'" in run.stderr:
        pytest.skip("the peer venv lacks vLLM's structured-output dependencies (lm-format-enforcer==0.11.3, "
                    "interegular, outlines_core==0.2.14): vLLM imports them to validate any constraint")
    assert run.returncode == 0, run.stderr[-3000:]
    answers: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return answers


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.parametrize("case", CASES)
def test_a_constraint_is_refused_or_resolved_as_vllm_does(vllm_answers: dict[str, Any], case: str) -> None:
    want, got = vllm_answers[case], mmfront_answer(CASES[case])
    if "error" in want and "error" in got:
        # vLLM's error response strips the message; mmfront strips it where it is made
        assert _XGRAMMAR_TIME.sub("", got["error"]) == _XGRAMMAR_TIME.sub("", want["error"]).strip()
    else:
        assert got == want


def test_a_choice_becomes_xgrammars_grammar_and_the_backend_is_written_in() -> None:
    params = StructuredOutputsParams(choice=['say "hi"', "a\nb"])
    structured.resolve_backend(params, "auto", fast_tokenizer=True)
    assert (params.choice, params.grammar) == (None, 'root ::= "say \\"hi\\"" | "a\\nb"')
    assert (params._backend, params._backend_was_auto) == ("xgrammar", True)


def test_what_xgrammar_refuses_falls_back_to_guidance() -> None:
    params = StructuredOutputsParams(json={"type": "integer", "multipleOf": 3})
    structured.resolve_backend(params, "auto", fast_tokenizer=True)
    assert (params._backend, params._backend_was_auto) == ("guidance", True)
    with pytest.raises(ValidationError, match=r"^No compatible structured output backend"):
        structured.resolve_backend(StructuredOutputsParams(json={"type": "integer", "multipleOf": 3}), "auto",
                                   fast_tokenizer=False)


@pytest.mark.parametrize(("fields", "message"), [
    ({"regex": "[a-"}, "^Grammar error: at 1\\(8\\): invalid regex"),
    ({"grammar": "root ::= x y"}, "^Invalid grammar specification: Failed to convert the grammar from GBNF to Lark: "
                                  "Rule 'x' not found"),
    ({"json": "{not json"}, "^Invalid JSON grammar specification.$"),
    ({"choice": []}, r"^Choice '\[\]' cannot be an empty list$"),
    ({"json_object": False}, "^structured_outputs.json_object must be True if set"),
    ({"json": deep(65)}, "^The JSON schema is nested too deeply: objects and arrays may nest at most 64 levels$"),
])
def test_a_bad_constraint_is_a_validation_error_without_a_parameter(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        structured.resolve_backend(StructuredOutputsParams(**fields), "auto", fast_tokenizer=True)
    assert info.value.parameter is None and info.value.http_status == 400


def test_one_backend_is_used_without_fallback() -> None:
    with pytest.raises(ValidationError, match=r"^The provided JSON schema contains features not supported by xgrammar"):
        structured.resolve_backend(StructuredOutputsParams(json={"type": "number", "multipleOf": 2}), "xgrammar",
                                   fast_tokenizer=True)
    params = StructuredOutputsParams(regex="[0-9]+")
    structured.resolve_backend(params, "guidance", fast_tokenizer=True)
    assert (params._backend, params._backend_was_auto) == ("guidance", False)
    with pytest.raises(ValidationError, match=r"^The structured outputs backend 'outlines' is not one mmfront"):
        structured.resolve_backend(StructuredOutputsParams(regex="a"), "outlines", fast_tokenizer=True)


def chat(**fields: Any) -> ChatCompletionRequest:
    request: ChatCompletionRequest = request_decoding.decode_request(
        json.dumps({"messages": MESSAGES, **fields}).encode(), ChatCompletionRequest)
    return request


def completion(**fields: Any) -> CompletionRequest:
    request: CompletionRequest = request_decoding.decode_request(json.dumps({"prompt": "hi", **fields}).encode(),
                                                         CompletionRequest)
    return request


def test_response_format_becomes_the_constraint() -> None:
    assert sampling.structured_outputs(chat(response_format={"type": "text"})) is None
    assert sampling.structured_outputs(chat(response_format={"type": "json_object"})) == StructuredOutputsParams(
        json_object=True)
    assert sampling.structured_outputs(chat(response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})) == StructuredOutputsParams(
        json=SCHEMA)
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    assert sampling.structured_outputs(chat(response_format=tag)) == StructuredOutputsParams(
        structural_tag=json.dumps(tag))
    both = chat(structured_outputs={"json": {"type": "string"}, "disable_any_whitespace": True},
                response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
    assert sampling.structured_outputs(both) == StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    with pytest.raises(ValidationError, match=r"^You can only use one kind of structured outputs constraint"):
        sampling.structured_outputs(chat(structured_outputs={"regex": "a"}, response_format={"type": "json_object"}))


def test_the_constraint_reaches_the_sampling_params() -> None:
    params = sampling.sampling_params(chat(structured_outputs={"regex": "[0-9]+"}), max_tokens=5)
    assert params.structured_outputs == StructuredOutputsParams(regex="[0-9]+")
    params = sampling.sampling_params(completion(structured_outputs={"choice": ["a", "b"]}), max_tokens=5)
    assert params.structured_outputs == StructuredOutputsParams(choice=["a", "b"])
    sampling.verify_params(params, sampling.Vocabulary(None, 1000, 999))
    assert (params.structured_outputs.choice, params.structured_outputs.grammar) == (None, 'root ::= "a" | "b"')
    assert (params.structured_outputs._backend, params.structured_outputs._backend_was_auto) == ("xgrammar", True)


@pytest.mark.parametrize(("make", "param"), [
    (lambda: chat(structured_outputs={"regex": {"1": "Python", "2": "C++"}}), "body.structured_outputs.regex"),
    (lambda: chat(response_format={"type": "xml"}), "body.response_format.type"),
])
def test_a_field_of_the_wrong_type_is_a_body_error(make: Any, param: str) -> None:
    with pytest.raises(RequestBodyError) as info:
        make()
    assert info.value.parameter == param


@pytest.mark.parametrize(("make", "param", "message"), [
    (lambda: chat(structured_outputs={"regex": "a", "choice": ["a"]}), None,
     r"^You can only use one kind of constraints for structured outputs \('json', 'regex' or 'choice'\).$"),
    (lambda: completion(structured_outputs={"json": {}, "regex": "a"}), "structured_outputs",
     "^You can only use one kind of constraints"),
    (lambda: chat(response_format={"type": "json_schema"}), "response_format",
     "^When response_format type is 'json_schema', the 'json_schema' field must be provided.$"),
    (lambda: chat(response_format={"type": "structural_tag", "format": 5}), "response_format",
     "^Invalid response_format structural_tag specification.$"),
    (lambda: chat(response_format={"type": "structural_tag"}), "response_format",
     "^Invalid response_format structural_tag specification.$"),
    (lambda: chat(structured_outputs={"structural_tag": "{}"}), "structured_outputs",
     "^Invalid structured_outputs structural_tag specification.$"),
    (lambda: sampling.sampling_params(chat(structured_outputs={"regex": "a", "grammar": "b"}), 5), None,
     "^You can only use one kind of structured outputs constraint but multiple are specified: {'json': None, "
     "'regex': 'a', 'choice': None, 'grammar': 'b', 'json_object': None, 'disable_any_whitespace': False, "
     "'disable_additional_properties': False, 'whitespace_pattern': None, 'structural_tag': None, '_backend': None, "
     "'_backend_was_auto': False}$"),
    (lambda: sampling.sampling_params(chat(structured_outputs={}), 5), None,
     "^You must use one kind of structured outputs constraint but none are specified"),
])
def test_vllms_request_checks(make: Any, param: str | None, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        make()
    assert info.value.parameter == param and info.value.error_type == "BadRequestError"
