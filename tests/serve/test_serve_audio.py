"""Chat with audio through ``mmfront serve`` (tiny Qwen2-Audio with random weights behind
``mmfront worker``): ``input_audio`` and ``audio_url`` parts, JSON and SSE, the text equal to the
model's own tokens decoded."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from serve_harness import MODEL_NAME, Served, expected_text, serve

from local_services import greedy_answers
from mmfront.testing.media import make_audio, wav_bytes

pytestmark = [pytest.mark.slow, pytest.mark.hf_version(">=5.16", reason="Qwen2-Audio reports offsets from 5.16")]

WAV = base64.b64encode(wav_bytes(make_audio(1.0, seed=3), 16000)).decode()
MAX_TOKENS = 8
PARTS: dict[str, dict[str, Any]] = {
    "input_audio": {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
    "audio_url": {"type": "audio_url", "audio_url": {"url": f"data:audio/wav;base64,{WAV}"}},
}


def messages(part: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [PARTS[part], {"type": "text", "text": "What do you hear?"}]}]


@pytest.fixture(scope="module")
def served(qwen2_audio_weights_dir: Path) -> Iterator[tuple[Served, str]]:
    [tokens] = greedy_answers(qwen2_audio_weights_dir, [messages("input_audio")], MAX_TOKENS)
    with serve(qwen2_audio_weights_dir) as s:
        yield s, expected_text(s.preprocessor.tokenizer, tokens)


@pytest.mark.parametrize("part", sorted(PARTS))
def test_chat_with_audio_json_and_stream(served: tuple[Served, str], part: str) -> None:
    s, want = served
    client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0, timeout=120)
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages(part), max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                         temperature=0)
    assert out.choices[0].message.content == want
    response = httpx.post(s.v1 + "/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "messages": messages(part), "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    events = [block.removeprefix("data: ") for block in response.text.split("\n\n") if block]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks[1:-1]) == want
    assert chunks[-1]["usage"]["completion_tokens"] == out.usage.completion_tokens  # type: ignore[union-attr]
    assert chunks[-1]["usage"]["prompt_tokens"] == out.usage.prompt_tokens  # type: ignore[union-attr]
