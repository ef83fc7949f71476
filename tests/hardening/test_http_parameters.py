"""Hardening, issue 36 class "JSON and parameters": a request's nesting, integers, lists and ids
are bounded before anything runs, each refusal a 400 in vLLM's error JSON naming the field, and
no error message echoes more than a bounded piece of what the request sent.

Against ``mmfront serve``'s app in process (the reference engine behind it); the engine requests
the server makes are recorded, so a refused request is seen to start none. Where vLLM 0.33 answers
the same case (tests/serve/test_vllm_serve_validation.py compares them side by side), the status,
``type`` and ``param`` here are vLLM's; the differences are listed in docs/serving.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmfront.serve.errors import MAX_ERROR_MESSAGE_CHARS
from mmfront.serve.protocol import MAX_STOP_STRINGS
from mmfront.serve.request_checks import MAX_COMPLETION_PROMPTS, MAX_REQUEST_ID_LENGTH
from mmfront.serve.request_decoding import MAX_JSON_DEPTH
from mmfront.wire.params import DEFAULT_MAX_N_SEQUENCES
from serve.serve_harness import MODEL_NAME, Served, serve

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BASE = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 2,
        "temperature": 0}


@pytest.fixture(scope="module")
def served(gemma3_weights_dir: Path) -> Iterator[Served]:
    with serve(gemma3_weights_dir) as running:
        yield running


@pytest.fixture
def engine_requests(served: Served, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the engine requests the server starts during the test."""
    started: list[str] = []
    original = served.client.add_request

    async def recording(request_id: str, *args: Any, **kwargs: Any) -> Any:
        started.append(request_id)
        return await original(request_id, *args, **kwargs)

    monkeypatch.setattr(served.client, "add_request", recording)
    return started


def post(served: Served, raw: bytes, path: str = CHAT, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(served.url + path, content=raw, timeout=60,
                      headers={"Content-Type": "application/json", **(headers or {})})


def chat(**fields: Any) -> bytes:
    return json.dumps({**BASE, **fields}).encode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def in_object(value: str) -> str:
    return '{"a": ' + value + "}"


def with_raw(field: str, value: str) -> bytes:
    """The base chat with one more field written as raw JSON text."""
    return chat()[:-1] + f', "{field}": {value}}}'.encode()


def error_of(answer: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert answer.status_code == status, answer.text[:2000]
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == status
    return error


DEEP = 5000
DEPTH_BOMBS = {
    "body": ("[" * DEEP + "]" * DEEP).encode(),
    "unknown_field": with_raw("x", nested(DEEP)),
    "content": json.dumps({**BASE, "messages": [{"role": "user", "content": "@"}]}).encode().replace(
        b'"@"', nested(DEEP).encode()),
    "part": json.dumps({**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "@"}]}]}
                       ).encode().replace(b'"@"', nested(DEEP).encode()),
    "mm_processor_kwargs": with_raw("mm_processor_kwargs", in_object(nested(DEEP))),
    "chat_template_kwargs": with_raw("chat_template_kwargs", in_object(nested(DEEP))),
}
"""Nesting bombs in each place the attacker put them (vLLM: 400)."""


@pytest.mark.parametrize(("raw", "param"), [
    (with_raw("kv_transfer_params", in_object(nested(MAX_JSON_DEPTH - 1))), "body.kv_transfer_params"),
    (with_raw("chat_template_kwargs", in_object(nested(500))), "body.chat_template_kwargs"),
    (json.dumps({**BASE, "messages": [{"role": "user", "content": "@"}]}).encode().replace(
        b'"@"', nested(MAX_JSON_DEPTH).encode()), "body.messages"),
], ids=["kv_transfer_params", "chat_template_kwargs", "content"])
def test_a_field_nested_past_the_bound_is_a_400_naming_it(served: Served, engine_requests: list[str], raw: bytes,
                                                          param: str) -> None:
    """Nesting the decoder takes but later code copies or renders with recursion
    (``kv_transfer_params`` 500 levels deep was a 500)."""
    error = error_of(post(served, raw))
    assert (error["type"], error["param"]) == ("Bad Request", param)
    assert error["message"].endswith(f"nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.")
    assert engine_requests == []


@pytest.mark.parametrize("where", DEPTH_BOMBS)
def test_deep_nesting_is_a_400_naming_the_body(served: Served, engine_requests: list[str], where: str) -> None:
    error = error_of(post(served, DEPTH_BOMBS[where]))
    assert (error["type"], error["param"]) == ("Bad Request", "body")
    assert "nests" in error["message"] or where == "body"  # an array is no request, whatever its depth
    assert engine_requests == []


def test_nesting_within_the_bound_is_served(served: Served) -> None:
    """A value nested as deep as the bound allows (the body's own two levels included) is served."""
    answer = post(served, with_raw("kv_transfer_params", in_object(nested(MAX_JSON_DEPTH - 2))))
    assert answer.status_code == 200, answer.text[:2000]
    text = json.dumps({**BASE, "messages": [{"role": "user", "content": "[{" * (MAX_JSON_DEPTH + 1)}]}).encode()
    answer = post(served, text)  # brackets in strings are text, not nesting
    assert answer.status_code == 200, answer.text[:2000]


@pytest.mark.parametrize(("fields", "param"), [
    ({"seed": 2**64}, "body.seed"),
    ({"seed": 2**64 - 1, "n": 2, "temperature": 1.0}, "body.seed"),
    ({"seed": -(2**63) - 1}, "body.seed"),
    ({"priority": -(2**63) - 1}, "body.priority"),
    ({"priority": 2**63}, "body.priority"),
    ({"top_k": 2**64, "temperature": 1.0}, "body.top_k"),
    ({"stop": [f"s{i}" for i in range(100_000)]}, "body.stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "body.stop"),
])
def test_out_of_range_fields_are_refused_by_their_type(served: Served, engine_requests: list[str],
                                                        fields: dict[str, Any], param: str) -> None:
    """vLLM's pydantic bounds (``seed``, ``priority``: 64-bit; ``stop``: at most
    ``VLLM_MAX_STOP_STRINGS``), and ``top_k``, which no other rule bounds before the engine."""
    error = error_of(post(served, chat(**fields)))
    assert (error["type"], error["param"]) == ("Bad Request", param)
    assert engine_requests == []


def test_as_many_stop_strings_as_vllm_allows_are_served(served: Served) -> None:
    assert post(served, chat(stop=[f"zz{i}" for i in range(MAX_STOP_STRINGS)])).status_code == 200


@pytest.mark.parametrize("n", [10**9, DEFAULT_MAX_N_SEQUENCES + 1, 2**64])
def test_n_past_vllms_cap_starts_nothing(served: Served, engine_requests: list[str], n: int) -> None:
    error = error_of(post(served, chat(n=n, temperature=1.0)))
    assert (error["type"], error["param"]) == ("BadRequestError", "n")
    assert error["message"].startswith(f"n must be at most {DEFAULT_MAX_N_SEQUENCES}, got {n}.")
    assert engine_requests == []


@pytest.mark.parametrize(("fields", "param"), [
    ({"routed_experts_prompt_start": 2**64}, "routed_experts_prompt_start"),
    ({"routed_experts_prompt_start": 10**6}, "routed_experts_prompt_start"),
    ({"stop_token_ids": [2**70]}, "stop_token_ids"),
    ({"allowed_token_ids": [2**70]}, "allowed_token_ids"),
    ({"logit_bias": {str(2**70): 1.0}}, "logit_bias"),
    ({"vllm_xargs": {"a": 2**70}}, "extra_args"),
])
def test_ints_past_what_the_engine_takes_are_refused_by_vllms_rule(
        served: Served, engine_requests: list[str], fields: dict[str, Any], param: str) -> None:
    """Checked as vLLM checks them (the prompt's length, the vocabulary, msgpack's 64 bits)."""
    error = error_of(post(served, chat(**fields)))
    assert (error["type"], error["param"]) == ("BadRequestError", param)
    assert engine_requests == []


def test_a_million_stop_token_ids_are_checked_against_the_vocabulary(served: Served,
                                                                    engine_requests: list[str]) -> None:
    """Every id is checked; the answer quotes a bounded piece of them."""
    answer = post(served, chat(stop_token_ids=list(range(10**9, 10**9 + 1_000_000))))
    error = error_of(answer)
    assert error["param"] == "stop_token_ids" and error["message"].startswith("token_id(s) [1000000000, 1000000001")
    assert "characters omitted" in error["message"]
    assert len(error["message"]) <= MAX_ERROR_MESSAGE_CHARS and len(answer.content) < 2 * MAX_ERROR_MESSAGE_CHARS
    assert engine_requests == []


def test_too_many_completion_prompts_are_refused(served: Served, engine_requests: list[str]) -> None:
    body = json.dumps({"model": MODEL_NAME, "prompt": ["Hi"] * (MAX_COMPLETION_PROMPTS + 1), "max_tokens": 1}).encode()
    error = error_of(post(served, body, COMPLETIONS))
    assert (error["type"], error["param"]) == ("BadRequestError", "prompt")
    assert error["message"].startswith(f"prompt list length {MAX_COMPLETION_PROMPTS + 1} exceeds the maximum")
    assert engine_requests == []


@pytest.mark.parametrize("request_id", ["r" * (1 << 20), "r" * (MAX_REQUEST_ID_LENGTH + 1), "a b", "a\u00e9"])
def test_a_body_request_id_is_bounded(served: Served, engine_requests: list[str], request_id: str) -> None:
    answer = post(served, chat(request_id=request_id, stream=True))
    error = error_of(answer)
    assert (error["type"], error["param"]) == ("BadRequestError", "request_id")
    assert len(answer.content) < 2 * MAX_ERROR_MESSAGE_CHARS
    assert engine_requests == []


@pytest.mark.parametrize("request_id", [b"r" * 8192, b"a b", "\u00e9t\u00e9".encode("latin-1")])
def test_an_x_request_id_header_is_bounded(served: Served, engine_requests: list[str], request_id: bytes) -> None:
    answer = httpx.post(served.url + CHAT, content=chat(), timeout=60,
                        headers={b"Content-Type": b"application/json", b"X-Request-Id": request_id})
    error = error_of(answer)
    assert (error["type"], error["param"]) == ("BadRequestError", "X-Request-Id")
    assert engine_requests == []


def test_a_bounded_id_names_the_answer(served: Served) -> None:
    request_id = "client-7:" + "x" * (MAX_REQUEST_ID_LENGTH - 9)
    answer = post(served, chat(), headers={"X-Request-Id": request_id})
    assert answer.status_code == 200 and answer.json()["id"] == f"chatcmpl-{request_id}"
    assert post(served, chat(request_id="abc-1")).json()["id"] == "chatcmpl-abc-1"


def test_an_unknown_model_name_is_not_echoed_whole(served: Served) -> None:
    answer = post(served, chat(model="m" * (50 << 20) + "-end"))
    error = error_of(answer, 404)
    assert (error["type"], error["param"]) == ("NotFoundError", "model")
    message = error["message"]
    assert len(message) <= MAX_ERROR_MESSAGE_CHARS and len(answer.content) < 2 * MAX_ERROR_MESSAGE_CHARS
    assert message.startswith("The model `mmm") and message.endswith(f"Valid aliases: {MODEL_NAME}.")
    assert "characters omitted" in message


def test_a_field_path_quoting_a_key_is_bounded(served: Served) -> None:
    answer = post(served, chat(logit_bias={"k" * (1 << 20): "x"}))
    error = error_of(answer)
    assert error["type"] == "Bad Request" and error["param"].startswith("body.logit_bias.kkk")
    assert len(answer.content) < 3 * MAX_ERROR_MESSAGE_CHARS
