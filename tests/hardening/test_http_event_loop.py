"""Hardening, issue 36 class "the event loop never waits on user-sized work": while one client's
request makes the server do work that grows with its fields (100,000 stop strings, a huge
``bad_words`` entry to tokenize), another client's chat is answered within a bound; and a request whose client leaves costs the preparation pool nothing once it is gone.

Against ``mmfront serve``'s app in process (the reference engine behind it). The bounds are
seconds, far above a normal answer here (well under one), far below what the work takes on the
loop: these are not speed benchmarks.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_http_parameters import engine_requests  # noqa: F401  the engine requests a test starts

from mmfront.serve import request_decoding
from serve.serve_harness import MODEL_NAME, Served, serve

CHAT = "/v1/chat/completions"
NORMAL = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 2,
          "temperature": 0}
ANSWER_BOUND_S = 3.0
"""How long the normal chat may take while the hostile request is served."""


@pytest.fixture(scope="module")
def served(gemma3_weights_dir: Path) -> Iterator[Served]:
    with serve(gemma3_weights_dir) as running:
        assert post(running, NORMAL).status_code == 200  # warm: the first answer loads what it needs
        yield running


def post(served: Served, body: dict[str, Any], timeout: float = 120, **headers: str) -> httpx.Response:
    return httpx.post(served.url + CHAT, content=json.dumps(body).encode(), timeout=timeout,
                      headers={"Content-Type": "application/json", **headers})


def timed(served: Served, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    answer = post(served, body)
    return answer, time.monotonic() - start


HOSTILE = {
    "stop_strings": {**NORMAL, "stop": [f"stop string {i}" for i in range(100_000)], "stream": True,
                     "max_tokens": 48, "ignore_eos": True},
    "bad_words": {**NORMAL, "temperature": 1.0, "bad_words": [" ".join(f"w{i}" for i in range(100_000))]},
}
"""Requests whose fields cost seconds of Python work where the loop did it: 100,000 stop strings
searched at every streamed step (vLLM refuses more than 4), a 700 kB bad word to tokenize."""


@pytest.mark.parametrize("case", HOSTILE)
def test_another_clients_chat_is_answered_while_a_hostile_request_is_served(served: Served, case: str) -> None:
    with ThreadPoolExecutor(2) as pool:
        hostile: Future[tuple[httpx.Response, float]] = pool.submit(timed, served, HOSTILE[case])
        time.sleep(0.3)  # its body is on its way
        normal, took = timed(served, NORMAL)
        hostile_answer, hostile_took = hostile.result(timeout=300)
    assert normal.status_code == 200, normal.text
    assert took < ANSWER_BOUND_S, f"the normal chat took {took:.2f} s beside {case} ({hostile_took:.2f} s)"
    assert hostile_answer.status_code in (200, 400), hostile_answer.text[:500]


@pytest.fixture
def blocked_pool(served: Served, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """Every preparation waits for the event (the pool fills up); the ids prepared, and the bodies
    decoded, are recorded in order."""
    release = threading.Event()
    seen: list[str] = []
    preprocess, decode = served.preprocessor.preprocess, request_decoding.decode_request

    def waiting(*args: Any, request_id: str, **kwargs: Any) -> Any:
        seen.append(f"prepare {request_id}")
        release.wait(60)
        return preprocess(*args, request_id=request_id, **kwargs)

    def recording(body: bytes, cls: type[Any]) -> Any:
        request = decode(body, cls)
        seen.append(f"decode {request.request_id}")
        return request

    monkeypatch.setattr(served.preprocessor, "preprocess", waiting)
    monkeypatch.setattr(request_decoding, "decode_request", recording)
    try:
        yield release, seen
    finally:
        release.set()


def gone(served: Served, request_id: str, after_s: float) -> None:
    """A client that sends its request and leaves after ``after_s`` seconds."""
    with pytest.raises(httpx.ReadTimeout):
        post(served, {**NORMAL, "request_id": request_id}, timeout=after_s)


def wait_for(condition: Any, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_client_that_leaves_before_its_preparation_starts_costs_the_pool_nothing(
        served: Served, blocked_pool: tuple[threading.Event, list[str]]) -> None:
    release, seen = blocked_pool
    threads = served.preprocessor.pipeline.threads
    workers = threads.budget + threads.lanes  # the preparation pool's size
    with ThreadPoolExecutor(workers) as clients:
        held = [clients.submit(post, served, {**NORMAL, "request_id": f"held-{i}"}) for i in range(workers)]
        wait_for(lambda: sum(s.startswith("prepare chatcmpl-held-") for s in seen) == workers, "the pool did not fill")
        gone(served, "gone-early", 1.0)
        time.sleep(0.5)  # the server has read the disconnect
        release.set()
        assert all(f.result(60).status_code == 200 for f in held)
    assert post(served, {**NORMAL, "request_id": "after"}).status_code == 200
    assert not [s for s in seen if "gone-early" in s], seen  # neither decoded nor prepared


def test_a_client_that_leaves_during_its_preparation_starts_no_engine_request(
        served: Served, blocked_pool: tuple[threading.Event, list[str]], engine_requests: list[str]) -> None:  # noqa: F811
    release, seen = blocked_pool
    gone(served, "gone-midway", 1.0)
    assert seen[-1] == "prepare chatcmpl-gone-midway"
    time.sleep(0.5)
    release.set()
    assert post(served, {**NORMAL, "request_id": "after"}).status_code == 200
    assert [r for r in engine_requests if "gone-midway" in r] == [] and any("after" in r for r in engine_requests)
