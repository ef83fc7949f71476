"""``vllm serve``'s routes besides generation, and the HTTP flags, on ``mmfront serve``'s app in
front of a real ``mmfront worker`` (tiny Gemma 3): ``/tokenize`` (prompt and chat forms, an
image's placeholders expanded, ``add_special_tokens``, ``return_token_strs``), ``/detokenize``,
``/tokenizer_info`` (only with ``--enable-tokenizer-info-endpoint``), ``/ping``,
``/invocations`` (routed by body), ``/openapi.json``, ``/docs`` and ``/redoc`` (gone with
``--disable-fastapi-docs``), CORS, ``--root-path``, ``--middleware``,
``--enable-request-id-headers``, ``--enable-force-include-usage``, ``--response-role``,
``--return-tokens-as-token-ids`` and the request log. The same cases against ``vllm serve`` side
by side: tests/serve/test_vllm_serve_routes.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_harness import MODEL_NAME, Served, run_app, serve
from starlette.requests import Request
from starlette.responses import Response

from mmfront import MultiModalConfig
from mmfront.serve.app import create_app
from mmfront.serve.protocol import CompletionRequest
from mmfront.serve.settings import ServeSettings
from mmfront.testing.media import image_data_url, make_image

pytestmark = pytest.mark.slow

IMAGE = image_data_url(make_image(24, 20, seed=1))
TEXT_CHAT = [{"role": "user", "content": "Hi there!"}, {"role": "assistant", "content": "Nice to meet you!"},
             {"role": "user", "content": "Can I ask a question?"}]
IMAGE_CHAT = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                          {"type": "text", "text": "What is this?"}]}]


async def tagging_middleware(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """A ``--middleware`` function: tags every response."""
    response = await call_next(request)
    response.headers["X-Tagged"] = "yes"
    return response


@dataclass
class Apps:
    served: Served
    plain: str
    flagged: str
    bare: str
    tokenizer: Any
    flagged_app: Any
    bare_app: Any


@pytest.fixture(scope="module")
def apps(gemma3_weights_dir: Path) -> Iterator[Apps]:
    config = MultiModalConfig(mm_processor_cache_gb=0.02, max_model_len=2048, trust_request_chat_template=True)
    with serve(gemma3_weights_dir, config=config) as served:
        flagged = create_app(served.client, ServeSettings(
            gemma3_weights_dir, served_model_name=(MODEL_NAME,), enable_tokenizer_info_endpoint=True,
            allowed_origins=("https://app.example",), allow_credentials=True, root_path="/llm",
            middleware=(f"{__name__}.tagging_middleware",), enable_request_id_headers=True,
            enable_force_include_usage=True, response_role="model", return_tokens_as_token_ids=True,
            enable_log_requests=True, max_log_len=5, log_error_stack=True, enable_server_load_tracking=True,
            default_chat_template_kwargs={"greeting": "hello", "name": "server"}, fingerprint_mode="custom",
            fingerprint_value="fp-1", trust_request_mm_kwargs=True))
        bare = create_app(served.client, ServeSettings(gemma3_weights_dir, served_model_name=(MODEL_NAME,),
                                                       disable_fastapi_docs=True, fingerprint_mode="none"))
        with run_app(flagged) as flagged_url, run_app(bare) as bare_url:
            yield Apps(served, served.url, flagged_url, bare_url, served.preprocessor.tokenizer, flagged, bare)


def post(url: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, json=body, timeout=120, **kwargs)


# --- /tokenize, /detokenize, /tokenizer_info ----------------------------------------------------


@pytest.mark.parametrize("add_special", [False, True])
def test_tokenize_prompt(apps: Apps, add_special: bool) -> None:
    prompt = "vllm1 This is a test prompt."
    tokens = apps.tokenizer.encode(prompt, add_special_tokens=add_special)
    answer = post(f"{apps.plain}/tokenize", {"model": MODEL_NAME, "prompt": prompt, "add_special_tokens": add_special})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"count": len(tokens), "max_model_len": 2048, "tokens": tokens, "token_strs": None}


def test_tokenize_return_token_strs(apps: Apps) -> None:
    prompt = "This is a token_strs test prompt! vllm1"
    tokens = apps.tokenizer.encode(prompt, add_special_tokens=True)
    answer = post(f"{apps.plain}/tokenize", {"prompt": prompt, "return_token_strs": True}).json()
    assert answer["tokens"] == tokens
    assert answer["token_strs"] == apps.tokenizer.convert_ids_to_tokens(tokens)


@pytest.mark.parametrize(("add_generation", "continue_final", "add_special"),
                         [(True, False, False), (False, False, False), (False, True, False), (True, False, True)])
def test_tokenize_chat(apps: Apps, add_generation: bool, continue_final: bool, add_special: bool) -> None:
    """vLLM's test_tokenize_chat: the template rendered, then tokenized (``add_special_tokens``
    adds the tokenizer's own on top, so Gemma's BOS twice)."""
    conversation = [*TEXT_CHAT, {"role": "assistant", "content": "Sure,"}] if continue_final else TEXT_CHAT
    prompt = apps.tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation,
                                                continue_final_message=continue_final, tokenize=False)
    tokens = apps.tokenizer.encode(prompt, add_special_tokens=add_special)
    answer = post(f"{apps.plain}/tokenize", {"model": MODEL_NAME, "messages": conversation,
                                             "add_generation_prompt": add_generation,
                                             "continue_final_message": continue_final, "add_special_tokens": add_special})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"count": len(tokens), "max_model_len": 2048, "tokens": tokens, "token_strs": None}


def test_tokenize_chat_with_an_image_counts_its_placeholders(apps: Apps) -> None:
    """The ids are exactly those a chat completion of the messages sends (the image expanded)."""
    expected = apps.served.preprocessor.preprocess(IMAGE_CHAT)["prompt_token_ids"]
    answer = post(f"{apps.plain}/tokenize", {"messages": IMAGE_CHAT}).json()
    assert answer["tokens"] == list(expected)
    text_only = post(f"{apps.plain}/tokenize", {"messages": [{"role": "user", "content": "What is this?"}]}).json()
    assert answer["count"] == len(expected) > text_only["count"] + 8  # the image's placeholders


def test_tokenize_errors(apps: Apps) -> None:
    both = post(f"{apps.plain}/tokenize", {"messages": TEXT_CHAT, "add_generation_prompt": True,
                                           "continue_final_message": True})
    assert both.status_code == 400
    assert both.json()["error"]["message"].startswith(
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    unknown = post(f"{apps.plain}/tokenize", {"model": "other", "prompt": "x"})
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "NotFoundError")
    shape = post(f"{apps.plain}/tokenize", {"prompt": 3})
    assert (shape.status_code, shape.json()["error"]["param"]) == (400, "body.prompt")
    text = httpx.post(f"{apps.plain}/tokenize", content=b"{}", headers={"content-type": "text/plain"})
    assert text.status_code == 400


def test_detokenize(apps: Apps) -> None:
    prompt = "This is a test prompt. vllm1"
    tokens = apps.tokenizer.encode(prompt, add_special_tokens=False)
    answer = post(f"{apps.plain}/detokenize", {"model": MODEL_NAME, "tokens": tokens})
    assert (answer.status_code, answer.json()) == (200, {"prompt": prompt})
    negative = post(f"{apps.plain}/detokenize", {"tokens": [5, -1]})
    assert (negative.status_code, negative.json()["error"]["param"]) == (400, "tokens.1")


def test_tokenizer_info_only_with_its_flag(apps: Apps) -> None:
    assert httpx.get(f"{apps.plain}/tokenizer_info").status_code == 404
    info = httpx.get(f"{apps.flagged}/tokenizer_info").json()
    assert info["tokenizer_class"] == type(apps.tokenizer).__name__
    assert "vocab_file" not in info and "merges_file" not in info
    # vLLM's TokenizerInfo writes each added token as its text
    added = info["added_tokens_decoder"]
    assert added and all(text == apps.tokenizer.convert_ids_to_tokens(int(i)) for i, text in added.items())


# --- /ping, /invocations, docs -------------------------------------------------------------------


def test_ping_answers_as_health(apps: Apps) -> None:
    assert httpx.get(f"{apps.plain}/ping").status_code == 200
    assert httpx.post(f"{apps.plain}/ping").status_code == 200


def test_invocations_routes_by_body(apps: Apps) -> None:
    """A chat body is answered as a chat completion, a prompt as a completion; the same answer
    as the route itself (greedy)."""
    chat = {"messages": TEXT_CHAT, "max_tokens": 4, "temperature": 0}
    via = post(f"{apps.plain}/invocations", chat).json()
    direct = post(f"{apps.plain}/v1/chat/completions", chat).json()
    assert via["object"] == "chat.completion"
    assert via["choices"] == direct["choices"]
    completion = {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0}
    via = post(f"{apps.plain}/invocations", completion).json()
    assert via["object"] == "text_completion"
    assert via["choices"] == post(f"{apps.plain}/v1/completions", completion).json()["choices"]
    neither = post(f"{apps.plain}/invocations", {"prompt": 3})
    assert neither.status_code == 400
    assert neither.json()["error"]["message"] == ("Cannot find suitable handler for request. Expected one of: "
                                                  "['ChatCompletionRequest', 'CompletionRequest']")
    assert post(f"{apps.plain}/invocations", {"prompt": "x", "max_tokens": -1}).status_code == 400
    no_prompt = post(f"{apps.plain}/invocations", {"messages": "not a list"}).json()["error"]  # a completion's
    assert (no_prompt["param"], no_prompt["message"]) == (
        "prompt", "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)")


def test_an_empty_model_name_and_lax_token_ids_are_taken_as_vllm_takes_them(apps: Apps) -> None:
    chat = post(f"{apps.plain}/v1/chat/completions", {"model": "", "messages": TEXT_CHAT, "max_tokens": 1,
                                                      "temperature": 0})
    assert (chat.status_code, chat.json()["model"]) == (200, MODEL_NAME)
    assert post(f"{apps.plain}/detokenize", {"tokens": [str(t) for t in apps.tokenizer.encode(
        "Hello", add_special_tokens=False)]}).json() == {"prompt": "Hello"}


def test_an_empty_request_id_is_used_as_it_is_as_vllm_uses_it(apps: Apps) -> None:
    body = {"messages": TEXT_CHAT, "max_tokens": 1, "temperature": 0}
    assert post(f"{apps.plain}/v1/chat/completions", {**body, "request_id": ""}).json()["id"] == "chatcmpl-"
    header = httpx.post(f"{apps.plain}/v1/completions", json={"prompt": "x", "max_tokens": 1, "temperature": 0},
                        headers={"X-Request-Id": ""}, timeout=60)
    assert header.json()["id"] == "cmpl-"
    assert len(post(f"{apps.plain}/v1/chat/completions", body).json()["id"]) > len("chatcmpl-")  # none: random


def test_chat_bodies_vllm_refuses(apps: Apps) -> None:
    empty = post(f"{apps.plain}/v1/chat/completions", {"messages": []})
    assert empty.status_code == 400
    assert (empty.json()["error"]["message"], empty.json()["error"]["param"]) == (
        "Cannot apply chat template to an empty conversation. Provide at least one message.", None)
    null = post(f"{apps.plain}/v1/chat/completions", {"messages": [{"role": "user", "content": None}]})
    assert (null.status_code, null.json()["error"]["type"], null.json()["error"]["param"]) == (
        400, "Bad Request", "body.messages.0.content")
    zero = post(f"{apps.plain}/v1/chat/completions", {"messages": TEXT_CHAT, "max_completion_tokens": 0,
                                                       "max_tokens": 3})  # the first wins, 0 included
    assert (zero.status_code, zero.json()["error"]["message"]) == (
        400, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)")
    empty_ids = post(f"{apps.plain}/v1/completions", {"prompt": [[1000], []], "max_tokens": 2})
    assert (empty_ids.status_code, empty_ids.json()["error"]["message"]) == (400, "The decoder prompt cannot be empty")
    tokenized = post(f"{apps.plain}/tokenize", {"messages": [{"role": "user", "content": None}]})
    assert (tokenized.status_code, tokenized.json()["error"]["param"]) == (400, "body.messages.0.content")
    # vLLM's request model refuses the chat, so /invocations reads the body as a completion
    via = post(f"{apps.plain}/invocations", {"messages": [{"role": "user", "content": None}]}).json()["error"]
    assert via["param"] == "prompt"


def test_media_io_kwargs_reach_the_media_loading_with_trust_request_mm_kwargs(apps: Apps) -> None:
    """Without the flag a request's ``media_io_kwargs`` are refused in vLLM's words; with it they are
    the media loading's options: honoured, and an option loading does not take refused, naming them."""
    chat = {"model": MODEL_NAME, "messages": IMAGE_CHAT, "max_tokens": 1, "temperature": 0}
    loading = {"media_io_kwargs": {"image": {"rgba_background_color": [0, 0, 0]}}}
    untrusted = post(f"{apps.plain}/v1/chat/completions", {**chat, **loading})
    assert untrusted.status_code == 400
    assert untrusted.json()["error"]["message"].startswith("Per-request media_io_kwargs are disabled by default")
    for path in ("/v1/chat/completions", "/tokenize"):
        honoured = post(f"{apps.flagged}/llm{path}", {**chat, **loading})
        assert honoured.status_code == 200, honoured.text
        unknown = post(f"{apps.flagged}/llm{path}", {**chat, "media_io_kwargs": {"image": {"nope": 1}}})
        assert unknown.status_code == 400, path
        assert unknown.json()["error"]["param"] == "media_io_kwargs"
        assert "image loading accepts ['image_mode', 'rgba_background_color']" in unknown.json()["error"]["message"]
    completion = post(f"{apps.flagged}/llm/v1/completions", {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1, "temperature": 0,
                                                             **loading})
    assert completion.status_code == 200


def test_anthropic_messages_answer_as_the_chat_route(apps: Apps) -> None:
    """``/v1/messages`` serves the chat request it translates into: the same prompt and text as
    ``/v1/chat/completions``, written as an Anthropic message, whole or as its events."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE.split(",", 1)[1]}}
    anthropic = {"model": MODEL_NAME, "max_tokens": 4, "temperature": 0, "system": "Be brief.",
                 "messages": [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]}
    chat = post(f"{apps.plain}/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 4, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."}, *IMAGE_CHAT]}).json()
    answer = post(f"{apps.plain}/v1/messages", anthropic)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["content"] == [{"type": "text", "text": chat["choices"][0]["message"]["content"]}]
    assert body["usage"] == {"input_tokens": chat["usage"]["prompt_tokens"],
                             "output_tokens": chat["usage"]["completion_tokens"]}
    assert (body["type"], body["role"], body["model"], body["stop_reason"]) == ("message", "assistant", MODEL_NAME,
                                                                                "max_tokens")
    stream = post(f"{apps.plain}/v1/messages", {**anthropic, "stream": True})
    assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = [(e.split("\n")[0].removeprefix("event: "), json.loads(e.split("\n")[1].removeprefix("data: ")))
              for e in stream.text.split("\n\n") if e.strip()]
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 1 and names == ["message_start", "content_block_start", *["content_block_delta"] * deltas,
                                     "content_block_stop", "message_delta", "message_stop"]
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == body["content"][0]["text"]
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    count = post(f"{apps.plain}/v1/messages/count_tokens", {k: v for k, v in anthropic.items()
                                                            if k not in ("max_tokens", "temperature")}).json()
    assert count == {"input_tokens": chat["usage"]["prompt_tokens"],
                     "context_management": {"original_input_tokens": chat["usage"]["prompt_tokens"]}}


def test_anthropic_errors_take_anthropics_shape_after_the_body_is_read(apps: Apps) -> None:
    unknown = post(f"{apps.plain}/v1/messages", {"model": "other", "max_tokens": 1, "messages": TEXT_CHAT})
    assert unknown.status_code == 404
    assert unknown.json() == {"type": "error", "error": {
        "type": "not_found_error", "message": f"The model `other` does not exist. Valid aliases: {MODEL_NAME}."}}
    shape = post(f"{apps.plain}/v1/messages", {"model": MODEL_NAME, "messages": TEXT_CHAT})
    assert shape.status_code == 400
    assert (shape.json()["error"]["type"], shape.json()["error"]["param"]) == ("Bad Request", "body.max_tokens")
    empty = post(f"{apps.plain}/v1/messages", {"model": MODEL_NAME, "max_tokens": 1, "messages": []})
    assert empty.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": (
        "Cannot apply chat template to an empty conversation. Provide at least one message.")}}


def test_openapi_and_docs(apps: Apps) -> None:
    schema = httpx.get(f"{apps.plain}/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/invocations", "/ping",
            "/v1/models", "/health", "/version", "/metrics"} <= set(schema["paths"])
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "messages" in schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]["properties"]
    assert "swagger-ui" in httpx.get(f"{apps.plain}/docs").text
    assert "<redoc spec-url=\"/openapi.json\">" in httpx.get(f"{apps.plain}/redoc").text
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(f"{apps.bare}{path}").status_code == 404
    assert httpx.get(f"{apps.flagged}/docs").text.count("url: '/llm/openapi.json'") == 1
    assert httpx.get(f"{apps.flagged}/openapi.json").json()["servers"] == [{"url": "/llm"}]


# --- HTTP flags ----------------------------------------------------------------------------------


def test_cors(apps: Apps) -> None:
    """Off by default (no CORS header); ``--allowed-origins`` lets the origin named in."""
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    allowed = httpx.options(f"{apps.flagged}/v1/models", headers=preflight)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert allowed.headers["access-control-allow-credentials"] == "true"
    other = httpx.get(f"{apps.flagged}/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    plain = httpx.get(f"{apps.plain}/v1/models", headers={"Origin": "https://app.example"})
    assert "access-control-allow-origin" not in plain.headers


def test_root_path_serves_both_prefixed_and_plain_paths(apps: Apps) -> None:
    """vLLM's test_root_path: behind a proxy at /llm, both /llm/v1/... and /v1/... answer."""
    for path in ("/llm/v1/models", "/v1/models"):
        assert httpx.get(apps.flagged + path).json()["data"][0]["id"] == MODEL_NAME


def test_middleware_and_request_id_headers(apps: Apps) -> None:
    given = httpx.get(f"{apps.flagged}/health", headers={"X-Request-Id": "abc"})
    assert (given.headers["x-tagged"], given.headers["x-request-id"]) == ("yes", "abc")
    made = httpx.get(f"{apps.flagged}/health").headers["x-request-id"]
    assert len(made) == 32 and int(made, 16) >= 0
    assert "x-tagged" not in httpx.get(f"{apps.plain}/health").headers
    assert "x-request-id" not in httpx.get(f"{apps.plain}/health").headers


def stream_events(url: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_force_include_usage(apps: Apps) -> None:
    """Without ``stream_options`` every chunk carries the usage so far and a usage chunk ends the
    stream; without the flag there is none."""
    body = {"messages": TEXT_CHAT, "max_tokens": 3, "temperature": 0}
    forced = stream_events(f"{apps.flagged}/v1/chat/completions", body)
    assert all(chunk.get("usage") for chunk in forced)
    assert forced[-1]["choices"] == [] and forced[-1]["usage"]["completion_tokens"] == 3
    plain = stream_events(f"{apps.plain}/v1/chat/completions", body)
    assert all(chunk.get("usage") is None for chunk in plain)


def test_response_role(apps: Apps) -> None:
    body = {"messages": TEXT_CHAT, "max_tokens": 2, "temperature": 0}
    assert post(f"{apps.flagged}/v1/chat/completions", body).json()["choices"][0]["message"]["role"] == "model"
    assert stream_events(f"{apps.flagged}/v1/chat/completions", body)[0]["choices"][0]["delta"]["role"] == "model"
    assert post(f"{apps.plain}/v1/chat/completions", body).json()["choices"][0]["message"]["role"] == "assistant"
    continued = {**body, "messages": [*TEXT_CHAT, {"role": "assistant", "content": "Sure"}],
                 "add_generation_prompt": False, "continue_final_message": True}
    assert post(f"{apps.flagged}/v1/chat/completions", continued).json()["choices"][0]["message"]["role"] == "assistant"


def test_return_tokens_as_token_ids(apps: Apps) -> None:
    """With the flag, logprob tokens are written ``token_id:{id}`` unless the request says
    otherwise (end to end with logprobs: test_vllm_serve_routes.py)."""
    flagged = apps.flagged_app.state.mmfront_server
    plain = apps.bare_app.state.mmfront_server
    request = CompletionRequest(prompt="x")
    assert flagged.logprob_format(request).token(17, None) == "token_id:17"
    assert plain.logprob_format(request).token(17, None) == apps.tokenizer.decode([17])
    as_text = CompletionRequest(prompt="x", return_tokens_as_token_ids=False)
    assert flagged.logprob_format(as_text).token(17, None) == apps.tokenizer.decode([17])


def test_request_log(apps: Apps, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="mmfront.serve.requests"):
        post(f"{apps.flagged}/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 2, "temperature": 0},
             headers={"X-Request-Id": "logged-1"})
        post(f"{apps.plain}/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 2, "temperature": 0},
             headers={"X-Request-Id": "unlogged-1"})
    messages = [r.getMessage() for r in caplog.records if r.name == "mmfront.serve.requests"]
    received = [m for m in messages if m.startswith("Received request ")]
    assert len(received) == 1 and received[0].startswith("Received request cmpl-logged-1-")
    details = [m for m in messages if "details: prompt: " in m]
    assert len(details) == 1 and "prompt: 'The q'" in details[0]  # --max-log-len 5


def test_default_chat_template_kwargs_under_the_requests(apps: Apps) -> None:
    template = "{{ greeting }} {{ name }}:{% for m in messages %}{{ m['content'] }}{% endfor %}"
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template": template}

    def rendered(url: str, kwargs: dict[str, str] | None) -> str:
        tokens = post(f"{url}/tokenize", {**body, **({"chat_template_kwargs": kwargs} if kwargs else {})}).json()
        return str(apps.tokenizer.decode(tokens["tokens"]))

    assert rendered(apps.flagged, None) == "hello server:x"
    assert rendered(apps.flagged, {"name": "request"}) == "hello request:x"
    assert rendered(apps.plain, {"greeting": "hi"}) == "hi :x"


def test_fingerprint_modes(apps: Apps) -> None:
    body = {"prompt": "The quick brown fox", "max_tokens": 1, "temperature": 0}
    assert post(f"{apps.flagged}/v1/completions", body).json()["system_fingerprint"] == "fp-1"
    assert post(f"{apps.bare}/v1/completions", body).json()["system_fingerprint"] is None
    assert post(f"{apps.plain}/v1/completions", body).json()["system_fingerprint"].startswith("mmfront-")


def test_server_load(apps: Apps) -> None:
    """``/load`` counts generation requests in flight, only with the flag."""
    assert httpx.get(f"{apps.flagged}/load").json() == {"server_load": 0}
    body = {"prompt": "The quick brown fox", "max_tokens": 400, "ignore_eos": True, "temperature": 0}
    seen: dict[str, set[int]] = {}
    for name, url in (("flagged", apps.flagged), ("plain", apps.plain)):
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(post, f"{url}/v1/completions", body)
            loads = set()
            while not done.done():
                loads.add(httpx.get(f"{url}/load").json()["server_load"])
            assert done.result().json()["usage"]["completion_tokens"] == 400
        seen[name] = loads
    assert seen == {"flagged": {0, 1}, "plain": {0}} or seen == {"flagged": {1}, "plain": {0}}
    assert httpx.get(f"{apps.flagged}/load").json() == {"server_load": 0}


def test_log_error_stack(apps: Apps, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="mmfront.serve.server"):
        assert post(f"{apps.flagged}/v1/completions", {"prompt": "x", "max_tokens": -1}).status_code == 400
        assert post(f"{apps.plain}/v1/completions", {"prompt": "x", "max_tokens": -1}).status_code == 400
    logged = [r for r in caplog.records if r.name == "mmfront.serve.server"]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert logged[0].getMessage() == "Error response to POST /v1/completions"
