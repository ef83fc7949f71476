"""When a chat stream's first event goes out. vLLM's chat stream sends each choice's role chunk
with the request's first engine output (``vllm serve`` and its Rust frontend alike: the role and
the first token arrive together), so a client's time to its first chunk, which ``vllm bench
serve`` reports as TTFT, is the time to the first token. The response's head goes out before,
as soon as the request is sent to the engine."""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from serve_harness import MODEL_NAME, serve

from mmfront.engine.runner import ModelRunner
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire.structs import EngineCoreOutput, FinishReason

pytestmark = pytest.mark.slow

HOLD_S = 0.5
"""How long the test watches for an event while the engine holds the request's first step: the
role chunk sent before it came within milliseconds."""


class HeldFirstStep(ModelRunner):
    """The worker's runner, its first step held until the test releases it."""

    def __init__(self, model_dir: Path, entered: threading.Event, release: threading.Event) -> None:
        super().__init__(model_dir)
        self.entered, self.release = entered, release

    def step(self) -> list[EngineCoreOutput]:
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(60)
        return super().step()


def read_stream(url: str, body: dict[str, Any], arrived: queue.Queue[tuple[float, str]]) -> None:
    """Puts ``head STATUS`` when the response's head is in (and an error's body), then each ``data:``
    event's text, each with the time it arrived."""
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        arrived.put((time.monotonic(), f"head {response.status_code}"))
        if response.status_code != 200:
            arrived.put((time.monotonic(), response.read().decode()))
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrived.put((time.monotonic(), line.removeprefix("data: ")))


def test_a_chat_stream_sends_its_role_with_the_first_token(gemma3_weights_dir: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    arrived: queue.Queue[tuple[float, str]] = queue.Queue()
    image = image_data_url(make_image(24, 20, seed=3))
    body = {"model": MODEL_NAME, "stream": True, "max_tokens": 3, "temperature": 0.0,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                      {"type": "text", "text": "What is this?"}]}]}
    with serve(gemma3_weights_dir, runner=lambda folder: HeldFirstStep(folder, entered, release)) as served:
        reader = threading.Thread(target=read_stream, args=(f"{served.v1}/chat/completions", body, arrived))
        reader.start()
        try:
            assert entered.wait(60), f"the request never reached the engine: {list(arrived.queue)}"
            assert arrived.get(timeout=60)[1] == "head 200"  # the head goes out with the request sent
            with pytest.raises(queue.Empty):
                arrived.get(timeout=HOLD_S)
        finally:
            released = time.monotonic()
            release.set()
            reader.join(60)
    events = []
    while not arrived.empty():
        events.append(arrived.get())
    assert events and all(at >= released for at, _ in events)
    deltas = [json.loads(text)["choices"][0]["delta"] for _, text in events[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert len(deltas) > 1 and all("role" not in delta for delta in deltas[1:])
    assert events[-1][1] == "[DONE]"


class FailingStep(ModelRunner):
    """The worker's runner, whose outputs report each request failed (``FinishReason.ERROR``), as an
    engine reports a request it could not serve."""

    def step(self) -> list[EngineCoreOutput]:
        return [msgspec.structs.replace(output, new_token_ids=[], finish_reason=FinishReason.ERROR)
                for output in super().step()]


def test_a_request_the_engine_fails_gets_its_role_chunk_before_the_error(gemma3_weights_dir: Path) -> None:
    """The failure is the request's first engine output, so the role goes out with it, then the error
    (vLLM's stream alike: tests/serve/test_vllm_serve_anthropic.py)."""
    body = {"model": MODEL_NAME, "stream": True, "max_tokens": 3, "temperature": 0.0,
            "messages": [{"role": "user", "content": "Hi"}]}
    with serve(gemma3_weights_dir, runner=FailingStep) as served:
        answer = httpx.post(f"{served.v1}/chat/completions", json=body, timeout=120)
    events = [e.removeprefix("data: ") for e in answer.text.split("\n\n") if e.strip()]
    assert answer.status_code == 200 and len(events) == 3, answer.text
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert json.loads(events[1])["error"]["code"] == 500 and events[2] == "[DONE]"
