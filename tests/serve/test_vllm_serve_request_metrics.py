"""``--enable-per-request-metrics`` side by side: ``mmfront serve`` and ``vllm serve`` (peer venv),
each started with it in front of a stock vLLM 0.33 engine core that keeps its statistics (the
engine sends the queued and scheduled events the queue and first-token times need), given the same
requests. The times differ run to run, so what is compared is where ``metrics`` appears, its
fields and which of them are ``null``; each time is checked to be a plausible number of ms.

As vLLM: a whole answer with one choice carries ``metrics`` (``null`` for ``n`` > 1 or several
prompts); a stream carries it on its usage chunk only (without ``null`` fields).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from test_vllm_serve_parity import (
    CHAT,
    MODEL,
    PEER,
    PEER_DIR,
    SERVED,
    Pair,
    both,
    explain,
    running_pair,
)

from mmfront.testing.peer import SKIP_REASON

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

FLAGS = ["--enable-per-request-metrics"]
TIMES = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():
        pytest.skip(SKIP_REASON)
    with running_pair(tmp_path_factory.mktemp("per_request_metrics"), server_args=FLAGS,
                      engine_log_stats=True) as both_servers:
        yield both_servers


def shape(metrics: Any) -> Any:
    """Where the times are: the field names, each one's ``null`` or not; each time a plausible ms."""
    if metrics is None:
        return None
    for name in TIMES:
        value = metrics.get(name)
        assert value is None or (isinstance(value, float) and 0 <= value < 600_000), metrics
    return {name: value is None for name, value in metrics.items()}


def usage_chunk(text: str) -> dict[str, Any]:
    events = [json.loads(e.removeprefix("data: ")) for e in text.split("\n\n")
              if e.startswith("data: ") and e != "data: [DONE]"]
    [chunk] = [e for e in events if not e["choices"]]
    assert all("metrics" not in e for e in events if e["choices"]), text
    return chunk


TEXT = [{"role": "user", "content": "Hi there"}]
WHOLE = {
    "chat": ("/v1/chat/completions", {"model": SERVED, "messages": TEXT, "max_tokens": 3}),
    "chat_image": ("/v1/chat/completions", {"model": SERVED, "messages": CHAT, "max_tokens": 4}),
    "chat_one_token": ("/v1/chat/completions", {"model": SERVED, "messages": TEXT, "max_tokens": 1}),
    "chat_n2": ("/v1/chat/completions", {"model": SERVED, "messages": TEXT, "max_tokens": 3, "n": 2,
                                         "temperature": 1.0}),
    "completion": ("/v1/completions", {"model": SERVED, "prompt": "Hello there", "max_tokens": 3}),
    "completion_two_prompts": ("/v1/completions", {"model": SERVED, "prompt": ["Hello", "there"], "max_tokens": 3}),
}


@pytest.mark.parametrize("case", WHOLE)
def test_a_whole_answer_carries_vllms_metrics(pair: Pair, case: str) -> None:
    path, body = WHOLE[case]
    vllm, mmfront = both(pair, "POST", path, body)
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    want, got = vllm.json(), mmfront.json()
    assert "metrics" in want and "metrics" in got, explain(pair, vllm, mmfront)
    assert shape(got["metrics"]) == shape(want["metrics"]), explain(pair, vllm, mmfront)
    assert (want["metrics"] is None) is (case in ("chat_n2", "completion_two_prompts"))


STREAMS = {
    "chat": ("/v1/chat/completions", {"model": SERVED, "messages": TEXT, "max_tokens": 3}),
    "completion": ("/v1/completions", {"model": SERVED, "prompt": "Hello there", "max_tokens": 3}),
    "chat_n2": ("/v1/chat/completions", {"model": SERVED, "messages": TEXT, "max_tokens": 3, "n": 2}),
}


@pytest.mark.parametrize("case", STREAMS)
def test_a_streams_usage_chunk_carries_vllms_metrics(pair: Pair, case: str) -> None:
    path, body = STREAMS[case]
    vllm, mmfront = both(pair, "POST", path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    want, got = usage_chunk(vllm.text), usage_chunk(mmfront.text)
    assert ("metrics" in got) is ("metrics" in want) is (case != "chat_n2"), explain(pair, vllm, mmfront)
    assert shape(got.get("metrics")) == shape(want.get("metrics")), explain(pair, vllm, mmfront)
    assert None not in (got.get("metrics") or {}).values()


def test_a_stream_without_usage_carries_none(pair: Pair) -> None:
    path, body = STREAMS["chat"]
    vllm, mmfront = both(pair, "POST", path, {**body, "stream": True})
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert '"metrics"' not in vllm.text and '"metrics"' not in mmfront.text, explain(pair, vllm, mmfront)
