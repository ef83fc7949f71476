"""The OpenAI surface of ``mmfront serve`` against a real ``mmfront worker`` (tiny Gemma 3 with
random weights, greedy): chat and completions, JSON and SSE, read with the official ``openai``
client and raw HTTP; the text equals the model's own tokens decoded; ``n > 1``, stop strings,
usage, the error table, ``--api-key``, the body limit, ``/v1/models``, ``/health``, ``/version``,
``/metrics``. One worker and server for the whole module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_harness import MODEL_NAME, Served, expected_text, run_app, serve

from local_services import greedy_answers
from mmfront import MultiModalConfig
from mmfront.serve.app import create_app
from mmfront.serve.settings import ServeSettings
from mmfront.testing.media import image_data_url, make_image

pytestmark = pytest.mark.slow

IMAGES = [image_data_url(make_image(24 + 4 * i, 20 + 2 * i, seed=i)) for i in range(3)]
MAX_TOKENS = 12
API_KEY = "sesame"
BODY_LIMIT = 64 << 10


def chat(*images: int, text: str = "What is in these pictures?") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": IMAGES[i]}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@dataclass
class Setup:
    served: Served
    keyed_url: str
    small_body_url: str
    tokenizer: Any
    expected: dict[str, list[int]]

    def text(self, name: str) -> str:
        return expected_text(self.tokenizer, self.expected[name])


PROMPTS: dict[str, Any] = {"one": chat(0), "two": chat(1, 2), "plain": "The quick brown fox"}


@pytest.fixture(scope="module")
def setup(gemma3_weights_dir: Path) -> Iterator[Setup]:
    config = MultiModalConfig(mm_processor_cache_gb=0.02, limit_mm_per_prompt={"image": 2})
    tokens = greedy_answers(gemma3_weights_dir, list(PROMPTS.values()), MAX_TOKENS)
    with serve(gemma3_weights_dir, config=config) as served:
        keyed = create_app(served.client, ServeSettings(gemma3_weights_dir, served_model_name=(MODEL_NAME,),
                                                        api_key=API_KEY))
        small = create_app(served.client, ServeSettings(gemma3_weights_dir, served_model_name=(MODEL_NAME,),
                                                        max_body_bytes=BODY_LIMIT))
        with run_app(keyed) as keyed_url, run_app(small) as small_url:
            yield Setup(served, keyed_url, small_url, served.preprocessor.tokenizer, dict(zip(PROMPTS, tokens)))


@pytest.fixture(scope="module")
def client(setup: Setup) -> openai.OpenAI:
    return openai.OpenAI(base_url=setup.served.v1, api_key="unused", max_retries=0, timeout=120)


def finish_of(setup: Setup, name: str) -> str:
    return "length" if len(setup.expected[name]) == MAX_TOKENS else "stop"


def prompt_tokens(setup: Setup, name: str) -> int:
    return len(setup.served.preprocessor.preprocess(PROMPTS[name])["prompt_token_ids"])


def sse_events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an event stream, JSON-decoded but for ``[DONE]``."""
    events = []
    for block in response.text.split("\n\n"):
        if block:
            assert block.startswith("data: ")
            payload = block.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# --- chat -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["one", "two"])
def test_chat_with_images_answers_the_models_own_text_and_usage(setup: Setup, client: openai.OpenAI,
                                                                 name: str) -> None:
    out = client.chat.completions.create(model=MODEL_NAME, messages=PROMPTS[name], max_tokens=MAX_TOKENS, temperature=0)
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion" and out.model == MODEL_NAME
    [choice] = out.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == setup.text(name)
    assert choice.finish_reason == finish_of(setup, name)
    assert out.usage is not None
    assert out.usage.prompt_tokens == prompt_tokens(setup, name)
    assert out.usage.completion_tokens == len(setup.expected[name])
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_chat_json_has_vllms_fields(setup: Setup) -> None:
    body = httpx.post(setup.served.v1 + "/chat/completions", timeout=120,
                      json={"model": MODEL_NAME, "messages": PROMPTS["one"], "max_tokens": MAX_TOKENS,
                            "temperature": 0}).json()
    assert list(body) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                          "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
                          "ec_transfer_params", "metrics"]
    [choice] = body["choices"]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
                            "routed_experts", "weight_versions"]
    assert choice["stop_reason"] is None and choice["logprobs"] is None
    assert list(body["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
                                   "completion_tokens_details"]


def test_chat_stream_sends_role_content_finish_usage_and_done(setup: Setup) -> None:
    response = httpx.post(setup.served.v1 + "/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "messages": PROMPTS["two"], "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    role, *content, finish, usage = events[:-1]
    assert len({e["id"] for e in events[:-1]}) == 1 and all(e["object"] == "chat.completion.chunk"
                                                            for e in events[:-1])
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    [last] = finish["choices"]
    assert last["finish_reason"] == finish_of(setup, "two") and last["stop_reason"] is None
    text = "".join(c["choices"][0]["delta"]["content"] for c in [*content, finish])
    assert text == setup.text("two")
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": prompt_tokens(setup, "two"), "total_tokens": prompt_tokens(setup, "two") + MAX_TOKENS,
        "completion_tokens": len(setup.expected["two"])}
    assert "system_fingerprint" in usage and "system_fingerprint" not in finish


def test_chat_stream_with_the_openai_client(setup: Setup, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL_NAME, messages=PROMPTS["one"], max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == setup.text("one")
    assert chunks[-1].choices[0].finish_reason == finish_of(setup, "one")
    assert chunks[-1].usage is None  # no usage chunk without stream_options.include_usage


def test_async_client_runs_requests_concurrently(setup: Setup) -> None:
    import asyncio

    async def main() -> list[str | None]:
        async with openai.AsyncOpenAI(base_url=setup.served.v1, api_key="unused", max_retries=0) as aclient:
            outs = await asyncio.gather(*(aclient.chat.completions.create(
                model=MODEL_NAME, messages=PROMPTS[name], max_tokens=MAX_TOKENS, temperature=0)
                for name in ("one", "two", "one")))
        return [o.choices[0].message.content for o in outs]

    assert asyncio.run(main()) == [setup.text("one"), setup.text("two"), setup.text("one")]


def test_n_choices_are_separate_engine_requests_merged(setup: Setup, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL_NAME, messages=PROMPTS["one"], max_tokens=MAX_TOKENS, n=3,
                                         temperature=1.0, extra_body={"top_k": 1})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.message.content for c in out.choices] == [setup.text("one")] * 3  # top_k 1: greedy, as the engine
    assert out.usage is not None and out.usage.completion_tokens == 3 * len(setup.expected["one"])
    assert out.usage.prompt_tokens == prompt_tokens(setup, "one")
    events = sse_events(httpx.post(setup.served.v1 + "/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "messages": PROMPTS["one"], "max_tokens": MAX_TOKENS, "n": 2, "temperature": 1.0,
        "top_k": 1, "stream": True}))
    texts = {0: "", 1: ""}
    for event in events[:-1]:
        [choice] = event["choices"]
        texts[choice["index"]] += choice["delta"].get("content", "")
    assert texts == {0: setup.text("one"), 1: setup.text("one")}


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_the_text_and_ends_the_choice(setup: Setup, include: bool) -> None:
    full = setup.text("one")
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = full.index(stop) + (len(stop) if include else 0)
    body = {"model": MODEL_NAME, "messages": PROMPTS["one"], "max_tokens": MAX_TOKENS, "temperature": 0, "stop": [stop],
            "include_stop_str_in_output": include}
    out = httpx.post(setup.served.v1 + "/chat/completions", json=body, timeout=120).json()
    [choice] = out["choices"]
    assert (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]) == (full[:cut], "stop", stop)
    assert out["usage"]["completion_tokens"] <= len(setup.expected["one"])
    events = sse_events(httpx.post(setup.served.v1 + "/chat/completions", json={**body, "stream": True},
                                   timeout=120))
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[1:-1]) == full[:cut]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["choices"][0]["stop_reason"] == stop


def test_x_request_id_names_the_response(setup: Setup) -> None:
    response = httpx.post(setup.served.v1 + "/chat/completions", headers={"X-Request-Id": "abc-123"}, timeout=120,
                          json={"model": MODEL_NAME, "messages": PROMPTS["one"], "max_tokens": 2, "temperature": 0})
    assert response.json()["id"] == "chatcmpl-abc-123" and response.headers["x-request-id"] == "abc-123"


# --- completions ------------------------------------------------------------------------------------


def test_completion_of_a_text_prompt(setup: Setup, client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPTS["plain"], max_tokens=MAX_TOKENS, temperature=0)
    assert out.id.startswith("cmpl-") and out.object == "text_completion"
    [choice] = out.choices
    assert choice.text == setup.text("plain") and choice.finish_reason == finish_of(setup, "plain")
    assert out.usage is not None and out.usage.prompt_tokens == prompt_tokens(setup, "plain")
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPTS["plain"], max_tokens=MAX_TOKENS,
                                       temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == setup.text("plain")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(setup.expected["plain"])


def test_completion_of_several_prompts(setup: Setup) -> None:
    out = httpx.post(setup.served.v1 + "/completions", timeout=120, json={
        "model": MODEL_NAME, "prompt": [PROMPTS["plain"], PROMPTS["plain"]], "max_tokens": MAX_TOKENS,
        "temperature": 0}).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert [c["text"] for c in out["choices"]] == [setup.text("plain")] * 2
    assert out["usage"]["prompt_tokens"] == 2 * prompt_tokens(setup, "plain")


# --- errors ----------------------------------------------------------------------------------------


ERRORS = [
    ("unknown model", {"model": "nope"}, 404, "NotFoundError", "model"),
    ("max_tokens -1", {"max_tokens": -1}, 400, "BadRequestError", "max_tokens"),
    ("max_tokens over the context", {"max_tokens": 100_000}, 400, "BadRequestError", "max_tokens"),
    ("temperature", {"temperature": 5}, 400, "BadRequestError", "temperature"),
    ("n with greedy", {"n": 2, "temperature": 0}, 400, "BadRequestError", "n"),
    ("stream_options without stream", {"stream_options": {"include_usage": True}}, 400, "BadRequestError",
     "stream_options"),
    ("top_logprobs without logprobs", {"top_logprobs": 2}, 400, "BadRequestError", "top_logprobs"),
    ("messages missing", {"messages": None}, 400, "Bad Request", "body.messages"),
    ("messages not a list", {"messages": "hi"}, 400, "Bad Request", "body.messages"),
    ("max_tokens not a number", {"max_tokens": "many"}, 400, "Bad Request", "body.max_tokens"),
    ("too many images", {"messages": chat(0, 1, 2)}, 400, "BadRequestError", "image"),
    ("bad image", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400, "BadRequestError",
     "multi_modal_data"),
    ("unknown processor kwarg", {"mm_processor_kwargs": {"do_pan_and_scn": True}}, 400, "BadRequestError",
     "mm_processor_kwargs"),
    # a URL refused before any connection is a 400 (vLLM: a URL outside its domains): by default any public
    # host is fetched, a loopback or link-local address only where --allowed-media-domains names it; one that
    # cannot be fetched a 422 (vLLM's VLLMUnprocessableEntityError)
    ("loopback media URL", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}]}]}, 400, "BadRequestError",
     "multi_modal_data"),
    ("link-local media URL", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}]}, 400,
     "BadRequestError", "multi_modal_data"),
    ("malformed media URL", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://[::g]/cat.png"}}]}]}, 422, "UnprocessableEntityError",
     "multi_modal_data"),
]


@pytest.mark.parametrize(("case", "change", "status", "kind", "param"), ERRORS, ids=[e[0] for e in ERRORS])
def test_error_table(setup: Setup, case: str, change: dict[str, Any], status: int, kind: str,
                     param: str | None) -> None:
    body = {"model": MODEL_NAME, "messages": PROMPTS["one"], "max_tokens": 2, "temperature": 0, **change}
    body = {k: v for k, v in body.items() if v is not None}
    response = httpx.post(setup.served.v1 + "/chat/completions", json=body, timeout=120)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert (error["type"], error["param"], error["code"]) == (kind, param, status)
    assert error["message"]
    if case == "bad image":
        assert "not an image" in error["message"]  # mmfront's own media message, which says what to send
    if case in ("loopback media URL", "link-local media URL"):
        assert "unless --allowed-media-domains names the host" in error["message"]


def test_malformed_json_and_unknown_routes(setup: Setup) -> None:
    json_type = {"Content-Type": "application/json"}
    response = httpx.post(setup.served.v1 + "/chat/completions", content=b"{not json", headers=json_type, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["type"] == "Bad Request"
    form = httpx.post(setup.served.v1 + "/chat/completions", data={"messages": "hi"}, timeout=60)
    assert form.status_code == 400 and "Only 'application/json'" in form.json()["error"]["message"]
    assert httpx.get(setup.served.url + "/nope").json() == {"detail": "Not Found"}
    assert httpx.get(setup.served.v1 + "/chat/completions").status_code == 405


def test_openai_client_raises_its_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=PROMPTS["one"], max_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=PROMPTS["one"], max_tokens=-1)
    assert info.value.body["param"] == "max_tokens"  # type: ignore[index]


def test_api_key_is_required_on_v1_routes(setup: Setup) -> None:
    body = {"model": MODEL_NAME, "messages": PROMPTS["one"], "max_tokens": 2, "temperature": 0}
    assert httpx.post(setup.keyed_url + "/v1/chat/completions", json=body, timeout=60).status_code == 401
    wrong = httpx.post(setup.keyed_url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": "Bearer wrong"})
    assert (wrong.status_code, wrong.json()) == (401, {"error": "Unauthorized"})
    assert httpx.get(setup.keyed_url + "/health").status_code == 200  # only /v1 is guarded, as in vLLM
    keyed = openai.OpenAI(base_url=setup.keyed_url + "/v1", api_key=API_KEY, max_retries=0)
    assert keyed.chat.completions.create(model=MODEL_NAME, messages=PROMPTS["one"], max_tokens=2, temperature=0).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=setup.keyed_url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_body_over_the_limit_is_refused_before_it_is_read(setup: Setup) -> None:
    big = {"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, "messages": chat(0, text="x" * (2 * BODY_LIMIT))}
    response = httpx.post(setup.small_body_url + "/v1/chat/completions", json=big, timeout=60)
    assert response.status_code == 413 and response.json()["error"]["code"] == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"model": "tiny", "messages": [{"role": "user", "content": "'
        for _ in range(4):
            yield b"x" * BODY_LIMIT

    response = httpx.post(setup.small_body_url + "/v1/chat/completions", content=chunks(), timeout=60,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    small = {"model": MODEL_NAME, "max_tokens": 2, "temperature": 0, "messages": PROMPTS["one"]}
    assert httpx.post(setup.small_body_url + "/v1/chat/completions", json=small, timeout=60).status_code == 200


# --- the other routes --------------------------------------------------------------------------------


def test_models_health_version(setup: Setup, gemma3_weights_dir: Path) -> None:
    models = httpx.get(setup.served.v1 + "/models").json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert (card["id"], card["object"], card["owned_by"], card["root"], card["parent"]) == (
        MODEL_NAME, "model", "vllm", str(gemma3_weights_dir), None)
    assert card["max_model_len"] == setup.served.client.max_model_len
    assert card["permission"][0]["object"] == "model_permission"
    health = httpx.get(setup.served.url + "/health")
    assert (health.status_code, health.content) == (200, b"")
    from mmfront import __version__
    assert httpx.get(setup.served.url + "/version").json() == {"version": __version__}


def scrape(url: str) -> dict[str, float]:
    """Each series of ``/metrics`` by its line's name and labels."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in httpx.get(url + "/metrics").text.splitlines() if line and not line.startswith("#")}


def test_metrics_carry_vllms_names(setup: Setup, client: openai.OpenAI) -> None:
    before = scrape(setup.served.url)
    answer = client.chat.completions.create(model=MODEL_NAME, messages=PROMPTS["one"], max_tokens=2, temperature=0)
    after = scrape(setup.served.url)
    text = httpx.get(setup.served.url + "/metrics").text
    labels = f'engine="0",model_name="{MODEL_NAME}"'

    def grew(name: str) -> float:
        return after[f"{name}{{{labels}}}"] - before[f"{name}{{{labels}}}"]

    # the worker sends a stock engine's statistics: the request's prompt, tokens and timings are counted
    assert answer.usage is not None
    assert grew("vllm:prompt_tokens_total") == answer.usage.prompt_tokens
    assert grew("vllm:generation_tokens_total") == answer.usage.completion_tokens == 2
    assert grew("vllm:request_prompt_tokens_sum") == answer.usage.prompt_tokens
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_queue_time_seconds_count", "vllm:request_params_max_tokens_count"):
        assert grew(name) == 1, name
    assert grew("vllm:inter_token_latency_seconds_count") == 1
    assert after[f"vllm:num_requests_running{{{labels}}}"] == 0
    for name in ("vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert f"{name}{{{labels}}}" in text, name
    assert f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL_NAME}"}}' in text
    hits = [line for line in text.splitlines() if line.startswith("vllm:mm_cache_hits_total")]
    assert float(hits[0].split()[-1]) > 0  # image 0 was sent many times


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(setup: Setup) -> None:
    events = sse_events(httpx.post(setup.served.v1 + "/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "messages": PROMPTS["one"], "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}))
    chunks = events[:-2]
    prompt = prompt_tokens(setup, "one")
    assert chunks[0]["usage"] == {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0,
                                  "completion_tokens_details": None}
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == len(setup.expected["one"])
    assert events[-2]["usage"]["completion_tokens"] == len(setup.expected["one"])


def test_the_app_mounts_in_another_asgi_app(setup: Setup, gemma3_weights_dir: Path) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    inner = create_app(setup.served.client, ServeSettings(gemma3_weights_dir, served_model_name=(MODEL_NAME,),
                                                          api_key=API_KEY))
    with run_app(Starlette(routes=[Mount("/llm", app=inner)])) as url:
        assert httpx.get(url + "/llm/health").status_code == 200
        assert httpx.get(url + "/llm/v1/models").status_code == 401
        mounted = openai.OpenAI(base_url=url + "/llm/v1", api_key=API_KEY, max_retries=0, timeout=120)
        out = mounted.chat.completions.create(model=MODEL_NAME, messages=PROMPTS["one"], max_tokens=MAX_TOKENS,
                                              temperature=0)
        assert out.choices[0].message.content == setup.text("one")
