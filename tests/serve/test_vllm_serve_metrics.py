"""Observability side by side: ``mmfront serve`` and ``vllm serve`` (peer venv), each in front of
a stock vLLM 0.33 engine core that keeps its statistics (``data/stock_engine_log_stats.py``: the
engine vLLM's docs run, without ``--disable-log-stats``), started with the same flags
(``--enable-log-requests --enable-log-outputs --enable-prompt-tokens-details``,
``VLLM_LOG_STATS_INTERVAL=1``), given the same requests in the same order.

Compared: every ``vllm:`` family on ``/metrics`` (name, type, HELP text, label names, the series
that exist before any request, each histogram's buckets), then after the same traffic the value of
every series that does not depend on timing (token counters and their histograms' counts and
sums, finish reasons, prefix-cache and multimodal-cache counts, gauges; a timing histogram's
count), the periodic stats line with its throughputs masked, the output logs, the usage's
``prompt_tokens_details`` of chat and completions, whole and streamed, and the routes the start-up
banner lists. One difference, asserted: ``vllm:cache_config_info`` (the engine's KV-cache
configuration, which a stock engine does not tell its API server; docs/serving.md, "Differences").
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_vllm_serve_parity import CHAT, MODEL, PEER, PEER_DIR, SERVED, Pair, Side, start_side, wait_healthy

from mmfront.testing.peer import SKIP_REASON

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

FLAGS = ["--enable-log-requests", "--enable-log-outputs", "--enable-prompt-tokens-details"]
ONLY_VLLM = {"vllm:cache_config_info"}
TIMING = re.compile(r"vllm:(time_to_first_token|inter_token_latency|request_time_per_output_token|e2e_request_latency|"
                    r"request_(queue|inference|prefill|decode)_time)_seconds")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():
        pytest.skip(SKIP_REASON)
    folder = tmp_path_factory.mktemp("observability")
    sides: list[Side] = []
    interval = {"VLLM_LOG_STATS_INTERVAL": "1"}
    try:
        sides.append(start_side("vllm", [str(PEER.parent / "vllm")], interval, folder, server_args=FLAGS,
                                engine_log_stats=True))
        mmfront_env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "VLLM_TARGET_DEVICE": "cpu", **interval}
        sides.append(start_side("mmfront", [sys.executable, "-m", "mmfront.cli"], mmfront_env, folder,
                                server_args=FLAGS, engine_log_stats=True))
        wait_healthy(sides)
        yield Pair(*sides)
    finally:
        for side in sides:
            side.stop()


def families(side: Side) -> dict[str, Any]:
    text = httpx.get(side.url + "/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text)
            if f.name.startswith("vllm:") and not f.name.endswith("_created")}  # a counter's creation time


def shape(family: Any) -> dict[str, Any]:
    """A family as declared: type, HELP, label names, the series it has, a histogram's buckets."""
    labels = sorted({tuple(sorted(s.labels)) for s in family.samples if not s.name.endswith("_created")})
    series = sorted({tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                     for s in family.samples if not s.name.endswith("_created")})
    buckets = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
    return {"type": family.type, "help": family.documentation, "labels": labels, "series": series,
            "buckets": buckets}


def test_every_vllm_family_is_declared_as_vllms(pair: Pair) -> None:
    vllm, mmfront = families(pair.vllm), families(pair.mmfront)
    assert set(vllm) - set(mmfront) == ONLY_VLLM
    assert set(mmfront) <= set(vllm)
    assert len(mmfront) == 38
    for name in sorted(mmfront):
        assert shape(mmfront[name]) == shape(vllm[name]), name


def post(side: Side, path: str, body: dict[str, Any], request_id: str) -> httpx.Response:
    answer = httpx.post(side.url + path, json=body, headers={"X-Request-Id": request_id}, timeout=120)
    assert answer.status_code == 200, (side.name, answer.text, side.tails())
    return answer


def usage_of_stream(answer: httpx.Response) -> dict[str, Any]:
    events = [json.loads(line[6:]) for line in answer.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return next(e["usage"] for e in reversed(events) if e.get("usage"))


TRAFFIC: list[tuple[str, str, dict[str, Any]]] = [
    ("chat-1", "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "max_tokens": 5}),
    ("chat-2", "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "max_tokens": 5}),
    ("chat-stream", "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "max_tokens": 4, "stream": True,
                                             "stream_options": {"include_usage": True}}),
    # the stop string ends in the third token ('linen'): three tokens count, however many steps the engine makes
    # before the abort reaches it (on a loaded machine, more)
    ("chat-stop", "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "max_tokens": 16, "stop": ["line"]}),
    # ... and in the last token the request may make: the engine finishes it by length, both servers say stop
    ("chat-endstop", "/v1/chat/completions", {"model": SERVED, "messages": CHAT, "max_tokens": 3, "stop": ["line"]}),
    ("cmpl-n2", "/v1/completions", {"model": SERVED, "prompt": "hello there", "max_tokens": 4, "n": 2}),
    ("cmpl-stream", "/v1/completions", {"model": SERVED, "prompt": "hello there", "max_tokens": 3, "stream": True,
                                        "stream_options": {"include_usage": True}}),
]


@pytest.fixture(scope="module")
def traffic(pair: Pair) -> dict[str, tuple[httpx.Response, httpx.Response]]:
    answers = {}
    for request_id, path, body in TRAFFIC:
        answers[request_id] = (post(pair.vllm, path, body, request_id), post(pair.mmfront, path, body, request_id))
    time.sleep(3)  # the last steps' statistics, and a stats line after them (every second)
    return answers


def test_prompt_tokens_details_as_vllms(traffic: dict[str, tuple[httpx.Response, httpx.Response]]) -> None:
    for request_id, (vllm, mmfront) in traffic.items():
        if "stream" in request_id:
            assert usage_of_stream(mmfront) == usage_of_stream(vllm), request_id
        else:
            assert mmfront.json()["usage"] == vllm.json()["usage"], request_id
    chat = traffic["chat-2"][1].json()["usage"]["prompt_tokens_details"]
    assert chat["cached_tokens"] > 0 and chat["multimodal_tokens"] == {"image": 260}


def series(side: Side) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in families(side).values():
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def timeless(key: tuple[str, tuple[tuple[str, str], ...]]) -> bool:
    """Whether a series' value does not depend on timing: every one but the timing histograms'
    buckets and sums, and the per-step histogram's buckets and count (how steps batch requests)."""
    name = key[0]
    if TIMING.match(name):
        return name.endswith("_count")
    if name.startswith("vllm:iteration_tokens_total"):
        return name.endswith("_sum")
    return name != "vllm:cache_config_info"


def test_the_same_traffic_gives_the_same_numbers(pair: Pair,
                                                 traffic: dict[str, tuple[httpx.Response, httpx.Response]]) -> None:
    vllm, mmfront = series(pair.vllm), series(pair.mmfront)
    compared = {key: value for key, value in vllm.items() if timeless(key)}
    assert {key: mmfront.get(key) for key in compared} == compared
    labels = (("engine", "0"), ("model_name", SERVED))
    assert mmfront[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "length"),
                                                   ("model_name", SERVED)))] == 6
    assert mmfront[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "stop"),
                                                   ("model_name", SERVED)))] == 2
    assert mmfront[("vllm:generation_tokens_total", labels)] == 5 + 5 + 4 + 3 + 3 + 2 * 4 + 3
    assert mmfront[("vllm:mm_cache_hits_total", labels)] == 4  # chat-2, chat-stream, chat-stop, chat-endstop


STATS_LINE = re.compile(r"Engine 000: Avg prompt throughput: [0-9.]+ tokens/s, Avg generation throughput: "
                        r"[0-9.]+ tokens/s, (.*)$")


def stats_lines(side: Side) -> list[str]:
    return [m.group(1) for line in side.logs["server"].read_text(errors="replace").splitlines()
            if (m := STATS_LINE.search(line))]


def test_the_stats_line_is_vllms(pair: Pair, traffic: dict[str, tuple[httpx.Response, httpx.Response]]) -> None:
    vllm, mmfront = stats_lines(pair.vllm), stats_lines(pair.mmfront)
    assert vllm and mmfront, (pair.vllm.tails(), pair.mmfront.tails())
    assert mmfront[-1] == vllm[-1]
    assert mmfront[-1].startswith("Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: ")


OUTPUT_LOG = re.compile(r"(Generated response \S+ .*)$")


def output_logs(side: Side, request_id: str) -> list[str]:
    return [m.group(1) for line in side.logs["server"].read_text(errors="replace").splitlines()
            if (m := OUTPUT_LOG.search(line)) and request_id in line]


@pytest.mark.parametrize("request_id", [request_id for request_id, _, _ in TRAFFIC])
def test_output_logs_are_vllms(pair: Pair, traffic: dict[str, tuple[httpx.Response, httpx.Response]],
                               request_id: str) -> None:
    vllm, mmfront = output_logs(pair.vllm, f"-{request_id}"), output_logs(pair.mmfront, f"-{request_id}")
    assert vllm
    if "stream" in request_id:  # where a stream's text is cut into deltas depends on timing
        assert [line for line in mmfront if "(streaming delta)" not in line] == [
            line for line in vllm if "(streaming delta)" not in line]
        assert "".join(re.findall(r"output: '(.*)', finish", " ".join(mmfront))) != ""
    else:
        assert mmfront == vllm


ROUTE = re.compile(r"Route: (\S+), Methods: (.*)$")


def routes(side: Side) -> dict[str, set[str]]:
    """Each logged path's methods (vLLM declares ``/ping`` twice, once per method)."""
    found: dict[str, set[str]] = {}
    for line in side.logs["server"].read_text(errors="replace").splitlines():
        if m := ROUTE.search(line):
            found.setdefault(m.group(1), set()).update(m.group(2).split(", "))
    return found


def test_the_banner_lists_the_routes_as_vllm(pair: Pair) -> None:
    vllm, mmfront = routes(pair.vllm), routes(pair.mmfront)
    assert {"/v1/chat/completions", "/v1/completions", "/metrics", "/health", "/tokenize"} <= set(mmfront)
    shared = set(vllm) & set(mmfront)
    # Starlette answers HEAD on every GET route (FastAPI's API routes answer 405): docs/serving.md
    assert {path: mmfront[path] - {"HEAD"} for path in shared} == {path: vllm[path] - {"HEAD"} for path in shared}
    assert mmfront["/health"] == {"GET", "HEAD"} and vllm["/health"] == {"GET"}
    log = pair.mmfront.logs["server"].read_text(errors="replace")
    assert "mmfront server version " in log and f"serving model {MODEL}" in log
    assert f"Starting mmfront server on {pair.mmfront.url}" in log
