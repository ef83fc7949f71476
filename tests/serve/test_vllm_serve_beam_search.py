"""``use_beam_search`` sent to ``vllm serve`` and ``mmfront serve`` (the same flags,
``--data-parallel-size-local 0``, each in front of a stock vLLM 0.33 engine core whose executor
returns logprobs as vLLM's GPU runner does: ``../shared/peer/logprob_stub.py``), asserting
mmfront's answer equals vLLM's field by field (ids, ``created`` and the fingerprint masked):
texts, token ids, logprobs, finish reasons, usage, and the errors' status, type and param.

Ported from vLLM's tests/entrypoints/openai (the model is the peer's tiny Gemma 3, so prompts and
exact texts are ours; at each step the stub's candidates are its next token ``t`` then ``t + 1``,
``t + 2``, ... with logprobs -0.1, -0.2, ..., so the beams differ from the second one on):

* test_vision.py: ``test_single_chat_session_image_beamsearch`` (an image, ``n=2``, logprobs);
* completion/test_completion.py: ``test_batch_completions``' beam-search request (two prompts,
  ``n=2``) and its refusal of a streamed beam search;
* the fields beam search reads (``length_penalty``, ``include_stop_str_in_output``,
  ``ignore_eos``, ``max_tokens`` 0, ``echo``) and vLLM's refusals (``logprob_token_ids``, ``echo``
  with ``logprobs``, ``n`` out of range, ``allowed_token_ids``, ``2 * n`` over ``--max-logprobs``);
* observability: an image prompt's ``vllm:mm_cache_queries``/``hits`` (one lookup, whatever its
  ``n`` or beam steps) and ``--enable-log-requests``' ``Received request`` lines.

Skipped where the peer venv, its model folder or ``../shared/peer`` is absent.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from logprob_pair import LOGPROB_ENGINE, start_pair
from test_vllm_serve_parity import (
    CHAT,
    MODEL,
    PEER,
    PEER_DIR,
    SERVED,
    Answer,
    Pair,
    Side,
    both,
    explain,
    masked,
    start_side,
    wait_healthy,
)

from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

CHAT_PATH, COMPLETION_PATH = "/v1/chat/completions", "/v1/completions"
QUESTION = [{"role": "user", "content": "what is 1+1?"}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from start_pair(tmp_path_factory.mktemp("beams"), ["--enable-log-requests"])


def chat(messages: list[dict[str, Any]] = QUESTION, **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": messages, "use_beam_search": True, **fields}


def completion(prompt: Any = "Hello, my name is", **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": prompt, "use_beam_search": True, **fields}


def same(pair: Pair, path: str, body: dict[str, Any], status: int = 200) -> Any:
    """The answer both give (``status`` each), mmfront's equal to vLLM's."""
    vllm, mmfront = both(pair, "POST", path, body)
    assert vllm.status == mmfront.status == status, explain(pair, vllm, mmfront)
    assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)
    return vllm.json()


def events(answer: Answer) -> list[Any]:
    """A stream's events, masked; ``[DONE]`` as the string."""
    out = [e.removeprefix("data: ") for e in answer.text.split("\n\n") if e.strip()]
    return [e if e == "[DONE]" else masked(json.loads(e)) for e in out]


def refused(pair: Pair, path: str, body: dict[str, Any], param: str | None) -> str:
    """Both refuse with the same 400 naming ``param``; vLLM's message."""
    error = same(pair, path, body, 400)["error"]
    assert error["type"] == "BadRequestError" and error["param"] == param, error
    return str(error["message"])


# --- test_vision.py ---------------------------------------------------------------------------------


def test_single_chat_session_image_beamsearch(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(CHAT, n=2, max_completion_tokens=10, logprobs=True, top_logprobs=5))
    first, second = body["choices"]
    assert first["message"]["content"] != second["message"]["content"]
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    assert len(first["logprobs"]["content"]) == 10 and len(first["logprobs"]["content"][0]["top_logprobs"]) == 4
    assert body["usage"]["completion_tokens"] == 20


def mm_cache_counts(answer: Answer) -> dict[str, float]:
    """``vllm:mm_cache_queries`` and ``vllm:mm_cache_hits`` of a ``/metrics`` page."""
    counts: dict[str, float] = {}
    for line in answer.text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in ("vllm:mm_cache_queries_total", "vllm:mm_cache_hits_total"):
            counts[name] = counts.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


@pytest.mark.parametrize(("seed", "fields"), [(11, {"use_beam_search": True}), (12, {"use_beam_search": False,
                                                                                     "temperature": 1.0})],
                         ids=["beam_search", "n_choices"])
def test_an_image_prompt_counts_one_lookup_whatever_its_engine_requests(
        pair: Pair, seed: int, fields: dict[str, Any]) -> None:
    """vLLM processes the image once, with the prompt, and counts one processor-cache lookup
    then; its ``n`` choices and its beams' step requests (1 + 3 + 3 + 3 here) carry what that
    made. mmfront commits each engine request to its processor cache (so the image's data goes
    to the engine once) and counts only the first commit of a prepared prompt."""
    image = {"type": "image_url", "image_url": {"url": image_data_url(make_image(48, 40, seed=seed))}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "Describe it."}]}]
    before = [mm_cache_counts(a) for a in both(pair, "GET", "/metrics")]
    same(pair, CHAT_PATH, chat(messages, n=3, max_tokens=4, **fields))
    after = [mm_cache_counts(a) for a in both(pair, "GET", "/metrics")]
    vllm, mmfront = ({k: a[k] - b.get(k, 0.0) for k in a} for b, a in zip(before, after))
    assert vllm == {"vllm:mm_cache_queries_total": 1.0, "vllm:mm_cache_hits_total": 0.0}, vllm
    assert mmfront == vllm


RECEIVED = re.compile(r"(Received request \S+: params: .*)$")


def received(side: Side, request_id: str) -> list[str]:
    """The request log's ``Received request`` lines naming ``request_id``."""
    return [m.group(1) for line in side.logs["server"].read_text(errors="replace").splitlines()
            if (m := RECEIVED.search(line)) and request_id in line]


@pytest.mark.parametrize(("request_id", "path", "body"), [
    ("beams-chat-log", CHAT_PATH, chat(n=2, max_tokens=3, temperature=0.5)),
    ("beams-completion-log", COMPLETION_PATH, completion(["Hello, my name is", "The capital of France is"], n=2,
                                                          max_tokens=2, length_penalty=0.5, ignore_eos=True)),
    ("plain-chat-log", CHAT_PATH, chat(n=2, max_tokens=3, use_beam_search=False, temperature=1.0, seed=3, stop=["x"])),
    ("plain-completion-log", COMPLETION_PATH, completion(["Hello, my name is", "The capital of France is"], n=2,
                                                   max_tokens=2, use_beam_search=False, temperature=1.0, logprobs=2)),
])
def test_the_request_log_is_vllms(pair: Pair, request_id: str, path: str, body: dict[str, Any]) -> None:
    """``--enable-log-requests``: one ``Received request`` line per prompt, beam search or not,
    under vLLM's id and with vLLM's parameters (``BeamSearchParams`` for a beam search)."""
    same(pair, path, {**body, "request_id": request_id})
    vllm = received(pair.vllm, f"-{request_id}")
    assert len(vllm) == (1 if path == CHAT_PATH else 2), vllm
    assert received(pair.mmfront, f"-{request_id}") == vllm


def test_the_beams_are_the_best_by_cumulative_logprob(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(n=3, max_tokens=4, temperature=0.0, return_token_ids=True))
    assert [c["token_ids"] for c in body["choices"]] == [[1000, 1000, 1000, 1000], [1000, 1000, 1000, 1001],
                                                         [1000, 1000, 1001, 1000]]
    assert body["usage"] == {**body["usage"], "completion_tokens": 12}


def test_one_beam(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(max_tokens=3, return_token_ids=True))
    assert [c["token_ids"] for c in body["choices"]] == [[1000, 1000, 1000]]


def test_the_fields_beam_search_reads(pair: Pair) -> None:
    """``stop`` and ``seed`` are not beam search's and are ignored, as vLLM ignores them."""
    body = same(pair, CHAT_PATH, chat(n=2, max_tokens=6, length_penalty=0.5, include_stop_str_in_output=True,
                                      ignore_eos=True, skip_special_tokens=False, stop=["x"], seed=3))
    assert len(body["choices"]) == 2


def test_sampling_fields_beam_search_does_not_read_are_not_checked(pair: Pair) -> None:
    """vLLM builds no ``SamplingParams`` of the request's for a beam search: ``top_p`` out of range
    and a ``stop_token_ids`` out of the vocabulary pass, as they pass there."""
    same(pair, CHAT_PATH, chat(n=2, max_tokens=3, top_p=5, stop_token_ids=[999999999], temperature=1e-6))


def test_a_chat_beam_search_echoes_and_streams_usage_and_logprobs(pair: Pair) -> None:
    turns = [*QUESTION, {"role": "assistant", "content": "so"}]
    same(pair, CHAT_PATH, chat(turns, n=2, max_tokens=3, echo=True, add_generation_prompt=False,
                               continue_final_message=True))
    vllm, mmfront = both(pair, "POST", CHAT_PATH, chat(
        n=2, max_tokens=3, stream=True, logprobs=True, return_token_ids=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert events(mmfront) == events(vllm), explain(pair, vllm, mmfront)


def test_no_tokens_is_one_empty_beam(pair: Pair) -> None:
    body = same(pair, CHAT_PATH, chat(n=2, max_tokens=0))
    assert [c["message"]["content"] for c in body["choices"]] == [""]
    assert body["usage"]["completion_tokens"] == 0


def test_a_streamed_chat_answers_each_beam_whole(pair: Pair) -> None:
    for usage in ({}, {"stream_options": {"include_usage": True}}):
        vllm, mmfront = both(pair, "POST", CHAT_PATH, chat(CHAT, n=2, max_tokens=3, stream=True, **usage))
        assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
        assert events(mmfront) == events(vllm), explain(pair, vllm, mmfront)
        assert events(vllm)[-1] == "[DONE]" and len(events(vllm)) == 5 + bool(usage)


# --- completion/test_completion.py ------------------------------------------------------------------


def test_completion_beams(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion(n=3, max_tokens=4))
    assert len({c["text"] for c in body["choices"]}) == 3


def test_batch_completions_beam_search(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion(["Hello, my name is", "The capital of France is"], n=2,
                                                  max_tokens=5))
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["choices"][0]["text"] != body["choices"][1]["text"]


def test_completion_beams_with_logprobs_and_token_ids(pair: Pair) -> None:
    body = same(pair, COMPLETION_PATH, completion([2, 3416, 499], n=2, max_tokens=3, logprobs=2,
                                                  return_token_ids=True))
    assert [c["token_ids"] for c in body["choices"]] == [[1000, 1000, 1000], [1000, 1000, 1001]]


@pytest.mark.parametrize("max_tokens", [3, 0])
def test_completion_beams_with_echo(pair: Pair, max_tokens: int) -> None:
    body = same(pair, COMPLETION_PATH, completion("Hello", n=2, max_tokens=max_tokens, echo=True))
    assert all(c["text"].startswith("Hello") for c in body["choices"])
    assert len(body["choices"]) == (2 if max_tokens else 1)


def test_a_streamed_completion_beam_search_is_refused(pair: Pair) -> None:
    message = refused(pair, COMPLETION_PATH, completion(n=2, max_tokens=3, stream=True), None)
    assert message == "Streaming is not currently supported with beam search"


# --- refusals -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "param"), [
    (CHAT_PATH, chat(n=2, logprobs=True, logprob_token_ids=[5]), "logprob_token_ids"),
    (COMPLETION_PATH, completion(n=2, logprobs=1, logprob_token_ids=[5]), "logprob_token_ids"),
    (COMPLETION_PATH, completion(n=2, echo=True, logprobs=1), "echo"),
    (CHAT_PATH, chat(n=0), None),
    (CHAT_PATH, chat(n=16385), None),
    (CHAT_PATH, chat(n=2, allowed_token_ids=[1000, 1001]), None),
    (CHAT_PATH, chat(n=11, max_tokens=3), "logprobs"),  # 22 candidates a step, over --max-logprobs 20
    (CHAT_PATH, chat(n=16384, max_tokens=3), "logprobs"),  # the n cap
    (COMPLETION_PATH, completion(n=2, max_tokens=5000), "max_tokens"),
    (CHAT_PATH, chat(n=2, max_tokens=3, temperature=-1), "temperature"),
    (COMPLETION_PATH, completion(n=2, max_tokens=3, temperature=3), "temperature"),
], ids=["chat_logprob_token_ids", "completion_logprob_token_ids", "echo_with_logprobs", "n_0", "n_over_the_cap",
        "allowed_token_ids", "n_over_max_logprobs", "n_at_the_cap", "max_tokens_over_the_context",
        "negative_temperature", "temperature_over_2"])
def test_refused_alike(pair: Pair, path: str, body: dict[str, Any], param: str | None) -> None:
    refused(pair, path, body, param)
    same(pair, path, {**body, "n": 2, "max_tokens": 2, "use_beam_search": False, "logprob_token_ids": None,
                      "allowed_token_ids": None, "echo": False, "temperature": 1.0})  # and both still serve


@pytest.mark.parametrize("fields", [{"n": 11}, {"n": 2, "temperature": -1}], ids=["n_over_max_logprobs",
                                                                                "negative_temperature"])
def test_step_parameters_refused_in_a_stream_are_refused_before_it(pair: Pair, fields: dict[str, Any]) -> None:
    """vLLM finds ``2 * n`` over ``--max-logprobs`` or a negative temperature as the search starts,
    in the stream (200, the error as an event); mmfront before the stream starts: 400 with the same
    error (docs/serving.md)."""
    vllm, mmfront = both(pair, "POST", CHAT_PATH, chat(max_tokens=3, stream=True, **fields))
    assert vllm.status == 200 and mmfront.status == 400, explain(pair, vllm, mmfront)
    event, done = events(vllm)
    assert done == "[DONE]" and mmfront.json() == event, explain(pair, vllm, mmfront)


# --- a client that leaves -----------------------------------------------------------------------------

LEAVING = "leave"
"""The request ids of the searches left (``chatcmpl-leave-...``), so the trace tells their steps apart."""
STEPS_BEFORE_LEAVING = 6
"""Step requests a search's engine is handed before its client leaves: the first step's one, the
second's four and the first of the third's, whose other three beams then wait (``--max-num-seqs 1``)."""


def engine_requests(trace: Path, prefix: str) -> tuple[set[str], set[str]]:
    """The requests of ids starting ``prefix`` that the stub engine was handed, and those its
    scheduler finished (a line still being written is not read yet). A request aborted while it
    waited is finished without ever being handed: vLLM's ``finish_requests`` frees a waiting
    request into ``finished_req_ids`` too."""
    text = trace.read_text() if trace.exists() else ""
    events = [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]
    ours = [e for e in events if e["req_id"].startswith(prefix)]
    return ({e["req_id"] for e in ours if e["ev"] == "new"}, {e["req_id"] for e in ours if e["ev"] == "finished"})


def leave_mid_search(side: Side, trace: Path, body: dict[str, Any]) -> None:
    """Send ``body`` on a connection of its own and close it once the engine was handed
    :data:`STEPS_BEFORE_LEAVING` of its search's step requests, however long a loaded machine
    takes to prepare it (a stream is read to its head first: 200)."""
    url = httpx.URL(side.url)
    assert url.host and url.port
    payload = json.dumps(body).encode()
    head = (f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    prefix = f"chatcmpl-{body['request_id']}-"
    deadline = time.monotonic() + 120
    with socket.create_connection((url.host, url.port), timeout=120) as connection:
        connection.sendall(head + payload)
        if body.get("stream"):
            received = b""
            while b"\r\n\r\n" not in received:
                part = connection.recv(65536)
                assert part, f"the stream ended before its head: {received!r}"
                received += part
            assert received.startswith(b"HTTP/1.1 200 "), received
        while len(engine_requests(trace, prefix)[0]) < STEPS_BEFORE_LEAVING:
            assert time.monotonic() < deadline, f"the search never reached the engine\n{side.tails()}"
            time.sleep(0.01)


def test_a_client_that_leaves_mid_search_aborts_every_engine_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four beams of 2,000 steps, left once the engine was handed a few of their step requests (a
    whole answer, then a stream), as the other beams of a step wait: the engine runs one request
    at a time (``--max-num-seqs 1``), each model step 0.2 s. Every step request the engine was
    handed is finished by its scheduler (those aborted while they waited are finished without
    being handed), and no new one comes, even while the server answers another request."""
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("STUB_TRACE_LOG", str(trace))
    monkeypatch.setenv("STUB_TRACE_STEP_DELAY_S", "0.2")
    side = start_side("mmfront", [sys.executable, "-m", "mmfront.cli"],
                      {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "VLLM_TARGET_DEVICE": "cpu"}, tmp_path,
                      engine_args=[*LOGPROB_ENGINE, "--max-num-seqs", "1"])
    try:
        wait_healthy([side])
        body = chat(CHAT, n=4, max_tokens=2000)
        leave_mid_search(side, trace, {**body, "request_id": f"{LEAVING}-whole"})
        leave_mid_search(side, trace, {**body, "request_id": f"{LEAVING}-stream", "stream": True})
        left = f"chatcmpl-{LEAVING}-"
        deadline = time.monotonic() + 30
        while True:
            handed, finished = engine_requests(trace, left)
            time.sleep(1.0)
            if engine_requests(trace, left) == (handed, finished) and handed <= finished:
                break
            assert time.monotonic() < deadline, (f"handed, not finished: {sorted(handed - finished)}; handed since: "
                                                 f"{sorted(engine_requests(trace, left)[0] - handed)}\n{side.tails()}")
        for search in ("whole", "stream"):
            steps = len(engine_requests(trace, f"{left}{search}-")[0])
            assert STEPS_BEFORE_LEAVING <= steps < 4 * 2000, (search, steps)
        answer = httpx.post(side.url + CHAT_PATH, json=chat(n=2, max_tokens=3), timeout=60)  # it still serves
        assert answer.status_code == 200 and len(answer.json()["choices"]) == 2, answer.text
        assert engine_requests(trace, left) == (handed, finished)  # and the searches left stay stopped
    finally:
        side.stop()
