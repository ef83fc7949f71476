"""vLLM's own OpenAI server tests of logprobs, ``prompt_logprobs``, ``echo``, ``return_token_ids``
and ``return_tokens_as_token_ids``, each case sent to ``vllm serve`` and ``mmfront serve`` (the
same flags, ``--data-parallel-size-local 0``, each in front of a stock vLLM 0.33 engine core
whose executor returns logprobs as vLLM's GPU runner does: ``../shared/peer/logprob_stub.py``),
asserting mmfront's answer equals vLLM's field by field (ids, ``created`` and the fingerprint
masked) and that vLLM's own assertions of the case hold for it.

Ported from vLLM's tests/entrypoints/openai (the model is the peer's tiny Gemma 3, so prompts and
exact counts are ours; the stub generates tokens 1000, 1001, ...):

* chat_completion/test_chat.py: ``test_no_logprobs_chat``, ``test_zero_logprobs_chat``,
  ``test_some_logprobs_chat``, ``test_too_many_chat_logprobs`` (streamed and not),
  ``test_prompt_logprobs_chat`` (1, 0, -1, none), ``test_more_than_one_prompt_logprobs_chat``,
  ``test_single_chat_session`` (with ``logprobs``), and the same logprobs streamed;
* completion/test_completion.py: ``test_no_logprobs``, ``test_zero_logprobs``,
  ``test_some_logprobs``, ``test_too_many_completion_logprobs`` (streamed and not),
  ``test_prompt_logprobs_completion`` (-1, 0, 1, none), ``test_echo_logprob_completion`` (text and
  token-id prompts, ``logprobs`` 1 and 0), ``test_parallel_no_streaming`` (``n=3``, ``logprobs=0``),
  and completion logprobs streamed (with a stop string: completion/test_completion_text_offset.py);
* chat_completion/test_chat_echo.py: ``test_chat_session_with_echo_and_continue_final_message``
  (echo true and false; ``prompt_logprobs`` -1 and ``top_logprobs`` -1 need ``--max-logprobs``
  of the vocabulary: test_vllm_serve_logprob_flags.py);
* basic/test_return_token_ids.py: ``test_basic_completion_with_emoji``,
  ``test_comparison_with_prompt_logprobs_and_logprobs`` (streamed and not),
  ``test_chat_completion_with_emoji_and_token_ids`` (streamed and not), and
  ``test_chat_completion_with_tool_use`` without its tools (tools are another part of issue 33);
* test_return_tokens_as_ids.py, the request-field half (the server flag:
  test_vllm_serve_logprob_flags.py);
* completions ``echo`` with ``max_tokens`` 0, streamed and not.

Skipped where the peer venv, its model folder or ``../shared/peer`` is absent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from logprob_pair import start_pair, streamed
from test_vllm_serve_parity import MODEL, PEER, PEER_DIR, SERVED, Answer, Pair, both, explain, masked

from mmfront.testing.peer import SKIP_REASON

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

CHAT_PATH, COMPLETION_PATH = "/v1/chat/completions", "/v1/completions"
SESSION = [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": "what is 1+1?"}]
SERIES = [{"role": "system", "content": "You are a helpful assistant."},
          {"role": "user", "content": "Who won the world series in 2020?"},
          {"role": "assistant", "content": "The Los Angeles Dodgers won the World Series in 2020."},
          {"role": "user", "content": "Where was it played?"}]
EMOJI_CHAT = [{"role": "system", "content": "You like to use emojis in your responses."},
              {"role": "user", "content": "Repeat after me: I love cats 🐱"}]
SAYING = "Here is a common saying about apple. An apple a day, keeps"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from start_pair(tmp_path_factory.mktemp("logprobs"))


def chat(messages: list[dict[str, Any]] = SESSION, **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": messages, **fields}


def completion(prompt: Any = "Hello, my name is", **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": prompt, **fields}


def same(pair: Pair, path: str, body: dict[str, Any], status: int = 200) -> Any:
    """The answer both give (``status`` each), mmfront's equal to vLLM's."""
    vllm, mmfront = both(pair, "POST", path, body)
    assert vllm.status == mmfront.status == status, explain(pair, vllm, mmfront)
    assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)
    return vllm.json()


def same_stream(pair: Pair, path: str, body: dict[str, Any]) -> tuple[Answer, Answer]:
    """Both streams, saying the same of every choice's text, tokens, logprobs and usage."""
    vllm, mmfront = both(pair, "POST", path, {**body, "stream": True})
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert streamed(mmfront) == streamed(vllm), explain(pair, vllm, mmfront)
    return vllm, mmfront


# --- chat_completion/test_chat.py -----------------------------------------------------------------


def test_no_logprobs_chat(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(max_completion_tokens=5, temperature=0.0, logprobs=False))
    assert body["choices"][0]["logprobs"] is None


def test_zero_logprobs_chat(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(max_completion_tokens=5, temperature=0.0, logprobs=True, top_logprobs=0))
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and len(content[0]["top_logprobs"]) == 0
    assert content[0]["token"] == "cur" and content[0]["logprob"] == pytest.approx(-0.1)


def test_some_logprobs_chat(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(max_completion_tokens=5, temperature=0.0, logprobs=True, top_logprobs=5))
    top = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(top) == 5 and [t["logprob"] for t in top] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])


def test_some_logprobs_chat_streamed(pair: Pair) -> None:
    vllm, _ = same_stream(pair, CHAT_PATH, chat(max_completion_tokens=5, logprobs=True, top_logprobs=3,
                                                 stream_options={"include_usage": True}))
    [choice] = streamed(vllm)[0].values()
    assert len(choice.chat_logprobs) == 5 and all(len(c["top_logprobs"]) == 3 for c in choice.chat_logprobs)


def refused_before_the_stream(pair: Pair, path: str, body: dict[str, Any]) -> None:
    """vLLM checks ``--max-logprobs`` once the stream started (200, the error as an event, then
    ``[DONE]``); mmfront before it starts: 400 with the same error (docs/serving.md, "Differences")."""
    vllm, mmfront = both(pair, "POST", path, {**body, "stream": True})
    assert vllm.status == 200 and mmfront.status == 400, explain(pair, vllm, mmfront)
    event, done = [e for e in vllm.text.split("\n\n") if e.strip()]
    assert done == "data: [DONE]" and mmfront.json() == json.loads(event.removeprefix("data: ")), \
        explain(pair, vllm, mmfront)


def test_too_many_chat_logprobs(pair: Pair) -> None:
    refused_before_the_stream(pair, CHAT_PATH, chat(max_completion_tokens=10, logprobs=True, top_logprobs=21))
    same(pair, CHAT_PATH, chat(max_completion_tokens=10, logprobs=True, top_logprobs=30), 400)
    body = same(pair, CHAT_PATH, chat(max_completion_tokens=10))  # the servers still work
    assert body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("prompt_logprobs", [1, 0, -1, None])
def test_prompt_logprobs_chat(pair: Pair, prompt_logprobs: int | None) -> None:
    fields = {} if prompt_logprobs is None else {"prompt_logprobs": prompt_logprobs}
    if prompt_logprobs is not None and prompt_logprobs < 0:  # more than --max-logprobs (20)
        error = same(pair, CHAT_PATH, chat(SERIES, **fields), 400)["error"]
        assert error["param"] == "prompt_logprobs"
        return
    body = same(pair, CHAT_PATH, chat(SERIES, max_tokens=2, **fields))
    if prompt_logprobs is None:
        assert body["prompt_logprobs"] is None
    else:
        assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) > 1


def test_more_than_one_prompt_logprobs_chat(pair: Pair) -> None:
    one = same(pair, CHAT_PATH, chat(SERIES, max_tokens=2, prompt_logprobs=1))
    two = same(pair, CHAT_PATH, chat(SERIES, max_tokens=2, prompt_logprobs=2))
    assert len(one["prompt_logprobs"][3]) == 1 and len(two["prompt_logprobs"][3]) == 2


def test_prompt_logprobs_are_refused_in_a_stream(pair: Pair) -> None:
    error = same(pair, CHAT_PATH, chat(max_tokens=2, prompt_logprobs=1, stream=True), 400)["error"]
    assert error["param"] == "prompt_logprobs"


def test_single_chat_session(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(max_completion_tokens=5, logprobs=True, top_logprobs=5))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5
    turns = [*SESSION, {"role": "assistant", "content": choice["message"]["content"]},
             {"role": "user", "content": "express your result in json"}]
    same(pair, CHAT_PATH, chat(turns, max_completion_tokens=5))


# --- completion/test_completion.py ----------------------------------------------------------------


def test_no_logprobs(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion([0, 0, 0, 0, 0], max_tokens=5, temperature=0.0, logprobs=None))
    assert body["choices"][0]["logprobs"] is None


def test_zero_logprobs(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion([0, 0, 0, 0, 0], max_tokens=5, temperature=0.0, logprobs=0))
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["top_logprobs"][0]) == 1 and logprobs["text_offset"][0] == 0


def test_some_logprobs(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion([0, 0, 0, 0, 0], max_tokens=5, temperature=0.0, logprobs=5))
    assert 5 <= len(body["choices"][0]["logprobs"]["top_logprobs"][0]) <= 6


def test_too_many_completion_logprobs(pair: Pair) -> None:
    same(pair, COMPLETION_PATH, completion([0, 0, 0, 0, 0], max_tokens=5, temperature=0.0, logprobs=21), 400)
    refused_before_the_stream(pair, COMPLETION_PATH, completion([0, 0, 0, 0, 0], max_tokens=5, logprobs=30))
    same(pair, COMPLETION_PATH, completion([0, 0, 0, 0, 0], max_tokens=5, temperature=0.0))


@pytest.mark.parametrize("prompt_logprobs", [-1, 0, 1, None])
def test_prompt_logprobs_completion(pair: Pair, prompt_logprobs: int | None) -> None:
    fields = {} if prompt_logprobs is None else {"prompt_logprobs": prompt_logprobs}
    prompts = ["A robot may not injure another robot", "My name is"]
    if prompt_logprobs is not None and prompt_logprobs < 0:
        same(pair, COMPLETION_PATH, completion(prompts, **fields), 400)
        return
    body = same(pair, COMPLETION_PATH, completion(prompts, max_tokens=3, **fields))
    for choice in body["choices"]:
        assert (choice["prompt_logprobs"] is None) == (prompt_logprobs is None)


@pytest.mark.parametrize("logprobs", [1, 0])
@pytest.mark.parametrize("prompt", ["Hello, my name is", [0, 0, 0, 0, 0]], ids=["text", "token_ids"])
def test_echo_logprob_completion(pair: Pair, prompt: Any, logprobs: int) -> None:
    body = same(pair, COMPLETION_PATH, completion(prompt, max_tokens=5, temperature=0.0, echo=True,
                                                  logprobs=logprobs))
    choice = body["choices"][0]
    if isinstance(prompt, str):
        assert re.search(r"^" + prompt, choice["text"])
    got = choice["logprobs"]
    assert len(got["text_offset"]) > 5 and got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    for top in got["top_logprobs"][1:]:
        assert max(logprobs, 1) <= len(top) <= logprobs + 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_echo_of_the_prompt_alone(pair: Pair, stream: bool) -> None:
    body = completion("Hello there", max_tokens=0, echo=True, logprobs=1)
    if stream:
        same_stream(pair, COMPLETION_PATH, body)
    else:
        assert same(pair, COMPLETION_PATH, body)["choices"][0]["text"] == "Hello there"


def test_echo_streamed_with_logprobs(pair: Pair) -> None:
    same_stream(pair, COMPLETION_PATH, completion(max_tokens=4, echo=True, logprobs=2,
                                                  stream_options={"include_usage": True}))


def test_parallel_no_streaming(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion("What is an LLM?", max_tokens=6, n=3, temperature=1.0,
                                                  logprobs=0, seed=42))
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]


def test_completion_logprobs_streamed_with_a_stop_string(pair: Pair) -> None:
    vllm, _ = same_stream(pair, COMPLETION_PATH, completion(max_tokens=8, logprobs=0, stop=["\n\n"]))
    [choice] = streamed(vllm)[0].values()
    offsets, tokens = choice.completion_logprobs["text_offset"], choice.completion_logprobs["tokens"]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


# --- chat_completion/test_chat_echo.py ------------------------------------------------------------


@pytest.mark.parametrize("echo", [True, False])
def test_chat_session_with_echo_and_continue_final_message(pair: Pair, echo: bool) -> None:
    messages = [{"role": "user", "content": "tell me a common saying"}, {"role": "assistant", "content": SAYING}]
    body = same(pair, CHAT_PATH, chat(messages, max_tokens=4, echo=echo, continue_final_message=True,
                                      add_generation_prompt=False))
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and (SAYING in message["content"]) == echo


def test_chat_echo_streamed(pair: Pair) -> None:
    """Gemma 3's template takes message content as a list of parts: vLLM's streamed echo puts that
    list in a delta and fails (an error event after the role chunks); mmfront streams the text, as
    vLLM's whole answer joins it (docs/serving.md, "Differences")."""
    messages = [{"role": "user", "content": "tell me a common saying"}, {"role": "assistant", "content": SAYING}]
    body = chat(messages, max_tokens=4, echo=True, continue_final_message=True, add_generation_prompt=False, n=2)
    vllm, mmfront = both(pair, "POST", CHAT_PATH, {**body, "stream": True})
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert "validation error for DeltaMessage" in vllm.text, explain(pair, vllm, mmfront)
    whole = same(pair, CHAT_PATH, body)
    choices, _ = streamed(mmfront)
    assert [choices[i].text for i in (0, 1)] == [c["message"]["content"] for c in whole["choices"]]
    assert all(c.text.startswith(SAYING) for c in choices.values())


def test_chat_echo_of_another_role_adds_nothing(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(max_tokens=3, echo=True))
    assert body["choices"][0]["message"]["content"] == "cur 3In"


# --- basic/test_return_token_ids.py ---------------------------------------------------------------

EMOJI_PROMPT = "Complete this sentence with emojis: I love coding 🚀"


@pytest.mark.parametrize("return_token_ids", [True, False])
def test_basic_completion_with_emoji(pair: Pair, return_token_ids: bool) -> None:
    body = same(pair, COMPLETION_PATH, completion(EMOJI_PROMPT, max_tokens=10, temperature=0, logprobs=1,
                                                  return_token_ids=return_token_ids))
    choice = body["choices"][0]
    if return_token_ids:
        assert choice["token_ids"] == list(range(1000, 1010)) and choice["prompt_token_ids"][0] == 2
    else:
        assert choice["token_ids"] is None and choice["prompt_token_ids"] is None


@pytest.mark.parametrize("return_token_ids", [True, False])
def test_chat_completion_with_return_token_ids(pair: Pair, return_token_ids: bool) -> None:
    body = same(pair, CHAT_PATH, chat(SESSION, max_tokens=5, temperature=0, logprobs=True,
                                      return_token_ids=return_token_ids))
    assert (body["prompt_token_ids"] is None) != return_token_ids
    assert (body["choices"][0]["token_ids"] is None) != return_token_ids


def test_comparison_with_prompt_logprobs_and_logprobs(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion("Hello, world! How are you today?", max_tokens=20, temperature=0,
                                                  echo=True, logprobs=1, return_token_ids=True,
                                                  return_tokens_as_token_ids=True, prompt_logprobs=1))
    choice = body["choices"][0]
    ids = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
    assert ids == [*choice["prompt_token_ids"], *choice["token_ids"]] and choice["prompt_logprobs"] is not None
    vllm, _ = same_stream(pair, COMPLETION_PATH, completion(
        "Tell me a short fact about Python:", max_tokens=30, temperature=0, echo=False, logprobs=1,
        return_token_ids=True, return_tokens_as_token_ids=True))
    [streamed_choice] = streamed(vllm)[0].values()
    assert streamed_choice.chunks_with_prompt_ids == 1 and streamed_choice.prompt_token_ids
    assert streamed_choice.token_ids == [int(t.removeprefix("token_id:"))
                                         for t in streamed_choice.completion_logprobs["tokens"]]


def test_chat_completion_with_emoji_and_token_ids(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(EMOJI_CHAT, max_tokens=50, temperature=0, logprobs=True,
                                      return_token_ids=True))
    assert body["choices"][0]["token_ids"] and body["prompt_token_ids"]
    vllm, _ = same_stream(pair, CHAT_PATH, chat(EMOJI_CHAT, max_tokens=50, temperature=0, return_token_ids=True))
    [choice] = streamed(vllm)[0].values()
    assert choice.prompt_token_ids == body["prompt_token_ids"] and choice.chunks_with_prompt_ids == 1
    assert choice.token_ids == body["choices"][0]["token_ids"]


# --- chat_completion/test_logprob_token_ids_validation.py -----------------------------------------


@pytest.mark.parametrize(("path", "body"), [
    (CHAT_PATH, chat(max_tokens=2, logprob_token_ids=[5, 6])),
    (CHAT_PATH, chat(max_tokens=2, logprobs=True, logprob_token_ids=[5, 10**7])),
    (CHAT_PATH, chat(max_tokens=2, logprobs=True, logprob_token_ids=list(range(129)))),
    (COMPLETION_PATH, completion(max_tokens=2, logprob_token_ids=[5])),
    (COMPLETION_PATH, completion(max_tokens=0, echo=True, logprobs=1, logprob_token_ids=[5])),
], ids=["chat_without_logprobs", "out_of_vocabulary", "more_than_128", "completion_without_logprobs",
        "echo_of_the_prompt_alone"])
def test_logprob_token_ids_refused_alike(pair: Pair, path: str, body: dict[str, Any]) -> None:
    assert same(pair, path, body, 400)["error"]["param"] == "logprob_token_ids"


# --- test_return_tokens_as_ids.py (the request field) ---------------------------------------------


def test_completion_return_tokens_as_token_ids(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion("Say 'Hello, world! 🎉'", echo=True, temperature=0, max_tokens=10,
                                                  logprobs=1, return_tokens_as_token_ids=True))
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["tokens"][1:] == [next(iter(top)) for top in logprobs["top_logprobs"][1:]]


def test_chat_return_tokens_as_token_ids(pair: Pair) -> None:
    messages = [{"role": "system", "content": "You like to respond in only emojis, like 🎉"},
                {"role": "user", "content": "Please write some emojis: 🐱🐶🎉"}]
    body = same(pair, CHAT_PATH, chat(messages, temperature=0, max_tokens=8, logprobs=True,
                                      return_tokens_as_token_ids=True))
    tokens = [c["token"] for c in body["choices"][0]["logprobs"]["content"]]
    assert tokens == [f"token_id:{1000 + k}" for k in range(8)]
