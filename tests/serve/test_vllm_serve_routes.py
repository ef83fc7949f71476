"""vLLM's own tests of its routes and API-server flags (tests/entrypoints/openai: test_tokenization,
test_basic, test_root_path, test_vision's URL cases, the CORS, request-id, SageMaker and
force-include-usage cases), run against ``vllm serve`` and ``mmfront serve`` side by side, each in
front of a stock vLLM 0.33 engine core with the stub executor (the harness of
test_vllm_serve_parity.py), both started with the same flags: ``--enable-tokenizer-info-endpoint``,
``--enable-force-include-usage``, ``--allowed-origins``, ``--root-path /llm``,
``--enable-request-id-headers`` and ``--allowed-media-domains 127.0.0.1`` (vLLM's vision tests
fetch public image URLs; here a loopback HTTP server serves them, allowed by the flag).

Each case asserts mmfront answers as vLLM does: the same status and the same body (ids,
``created`` and fingerprints masked), or for streams what does not depend on timing. Intended
differences (docs/serving.md, "Differences from vllm serve") are asserted as such:
``/tokenizer_info`` names the tokenizer class each server holds; the rest of the configuration
(``truncation_side: left`` included) is equal.

Skipped where the peer venv, its model folder or ``../shared/peer`` is absent."""

from __future__ import annotations

import http.server
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_vllm_serve_parity import (
    CHAT,
    IMAGE,
    MODEL,
    PEER,
    PEER_DIR,
    REQUEST_S,
    SERVED,
    Answer,
    Pair,
    both,
    explain,
    masked,
    read_stream,
    start_side,
    wait_healthy,
)

from local_services import serve_http
from mmfront.testing.media import make_image
from mmfront.testing.peer import SKIP_REASON

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

ORIGIN = "https://app.example"


def _png() -> bytes:
    import io

    buffer = io.BytesIO()
    make_image(40, 32, seed=5).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/cat.png":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def images() -> Iterator[str]:
    with serve_http(_Images) as base:
        yield base


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, images: str) -> Iterator[Pair]:
    import os
    import sys

    assert PEER is not None
    folder = tmp_path_factory.mktemp("routes")
    extra = ["--enable-tokenizer-info-endpoint", "--enable-force-include-usage", "--allowed-origins",
             json.dumps([ORIGIN]), "--root-path", "/llm", "--enable-request-id-headers",
             "--allowed-media-domains", "127.0.0.1"]
    sides = []
    try:
        sides.append(start_side("vllm", [str(PEER.parent / "vllm")], {}, folder, server_args=extra))
        env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "VLLM_TARGET_DEVICE": "cpu"}
        sides.append(start_side("mmfront", [sys.executable, "-m", "mmfront.cli"], env, folder, server_args=extra))
        wait_healthy(sides)
        yield Pair(*sides)
    finally:
        for side in sides:
            side.stop()


def same(pair: Pair, method: str, path: str, body: Any = None) -> tuple[Answer, Answer]:
    vllm, mmfront = both(pair, method, path, body)
    assert vllm.status == mmfront.status, explain(pair, vllm, mmfront)
    if vllm.text or mmfront.text:
        assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)
    return vllm, mmfront


TURNS = [{"role": "user", "content": "Hi there!"}, {"role": "assistant", "content": "Nice to meet you!"},
         {"role": "user", "content": "Can I ask a question? vllm1"}]


# --- test_tokenization.py -----------------------------------------------------------------------


@pytest.mark.parametrize("add_special", [False, True])
def test_tokenize_completions(pair: Pair, add_special: bool) -> None:
    vllm, _ = same(pair, "POST", "/tokenize", {"add_special_tokens": add_special, "model": SERVED,
                                               "prompt": "vllm1 This is a test prompt."})
    assert vllm.status == 200 and vllm.json()["token_strs"] is None


@pytest.mark.parametrize(("add_generation", "continue_final", "add_special"), [
    (False, False, False), (False, False, True), (False, True, False), (False, True, True), (True, False, False),
    (True, False, True)])
def test_tokenize_chat(pair: Pair, add_generation: bool, continue_final: bool, add_special: bool) -> None:
    conversation = [*TURNS, {"role": "assistant", "content": "Sure,"}] if continue_final else TURNS
    vllm, _ = same(pair, "POST", "/tokenize", {"add_generation_prompt": add_generation,
                                               "continue_final_message": continue_final,
                                               "add_special_tokens": add_special, "messages": conversation,
                                               "model": SERVED})
    assert vllm.status == 200


def test_tokenize_chat_with_an_image(pair: Pair, images: str) -> None:
    """The image's placeholders, expanded, by data URL and by http URL."""
    for url in (IMAGE, f"{images}/cat.png"):
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                 {"type": "text", "text": "What is this?"}]}]
        vllm, _ = same(pair, "POST", "/tokenize", {"messages": messages})
        assert vllm.status == 200 and vllm.json()["count"] > 200


def test_tokenize_with_return_token_strs(pair: Pair) -> None:
    vllm, _ = same(pair, "POST", "/tokenize", {"prompt": "This is a token_strs test prompt! vllm1", "model": SERVED,
                                               "return_token_strs": True})
    assert vllm.status == 200 and vllm.json()["token_strs"]


@pytest.mark.parametrize(("path", "body"), [
    ("/tokenize", {"messages": [{"role": "developer", "content": "Be brief."}, *TURNS]}),  # rendered as system
    ("/tokenize", {"model": "", "prompt": "Hi"}),  # an empty model name is the served model's
    ("/detokenize", {"tokens": ["1000", 1001]}),  # lax, as vLLM's model
], ids=["developer_role", "empty_model", "token_as_string"])
def test_tokenize_bodies_found_by_the_differential_run(pair: Pair, path: str, body: Any) -> None:
    vllm, _ = same(pair, "POST", path, body)
    assert vllm.status == 200


def test_tokenize_refuses_null_user_content_as_a_body_error(pair: Pair) -> None:
    vllm, mmfront = both(pair, "POST", "/tokenize", {"messages": [{"role": "user", "content": None}]})
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    assert vllm.json()["error"]["type"] == mmfront.json()["error"]["type"] == "Bad Request"
    assert mmfront.json()["error"]["param"] == "body.messages.0.content"


def test_detokenize(pair: Pair) -> None:
    tokens = both(pair, "POST", "/tokenize", {"prompt": "This is a test prompt. vllm1",
                                              "add_special_tokens": False})[0].json()["tokens"]
    vllm, _ = same(pair, "POST", "/detokenize", {"model": SERVED, "tokens": tokens})
    assert vllm.json() == {"prompt": "This is a test prompt. vllm1"}


@pytest.mark.parametrize(("path", "body"), [
    ("/tokenize", {"model": "nope", "prompt": "x"}),
    ("/detokenize", {"model": "nope", "tokens": [1]}),
], ids=["tokenize", "detokenize"])
def test_tokenizer_routes_refuse_an_unknown_model(pair: Pair, path: str, body: Any) -> None:
    vllm, mmfront = both(pair, "POST", path, body)
    assert vllm.status == mmfront.status == 404, explain(pair, vllm, mmfront)
    assert mmfront.json()["error"]["type"] == vllm.json()["error"]["type"], explain(pair, vllm, mmfront)


def test_tokenizer_info(pair: Pair) -> None:
    """vLLM's test_tokenizer_info_*: the tokenizer's configuration, the same keys and values;
    ``tokenizer_class`` names the class each server loaded."""
    vllm, mmfront = both(pair, "GET", "/tokenizer_info")
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    want, got = vllm.json(), mmfront.json()
    # both cut prompts from the left when asked to truncate (vLLM loads its tokenizer so)
    assert want["truncation_side"] == got["truncation_side"] == "left"
    own = {"tokenizer_class"}
    assert {k: v for k, v in got.items() if k not in own} == {k: v for k, v in want.items() if k not in own}, \
        explain(pair, vllm, mmfront)
    assert isinstance(got["tokenizer_class"], str) and got["tokenizer_class"]


# --- test_basic.py, SageMaker, docs --------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"),
                                              ("GET", "/load")])
def test_plain_routes(pair: Pair, method: str, path: str) -> None:
    vllm, _ = same(pair, method, path)
    assert vllm.status == 200


def test_invocations_answer_as_the_routes(pair: Pair) -> None:
    """vLLM's test_sagemaker_*: a chat body is answered as a chat completion, a prompt as a completion."""
    for body in ({"model": SERVED, "messages": CHAT, "max_tokens": 3, "temperature": 0},
                 {"model": SERVED, "prompt": "Hello there", "max_tokens": 3, "temperature": 0}):
        vllm, _ = same(pair, "POST", "/invocations", body)
        assert vllm.status == 200


@pytest.mark.parametrize("body", [{"model": SERVED, "messages": "hi"}, {"model": SERVED, "prompt": 3}],
                         ids=["not_a_chat_nor_a_prompt", "neither_shape"])
def test_invocations_refuse_a_body_of_neither_kind(pair: Pair, body: Any) -> None:
    vllm, mmfront = both(pair, "POST", "/invocations", body)
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    assert mmfront.json()["error"]["message"] == vllm.json()["error"]["message"], explain(pair, vllm, mmfront)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_docs_routes(pair: Pair, path: str) -> None:
    vllm, mmfront = both(pair, "GET", path)
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    if path == "/openapi.json":
        served = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize",
                  "/invocations", "/health", "/ping", "/version", "/load", "/tokenizer_info"}
        assert served <= set(vllm.json()["paths"]) and served <= set(mmfront.json()["paths"])


# --- test_root_path.py, CORS, request ids --------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/models", "/llm/v1/models"])
def test_root_path(pair: Pair, path: str) -> None:
    vllm, _ = same(pair, "GET", path)
    assert vllm.status == 200


@pytest.mark.parametrize("origin", [ORIGIN, "https://other.example"])
def test_cors_preflight(pair: Pair, origin: str) -> None:
    headers = {"Origin": origin, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type"}
    answers = [httpx.options(side.url + "/v1/chat/completions", headers=headers, timeout=REQUEST_S)
               for side in (pair.vllm, pair.mmfront)]
    assert answers[0].status_code == answers[1].status_code
    cors = [{k: v for k, v in a.headers.items() if k.startswith("access-control-")} for a in answers]
    assert cors[1] == cors[0]


def test_request_id_headers(pair: Pair) -> None:
    for headers in ({"X-Request-Id": "given-1"}, {}):
        answers = [httpx.get(side.url + "/v1/models", headers=headers, timeout=REQUEST_S)
                   for side in (pair.vllm, pair.mmfront)]
        ids = [a.headers.get_list("x-request-id") for a in answers]
        assert [len(i) for i in ids] == [1, 1]
        if headers:
            assert ids[0] == ids[1] == ["given-1"]


# --- test_vision.py's URL cases, force-include-usage ----------------------------------------------


def test_chat_with_an_image_url(pair: Pair, images: str) -> None:
    """vLLM's test_single_chat_session_image et al.: the image fetched by URL, the same answer as
    the same image sent inline."""
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"{images}/cat.png"}},
                                             {"type": "text", "text": "What's in this image?"}]}]
    vllm, _ = same(pair, "POST", "/v1/chat/completions", {"model": SERVED, "messages": messages, "max_tokens": 4})
    assert vllm.status == 200


def test_chat_with_a_missing_image_url(pair: Pair, images: str) -> None:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"{images}/gone.png"}}]}]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", {"model": SERVED, "messages": messages})
    assert vllm.status >= 400 and mmfront.status >= 400, explain(pair, vllm, mmfront)


def test_an_image_url_outside_the_allowed_domains_is_a_400_in_both(pair: Pair, images: str) -> None:
    url = images.replace("127.0.0.1", "localhost") + "/cat.png"
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", {"model": SERVED, "messages": messages})
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_force_include_usage(pair: Pair, path: str) -> None:
    """vLLM's test_enable_force_include_usage: a stream without stream_options still ends with
    usage, and every chunk carries it."""
    body = ({"model": SERVED, "messages": CHAT, "max_tokens": 3} if path.endswith("chat/completions")
            else {"model": SERVED, "prompt": "Hello there", "max_tokens": 3})
    vllm, mmfront = both(pair, "POST", path, {**body, "stream": True})
    want, got = read_stream(vllm), read_stream(mmfront)
    assert want.usage and got.usage == want.usage, explain(pair, vllm, mmfront)
    assert got.finish == want.finish and got.text == want.text, explain(pair, vllm, mmfront)
