"""vLLM's logprob cases that need the servers' flags, on ``vllm serve`` and ``mmfront serve``
started with ``--max-logprobs -1 --return-tokens-as-token-ids`` (each in front of its own stock
engine with ``../shared/peer/logprob_stub.py``), each answer of mmfront equal to vLLM's:

* chat_completion/test_chat_echo.py: ``test_prompt_logprobs`` (``prompt_logprobs`` -1) and
  ``test_top_logprobs`` (``top_logprobs`` -1: every candidate the engine sent; the stub caps -1 at
  20, where a model sends its vocabulary);
* test_return_tokens_as_ids.py, the server-flag half: completions with ``echo`` and chat, tokens
  written ``token_id:N`` without the request asking, and a request's ``false`` turning it off;
* ``--max-logprobs -1`` lets ``logprobs`` -1 and vocabulary-sized requests through.

Skipped where the peer venv, its model folder or ``../shared/peer`` is absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from logprob_pair import start_pair
from test_vllm_serve_parity import MODEL, PEER, PEER_DIR, SERVED, Pair, both, explain, masked

from mmfront.testing.peer import SKIP_REASON

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

CHAT_PATH, COMPLETION_PATH = "/v1/chat/completions", "/v1/completions"
BEIJING = [{"role": "system", "content": "You are a helpful assistant."},
           {"role": "user", "content": "Beijing is the capital of which country?"}]
STUB_CAP = 20
"""The stub executor's width for -1 (``../shared/peer/logprob_stub.py``)."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from start_pair(tmp_path_factory.mktemp("logprob-flags"),
                          ["--max-logprobs", "-1", "--return-tokens-as-token-ids"])


def same(pair: Pair, path: str, body: dict[str, Any], status: int = 200) -> Any:
    vllm, mmfront = both(pair, "POST", path, {"model": SERVED, **body})
    assert vllm.status == mmfront.status == status, explain(pair, vllm, mmfront)
    assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)
    return vllm.json()


def test_prompt_logprobs(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, {"messages": BEIJING, "max_tokens": 2, "prompt_logprobs": -1})
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) > 1
    assert all(len(position) == STUB_CAP for position in body["prompt_logprobs"][1:])


def test_top_logprobs(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, {"messages": BEIJING, "max_tokens": 1, "top_logprobs": -1, "logprobs": True})
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 1 and len(content[0]["top_logprobs"]) == STUB_CAP


def test_completion_logprobs_of_all_candidates(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, {"prompt": "Hello", "max_tokens": 2, "logprobs": -1})
    assert all(len(top) == STUB_CAP for top in body["choices"][0]["logprobs"]["top_logprobs"])


def test_completion_return_tokens_as_token_ids_by_the_server(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, {"prompt": "Say 'Hello, world! 🎉'", "echo": True, "temperature": 0,
                                        "max_tokens": 10, "logprobs": 1})
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"][0] == "token_id:2" and logprobs["tokens"][-1] == "token_id:1009"
    assert logprobs["tokens"][1:] == [next(iter(top)) for top in logprobs["top_logprobs"][1:]]


def test_chat_return_tokens_as_token_ids_by_the_server(pair: Pair) -> None:
    messages = [{"role": "system", "content": "You like to respond in only emojis, like 🎉"},
                {"role": "user", "content": "Please write some emojis: 🐱🐶🎉"}]
    body = same(pair, CHAT_PATH, {"messages": messages, "temperature": 0, "max_tokens": 8, "logprobs": True})
    assert [c["token"] for c in body["choices"][0]["logprobs"]["content"]] == [f"token_id:{1000 + k}"
                                                                              for k in range(8)]


def test_a_request_turns_the_servers_token_ids_off(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, {"messages": BEIJING, "max_tokens": 2, "logprobs": True,
                                  "return_tokens_as_token_ids": False})
    assert not body["choices"][0]["logprobs"]["content"][0]["token"].startswith("token_id:")
