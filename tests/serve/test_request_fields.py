"""No request field is silently dropped: every field of vLLM 0.33's ``ChatCompletionRequest`` and
``CompletionRequest`` sent to ``mmfront serve`` is honoured (it changes the ``SamplingParams``,
the request options, the prompt or the number of engine requests the server makes, or the
answer) or refused with a 400 that names it; never accepted and ignored, except where vLLM
itself ignores it (:data:`IGNORED_AS_VLLM_DOES`, each with vLLM's reason).

The field lists are checked in (:data:`VLLM_FIELDS`) so this runs without vLLM; where the peer
venv exists, a test reads them from its pydantic models and asserts they are the same.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from serve_harness import MODEL_NAME, Served, serve

from mmfront.preprocess import RequestOptions
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

VLLM_FIELDS: dict[str, tuple[str, ...]] = {
    "ChatCompletionRequest": (
        "messages", "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
        "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
        "stream_options", "temperature", "top_p", "tools", "tool_choice", "reasoning_effort", "thinking_token_budget",
        "include_reasoning", "parallel_tool_calls", "user", "use_beam_search", "top_k", "min_p", "repetition_penalty",
        "watermarking", "length_penalty", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens",
        "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens", "truncation_side",
        "prompt_logprobs", "logprob_token_ids", "allowed_token_ids", "bad_words", "echo", "add_generation_prompt",
        "continue_final_message", "add_special_tokens", "documents", "chat_template", "chat_template_kwargs",
        "media_io_kwargs", "mm_processor_kwargs", "structured_outputs", "priority", "request_id", "session_id",
        "return_tokens_as_token_ids", "return_token_ids", "return_weight_versions", "routed_experts_prompt_start",
        "return_token_offsets", "return_prompt_text", "mm_payload", "return_mm_kwargs", "cache_salt",
        "kv_transfer_params", "ec_transfer_params", "vllm_xargs", "repetition_detection", "stream_interval"),
    "CompletionRequest": (
        "model", "prompt", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
        "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
        "use_beam_search", "top_k", "min_p", "repetition_penalty", "watermarking", "length_penalty", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "truncation_side", "allowed_token_ids",
        "prompt_logprobs", "logprob_token_ids", "bad_words", "prompt_embeds", "add_special_tokens", "response_format",
        "structured_outputs", "priority", "request_id", "session_id", "return_tokens_as_token_ids",
        "return_token_ids", "return_weight_versions", "routed_experts_prompt_start", "return_token_offsets",
        "mm_payload", "return_mm_kwargs", "cache_salt", "kv_transfer_params", "ec_transfer_params", "vllm_xargs",
        "repetition_detection", "thinking_token_budget", "stream_interval"),
}
"""The fields of vLLM 0.33's request models, in their order (``model_fields``)."""

REFUSED = frozenset({
    "prompt_embeds", "suffix",
    "media_io_kwargs", "thinking_token_budget", "chat_template", "mm_processor_kwargs",
})
"""Refused with a 400 naming the field: mmfront does not implement it yet (``NOT_SUPPORTED`` in
serve/request_checks.py says why), or vLLM refuses it too without a server flag
(``media_io_kwargs`` and ``mm_processor_kwargs`` without ``--trust-request-mm-kwargs``, ``thinking_token_budget`` without a
reasoning parser, ``chat_template`` without ``--trust-request-chat-template``)."""

IGNORED_AS_VLLM_DOES = {
    "user": "vLLM's protocol: 'this will be ignored by vLLM'",
    "length_penalty": "used by beam search only (with use_beam_search: tests/serve/test_vllm_serve_beam_search.py)",
    "return_token_offsets": "honoured on the /render endpoints only, 'ignored on regular generation endpoints'",
    "mm_payload": "honoured on the /render endpoints only, 'ignored on regular generation endpoints'",
    "return_mm_kwargs": "a deprecated alias of mm_payload",
    "watermarking": "no watermark configuration: vLLM warns and runs without watermarking",
}

TEXT = [{"role": "user", "content": "Say something."}]
CHAT_BASE = {"model": MODEL_NAME, "messages": TEXT, "max_tokens": 2, "temperature": 0}
COMPLETION_BASE = {"model": MODEL_NAME, "prompt": "Once upon", "max_tokens": 2, "temperature": 0}
"""Greedy, which the reference worker serves; a field it cannot honour is refused by it (a 400
naming the field, tests/serve/test_reference_engine_limits.py), which changes the answer too."""
SAMPLING = {"chat": {"temperature": 0.5}, "completion": {"temperature": 0.5}}
"""What ``top_p``, ``top_k`` and ``min_p`` need to change anything: at temperature 0 they are
ignored (vLLM resets them)."""
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"

SAMPLES: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Something else entirely."}],
    "prompt": "A different prompt",
    "model": "not-served",
    "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.2, "temperature": 0.9, "top_p": 0.5,
    "top_k": 5, "min_p": 0.1, "seed": 7, "n": 2, "stop": ["zz"], "stop_token_ids": [7], "min_tokens": 1,
    "ignore_eos": True, "include_stop_str_in_output": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "max_tokens": 3, "max_completion_tokens": 3,
    "logit_bias": {"5": 1.0}, "allowed_token_ids": [1, 2, 3], "bad_words": ["hello"],
    "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "[a-z]+"},
    "repetition_detection": {"max_pattern_size": 4, "min_pattern_size": 1, "min_count": 3},
    "routed_experts_prompt_start": 2, "vllm_xargs": {"k": 1}, "kv_transfer_params": {"do_remote_decode": True},
    "ec_transfer_params": {"k": "v"},
    "stream": True, "stream_options": {"include_usage": True}, "request_id": "my-request-1",
    "chat_template": TEMPLATE, "chat_template_kwargs": {"custom": 1}, "add_generation_prompt": False,
    "continue_final_message": True, "mm_processor_kwargs": {"do_pan_and_scan": True}, "cache_salt": "salt-1",
    "priority": 3, "user": "someone", "length_penalty": 2.0, "return_token_offsets": True, "mm_payload": "none",
    "return_mm_kwargs": False, "watermarking": True,
    "use_beam_search": True, "truncate_prompt_tokens": 3, "truncation_side": "right", "session_id": "s-1",
    "return_weight_versions": True, "stream_interval": 2, "documents": [{"title": "a", "text": "b"}],
    "return_prompt_text": True, "prompt_embeds": "AAAA", "suffix": "x", "media_io_kwargs": {"image": {"k": 1}},
    "thinking_token_budget": 10, "prompt_logprobs": 1, "logprob_token_ids": [1], "return_token_ids": True,
    "return_tokens_as_token_ids": True, "echo": True, "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto", "reasoning_effort": "low", "include_reasoning": False, "parallel_tool_calls": False,
}
"""A value other than vLLM's default for every field."""
EXTRA: dict[str, dict[str, Any]] = {
    "logprobs": {"chat": {"logprobs": True}, "completion": {"logprobs": 2}},
    "top_logprobs": {"chat": {"logprobs": True, "top_logprobs": 3}},
    "logprob_token_ids": {"chat": {"logprobs": True}, "completion": {"logprobs": 1}},
    "stream_options": {"chat": {"stream": True}, "completion": {"stream": True}},
    "top_p": SAMPLING, "top_k": SAMPLING, "min_p": SAMPLING,
    "n": {"chat": {"temperature": 0.5, "top_k": 1}, "completion": {"temperature": 0.5, "top_k": 1}},
    "return_tokens_as_token_ids": {"chat": {"logprobs": True}, "completion": {"logprobs": 1}},
    "add_special_tokens": {"chat": {"add_special_tokens": True}, "completion": {"add_special_tokens": False}},
    "truncation_side": {"chat": {"truncate_prompt_tokens": 3}, "completion": {"truncate_prompt_tokens": 2}},
    "continue_final_message": {"chat": {"add_generation_prompt": False,
                                        "messages": [*TEXT, {"role": "assistant", "content": "Well"}]}},
}
"""Fields that need company to be sent at all (``top_logprobs`` needs ``logprobs``), sent with it;
their base request gets the company too, less the field."""


@dataclass
class Seen:
    """What one HTTP request made the server do."""

    status: int
    body: Any
    content_type: str
    engine_requests: list[tuple[str, dict[str, Any], Any, list[int]]] = field(default_factory=list)
    """Per engine request: its id, its SamplingParams as a dict, its options, its prompt ids."""


@pytest.fixture(scope="module")
def served(gemma3_weights_dir: Path) -> Iterator[Served]:
    with serve(gemma3_weights_dir) as running:
        yield running


def send(served: Served, path: str, body: dict[str, Any]) -> Seen:
    """Send ``body``, recording each engine request the server makes for it."""
    client = served.client
    calls: list[tuple[str, dict[str, Any], Any, list[int]]] = []
    original = client.add_request

    async def recording(request_id: str, inputs: Any, params: Any = None, *, options: RequestOptions | None = None,
                        **kwargs: Any) -> Any:
        calls.append((request_id, msgspec.structs.asdict(params), options, list(inputs["prompt_token_ids"])))
        return await original(request_id, inputs, params, options=options, **kwargs)

    client.add_request = recording  # type: ignore[method-assign]
    try:
        answer = httpx.post(served.url + path, json=body, timeout=120)
    finally:
        client.add_request = original  # type: ignore[method-assign]
    text = answer.text
    body_out: Any = text if "event-stream" in answer.headers.get("content-type", "") else answer.json()
    return Seen(answer.status_code, body_out, answer.headers.get("content-type", ""), calls)


def refused_by_the_reference_engine(seen: Seen) -> bool:
    """The field reached the engine request, and the reference worker said it cannot honour it
    (tests/serve/test_reference_engine_limits.py): a 400 naming the field it refused."""
    if seen.status != 400 or not seen.engine_requests:
        return False
    error = seen.body["error"]
    return bool(error["message"].startswith("mmfront's reference engine") and error["param"])


def observed(seen: Seen) -> Any:
    """What a field may change, less what changes on every request (ids, times)."""
    requests = [(params, options, prompt) for _, params, options, prompt in seen.engine_requests]
    answer = seen.body
    if isinstance(answer, dict):
        answer = {k: v for k, v in answer.items() if k not in ("id", "created", "usage")}
    usage_chunk = '"choices":[]' in seen.body if isinstance(seen.body, str) else None
    shape = (seen.content_type, answer, usage_chunk)
    return seen.status, requests, shape


ENDPOINTS = {"chat": ("/v1/chat/completions", "ChatCompletionRequest", CHAT_BASE),
             "completion": ("/v1/completions", "CompletionRequest", COMPLETION_BASE)}
CASES = [(endpoint, name) for endpoint, (_, model, _) in ENDPOINTS.items() for name in VLLM_FIELDS[model]]


def test_every_field_has_a_sample_and_an_outcome() -> None:
    for names in VLLM_FIELDS.values():
        for name in names:
            assert name in SAMPLES or name in EXTRA, name
    assert not set(IGNORED_AS_VLLM_DOES) & REFUSED


SHOWN_ELSEWHERE = {
    "return_tokens_as_token_ids": "it changes logprob tokens only, and the reference worker computes no logprobs: "
                                  "tests/serve/test_vllm_serve_logprob_flags.py shows it honoured on a stock vLLM engine",
    "tools": "honoured only with a tool parser and a template that renders tools (vLLM refuses 'auto' without "
             "--enable-auto-tool-choice too): tests/serve/test_tools_vllm_serve.py shows it against vllm serve",
    "tool_choice": "as tools: tests/serve/test_tools_vllm_serve.py and test_chat_parsing.py",
    "parallel_tool_calls": "as tools: tests/serve/test_chat_parsing.py",
    "include_reasoning": "changes an answer only with --reasoning-parser: tests/serve/test_tools_vllm_serve.py",
    "use_beam_search": "each step asks the engine for logprobs, which the reference worker does not compute: "
                       "tests/serve/test_vllm_serve_beam_search.py shows it against vllm serve on a stock vLLM engine",
    "return_weight_versions": "the reference worker labels no weights (the answer's spans stay null, as vLLM's for "
                              "such an engine); tests/serve/test_vllm_serve_fields.py shows them on a stock vLLM "
                              "engine, which labels its weights 'default'",
}
"""Fields this server (the reference worker, no parsers) cannot show honoured, and the tests that do."""


@pytest.mark.slow
@pytest.mark.parametrize(("endpoint", "name"), CASES, ids=[f"{e}-{n}" for e, n in CASES])
def test_a_field_is_honoured_or_refused_never_dropped(served: Served, endpoint: str, name: str) -> None:
    if name in ("structured_outputs", "response_format"):
        pytest.importorskip("xgrammar", reason="xgrammar is not installed (a dependency of mmfront: pip install -e .)")
    if name in SHOWN_ELSEWHERE:
        pytest.skip(f"{name}: {SHOWN_ELSEWHERE[name]}")
    path, _, base = ENDPOINTS[endpoint]
    company = EXTRA.get(name, {}).get(endpoint, {})
    sent = {**base, **company}
    if name in SAMPLES:
        sent[name] = SAMPLES[name]
    reference = {k: v for k, v in {**base, **company}.items() if k != name}
    got = send(served, path, sent)
    if name in REFUSED:
        assert got.status == 400, got.body
        error = got.body["error"]
        assert error["param"] == name or name in error["message"], error
        return
    assert got.status in (200, 404) or refused_by_the_reference_engine(got), got.body
    want = send(served, path, reference)
    if name in IGNORED_AS_VLLM_DOES:
        assert observed(got) == observed(want)
    elif name == "request_id":
        assert got.body["id"].endswith(SAMPLES["request_id"]) and not want.body["id"].endswith(SAMPLES["request_id"])
    else:
        assert observed(got) != observed(want), f"{name} changed nothing: {observed(got)}"


def test_the_field_lists_are_vllms() -> None:
    python = vllm_peer_python()
    if python is None:
        pytest.skip(SKIP_REASON)
    script = ("import json\nfrom vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest\n"
              "from vllm.entrypoints.openai.completion.protocol import CompletionRequest\n"
              "print(json.dumps({c.__name__: list(c.model_fields) for c in (ChatCompletionRequest, CompletionRequest)}))")
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300, check=False,
                         env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    live = json.loads(run.stdout.strip().splitlines()[-1])
    assert {k: tuple(v) for k, v in live.items()} == VLLM_FIELDS


def test_the_recording_sees_the_engine_requests(served: Served) -> None:
    seen = send(served, "/v1/chat/completions", {**CHAT_BASE, "n": 2, "temperature": 0.5, "top_k": 1})
    assert seen.status == 200 and len(seen.engine_requests) == 2
    assert [params["n"] for _, params, _, _ in seen.engine_requests] == [1, 1]
