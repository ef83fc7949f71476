"""What the server does when a client goes away, and when the engine does: a client that
disconnects mid-stream (or drops a non-streaming request) aborts its request in the engine,
which stops generating and serves the next request; so does a stop string; an engine that stops fails the request in
flight with an error chunk within ``engine_timeout_s`` (500, vLLM's answer to its ``EngineDeadError``), and
``/health`` answers 503 from then on."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve_harness import MODEL_NAME, Served, expected_text, serve

from local_services import greedy_answers
from mmfront.testing.media import image_data_url, make_image

pytestmark = pytest.mark.slow

LONG = 4000
MESSAGES = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_url(make_image(24, 20))}},
                                         {"type": "text", "text": "Describe it at length."}]}]


def running(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            return float(line.split()[-1])
    raise AssertionError("no vllm:num_requests_running")


def assert_engine_idle(served: Served) -> None:
    """Nothing generates any more, within 3 s (the abort travels through the client's reader
    thread): a long request would add tokens every few milliseconds for many seconds."""
    deadline = time.monotonic() + 30
    while running(served.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(served.url) == 0
    deadline = time.monotonic() + 3
    while True:
        before = served.worker_stats.tokens
        time.sleep(0.5)
        if served.worker_stats.tokens == before:
            return
        assert time.monotonic() < deadline, "the engine kept generating for a request nobody reads"


def test_disconnects_and_stop_strings_abort_and_a_dead_engine_fails_fast(gemma3_weights_dir: Path) -> None:
    long_body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": LONG, "ignore_eos": True,
                 "temperature": 0}
    [first] = greedy_answers(gemma3_weights_dir, [MESSAGES], 6)
    with serve(gemma3_weights_dir, engine_timeout_s=3) as served:
        early = expected_text(served.preprocessor.tokenizer, first)
        stop = early[len(early) // 2:len(early) // 2 + 2]
        chat_url = served.v1 + "/chat/completions"
        # a stream read for a few chunks, then closed
        with httpx.stream("POST", chat_url, json={**long_body, "stream": True}, timeout=60) as response:
            lines = response.iter_lines()
            got = [line for line, _ in zip(lines, range(6)) if line.startswith("data: ")]
        assert len(got) >= 3
        # a non-streaming request whose client gives up
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(chat_url, json=long_body, timeout=httpx.Timeout(60, read=0.5))
        assert_engine_idle(served)  # the engine stopped generating for both
        assert served.worker_stats.tokens < LONG
        # a stop string ends the choice here and the request in the engine
        stopped = httpx.post(chat_url, json={**long_body, "stop": [stop]}, timeout=60).json()["choices"][0]
        assert (stopped["finish_reason"], stopped["stop_reason"]) == ("stop", stop)
        assert_engine_idle(served)
        assert served.worker_stats.tokens < LONG
        after = httpx.post(chat_url, json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 3, "temperature": 0}, timeout=60)
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 3

        # the engine goes away while a request streams and another waits for its whole answer
        with ThreadPoolExecutor(1) as pool:
            with httpx.stream("POST", chat_url, json={**long_body, "stream": True}, timeout=60) as response:
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
                waiting = pool.submit(httpx.post, chat_url, json=long_body, timeout=60)
                deadline = time.monotonic() + 30
                while served.worker_stats.requests < 6 and time.monotonic() < deadline:
                    time.sleep(0.01)
                stats = served.stop_engine()
                start = time.monotonic()
                rest = [line.removeprefix("data: ") for line in lines if line]
            whole = waiting.result()
        assert time.monotonic() - start < 20
        assert rest[-1] == "[DONE]"
        # an EngineDeadError, answered as vLLM's server answers its own: 500, and /health 503
        error = json.loads(rest[-2])["error"]
        assert (error["type"], error["code"], error["param"]) == ("InternalServerError", 500, None)
        assert whole.status_code == 500 and whole.json()["error"]["type"] == "InternalServerError"
        assert stats.requests == 6 and stats.tokens < 2 * LONG
        health = httpx.get(served.url + "/health")
        assert health.status_code == 503
        refused = httpx.post(chat_url, json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 3, "temperature": 0}, timeout=60)
        assert refused.status_code == 500 and refused.json()["error"]["type"] == "InternalServerError"
