"""The constraint a chat request with tools sends the engine, from mmfront and from the installed
vLLM 0.33 (its ``Parser.adjust_request``: tests/serve/data/vllm_structural_tag_oracle.py), for
every tool parser, tool choice, strict tool, ``parallel_tool_calls: false``, response format and
``--tool-strict-level``: the same ``StructuredOutputsParams``, the structural tag's JSON byte for
byte. Skipped where the peer venv is absent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_chat_parsing import Tokenizer

from mmfront.errors import ValidationError
from mmfront.serve import request_decoding, sampling
from mmfront.serve.chat_parsing import ChatParsing
from mmfront.serve.protocol import ChatCompletionRequest
from mmfront.serve.settings import ServeSettings
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python

PEER = vllm_peer_python()
MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
ORACLE = Path(__file__).parent / "data" / "vllm_structural_tag_oracle.py"
pytestmark = [pytest.mark.vllm_side_by_side, pytest.mark.skipif(PEER is None or MODEL is None, reason=SKIP_REASON)]

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
STRICT = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
LOOSE = {**TIME, "function": {**TIME["function"], "strict": False}}
PARSERS = ["hermes", "qwen3_json", "llama3_json", "deepseek_v3", "qwen3_xml", "qwen3_coder", "pythonic", "mistral"]
"""``mistral`` as with a Hugging Face tokenizer: vLLM constrains its ``required`` and named calls
to a JSON array of ``{"name", "arguments"}`` (with a Mistral tokenizer, Mistral's grammar
instead, which mmfront does not build: docs/serving.md)."""
CHOICES: dict[str, Any] = {"auto": "auto", "required": "required", "none": "none",
                           "named": {"type": "function", "function": {"name": "get_weather"}}}
VARIANTS: dict[str, tuple[dict[str, Any], str | None]] = {
    "plain": ({"tools": [WEATHER, TIME]}, None),
    "strict": ({"tools": [STRICT, LOOSE]}, None),
    "one_call": ({"tools": [WEATHER, TIME], "parallel_tool_calls": False}, None),
    "strict_json_object": ({"tools": [STRICT, TIME], "response_format": {"type": "json_object"}}, None),
    "strict_schema": ({"tools": [STRICT], "response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}, None),
    "strict_regex": ({"tools": [STRICT], "structured_outputs": {"regex": "[a-z]+"}}, None),
    "one_call_choice": ({"tools": [WEATHER], "parallel_tool_calls": False, "structured_outputs": {
        "choice": ["yes", "no"]}}, None),
    "level_function": ({"tools": [WEATHER, LOOSE]}, "function"),
    "level_parameter": ({"tools": [WEATHER, LOOSE]}, "parameter"),
}
CASES = {f"{parser}-{choice}-{variant}": (parser, choice, variant)
         for parser in PARSERS for choice in CHOICES for variant in VARIANTS}


def case_fields(choice: str, variant: str) -> dict[str, Any]:
    return {**VARIANTS[variant][0], "tool_choice": CHOICES[choice]}


@pytest.fixture(scope="module")
def vllm() -> dict[str, Any]:
    cases = [{"parser": parser, "strict_level": VARIANTS[variant][1], "request": case_fields(choice, variant)}
             for parser, choice, variant in CASES.values()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([str(PEER), str(ORACLE), str(MODEL)], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600, check=True, env=env)
    return dict(zip(CASES, json.loads(done.stdout)))


def mmfront_constraint(parser: str, choice: str, variant: str) -> Any:
    """The constraint mmfront sends, or ``{"error": ...}`` with vLLM's words where it refuses."""
    settings = ServeSettings(Path("m"), enable_auto_tool_choice=True, tool_call_parser=parser,
                             tool_strict_level=VARIANTS[variant][1])
    body = {"messages": [{"role": "user", "content": "x"}], **case_fields(choice, variant)}
    try:
        request = request_decoding.decode_request(json.dumps(body).encode(), ChatCompletionRequest)
    except ValidationError as e:
        return {"error": f"VLLMValidationError: {e.args[0]}"}
    params = ChatParsing(settings, Tokenizer()).for_request(request).adjust(sampling.sampling_params(request, None))
    found = params.structured_outputs
    return None if found is None else msgspec.structs.asdict(found)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_engine_gets_vllms_constraint(vllm: dict[str, Any], case: str) -> None:
    assert mmfront_constraint(*CASES[case]) == vllm[case]
