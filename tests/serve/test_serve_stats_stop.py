"""A stop string and the statistics, through the app in front of a real ``mmfront worker`` (tiny
Gemma 3): the app's event loop is held while the engine client's reader thread reads every step of
the request, as a loaded machine lets the engine run ahead of the loop. vLLM counts an output as its
output processor searches it for the stop strings and drops the rest: three tokens, ended by
``stop``. (test_serve_stats.py checks the recorder itself; test_vllm_serve_metrics.py compares the
numbers with ``vllm serve``'s.)"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import MODEL_NAME, Served, serve

from mmfront import MultiModalConfig
from mmfront.engine.client_events import EngineStep
from mmfront.serve.app import create_app
from mmfront.serve.settings import ServeSettings

pytestmark = pytest.mark.slow

GREEDY = {"model": MODEL_NAME, "prompt": "hello there", "max_tokens": 6, "temperature": 0, "return_token_ids": True}
"""The tiny model answers 'help', 'V', '@', '\\ufffd', ' bette', ... (token ids 434, 86, 64, 227, 455, 206)."""


@pytest.fixture(scope="module")
def served(gemma3_weights_dir: Path) -> Iterator[Served]:
    with serve(gemma3_weights_dir, config=MultiModalConfig(mm_processor_cache_gb=0.02, max_model_len=2048)) as s:
        yield s


class HoldTheLoop:
    """A step observer (on the client's reader thread) that, at a request's first output, blocks
    the app's event loop until the engine has sent that request's last output."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.started = False
        self.engine_done = threading.Event()

    def __call__(self, step: EngineStep, request_ids: list[str]) -> None:
        if step.outputs and not self.started:
            self.started = True
            self.loop.call_soon_threadsafe(self.engine_done.wait, 60)  # before the output reaches its stream
        if any(output.finish_reason is not None for output in step.outputs):
            self.engine_done.set()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_tokens_after_the_stop_string_are_not_counted(served: Served, gemma3_weights_dir: Path) -> None:
    async def run() -> tuple[HoldTheLoop, dict[str, Any], str]:
        hold = HoldTheLoop(asyncio.get_running_loop())
        app = create_app(served.client, ServeSettings(gemma3_weights_dir, served_model_name=(MODEL_NAME,)))
        served.client.add_step_observer(hold)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
            answer = await http.post("/v1/completions", json={**GREEDY, "stop": ["V@"]}, timeout=120)
            metrics = await http.get("/metrics")
        return hold, answer.json(), metrics.text

    hold, answer, metrics = asyncio.run(run())
    assert hold.engine_done.is_set()  # the engine made all six tokens before the app saw the first
    choice = answer["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["finish_reason"], choice["stop_reason"]) == (
        "help", [434, 86, 64], "stop", "V@")
    assert answer["usage"]["completion_tokens"] == 3
    labels = (("engine", "0"), ("model_name", MODEL_NAME))
    found = samples(metrics)
    assert found[("vllm:generation_tokens_total", labels)] == 3
    assert found[("vllm:prompt_tokens_total", labels)] == 8
    for reason, count in [("stop", 1), ("length", 0), ("abort", 0)]:
        assert found[("vllm:request_success_total", (*labels[:1], ("finished_reason", reason), labels[1]))] == count
    assert (found[("vllm:request_generation_tokens_count", labels)],
            found[("vllm:request_generation_tokens_sum", labels)]) == (1, 3)
    assert found[("vllm:iteration_tokens_total_sum", labels)] == 8 + 3
    assert found[("vllm:time_to_first_token_seconds_count", labels)] == 1
    assert found[("vllm:inter_token_latency_seconds_count", labels)] == 2
